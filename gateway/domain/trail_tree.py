"""The trail's Merkle tree: RFC 9162's Merkle Tree Hash over the events' hashes, in event order.

A checkpoint signs the tree's root beside the chain's head, so one event is proven part of the signed trail by a few
hashes (its audit path, RFC 9162 section 2.1.3), without the events around it: an evidence bundle carries a change's
events and their paths, never the rest of the trail.

    leaf i (event seq i + 1)    SHA-256(0x00 || the event's hash, as its ASCII text "sha256:<hex>")
    node                        SHA-256(0x01 || left || right)
    a tree of n leaves          RFC 9162's MTH: the left subtree holds the largest power of two below n

The store keeps the root of each complete block of BLOCK leaves (written when a checkpoint is signed), so a root or a
path reads the block roots and at most two blocks' leaves, never the whole trail.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

BLOCK = 256  # leaves per stored subtree (a power of two)
PREFIX = "sha256:"


def leaf_hash(event_hash: str) -> bytes:
    return hashlib.sha256(b"\x00" + event_hash.encode()).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def as_text(digest: bytes) -> str:
    return PREFIX + digest.hex()


def from_text(text: str) -> bytes:
    """A hash written `sha256:<64 hex digits>` as its 32 bytes (ValueError when it is not one)."""
    if not text.startswith(PREFIX) or len(text) != len(PREFIX) + 64:
        raise ValueError(f"{text[:80]!r} is not a sha256: hash")
    return bytes.fromhex(text[len(PREFIX):])


def split_point(n: int) -> int:
    """The largest power of two below n (n > 1): where RFC 9162 splits a tree of n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


def subtree_root(leaves: Sequence[bytes]) -> bytes:
    """MTH of these leaf hashes (at least one)."""
    if len(leaves) == 1:
        return leaves[0]
    k = split_point(len(leaves))
    return node_hash(subtree_root(leaves[:k]), subtree_root(leaves[k:]))


@dataclass
class TrailTree:
    """The tree of the first `size` events, from the stored block roots and the leaves a question needs.

    `blocks[b]` is the root of leaves [b * BLOCK, (b + 1) * BLOCK) for every complete block below `size`; `leaves`
    holds the leaf hashes (by 0-based index) of the last, incomplete block and of any block a path is asked in."""

    size: int
    blocks: Sequence[bytes]
    leaves: Mapping[int, bytes]
    _known: dict[tuple[int, int], bytes] = field(default_factory=dict)

    def root(self) -> bytes:
        if self.size < 1:
            raise ValueError("an empty trail has no tree")
        return self._hash(0, self.size)

    def path(self, index: int) -> list[bytes]:
        """RFC 9162's PATH(index, D[size]): the siblings from the leaf up to the root."""
        if not 0 <= index < self.size:
            raise ValueError(f"leaf {index} is not in a tree of {self.size}")
        siblings, lo, hi = [], 0, self.size
        while hi - lo > 1:
            k = split_point(hi - lo)
            if index < lo + k:
                siblings.append(self._hash(lo + k, hi))
                hi = lo + k
            else:
                siblings.append(self._hash(lo, lo + k))
                lo += k
        return siblings[::-1]

    def _hash(self, lo: int, hi: int) -> bytes:
        n = hi - lo
        if n == 1:
            return self.leaves[lo]
        if n == BLOCK and lo % BLOCK == 0 and lo // BLOCK < len(self.blocks):
            return self.blocks[lo // BLOCK]
        key = (lo, hi)
        known = self._known.get(key)
        if known is None:
            k = split_point(n)
            known = self._known[key] = node_hash(self._hash(lo, lo + k), self._hash(lo + k, hi))
        return known


def leaves_wanted(size: int, indexes: Iterable[int]) -> list[tuple[int, int]]:
    """The ranges of leaves (0-based, half-open) a tree of `size` needs beside its stored blocks to give the paths
    of these leaves: the incomplete last block, and each asked leaf's block."""
    blocks = {i // BLOCK for i in indexes} | ({size // BLOCK} if size % BLOCK else set())
    return [(b * BLOCK, min(size, (b + 1) * BLOCK)) for b in sorted(blocks)]


def verify_path(index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2: whether `path` leads from leaf `index` of a tree of `size` to `root`."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


class RootBuilder:
    """The root of a stream of leaves, in O(log n) memory: complete subtrees kept left to right, merged as they
    fill (what `gateway audit verify --against` recomputes as it streams the trail)."""

    def __init__(self) -> None:
        self._peaks: list[tuple[int, bytes]] = []  # (leaves, root), sizes strictly decreasing
        self.size = 0

    def add(self, leaf: bytes) -> None:
        size, digest = 1, leaf
        while self._peaks and self._peaks[-1][0] == size:
            left = self._peaks.pop()[1]
            size, digest = size * 2, node_hash(left, digest)
        self._peaks.append((size, digest))
        self.size += 1

    def root(self) -> bytes:
        if not self._peaks:
            raise ValueError("an empty trail has no tree")
        digest = self._peaks[-1][1]
        for _, left in reversed(self._peaks[:-1]):
            digest = node_hash(left, digest)
        return digest


def block_roots(first_block: int, leaves_of: Callable[[int, int], Sequence[bytes]], upto: int) -> list[bytes]:
    """The roots of complete blocks from `first_block` up to the tree of `upto` leaves, each from its leaves."""
    return [subtree_root(leaves_of(b * BLOCK, (b + 1) * BLOCK)) for b in range(first_block, upto // BLOCK)]
