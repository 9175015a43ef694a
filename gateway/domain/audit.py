"""The audit trail's hash chain: each event's hash covers its content and the hash before it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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


def event_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(prev_hash.encode() + canonical_json(content)).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    seq: int | None
    reason: str


def verify_chain(events: Iterable[AuditEvent], head: tuple[int, str] | None) -> ChainBreak | None:
    """The first place the chain is broken (edited, removed or reordered event), or None."""
    prev_hash, prev_seq, last = GENESIS, 0, None
    for event in events:
        if event.seq != prev_seq + 1:
            return ChainBreak(event.seq, f"event {prev_seq + 1} is missing (next present is {event.seq})")
        if event.prev_hash != prev_hash:
            return ChainBreak(event.seq, f"event {event.seq} does not follow event {prev_seq} (removed or reordered)")
        if event_hash(prev_hash, event.content()) != event.hash:
            return ChainBreak(event.seq, f"event {event.seq} ({event.kind}) was edited after it was written")
        prev_hash, prev_seq, last = event.hash, event.seq, event
    if head is not None:
        head_seq, head_hash = head
        last_seq, last_hash = (last.seq, last.hash) if last else (0, GENESIS)
        if (last_seq, last_hash) != (head_seq, head_hash):
            return ChainBreak(head_seq, f"the newest events are missing: the chain should end at event {head_seq}")
    elif last is not None:
        return ChainBreak(None, "the chain head record is missing")
    return None
