"""The audit trail in SQL.

Each event is stored as its canonical bytes (what its hash covers); the columns beside them, and the stack, address and
proposal-address tables, are the index the filters search (verify checks the columns, the repository aside,
against the bytes). A page of a filtered
query is read the way EXPLAIN says is cheap. One filter kept in event order (a stack, a person, an outcome, a proposal,
a kind, a repository) is one statement, its index read in order up to the LIMIT. Otherwise each filter's events are
estimated (the planner's row estimate on PostgreSQL, a bounded count on SQLite) and the sparsest drives: an unordered
one (an address, a time range) with few events gives its events whole, checked a chunk at a time by primary key; else
the sparsest ordered index (an action is its kinds' indexes merged; a repository with a kind, an action or an outcome
is one filter, its kinds' arms of the (repository, kind) index merged) is read in growing windows of seq, each window one
statement that checks every other filter event by event, in order, up to the LIMIT. Nothing sorts every matching event
before the LIMIT, and nothing reads the trail whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import (
    ARRAY,
    BigInteger,
    and_,
    any_,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement, Select

from gateway.adapters.collector import collector_paused
from gateway.adapters.store.rows import MAX_ID, Records, as_event, now
from gateway.adapters.store.schema import (
    audit_checkpoints,
    audit_event_addresses,
    audit_event_stacks,
    audit_events,
    audit_head,
    audit_proposal_addresses,
    audit_tree_blocks,
    dumps,
)
from gateway.domain.audit import (
    AuditEvent,
    ChainLink,
    Checkpoint,
    EventQuery,
    event_addresses,
    event_bytes,
    event_outcome,
    event_repository,
    scan_payload,
)
from gateway.domain.principals import Actor

if TYPE_CHECKING:
    from sqlalchemy import Column

    from gateway.adapters.store.unit_of_work import SqlUnitOfWork

MEDIUM = 20_000  # an unordered filter (an address, a time range) with at most this many events drives: read whole
WINDOW = 50_000  # at most this many of the driving index's events are checked in one statement
CHUNK = 1000  # candidates checked against every filter by primary key, this many a statement
LINKS_CHUNK = 1000  # rows of the trail verify is sent at a time
NEW_PROPOSALS_PROBED = 200  # a batch naming this many (proposal, address) pairs first asks which proposals are new

EVENT_COLUMNS = ("seq", "canonical", "id", "at", "actor", "actor_kind", "kind", "proposal_id", "prev_hash", "hash",
                 "outcome", "repository")
# the planner settings a filtered query runs under on PostgreSQL (see SqlAuditLog._probing)
_IN_ORDER = {"enable_seqscan": "off", "enable_bitmapscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off",
             "max_parallel_workers_per_gather": "0"}
_READ = (audit_events.c.seq, audit_events.c.canonical, audit_events.c.prev_hash, audit_events.c.hash)
# the events of one kind, oldest first, as `query` reads them (the kind index, in order): built once
_OF_KIND = select(*_READ).where(audit_events.c.kind == bindparam("kind")).order_by(audit_events.c.seq)
# An event's row in audit_events (EVENT_COLUMNS), its stacks and the addresses its payload names
_Encoded = tuple[tuple[Any, ...], list[str], set[str]]


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
    ordered: Callable[[int, int | None], Select[Any]] | None = None  # its seqs in (after, upto], in order, from an index
    alone: Callable[[int], Select[Any]] | None = None  # its events themselves after `after`, in that order
    # its events in (after, upto] that meet these conditions too, in order, from its index: one window of a query
    page: Callable[[int, int | None, list[ColumnElement[bool]], int | None], Select[Any]] | None = None
    rough: int = 1  # how far the planner's estimate of its events may be too high (a prefix's can be 100 times)


def _within(seq: Any, after: int, upto: int | None) -> list[ColumnElement[bool]]:
    """after < seq <= upto (no upper bound when `upto` is None)."""
    return [seq > after] if upto is None else [seq > after, seq <= upto]


def _event_ids(count: int) -> list[str]:
    """`count` random (version 4) UUIDs, as `uuid.uuid4()` makes them, from one read of the system's randomness."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # the version
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # the variant
    h = raw.hex()
    return [f"{h[k:k + 8]}-{h[k + 8:k + 12]}-{h[k + 12:k + 16]}-{h[k + 16:k + 20]}-{h[k + 20:k + 32]}"
            for k in range(0, 32 * count, 32)]


def _read_fast(row: Mapping[str, Any]) -> AuditEvent:
    """`as_event`, read by orjson (an integer past 64 bits becomes a float: see `of_proposals`)."""
    c = orjson.loads(row["canonical"])
    return AuditEvent(c["seq"], c["id"], c["at"], c["actor"], c["actor_kind"], c["kind"], c["proposal_id"],
                      tuple(c["stacks"]), c["payload"], row["prev_hash"], row["hash"])


class SqlAuditLog(Records):
    """The hash-chained audit trail: appends, queries, the chain's head and its signed checkpoints."""

    def __init__(self, uow: SqlUnitOfWork):
        super().__init__(uow)
        self._head: tuple[int, str] | None = None  # the chain's head, row-locked by this transaction's first event
        self._head_moved = False
        self.appended = 0  # events this transaction added (counted once it commits)
        self.medium, self.window, self.chunk = MEDIUM, WINDOW, CHUNK  # where the query's plan changes (tests lower them)

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
        with collector_paused(), self.conn.begin_nested():  # a statement that fails takes the batch's other rows
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
            # the repository is an index beside the bytes, not in them: not covered by the chain (schema.py's
            # `_audit_by_repository` says why)
            yield ((seq, canonical.decode(), event_id, at, name, actor_kind, kind, proposal_id, prev_hash, event_hash,
                    event_outcome(kind), event_repository(kind, clean, stacks, self.repository)), stacks, addresses)
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
        if kind and proposal_id is None and not (actor or stack or since):  # what a view asks (who pushed): prebuilt
            return [as_event(r) for r in self.conn.execute(_OF_KIND, {"kind": kind}).mappings()]
        return self.query(EventQuery(proposal_id=proposal_id, actor=actor, stack=stack, since=since, kind=kind))

    def query(self, q: EventQuery, after: int = 0, limit: int | None = None) -> list[AuditEvent]:
        """Events matching every filter, oldest first, from `after` (keyset pagination)."""
        if q.proposal_id is not None and not 0 < q.proposal_id <= MAX_ID:
            return []
        filters = self._filters(q)
        if filters is None:  # no kind is both the action and the outcome asked for
            return []
        if not filters or (len(filters) == 1 and filters[0].alone is not None):  # one index read in order: a page
            e = audit_events.c
            alone = filters[0].alone if filters else (
                lambda after: select(*_READ).where(e.seq > after).order_by(e.seq))
            assert alone is not None
            return [as_event(r) for r in self.conn.execute(alone(after).limit(limit)).mappings()]
        sizes = [self._estimate(f) for f in filters]
        ordered = [(size, i) for i, (size, f) in enumerate(zip(sizes, filters, strict=True)) if f.ordered is not None]
        few = [(size // f.rough, i) for i, (size, f) in enumerate(zip(sizes, filters, strict=True))
               if f.ordered is None and size <= self.medium * f.rough]
        if few and (not ordered or min(few)[0] <= min(ordered)[0]):
            found = self._from_members(filters, filters[min(few)[1]], after, limit)
            if found is not None:
                return found
        trail = max(int(self.conn.scalar(select(func.max(audit_events.c.seq))) or 0), 1)
        driver, density = (filters[min(ordered)[1]], min(1.0, max(min(ordered)[0], 1) / trail)) if ordered else (
            None, 1.0)
        share = 1.0  # of the driver's events, how many match every filter (were the filters independent)
        for size in sizes:
            share *= min(1.0, size / trail)
        share /= density
        rows = self.window if limit is None else min(self.window, max(limit, limit / max(share, 1e-9) * 1.25))
        return self._from_windows(filters, driver, after, trail, max(1, int(rows / density)), int(self.window / density),
                                  limit)

    def _from_members(self, filters: list[_Filter], few: _Filter, after: int,
                      limit: int | None) -> list[AuditEvent] | None:
        """A filter with few events drives: its events after `after` (at most `medium`, else None: the estimate was
        wrong), in event order, a chunk at a time checked against every filter by primary key."""
        with self._probing():
            seqs = set(self.conn.scalars(few.members(after).limit(self.medium + 1)))
            if len(seqs) > self.medium:
                return None
            return self._checked(filters, sorted(seqs), limit)

    def _checked(self, filters: list[_Filter], seqs: list[int], limit: int | None) -> list[AuditEvent]:
        """The events of these seqs (ascending) that every filter matches, the first `limit`, checked a chunk at a
        time by primary key."""
        found: list[AuditEvent] = []
        for chunk in self._chunks(seqs):
            need = None if limit is None else limit - len(found)
            # on PostgreSQL one array parameter (a thousand bound values cost more to compile than to look up)
            among = (audit_events.c.seq == any_(bindparam("seqs", chunk, ARRAY(BigInteger))) if self._postgres
                     else audit_events.c.seq.in_(chunk))
            page = (select(*_READ).where(among, *(f.condition for f in filters))
                    .order_by(audit_events.c.seq).limit(need))
            found += [as_event(r) for r in self.conn.execute(page).mappings()]
            if limit is not None and len(found) >= limit:
                break
        return found

    def _from_windows(self, filters: list[_Filter], driver: _Filter | None, after: int, trail: int, span: int,
                      widest: int, limit: int | None) -> list[AuditEvent]:
        """Growing windows of seq, each (after, after + span] holding about as many of the driver's events (the
        sparsest ordered filter's, or the trail's) as a page needs, each next one four times wider, up to `widest`
        (`window` of the driver's events); the last one open-ended. On PostgreSQL a window is one statement: every
        filter's condition and the range, in seq order, up to the LIMIT, the driver's index read in that order. On
        SQLite (in-process, a statement costs little) the driver's seqs in the window, then checked a chunk at a
        time."""
        e = audit_events.c
        conditions = [f.condition for f in filters if f is not driver]  # the driver's page meets its own
        found: list[AuditEvent] = []
        with self._probing():
            while True:
                need = None if limit is None else limit - len(found)
                upto = after + span if after + span < trail else None
                if self._postgres:
                    page = driver.page(after, upto, conditions, need) if driver is not None and driver.page else (
                        select(*_READ).where(*_within(e.seq, after, upto), *conditions).order_by(e.seq))
                    found += [as_event(r) for r in self.conn.execute(page.limit(need)).mappings()]
                else:
                    seqs = (driver.ordered(after, upto) if driver is not None and driver.ordered else
                            select(e.seq).where(*_within(e.seq, after, upto)).order_by(e.seq))
                    found += self._checked(filters, list(self.conn.scalars(seqs)), need)
                if (limit is not None and len(found) >= limit) or upto is None:
                    return found
                after, span = upto, min(widest, span * 4)

    @contextmanager
    def _probing(self) -> Iterator[None]:
        """On PostgreSQL, for the query's statements only: the driving index read in order as the statement asks,
        each event checked as it comes (nested loops: another filter's index probed once per event), not gathered
        whole into a bitmap, a hash or a sort first (nor by parallel workers), and no table read whole. A window that fills its LIMIT early
        stops there, and a planner's estimate that is far off (a prefix's often is) cannot turn a few index probes
        into a scan of the trail. PostgreSQL takes no hints; these settings, for this transaction and put back
        after, are the nearest thing."""
        if not self._postgres:
            yield
            return
        names = ", ".join(f"current_setting('{name}')" for name in _IN_ORDER)
        before = self.conn.execute(text(f"SELECT {names}, " + ", ".join(
            f"set_config('{name}', '{value}', true)" for name, value in _IN_ORDER.items()))).one()
        try:
            yield
        finally:
            self.conn.execute(text("SELECT " + ", ".join(f"set_config('{name}', :v{i}, true)"
                                                         for i, name in enumerate(_IN_ORDER))),
                              {f"v{i}": value for i, value in enumerate(before[:len(_IN_ORDER)])})

    def _estimate(self, f: _Filter) -> int:
        """How many events a filter matches: the planner's estimate on PostgreSQL (no rows read), a count up to
        `medium` on SQLite."""
        if not self._postgres:
            return self._count(f.members(0), self.medium + 1)
        compiled = f.members(0).compile(self.conn, compile_kwargs={"render_postcompile": True})
        plan = self.conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), compiled.params).scalar()
        return int((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Plan Rows"])

    def _count(self, members: Select[Any], cap: int) -> int:
        """How many events a filter matches, counted up to `cap` (an index range that stops there)."""
        return int(self.conn.scalar(select(func.count()).select_from(members.limit(cap).subquery())) or 0)

    def _chunks(self, seqs: list[int]) -> Iterator[list[int]]:
        for start in range(0, len(seqs), self.chunk):
            yield seqs[start:start + self.chunk]

    def _filters(self, q: EventQuery) -> list[_Filter] | None:
        """Each filter of the query, with the index its events come from (None: no event can match)."""
        e = audit_events.c
        out = [self._column(e.proposal_id, q.proposal_id), self._column(e.actor, q.actor)]
        if q.stack:
            out.append(self._stack(q.stack))
        # a repository with a kind, an action or an outcome is one filter: each kind's events of the repository in
        # order, from the (repository, kind) index, so a rare combination reads only its own events (as two filters,
        # every event of the sparser was read to be checked: p95 ~350 ms at a million events on PostgreSQL)
        by_kind = q.repository if q.kind or q.outcome else None
        if q.action or by_kind:  # with the kind and the outcome, a few kinds, each read from an index in order
            kinds = [q.kind] if q.kind and not q.action else [
                k for k in self._kinds() if (not q.action or k == q.action or k.startswith(q.action + "."))
                and (not q.kind or k == q.kind) and (not q.outcome or event_outcome(k) == q.outcome)]
            if not kinds:
                return None
            # the outcome is the kinds' own (`event_outcome`; verify holds each row's to its kind): not asked again,
            # so no planner reads the outcome's index instead of the (repository, kind) one
            out.append(self._kinds_filter(kinds, [c == v for c, v in ((e.kind, q.kind), (e.repository, q.repository))
                                                  if v]))
        else:
            out += [self._column(e.kind, q.kind), self._column(e.outcome, q.outcome)]
        if q.since or q.until:
            window = and_(e.at >= q.since if q.since else literal(True), e.at <= q.until if q.until else literal(True))
            out.append(_Filter(window, lambda after: select(e.seq).where(window, e.seq > after)))
        if q.address:
            out.append(self._address(q.address))
        if not (q.action or by_kind):  # else the kinds' filter holds the repository
            out.append(self._column(e.repository, q.repository))
        return [f for f in out if f is not None]

    def _stack(self, stack: str) -> _Filter:
        """Events of a stack: from the stack index, in order, each looked up by primary key."""
        s, e = audit_event_stacks.c, audit_events.c
        return _Filter(exists().where(s.seq == e.seq, s.stack == stack),
                       lambda after: select(s.seq).where(s.stack == stack, s.seq > after),
                       lambda after, upto: select(s.seq).where(s.stack == stack, *_within(s.seq, after, upto))
                       .order_by(s.seq),
                       lambda after: select(*_READ).join(audit_event_stacks, s.seq == e.seq)
                       .where(s.stack == stack, s.seq > after).order_by(s.seq),
                       lambda after, upto, conditions, _: select(*_READ).join(audit_event_stacks, s.seq == e.seq)
                       .where(s.stack == stack, *_within(s.seq, after, upto), *conditions).order_by(s.seq))

    def _column(self, column: Column[Any], value: Any) -> _Filter | None:
        """An equality on a column indexed with seq: its events come in order from the index."""
        if value is None or value == "":
            return None
        e = audit_events.c
        return _Filter(column == value, lambda after: select(e.seq).where(column == value, e.seq > after),
                       lambda after, upto: select(e.seq).where(column == value, *_within(e.seq, after, upto))
                       .order_by(e.seq),
                       lambda after: select(*_READ).where(column == value, e.seq > after).order_by(e.seq),
                       lambda after, upto, conditions, _: select(*_READ)
                       .where(column == value, *_within(e.seq, after, upto), *conditions).order_by(e.seq))

    def _kinds_filter(self, kinds: list[str], also: list[ColumnElement[bool]]) -> _Filter:
        """Events of any of these kinds: each kind's events in order from the kind index, merged."""
        e = audit_events.c
        condition = and_(e.kind.in_(kinds), *also)

        def merged(columns: Sequence[Any], after: int, upto: int | None, conditions: Sequence[ColumnElement[bool]],
                   limit: int | None) -> Select[Any]:
            # the kind named in each arm, not the list (an IN on the index's first column gives no order in PG 15)
            arms = [select(*columns).where(e.kind == k, *also, *_within(e.seq, after, upto), *conditions)
                    for k in kinds]
            if len(arms) == 1:
                return arms[0].order_by(e.seq)
            if self._postgres:  # each arm in order up to the LIMIT, so that they are merged (SQLite merges plain arms)
                arms = [select(arm) for arm in (a.order_by(e.seq).limit(limit).subquery() for a in arms)]
            union = union_all(*arms).subquery()
            return select(*union.c).order_by(union.c.seq)

        return _Filter(condition, lambda after: select(e.seq).where(condition, e.seq > after),
                       lambda after, upto: merged((e.seq,), after, upto, (), None), None,
                       lambda after, upto, conditions, limit: merged(_READ, after, upto, conditions, limit))

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

        return _Filter(condition, members, rough=20)

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
        filters = self._filters(q)
        if filters is None:
            return 0
        return int(self.conn.scalar(select(func.count()).select_from(audit_events)
                                    .where(*(f.condition for f in filters))) or 0)

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
            with collector_paused(), raw.cursor(binary=True) as cursor:  # each row dies as verify moves on
                yield from cursor.stream(f"SELECT {columns.format(canonical='textsend(canonical)')} FROM audit_events "
                                         f"WHERE {where} ORDER BY seq", params, size=LINKS_CHUNK)
            return
        cursor = raw.cursor()
        try:
            cursor.execute(f"SELECT {columns.format(canonical='CAST(canonical AS BLOB)')} FROM audit_events "
                           f"WHERE {where.replace('%(after)s', ':after').replace('%(upto)s', ':upto')} ORDER BY seq",
                           params)
            with collector_paused():
                while rows := cursor.fetchmany(20_000):
                    yield from rows
        finally:
            cursor.close()

    def of_proposals(self, proposal_ids: Sequence[int], exact: bool = True) -> list[AuditEvent]:
        """Every event of these proposals, oldest first: the proposal index read a chunk of proposals at a time.
        Not `exact`: read by orjson, four times faster, which reads an integer past 64 bits as a float (a reader of
        names, times, hashes and small numbers, such as the change population, loses nothing)."""
        e, found = audit_events.c, []
        wanted = sorted({p for p in proposal_ids if 0 < p <= MAX_ID})
        read = as_event if exact else _read_fast
        for start in range(0, len(wanted), self.chunk):
            chunk = wanted[start:start + self.chunk]
            among = (e.proposal_id == any_(bindparam("ids", chunk, ARRAY(BigInteger))) if self._postgres
                     else e.proposal_id.in_(chunk))
            found += [read(r) for r in self.conn.execute(select(*_READ).where(among)).mappings()]
        return sorted(found, key=lambda event: event.seq)

    def stored(self, seqs: Sequence[int]) -> list[tuple[int, str, str, str]]:
        """These events exactly as stored, oldest first: seq, canonical bytes (as text), prev_hash, hash."""
        e, rows = audit_events.c, []
        wanted = sorted(set(seqs))
        for chunk in self._chunks(wanted):
            rows += self.conn.execute(select(e.seq, e.canonical, e.prev_hash, e.hash).where(e.seq.in_(chunk))).all()
        return sorted((int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows)

    def hashes(self, after: int, upto: int) -> list[str]:
        """The hashes of events after..upto, in order (the trail tree's leaves)."""
        e = audit_events.c
        return list(self.conn.scalars(select(e.hash).where(e.seq > after, e.seq <= upto).order_by(e.seq)))

    def tree_blocks(self, upto: int) -> list[str]:
        """The stored roots of the trail tree's blocks 0..upto-1, in order, as far as they run without a gap."""
        b = audit_tree_blocks.c
        roots = []
        for block, root in self.conn.execute(select(b.block, b.root).where(b.block < upto).order_by(b.block)):
            if block != len(roots):
                break
            roots.append(root)
        return roots

    def add_tree_blocks(self, first: int, roots: Sequence[str]) -> None:
        """Keep blocks first.. (a root depends only on its events: another signer's copy of a block is the same)."""
        b = audit_tree_blocks.c
        have = set(self.conn.scalars(select(b.block).where(b.block >= first, b.block < first + len(roots))))
        rows = [{"block": first + i, "root": root} for i, root in enumerate(roots) if first + i not in have]
        if rows:
            try:
                with self.conn.begin_nested():
                    self.conn.execute(audit_tree_blocks.insert(), rows)
            except IntegrityError:  # a racing signer wrote them first: the same roots
                pass

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

    def oldest_unsigned_at(self) -> str | None:
        """When the oldest event no signed checkpoint covers was appended (None: every event is signed); two lookups
        on primary keys."""
        signed = self.conn.scalar(select(func.max(audit_checkpoints.c.seq))) or 0
        return self.conn.scalar(select(audit_events.c.at).where(audit_events.c.seq > signed)
                                .order_by(audit_events.c.seq).limit(1))

    def chain_head(self) -> tuple[int, str] | None:
        if self._head is not None:
            return self._head
        head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1)).mappings().first()
        return (head["seq"], head["hash"]) if head else None

