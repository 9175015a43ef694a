"""The audit trail's hash chain: each event's hash covers its canonical bytes and the hash before it.

An event is stored as those bytes (`event_bytes`), so verifying the chain hashes what is stored: it never decodes
an event or encodes it again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain.plan import canonical_json
from gateway.domain.repositories import DEFAULT_REPOSITORY
from gateway.domain.trail_tree import RootBuilder, as_text, leaf_hash

GENESIS = "sha256:" + "0" * 64


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    id: str
    at: str  # ISO 8601, UTC
    actor: str
    actor_kind: str
    kind: str
    proposal_id: int | None
    stacks: tuple[str, ...]
    payload: Mapping[str, Any]
    prev_hash: str
    hash: str

    def content(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "id": self.id, "at": self.at, "actor": self.actor,
            "actor_kind": self.actor_kind, "kind": self.kind, "proposal_id": self.proposal_id,
            "stacks": list(self.stacks), "payload": dict(self.payload),
        }

    @classmethod
    def from_canonical(cls, canonical: str, prev_hash: str, hash: str) -> AuditEvent:
        """The event its stored bytes say (what every read shows, whatever the index columns beside them say)."""
        c = json.loads(canonical)
        return cls(c["seq"], c["id"], c["at"], c["actor"], c["actor_kind"], c["kind"], c["proposal_id"],
                   tuple(c["stacks"]), c["payload"], prev_hash, hash)


# What verify reads of each stored event: its seq, prev_hash and hash, its stored (canonical) bytes, and the columns
# beside them that the filters search: actor, actor_kind, at, id, kind, proposal_id, outcome (all as stored)
ChainLink = tuple[int, str, str, bytes | None, str, str, str, str, str, int | None, str | None]


_ADDRESS = re.compile(r"^(?:module\.[\w-]+(?:\[[^\]]+\])?\.)*(?:data\.)?[a-z][a-z0-9_]*\.[A-Za-z_][\w-]*(?:\[[^\]]+\])?$")
OUTCOMES = frozenset({"refused", "failed", "succeeded", "interrupted", "withdrawn", "tripped"})


def event_addresses(payload: Any) -> set[str]:
    """Every resource address an event's payload names (what the trail is searched by)."""
    return scan_payload(payload)[0]


def scan_payload(payload: Any) -> tuple[set[str], bool]:
    """The resource addresses a payload names (`event_addresses`), and whether it holds a float or a value of none of
    JSON's types (a faster encoder than `json` may spell a float otherwise, and writes a UUID `json` refuses). One walk, a loop, not recursion: it runs for every event
    appended; JSON's own types are told by `type`, anything else by `isinstance`."""
    found: set[str] = set()
    floats = False
    pending = [payload]
    pop, extend, add, match = pending.pop, pending.extend, found.add, _ADDRESS.match
    while pending:
        value = pop()
        kind = type(value)
        if kind is str:
            if len(value) <= 300 and "." in value and match(value):
                add(value)
        elif kind is dict:
            extend(value.values())
        elif kind is list:
            extend(value)
        elif kind is float:
            floats = True
        elif kind in _SCALARS:
            continue
        elif isinstance(value, str):
            if len(value) <= 300 and "." in value and match(value):
                add(value)
        elif isinstance(value, Mapping):
            extend(value.values())
        elif isinstance(value, (list, tuple)):
            extend(value)
        elif isinstance(value, float):
            floats = True
        else:  # not one of JSON's types (a UUID, an enum, a date): `json` writes it, or refuses it, as ever
            floats = True
    return found, floats


_SCALARS = frozenset({int, bool, type(None)})


def event_outcome(kind: str) -> str | None:
    """`apply.refused` -> `refused`: the outcome an auditor filters by (None when the kind names none)."""
    last = kind.rsplit(".", 1)[-1]
    return last if last in OUTCOMES else None


def event_bytes(content: Mapping[str, Any]) -> bytes:
    """The one byte form of an event: what is stored, and what its hash covers."""
    return canonical_json(content)


def chain_hash(prev_hash: str, canonical: str) -> str:
    return "sha256:" + hashlib.sha256((prev_hash + canonical).encode()).hexdigest()


def event_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(prev_hash.encode() + event_bytes(content)).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    seq: int | None
    reason: str


def verify_chain(links: Iterable[ChainLink], head: tuple[int, str] | None, require_head: bool = True,
                 start: tuple[int, str] = (0, GENESIS), decode: Callable[[bytes], Any] = json.loads) -> ChainBreak | None:
    """The first place the chain is broken (edited, removed, inserted or reordered event), or an event whose searched
    columns disagree with its bytes (edited to hide it from a filter or misfile it), or None; streams its events, hashes
    each one's stored bytes as they are and reads them once (the hot loop of `gateway audit verify`).

    `start` resumes after an event already proven (a checkpoint's seq and hash): the events given follow it. `decode`
    reads the bytes for that check: `json.loads`, or a faster reader that reads them the same or fails (an event it
    finds disagreeing is read again by `json.loads` before it is called edited).
    """
    prev_seq, prev_hash = start
    sha256, indexed, outcome_of = hashlib.sha256, _INDEXED, _outcome_of
    for seq, link_prev, link_hash, canonical, actor, actor_kind, at, event_id, kind, proposal_id, outcome in links:
        if seq != prev_seq + 1:
            return ChainBreak(seq, f"event {prev_seq + 1} is missing (next present is {seq})")
        if link_prev != prev_hash:
            return ChainBreak(seq, f"event {seq} does not follow event {prev_seq} (removed, inserted or reordered)")
        if canonical is None or "sha256:" + sha256(prev_hash.encode() + canonical).hexdigest() != link_hash:
            return ChainBreak(seq, f"event {seq}{_kind_of(canonical)} was edited after it was written")
        columns = (seq, actor, actor_kind, at, event_id, kind, proposal_id)
        try:  # what a read shows is what json decodes the bytes to
            said = indexed(decode(canonical))
        except (ValueError, KeyError, TypeError, RecursionError):  # not JSON (to this reader), not an object, a field missing
            said = None
        if said != columns or type(said[0]) is not int or type(said[6]) not in _PROPOSAL or outcome != outcome_of(kind):
            broken = _misread(seq, canonical, columns, outcome)
            if broken is not None:
                return broken
        prev_seq, prev_hash = seq, link_hash
    if head is not None:
        if (prev_seq, prev_hash) != tuple(head):
            return ChainBreak(head[0], f"the newest events are missing: the chain should end at event {head[0]}")
    elif prev_seq != start[0] and require_head:
        return ChainBreak(None, "the chain head record is missing")
    return None


_INDEXED = operator.itemgetter("seq", "actor", "actor_kind", "at", "id", "kind", "proposal_id")
_PROPOSAL = (int, type(None))  # a JSON integer, or null: not true, not 7.0, not "7"
_outcome_of = functools.lru_cache(maxsize=1024)(event_outcome)  # a trail has a few dozen kinds


def _misread(seq: int, canonical: bytes, columns: tuple[Any, ...], outcome: str | None) -> ChainBreak | None:
    """The event's columns against its bytes as `json` reads them (what every read shows), once the faster reading
    disagreed (one that reads an integer past 64 bits as a float, say): a break, or None when they agree after all."""
    try:
        said = _INDEXED(json.loads(canonical))
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested deeper than json reads
        return ChainBreak(seq, f"event {seq} was edited after it was written: its stored bytes are not the JSON "
                               "object of an event")
    if said == columns and type(said[0]) is int and type(said[6]) in _PROPOSAL and outcome == event_outcome(columns[5]):
        return None
    return misindexed(seq)


def _kind_of(canonical: bytes | None) -> str:
    """` (approval)`: the kind of a broken event, when its bytes still say one (only read once the chain is broken)."""
    try:
        return f" ({json.loads(canonical or b'')['kind']})"
    except (ValueError, TypeError, KeyError, RecursionError):
        return ""


def misindexed(seq: int) -> ChainBreak:
    """An event whose index columns (what the filters search) disagree with its bytes: edited to hide it or misfile it."""
    return ChainBreak(seq, f"event {seq} was edited after it was written: the actor, kind, time or proposal the "
                           "filters search by no longer match the event")


@dataclass(frozen=True)
class Checkpoint:
    """A signed statement of the chain's head: "up to event `seq`, the chain ends in `hash`".

    Signed with a key kept outside the database, so whoever can rewrite every row and the head
    consistently still cannot make an earlier checkpoint agree with the rewritten chain.
    """

    seq: int
    hash: str
    at: str
    public_key: str  # base64 of the raw Ed25519 public key that signed it
    signature: str  # base64
    tree_root: str | None = None  # the root of the trail's Merkle tree of `seq` events (domain/trail_tree.py)

    def message(self) -> bytes:
        """What is signed: the head, and the tree's root when it has one (checkpoints signed before it have none)."""
        signed = {"seq": self.seq, "hash": self.hash, "at": self.at, "public_key": self.public_key}
        return canonical_json(signed if self.tree_root is None else {**signed, "tree_root": self.tree_root})

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "at": self.at, "public_key": self.public_key,
                "signature": self.signature, "tree_root": self.tree_root}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        root = data.get("tree_root")
        return cls(int(data["seq"]), str(data["hash"]), str(data["at"]), str(data["public_key"]),
                   str(data["signature"]), None if root is None else str(root))


def verify_against(links: Iterable[ChainLink], checkpoint: Checkpoint,
                   decode: Callable[[bytes], Any] = json.loads) -> ChainBreak | None:
    """Whether the trail, up to the checkpoint's event, is the one the checkpoint signed (the signature is
    checked by the caller): every event chained, the chain ending in the checkpoint's hash, and the Merkle tree of
    their hashes having the root it signed (when it signed one)."""
    seen: list[ChainLink] = []  # only the newest event is kept: the events stream through
    tree = RootBuilder() if checkpoint.tree_root else None

    def upto() -> Iterator[ChainLink]:
        for link in links:
            if link[0] > checkpoint.seq:
                return
            seen[:] = [link]
            if tree is not None:
                tree.add(leaf_hash(link[2]))
            yield link

    broken = verify_chain(upto(), None, require_head=False, decode=decode)
    if broken is not None:
        return broken
    last = seen[0] if seen else None
    if last is None or last[0] != checkpoint.seq:
        return ChainBreak(checkpoint.seq, f"event {checkpoint.seq} of the checkpoint is missing")
    if last[2] != checkpoint.hash:
        return ChainBreak(checkpoint.seq, f"the trail up to event {checkpoint.seq} is not the one the checkpoint "
                                          f"signed: it was rewritten (chain ends in {last[2][:19]}…, signed "
                                          f"{checkpoint.hash[:19]}…)")
    if tree is not None and as_text(tree.root()) != checkpoint.tree_root:
        return ChainBreak(checkpoint.seq, f"the Merkle tree of the trail up to event {checkpoint.seq} does not have "
                                          "the root the checkpoint signed: the trail was rewritten")
    return None


@dataclass(frozen=True)
class EventQuery:
    """What an auditor filters the trail by; every filter is a condition on an indexed column."""

    proposal_id: int | None = None
    actor: str | None = None
    stack: str | None = None
    since: str | None = None
    until: str | None = None
    kind: str | None = None
    action: str | None = None  # a kind or a kind prefix: `apply` matches apply.started, apply.failed, ...
    outcome: str | None = None
    address: str | None = None  # exact, or a prefix when it ends with `*`
    repository: str | None = None  # a declaration repository's events (see `event_repository`)


def event_repository(kind: str, payload: Mapping[str, Any], stacks: Sequence[str], written_in: str) -> str:
    """The declaration repository an event is of (what the `repository` filter finds it by): the one a
    repository.added/removed event names; else the one its stacks are of (`repo/stack` is repository `repo`'s, a
    name with no `/` the default repository's); else `written_in`, the repository of the unit of work that appends
    it (a proposal's events are written in its repository's: another's proposal is not found there). An event of no
    repository (a sign-in, a user added) is the repository's it was written in: the default one's, mostly."""
    if kind in ("repository.added", "repository.removed") and isinstance(payload.get("repository"), str):
        return str(payload["repository"])
    named = {stack.split("/", 1)[0] if "/" in stack else DEFAULT_REPOSITORY for stack in stacks}
    return named.pop() if len(named) == 1 else written_in
