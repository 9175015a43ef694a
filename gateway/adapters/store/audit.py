"""The audit trail in SQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, union, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.sql_store import (
    audit_checkpoints,
    audit_event_addresses,
    audit_event_stacks,
    audit_events,
    audit_head,
    dumps,
)
from gateway.adapters.store.rows import (
    MAX_ID,
    Records,
    as_event,
    now,
)
from gateway.domain.audit import AuditEvent, Checkpoint, EventQuery, event_addresses, event_hash, event_outcome
from gateway.domain.principals import Actor

if TYPE_CHECKING:
    from gateway.adapters.store.unit_of_work import SqlUnitOfWork


def _event_filters(q: EventQuery, after: int = 0) -> list[Any]:
    """Conditions on audit_events; the stack and address tables are searched from `after` on, and an address's
    proposals' events come as one set of seqs (a UNION), so each side uses its own index."""
    out: list[Any] = []
    if q.proposal_id is not None:
        out.append(audit_events.c.proposal_id == q.proposal_id)
    if q.actor:
        out.append(audit_events.c.actor == q.actor)
    if q.since:
        out.append(audit_events.c.at >= q.since)
    if q.until:
        out.append(audit_events.c.at <= q.until)
    if q.kind:
        out.append(audit_events.c.kind == q.kind)
    if q.action:
        out.append((audit_events.c.kind == q.action) | audit_events.c.kind.startswith(q.action + ".", autoescape=True))
    if q.outcome:
        out.append(audit_events.c.outcome == q.outcome)
    if q.stack:
        out.append(
            audit_events.c.seq.in_(
                select(audit_event_stacks.c.seq).where(
                    audit_event_stacks.c.stack == q.stack, audit_event_stacks.c.seq > after
                )
            )
        )
    if q.address:
        column = audit_event_addresses.c.address
        prefix = q.address[:-1].replace("/", "//").replace("%", "/%").replace("_", "/_")
        match = column.like(prefix + "%", escape="/") if q.address.endswith("*") else column == q.address
        naming = select(audit_event_addresses.c.seq).where(match)
        proposals = select(audit_events.c.proposal_id).where(
            audit_events.c.seq.in_(naming), audit_events.c.proposal_id.is_not(None)
        )
        their_events = select(audit_events.c.seq).where(
            audit_events.c.seq > after, audit_events.c.proposal_id.in_(proposals)
        )
        out.append(audit_events.c.seq.in_(union(naming.where(audit_event_addresses.c.seq > after), their_events)))
    return out


class SqlAuditLog(Records):
    """The hash-chained audit trail: appends, queries, the chain's head and its signed checkpoints."""

    def __init__(self, uow: SqlUnitOfWork):
        super().__init__(uow)
        self._head: tuple[int, str] | None = None  # the chain's head, row-locked by this transaction's first event
        self._head_moved = False

    def newest_seq(self, proposal_id: int) -> int:
        return int(
            self.conn.scalar(select(func.max(audit_events.c.seq)).where(audit_events.c.proposal_id == proposal_id)) or 0
        )

    def append(
        self,
        actor: Actor,
        kind: str,
        payload: Mapping[str, Any],
        proposal_id: int | None = None,
        stacks: Sequence[str] = (),
    ) -> AuditEvent:
        """Add one event to the chain."""
        return self.append_many([(actor, kind, payload, proposal_id, stacks)])[0]

    def append_many(
        self, entries: Sequence[tuple[Actor, str, Mapping[str, Any], int | None, Sequence[str]]]
    ) -> list[AuditEvent]:
        """Add events to the chain in order, written together. The head row lock (taken by the transaction's first
        event, held to its commit) keeps concurrent writers in line; the head row is written at the commit."""
        if self._head is None:
            head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1).with_for_update()).mappings().one()
            self._head = (head["seq"], head["hash"])
        events, rows, stack_rows, address_rows = [], [], [], []
        for actor, kind, payload, proposal_id, stacks in entries:
            prev_seq, prev_hash = self._head
            name, actor_kind = actor.name, actor.kind.value
            event = AuditEvent(
                seq=prev_seq + 1,
                id=str(uuid.uuid4()),
                at=now().isoformat(timespec="microseconds"),
                actor=name,
                actor_kind=actor_kind,
                kind=kind,
                proposal_id=proposal_id,
                stacks=tuple(stacks),
                payload=self.scrubber.scrub_data(json.loads(dumps(payload))),
                prev_hash=prev_hash,
                hash="",
            )
            event = AuditEvent(**{**event.__dict__, "hash": event_hash(prev_hash, event.content())})
            rows.append(
                {
                    "seq": event.seq,
                    "id": event.id,
                    "at": event.at,
                    "actor": event.actor,
                    "actor_kind": event.actor_kind,
                    "kind": event.kind,
                    "proposal_id": event.proposal_id,
                    "stacks": list(event.stacks),
                    "payload": dumps(event.payload),
                    "prev_hash": event.prev_hash,
                    "hash": event.hash,
                    "outcome": event_outcome(kind),
                }
            )
            stack_rows += [{"seq": event.seq, "stack": s} for s in set(event.stacks)]
            address_rows += [{"seq": event.seq, "address": a} for a in event_addresses(event.payload)]
            self._head, self._head_moved = (event.seq, event.hash), True
            events.append(event)
        self.conn.execute(insert(audit_events), rows)
        if stack_rows:
            self.conn.execute(insert(audit_event_stacks), stack_rows)
        if address_rows:
            self.conn.execute(insert(audit_event_addresses), address_rows)
        return events

    def write_chain_head(self) -> None:
        if self._head_moved and self._head is not None:
            self.conn.execute(
                update(audit_head).where(audit_head.c.id == 1).values(seq=self._head[0], hash=self._head[1])
            )
            self._head_moved = False

    def events(
        self,
        proposal_id: int | None = None,
        actor: str | None = None,
        stack: str | None = None,
        since: str | None = None,
        kind: str | None = None,
    ) -> list[AuditEvent]:
        return self.query(EventQuery(proposal_id=proposal_id, actor=actor, stack=stack, since=since, kind=kind))

    def query(self, q: EventQuery, after: int = 0, limit: int | None = None) -> list[AuditEvent]:
        """Events matching every filter, oldest first, from `after` (keyset pagination), in SQL on indexed columns."""
        if q.proposal_id is not None and not 0 < q.proposal_id <= MAX_ID:
            return []
        query = (
            select(audit_events)
            .where(audit_events.c.seq > after, *_event_filters(q, after))
            .order_by(audit_events.c.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        return [as_event(r) for r in self.conn.execute(query).mappings()]

    def count(self, q: EventQuery) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(audit_events).where(*_event_filters(q))) or 0)

    def iter(self, batch: int = 5000, upto: int | None = None, after: int = 0) -> Iterator[AuditEvent]:
        """Every event (after `after`) in order, read a batch at a time (constant memory however long the trail)."""
        while True:
            query = select(audit_events).where(audit_events.c.seq > after)
            if upto is not None:
                query = query.where(audit_events.c.seq <= upto)
            rows = self.conn.execute(query.order_by(audit_events.c.seq).limit(batch)).mappings().all()
            if not rows:
                return
            for row in rows:
                yield as_event(row)
            after = rows[-1]["seq"]

    def add_checkpoint(self, checkpoint: Checkpoint) -> bool:
        """Keep a signed checkpoint, once per event: a second one of the same head (another worker signing it at the
        same moment) changes nothing. Whether this one was kept."""
        if (
            self.conn.scalar(select(audit_checkpoints.c.seq).where(audit_checkpoints.c.seq == checkpoint.seq))
            is not None
        ):
            return False
        try:
            with self.conn.begin_nested():  # a racing signer's insert of the same seq wins; this one is not needed
                self.conn.execute(insert(audit_checkpoints).values(**checkpoint.to_json()))
        except IntegrityError:
            return False
        return True

    def checkpoints(self) -> list[Checkpoint]:
        rows = self.conn.execute(select(audit_checkpoints).order_by(audit_checkpoints.c.seq)).mappings()
        return [Checkpoint.from_json(r) for r in rows]

    def chain_head(self) -> tuple[int, str] | None:
        if self._head is not None:
            return self._head
        head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1)).mappings().first()
        return (head["seq"], head["hash"]) if head else None
