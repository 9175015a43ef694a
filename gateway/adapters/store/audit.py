"""The audit trail in SQL.

Each event is stored as its canonical bytes (what its hash covers); the columns beside them, and the stack, address
and proposal-address tables, are the index the filters search (and verify checks against the bytes). A page of
a filtered query is read the way EXPLAIN says is cheap: one filter kept in event order (a stack, a person, an outcome,
a proposal, a kind) is one statement, its index read in order up to the LIMIT; otherwise candidate seqs come in event
order from the filters' indexes (all of the smallest filter's events when it has few, or of the unordered filters
that have at most `medium`; otherwise growing windows of the ordered indexes, intersected), and each chunk of
candidates is checked against every filter by primary key. Nothing sorts every matching event before the LIMIT, and
nothing reads the trail whole.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import and_, exists, func, literal, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement, Select

from gateway.adapters.sql_store import (
    audit_checkpoints,
    audit_event_addresses,
    audit_event_stacks,
    audit_events,
    audit_head,
    audit_proposal_addresses,
    dumps,
)
from gateway.adapters.store.rows import MAX_ID, Records, as_event, now
from gateway.domain.audit import (
    AuditEvent,
    ChainLink,
    Checkpoint,
    EventQuery,
    event_addresses,
    event_bytes,
    event_outcome,
    scan_payload,
)
from gateway.domain.principals import Actor

if TYPE_CHECKING:
    from sqlalchemy import Column

    from gateway.adapters.store.unit_of_work import SqlUnitOfWork

SMALL = 2000  # a filter with fewer events than this drives the query: its events are read whole, then checked
MEDIUM = 20_000  # otherwise the filters' indexes are read this far and intersected
CHUNK = 1000  # candidates checked against every filter by primary key, this many a statement
LINKS_CHUNK = 1000  # rows of the trail verify is sent at a time
NEW_PROPOSALS_PROBED = 200  # a batch naming this many (proposal, address) pairs first asks which proposals are new

EVENT_COLUMNS = ("seq", "canonical", "id", "at", "actor", "actor_kind", "kind", "proposal_id", "prev_hash", "hash",
                 "outcome")
_READ = (audit_events.c.seq, audit_events.c.canonical, audit_events.c.prev_hash, audit_events.c.hash)
# An event's row in audit_events (EVENT_COLUMNS), its stacks and the addresses its payload names
_Encoded = tuple[tuple[Any, ...], list[str], set[str]]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cycle collector while a batch is encoded and written, or the trail streamed to verify (as
    `hcl.collector_paused` does for parsing). A batch's events, payloads and rows all live until it is written, and
    the collector would walk them (and every other object of the process, once they outlive two young collections)
    again and again: a third of an append's CPU, a tenth of verify's. Nothing here makes a reference cycle, so memory
    is still freed as it goes."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def canonical_bytes(content: Mapping[str, Any], floats: bool = True) -> bytes:
    """`event_bytes(content)`, ten times faster where it can be: orjson writes the same bytes as `json` for every JSON
    value but a float (it spells some exponents its own way: 1e-07 as 1e-7), so an event known to hold none
    (`floats=False`, from `scan_payload`) is written by it. Anything orjson will not write as `json` would (a
    subclass, a date, an integer past 64 bits, deep nesting) goes to `json`, which writes it, or refuses it, as ever."""
    if not floats:
        try:
            return orjson.dumps(content, option=_ORJSON_CANONICAL)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return event_bytes(content)


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


@dataclass(frozen=True)
class _Filter:
    """One filter: the condition an event must meet, and the index its events can be read from."""

    condition: ColumnElement[bool]
    members: Callable[[int], Select[Any]]  # the seqs after `after` it matches, in any order
    ordered: Callable[[int], Select[Any]] | None = None  # the same in seq order, from an index kept in that order
    alone: Callable[[int], Select[Any]] | None = None  # its events themselves after `after`, in that order


def _event_ids(count: int) -> list[str]:
    """`count` random (version 4) UUIDs, as `uuid.uuid4()` makes them, from one read of the system's randomness."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # the version
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # the variant
    h = raw.hex()
    return [f"{h[k:k + 8]}-{h[k + 8:k + 12]}-{h[k + 12:k + 16]}-{h[k + 16:k + 20]}-{h[k + 20:k + 32]}"
            for k in range(0, 32 * count, 32)]


class SqlAuditLog(Records):
    """The hash-chained audit trail: appends, queries, the chain's head and its signed checkpoints."""

    def __init__(self, uow: SqlUnitOfWork):
        super().__init__(uow)
        self._head: tuple[int, str] | None = None  # the chain's head, row-locked by this transaction's first event
        self._head_moved = False
        self.appended = 0  # events this transaction added (counted once it commits)
        self.small, self.medium, self.chunk = SMALL, MEDIUM, CHUNK  # where the query's plan changes (tests lower them)

    @property
    def _postgres(self) -> bool:
        return self.conn.dialect.name == "postgresql"

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
        event, held to its commit) keeps concurrent writers in line; the head row is written at the commit. Each
        event is encoded once: its canonical bytes are hashed and stored as they are. A batch is written whole or
        not at all: one that fails (in encoding or in writing) leaves the chain (and the transaction) as they were."""
        if self._head is None:
            head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1).with_for_update()).mappings().one()
            self._head = (head["seq"], head["hash"])
        if not entries:
            return []
        events: list[AuditEvent] = []
        with _collector_paused(), self.conn.begin_nested():  # a statement that fails takes the batch's other rows
            self._write(self._encode(entries, events))
        self._head, self._head_moved = (events[-1].seq, events[-1].hash), True
        self.appended += len(events)
        return events

    def _encode(self, entries: Sequence[tuple[Actor, str, Mapping[str, Any], int | None, Sequence[str]]],
                events: list[AuditEvent]) -> Iterator[_Encoded]:
        """Each event's rows, chained after the head, as it is encoded (so PostgreSQL stores one while the next is
        encoded); `events` gets each event once its rows are out."""
        assert self._head is not None
        seq, prev_hash = self._head
        scrubber, sha256 = self.scrubber, hashlib.sha256
        for (actor, kind, payload, proposal_id, stacks), event_id in zip(entries, _event_ids(len(entries)), strict=True):
            seq += 1
            name, actor_kind, stacks = actor.name, actor.kind.value, list(stacks)
            encoded = dumps(payload)
            clean, addresses, floats = decode_payload(encoded)  # JSON's own types: what the stored bytes decode to
            if scrubber.finds_in_json(encoded):  # most payloads hold no secret: walked only when one is there
                clean = scrubber.scrub_data(clean)
                addresses = event_addresses(clean)
            at = now().isoformat(timespec="microseconds")
            canonical = canonical_bytes({"seq": seq, "id": event_id, "at": at, "actor": name, "actor_kind": actor_kind,
                                     "kind": kind, "proposal_id": proposal_id, "stacks": stacks, "payload": clean},
                                    floats)
            event_hash = "sha256:" + sha256(prev_hash.encode() + canonical).hexdigest()
            yield ((seq, canonical.decode(), event_id, at, name, actor_kind, kind, proposal_id, prev_hash, event_hash,
                    event_outcome(kind)), stacks, addresses)
            events.append(AuditEvent(seq, event_id, at, name, actor_kind, kind, proposal_id, tuple(stacks), clean,
                                     prev_hash, event_hash))
            prev_hash = event_hash

    def _write(self, encoded: Iterator[_Encoded]) -> None:
        """Every row of a batch in a few statements: COPY on PostgreSQL (the events streamed as they are encoded),
        one executemany per table on SQLite."""
        rows, stack_rows, address_rows, named = [], [], [], set()

        def index(row: tuple[Any, ...], stacks: list[str], addresses: set[str]) -> None:
            stack_rows.extend([(row[0], s) for s in set(stacks)])
            address_rows.extend([(row[0], a) for a in addresses])
            if row[7] is not None:
                named.update([(row[7], a) for a in addresses])

        if not self._postgres:
            for row, stacks, addresses in encoded:
                rows.append(row)
                index(row, stacks, addresses)
            for table, columns, values in (("audit_events", EVENT_COLUMNS, rows),
                                           ("audit_event_stacks", ("seq", "stack"), stack_rows),
                                           ("audit_event_addresses", ("seq", "address"), address_rows)):
                if values:
                    self.conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(columns)}) "
                                              f"VALUES ({', '.join('?' for _ in columns)})", values)
            if named:
                self.conn.exec_driver_sql("INSERT OR IGNORE INTO audit_proposal_addresses (proposal_id, address) "
                                          "VALUES (?, ?)", sorted(named))
            return
        with self.conn.connection.driver_connection.cursor() as cursor:
            with cursor.copy(f"COPY audit_events ({', '.join(EVENT_COLUMNS)}) FROM STDIN") as copy:
                for row, stacks, addresses in encoded:
                    copy.write_row(row)
                    index(row, stacks, addresses)
            for table, columns, values in (("audit_event_stacks", ("seq", "stack"), stack_rows),
                                           ("audit_event_addresses", ("seq", "address"), address_rows)):
                if values:
                    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                        for value in values:
                            copy.write_row(value)
            if named:
                self._name_addresses(cursor, sorted(named))

    def _name_addresses(self, cursor: Any, named: list[tuple[int, str]]) -> None:
        """Which proposals name which addresses, each pair kept once (a proposal names most addresses again and
        again). A big batch's pairs of proposals with none kept yet are new: copied, with no conflict to look for
        (the head row lock keeps every other appender out until this transaction ends); the rest skip the pairs
        already kept."""
        if len(named) >= NEW_PROPOSALS_PROBED:
            proposals = sorted({p for p, _ in named})
            cursor.execute("SELECT p FROM unnest(%s::integer[]) AS p WHERE NOT EXISTS "
                           "(SELECT FROM audit_proposal_addresses a WHERE a.proposal_id = p)", (proposals,))
            new = {p for p, in cursor.fetchall()}
            if new:
                with cursor.copy("COPY audit_proposal_addresses (proposal_id, address) FROM STDIN") as copy:
                    for pair in named:
                        if pair[0] in new:
                            copy.write_row(pair)
                named = [pair for pair in named if pair[0] not in new]
        if named:
            cursor.execute("INSERT INTO audit_proposal_addresses (proposal_id, address) "
                           "SELECT * FROM unnest(%s::integer[], %s::text[]) ON CONFLICT DO NOTHING",
                           ([p for p, _ in named], [a for _, a in named]))

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
        """Events matching every filter, oldest first, from `after` (keyset pagination)."""
        if q.proposal_id is not None and not 0 < q.proposal_id <= MAX_ID:
            return []
        filters = self._filters(q)
        if not filters or (len(filters) == 1 and filters[0].alone is not None):  # one index read in order: a page
            e = audit_events.c
            alone = filters[0].alone if filters else (
                lambda after: select(*_READ).where(e.seq > after).order_by(e.seq))
            assert alone is not None
            return [as_event(r) for r in self.conn.execute(alone(after).limit(limit)).mappings()]
        found: list[AuditEvent] = []
        for chunk in self._candidates(filters, after, limit):
            need = None if limit is None else limit - len(found)
            page = (select(*_READ).where(audit_events.c.seq.in_(chunk), *(f.condition for f in filters))
                    .order_by(audit_events.c.seq).limit(need))
            found += [as_event(r) for r in self.conn.execute(page).mappings()]
            if limit is not None and len(found) >= limit:
                break
        return found

    def _candidates(self, filters: list[_Filter], after: int, limit: int | None) -> Iterator[list[int]]:
        """Seqs after `after`, ascending, a chunk at a time, among which are all the events every filter matches.

        The smallest filter's events, when it has fewer than `small`. Otherwise windows of the filters' ordered
        indexes (or of the trail itself), intersected: the first as long as a page, each next one four times longer
        up to `medium`; and from the second on, when unordered filters (an address, an action, a time range) have at
        most `medium` events, those events themselves, intersected (every candidate is among them, so a rare
        combination of common filters does not walk the trail a window at a time)."""
        # counted over the whole trail, from the ordered index where there is one: a count from `after` can read every
        # entry before it first (a time range, a prefix), and one in index order stops at the cap without the table
        sizes = sorted((self._count((f.ordered or f.members)(0), self.small), i) for i, f in enumerate(filters))
        if sizes and sizes[0][0] < self.small:
            yield from self._chunks(sorted(set(self.conn.scalars(filters[sizes[0][1]].members(after)))))
            return
        ordered = [f.ordered for f in filters if f.ordered is not None] or [
            lambda after: select(audit_events.c.seq).where(audit_events.c.seq > after).order_by(audit_events.c.seq)]
        unordered = [f for f in filters if f.ordered is None]
        whole: list[set[int]] | None = None
        size, first = min(self.medium, max(64, 2 * (limit or self.medium))), limit is not None
        while True:
            if whole is None and not first:  # the first window was not enough (or all are wanted): are any few?
                whole = [set(self.conn.scalars(f.members(after))) for f in unordered
                         if self._count(f.members(0), self.medium + 1) <= self.medium]
                if whole:  # complete sets: every candidate is in them, checked by primary key; nothing to walk
                    yield from self._chunks(sorted(set.intersection(*whole)))
                    return
            horizon, sets = None, [{s for s in found if s > after} for found in whole or []]
            for read in ordered:
                window = list(self.conn.scalars(read(after).limit(size)))
                if len(window) == size:
                    horizon = window[-1] if horizon is None else min(horizon, window[-1])
                sets.append(set(window))
            yield from self._chunks(sorted(set.intersection(*sets)))
            if horizon is None:
                return
            after, size, first = horizon, min(self.medium, size * 4), False

    def _count(self, members: Select[Any], cap: int) -> int:
        """How many events a filter matches, counted up to `cap` (an index range that stops there)."""
        return int(self.conn.scalar(select(func.count()).select_from(members.limit(cap).subquery())) or 0)

    def _chunks(self, seqs: list[int]) -> Iterator[list[int]]:
        for start in range(0, len(seqs), self.chunk):
            yield seqs[start:start + self.chunk]

    def _filters(self, q: EventQuery) -> list[_Filter]:
        """Each filter of the query, with the index its events come from."""
        e = audit_events.c
        out = [self._column(e.proposal_id, q.proposal_id), self._column(e.actor, q.actor)]
        if q.stack:
            s = audit_event_stacks.c
            out.append(_Filter(exists().where(s.seq == e.seq, s.stack == q.stack),
                               lambda after: select(s.seq).where(s.stack == q.stack, s.seq > after),
                               lambda after: select(s.seq).where(s.stack == q.stack, s.seq > after).order_by(s.seq),
                               lambda after: select(*_READ).join(audit_event_stacks, s.seq == e.seq)
                               .where(s.stack == q.stack, s.seq > after).order_by(s.seq)))
        out += [self._column(e.kind, q.kind), self._column(e.outcome, q.outcome)]
        if q.action:
            matches = e.kind.in_([k for k in self._kinds() if k == q.action or k.startswith(q.action + ".")])
            out.append(_Filter(matches, lambda after: select(e.seq).where(matches, e.seq > after)))
        if q.since or q.until:
            window = and_(e.at >= q.since if q.since else literal(True), e.at <= q.until if q.until else literal(True))
            out.append(_Filter(window, lambda after: select(e.seq).where(window, e.seq > after)))
        if q.address:
            out.append(self._address(q.address))
        return [f for f in out if f is not None]

    def _column(self, column: Column[Any], value: Any) -> _Filter | None:
        """An equality on a column indexed with seq: its events come in order from the index."""
        if value is None or value == "":
            return None
        e = audit_events.c
        return _Filter(column == value, lambda after: select(e.seq).where(column == value, e.seq > after),
                       lambda after: select(e.seq).where(column == value, e.seq > after).order_by(e.seq),
                       lambda after: select(*_READ).where(column == value, e.seq > after).order_by(e.seq))

    def _address(self, address: str) -> _Filter:
        """Events that name the address (exact, or a prefix ending in `*`), and every event of the proposals whose
        events name it. Neither is in event order: the filter drives only when its events fit in memory."""
        a, pa, e = audit_event_addresses.c, audit_proposal_addresses.c, audit_events.c
        condition = or_(exists().where(a.seq == e.seq, self._match(a.address, address)),
                        exists().where(pa.proposal_id == e.proposal_id, self._match(pa.address, address)))

        def members(after: int) -> Select[Any]:
            naming = select(a.seq).where(self._match(a.address, address), a.seq > after)
            proposals = select(pa.proposal_id).where(self._match(pa.address, address))
            their_events = select(e.seq).where(e.proposal_id.in_(proposals), e.seq > after)
            both = naming.union_all(their_events).subquery()
            return select(both.c.seq)

        return _Filter(condition, members)

    def _match(self, column: Column[Any], address: str) -> ColumnElement[bool]:
        """An exact address, or a prefix as a range the index reads (LIKE on PostgreSQL's pattern index; a byte range
        on SQLite, whose LIKE ignores case and so no index)."""
        if not address.endswith("*"):
            return column == address
        prefix = address[:-1]
        if not prefix:
            return column.is_not(None)
        if self._postgres:
            return column.like(prefix.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%", escape="/")
        return and_(column >= prefix, column < prefix[:-1] + chr(ord(prefix[-1]) + 1))

    def _kinds(self) -> list[str]:
        """The distinct kinds in the trail, read from the kind index one step per kind (a loose index scan)."""
        rows = self.conn.execute(text(
            "WITH RECURSIVE k(kind) AS (SELECT min(kind) FROM audit_events UNION ALL "
            "SELECT (SELECT min(kind) FROM audit_events WHERE kind > k.kind) FROM k WHERE k.kind IS NOT NULL) "
            "SELECT kind FROM k WHERE kind IS NOT NULL"))
        return [r[0] for r in rows]

    def count(self, q: EventQuery) -> int:
        """How many events match (for rate limits over a recent window: the conditions alone, in one statement)."""
        return int(self.conn.scalar(select(func.count()).select_from(audit_events)
                                    .where(*(f.condition for f in self._filters(q)))) or 0)

    def iter(self, batch: int = 5000, upto: int | None = None, after: int = 0) -> Iterator[AuditEvent]:
        """Every event (after `after`) in order, read a batch at a time (constant memory however long the trail)."""
        while True:
            query = select(*_READ).where(audit_events.c.seq > after)
            if upto is not None:
                query = query.where(audit_events.c.seq <= upto)
            rows = self.conn.execute(query.order_by(audit_events.c.seq).limit(batch)).mappings().all()
            if not rows:
                return
            for row in rows:
                yield as_event(row)
            after = rows[-1]["seq"]

    # an event's stored bytes read as `json.loads` reads them (or refused), four times faster: what verify checks
    decode = staticmethod(orjson.loads)

    def links(self, after: int = 0, upto: int | None = None) -> Iterator[ChainLink]:
        """Every event after `after` (up to `upto`), in order, as verify reads it: its seq, hashes and stored bytes
        (as bytes, not decoded), and the columns the filters search. Streamed in constant memory: on PostgreSQL in
        binary, in chunks the server sends while verify hashes the last (no round trip per batch), a cursor read in
        batches on SQLite."""
        where = "seq > %(after)s" + ("" if upto is None else " AND seq <= %(upto)s")
        columns = "seq, prev_hash, hash, {canonical}, actor, actor_kind, at, id, kind, proposal_id, outcome"
        params = {"after": after, "upto": upto}
        raw = self.conn.connection.driver_connection
        if self._postgres:
            with _collector_paused(), raw.cursor(binary=True) as cursor:  # each row dies as verify moves on
                yield from cursor.stream(f"SELECT {columns.format(canonical='textsend(canonical)')} FROM audit_events "
                                         f"WHERE {where} ORDER BY seq", params, size=LINKS_CHUNK)
            return
        cursor = raw.cursor()
        try:
            cursor.execute(f"SELECT {columns.format(canonical='CAST(canonical AS BLOB)')} FROM audit_events "
                           f"WHERE {where.replace('%(after)s', ':after').replace('%(upto)s', ':upto')} ORDER BY seq",
                           params)
            with _collector_paused():
                while rows := cursor.fetchmany(20_000):
                    yield from rows
        finally:
            cursor.close()

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
                self.conn.execute(audit_checkpoints.insert().values(**checkpoint.to_json()))
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

