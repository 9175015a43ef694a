"""The audit trail's hash chain: each event's hash covers its canonical bytes and the hash before it.

An event is stored as those bytes (`event_bytes`), so verifying the chain hashes what is stored: it never decodes
an event or encodes it again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.domain.plan import canonical_json

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


# What verify reads of each stored event: (seq, prev_hash, hash, canonical bytes as text)
ChainLink = tuple[int, str, str, str | None]


_ADDRESS = re.compile(r"^(?:module\.[\w-]+(?:\[[^\]]+\])?\.)*(?:data\.)?[a-z][a-z0-9_]*\.[A-Za-z_][\w-]*(?:\[[^\]]+\])?$")
OUTCOMES = frozenset({"refused", "failed", "succeeded", "interrupted", "withdrawn", "tripped"})


def event_addresses(payload: Any) -> set[str]:
    """Every resource address an event's payload names (what the trail is searched by)."""
    return scan_payload(payload)[0]


def scan_payload(payload: Any) -> tuple[set[str], bool]:
    """The resource addresses a payload names (`event_addresses`), and whether it holds a float (then its canonical
    bytes are `json`'s spelling of it: see `event_bytes`). One walk, a loop, not recursion: it runs for every event
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
    return found, floats


_SCALARS = frozenset({int, bool, type(None)})


def event_outcome(kind: str) -> str | None:
    """`apply.refused` -> `refused`: the outcome an auditor filters by (None when the kind names none)."""
    last = kind.rsplit(".", 1)[-1]
    return last if last in OUTCOMES else None


def event_bytes(content: Mapping[str, Any], floats: bool = True) -> bytes:
    """The one byte form of an event: what is stored, and what its hash covers (`canonical_json`).

    orjson writes those same bytes, ten times faster, for every JSON value but a float (it spells some exponents its
    own way: 1e-07 as 1e-7): an event its caller knows holds no float (`floats=False`, from `scan_payload`) is
    written by it. Anything orjson will not write as `json` would (a subclass, a date, an integer past 64 bits)
    falls back to `json`, which writes it, or refuses it, as it always has."""
    if not floats:
        try:
            return orjson.dumps(content, option=_ORJSON_CANONICAL)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return canonical_json(content)


_ORJSON_CANONICAL = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
                     | orjson.OPT_PASSTHROUGH_DATACLASS)


def decode_payload(encoded: str) -> tuple[Any, set[str], bool]:
    """`json.loads(encoded)` of a payload `json.dumps` wrote, with its `scan_payload` (addresses, whether it holds a
    float). orjson reads it, four times faster, unless a float is there: orjson reads an integer past 64 bits as one,
    so then `json` reads it again."""
    try:
        value = orjson.loads(encoded)
    except orjson.JSONDecodeError:  # NaN, a lone surrogate, nesting past orjson's depth: json's own reading
        value = json.loads(encoded)
        return (value, *scan_payload(value))
    addresses, floats = scan_payload(value)
    if floats:
        value = json.loads(encoded)
    return value, addresses, floats


def chain_hash(prev_hash: str, canonical: str) -> str:
    return "sha256:" + hashlib.sha256((prev_hash + canonical).encode()).hexdigest()


def event_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(prev_hash.encode() + event_bytes(content)).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    seq: int | None
    reason: str


def verify_chain(links: Iterable[ChainLink], head: tuple[int, str] | None,
                 require_head: bool = True, start: tuple[int, str] = (0, GENESIS)) -> ChainBreak | None:
    """The first place the chain is broken (edited, removed, inserted or reordered event), or None; streams its events
    and hashes each one's stored bytes as they are (the hot loop of `gateway audit verify`).

    `start` resumes after an event already proven (a checkpoint's seq and hash): the events given follow it.
    """
    prev_seq, prev_hash = start
    sha256 = hashlib.sha256
    for seq, link_prev, link_hash, canonical in links:
        if seq != prev_seq + 1:
            return ChainBreak(seq, f"event {prev_seq + 1} is missing (next present is {seq})")
        if link_prev != prev_hash:
            return ChainBreak(seq, f"event {seq} does not follow event {prev_seq} (removed, inserted or reordered)")
        if canonical is None or "sha256:" + sha256((prev_hash + canonical).encode()).hexdigest() != link_hash:
            return ChainBreak(seq, f"event {seq}{_kind_of(canonical)} was edited after it was written")
        prev_seq, prev_hash = seq, link_hash
    if head is not None:
        if (prev_seq, prev_hash) != tuple(head):
            return ChainBreak(head[0], f"the newest events are missing: the chain should end at event {head[0]}")
    elif prev_seq != start[0] and require_head:
        return ChainBreak(None, "the chain head record is missing")
    return None


def _kind_of(canonical: str | None) -> str:
    """` (approval)`: the kind of a broken event, when its bytes still say one (only read once the chain is broken)."""
    try:
        return f" ({json.loads(canonical or '')['kind']})"
    except (ValueError, TypeError, KeyError):
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

    def message(self) -> bytes:
        return canonical_json({"seq": self.seq, "hash": self.hash, "at": self.at, "public_key": self.public_key})

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "at": self.at, "public_key": self.public_key,
                "signature": self.signature}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        return cls(int(data["seq"]), str(data["hash"]), str(data["at"]), str(data["public_key"]),
                   str(data["signature"]))


def verify_against(links: Iterable[ChainLink], checkpoint: Checkpoint) -> ChainBreak | None:
    """Whether the trail, up to the checkpoint's event, is the one the checkpoint signed (the signature is
    checked by the caller): every event chained, and the chain ending in the checkpoint's hash."""
    seen: list[ChainLink] = []  # only the newest event is kept: the events stream through

    def upto() -> Iterator[ChainLink]:
        for link in links:
            if link[0] > checkpoint.seq:
                return
            seen[:] = [link]
            yield link

    broken = verify_chain(upto(), None, require_head=False)
    if broken is not None:
        return broken
    last = seen[0] if seen else None
    if last is None or last[0] != checkpoint.seq:
        return ChainBreak(checkpoint.seq, f"event {checkpoint.seq} of the checkpoint is missing")
    if last[2] != checkpoint.hash:
        return ChainBreak(checkpoint.seq, f"the trail up to event {checkpoint.seq} is not the one the checkpoint "
                                          f"signed: it was rewritten (chain ends in {last[2][:19]}…, signed "
                                          f"{checkpoint.hash[:19]}…)")
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
