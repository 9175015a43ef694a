"""How the trail is stored and searched: each event as its canonical bytes, verify hashing exactly those, the filter
columns checked against them, old trails migrated, and every filter answered from an index (no full scan or sort of
the events), on SQLite and PostgreSQL."""

from __future__ import annotations

import enum
import hashlib
import json
import random
import re
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from sqlalchemy import event, func, insert, inspect, select, text, update

from gateway.adapters.store.audit import _IN_ORDER, SqlAuditLog
from gateway.adapters.store.schema import MIGRATIONS, Database, audit_event_addresses, audit_events, audit_head
from gateway.adapters.store.unit_of_work import SqlStore
from gateway.domain.audit import GENESIS, AuditEvent, ChainBreak, EventQuery, event_addresses, event_hash, verify_chain
from gateway.domain.plan import canonical_json
from gateway.domain.principals import SystemActor
from gateway.domain.scrubbing import Scrubber


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.dispose()


def verify(db: Database) -> ChainBreak | None:
    """What `gateway audit verify` decides: the chain over the stored bytes, and the filter columns against them."""
    with SqlStore(db).session(readonly=True) as session:
        return verify_chain(session.audit.links(), session.audit.chain_head())


def some_events(db: Database, count: int = 6) -> None:
    with SqlStore(db).session() as session:
        session.audit.append_many([(SystemActor("erin" if i % 2 else "alice"), ["plan", "approval", "apply.failed"][i % 3],
                                    {"applied": [f"aws_instance.web{i}"], "note": "é ünïcode"}, 1 + i // 3, ["app"])
                                   for i in range(count)])


def test_verify_hashes_the_bytes_stored_not_a_re_encoding_of_them(db: Database) -> None:
    some_events(db)
    assert verify(db) is None
    with db.transaction() as conn:
        stored = conn.scalar(select(audit_events.c.canonical).where(audit_events.c.seq == 3))
        # the same event, spelled differently: decoding and encoding it again would give the original bytes back
        conn.execute(update(audit_events).where(audit_events.c.seq == 3).values(
            canonical=json.dumps(json.loads(stored), indent=1)))
    broken = verify(db)
    assert broken is not None and broken.seq == 3 and "edited" in broken.reason


def test_events_appended_while_verify_streams_are_not_taken_for_a_break(db: Database) -> None:
    """Verify reads the chain's head, then streams up to it: events appended and committed in between are after the
    head of its snapshot, not "events beyond the head" (PostgreSQL under READ COMMITTED would have streamed them)."""
    some_events(db)
    with SqlStore(db).session(readonly=True) as session:
        head = session.audit.chain_head()
        some_events(db, 4)  # another transaction, committed while the read is open
        with closing(session.audit.links()) as links:
            assert verify_chain(links, head) is None
        with closing(session.audit.links()) as links:
            assert [link[0] for link in links][-1] == 6  # (seq, prev_hash, hash, ...)
    assert verify(db) is None


def test_a_read_shows_the_stored_bytes_and_verify_sees_them_edited(db: Database) -> None:
    some_events(db)
    with db.transaction() as conn:
        stored = json.loads(conn.scalar(select(audit_events.c.canonical).where(audit_events.c.seq == 2)))
        conn.execute(update(audit_events).where(audit_events.c.seq == 2).values(
            canonical=json.dumps(stored | {"payload": {"applied": []}}, sort_keys=True, separators=(",", ":"))))
    with SqlStore(db).session(readonly=True) as session:
        assert session.audit.query(EventQuery(), after=1, limit=1)[0].payload == {"applied": []}
    broken = verify(db)
    assert broken is not None and broken.seq == 2 and "(approval) was edited" in broken.reason


@pytest.mark.parametrize("column, value", [("actor", "mallory"), ("proposal_id", 999), ("kind", "note"),
                                           ("outcome", None), ("at", "2020-01-01T00:00:00.000000+00:00")])
def test_a_filter_column_edited_to_hide_an_event_is_found(db: Database, column: str, value: Any) -> None:
    some_events(db)
    with db.transaction() as conn:
        conn.execute(update(audit_events).where(audit_events.c.seq == 3).values({column: value}))
    broken = verify(db)
    assert broken is not None and broken.seq == 3 and "edited" in broken.reason


@pytest.mark.parametrize("column, value, seq", [("canonical", None, 1250), ("proposal_id", None, 1300),
                                                ("proposal_id", 7, 1501), ("actor", "alice", 1777),
                                                ("id", "0" * 36, 1999)])
def test_an_event_of_a_large_batch_edited_is_found(db: Database, column: str, value: Any, seq: int) -> None:
    """A batch of 2,000 events is written in a few statements; any one of them edited afterwards is found (its
    bytes, or a column the filters search: a proposal given or taken away, another actor)."""
    with SqlStore(db).session() as session:
        session.audit.append_many([(SystemActor(f"p{i % 7}"), "plan", {"applied": [f"aws_instance.web{i}"], "n": i},
                                    None if i > 1500 else 1 + i // 10, ["app"]) for i in range(2000)])
    assert verify(db) is None
    with db.transaction() as conn:
        if column == "canonical":
            stored = json.loads(conn.scalar(select(audit_events.c.canonical).where(audit_events.c.seq == seq)))
            value = json.dumps(stored | {"payload": {"n": -1}}, sort_keys=True, separators=(",", ":"))
        conn.execute(update(audit_events).where(audit_events.c.seq == seq).values({column: value}))
    broken = verify(db)
    assert broken is not None and broken.seq == seq and "edited" in broken.reason, broken


@pytest.mark.parametrize("secret", ['pa"ss\\wörd\n', "plain-secret-value", "🔑-émoji-key"])
def test_a_known_secret_is_cut_from_an_event_wherever_it_is(db: Database, secret: str) -> None:
    """A payload is scrubbed only when its encoding holds a secret's spelling: a secret with quotes, backslashes,
    newlines or non-ASCII characters, in a key or a nested value, is still found and cut out of the stored bytes."""
    payload = {"note": f"token {secret} leaked", "nested": [{f"key-{secret}": 1}, ("x", secret)], "n": {7: "int key"}}
    with SqlStore(db, scrubber=Scrubber([secret])).session() as session:
        [event] = session.audit.append_many([(SystemActor("erin"), "plan", payload, 1, ["app"])])
    with db.transaction() as conn:
        stored = conn.scalar(select(audit_events.c.canonical))
    assert json.loads(stored)["payload"] == event.payload == {
        "note": "token (redacted) leaked", "nested": [{"key-(redacted)": 1}, ["x", "(redacted)"]], "n": {"7": "int key"}}
    assert secret not in stored and json.dumps(secret)[1:-1] not in stored
    assert verify(db) is None


class Label(str):
    """A str subclass, as a caller's stack name may be."""


def nested(depth: int) -> Any:
    value: Any = "aws_instance.deep"
    for _ in range(depth):
        value = {"d": value}
    return value


@pytest.mark.parametrize("payload", [
    {"small": 1e-07, "tiny": 5e-324, "big": 1e22, "plain": 0.1, "n": 3},
    {"nan": float("nan"), "inf": float("-inf"), "nul": "a\x00b"},  # read by json alone; PostgreSQL's json refused them
    {"huge": 2**70, "negative": -2**64, "edge": 2**64 - 1, "keys": {7: "int", 10: "int"}, "pair": ("a", 1)},
    {"text": "é ünïcode 🔑 \u2028\x01\x1f\x7f \"quoted\" back\\slash\n", "": [], "empty": {}, "t": True, "f": None},
    {"deep": nested(300)},  # deeper than orjson writes
])
def test_the_stored_bytes_are_json_s_canonical_form_whatever_the_payload(db: Database, payload: dict[str, Any]) -> None:
    """Whichever encoder writes an event (orjson where it spells JSON as `json` does, `json` for floats, integers past
    64 bits, subclasses, deep nesting), the stored bytes are `canonical_json` of what they decode to: the one byte
    form an auditor re-derives; the event returned is what a read shows; and the chain verifies."""
    with SqlStore(db).session() as session:
        [event] = session.audit.append_many([(SystemActor("erin"), "plan", payload, 1, [Label("app")])])
    with db.transaction() as conn:
        stored = conn.scalar(select(audit_events.c.canonical))
    assert stored.encode() == canonical_json(json.loads(stored)) == canonical_json(event.content())
    with SqlStore(db).session(readonly=True) as session:
        assert canonical_json(session.audit.query(EventQuery())[0].content()) == stored.encode()
    assert verify(db) is None
    if "deep" in payload:
        assert event_addresses(event.payload) == {"aws_instance.deep"}


class Colour(enum.Enum):
    RED = 1


@pytest.mark.parametrize("value", [uuid.uuid4(), Colour.RED])
def test_a_payload_value_json_refuses_is_refused_whichever_encoder_would_write_it(db: Database, value: Any) -> None:
    """orjson writes a UUID or an enum that `json` refuses: the trail refuses them as it always did, with or without a
    float beside them, and nothing of the batch is written."""
    for payload in ({"id": value}, {"id": value, "ratio": 0.5}):
        with pytest.raises(TypeError), SqlStore(db).session() as session:
            session.audit.append_many([(SystemActor("erin"), "plan", payload, 1, ["app"])])
    with db.transaction() as conn:
        assert conn.scalar(select(func.count()).select_from(audit_events)) == 0


def test_a_proposal_names_each_address_once_whatever_the_batches(db: Database) -> None:
    """A big batch copies the address pairs of proposals it is the first to name; pairs of proposals already named
    (by an earlier batch, big or of one event) are kept once: the address filter finds each proposal's events."""
    def batch(proposals: range, address: str) -> list[Any]:
        return [(SystemActor("erin"), "plan", {"applied": [f"aws_instance.{address}{p % 3}", f"aws_s3_bucket.b{p}"]},
                 p, ["app"]) for p in proposals for _ in range(2)]

    with SqlStore(db).session() as session:
        session.audit.append_many(batch(range(1, 151), "a"))  # 300 pairs of new proposals: copied
        session.audit.append(SystemActor("erin"), "plan", {"applied": ["aws_instance.a1"]}, 151, ["app"])
    with SqlStore(db).session() as session:  # the same pairs again, new ones of the same proposals, and new proposals
        session.audit.append_many(batch(range(100, 301), "a") + batch(range(140, 160), "z"))
    with db.transaction() as conn:
        pairs = conn.execute(text("SELECT proposal_id, address FROM audit_proposal_addresses")).fetchall()
    expected = ({(p, f"aws_instance.a{p % 3}") for p in range(1, 301)} | {(p, f"aws_s3_bucket.b{p}") for p in range(1, 301)}
                | {(p, f"aws_instance.z{p % 3}") for p in range(140, 160)} | {(151, "aws_instance.a1")})
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected
    with SqlStore(db).session(readonly=True) as session:
        found = session.audit.query(EventQuery(address="aws_instance.z2"))
        assert {e.proposal_id for e in found} == {p for p in range(140, 160) if p % 3 == 2}
        assert len(found) == 4 * 6 + 3 * 4  # 140, 143, 146, 149: two events in each batch; 152, 155, 158: in two
    assert verify(db) is None


def test_a_batch_that_fails_leaves_the_chain_and_the_transaction_as_they_were(db: Database) -> None:
    """A statement of a batch that fails (here: an index row already there) takes the batch's other rows with it:
    the events before it stay, the transaction goes on, and the chain verifies with none of the batch in it."""
    some_events(db)
    with SqlStore(db).session(readonly=True) as session:
        head_seq, _ = session.audit.chain_head()
    with db.transaction() as conn:  # a stray index row where the batch's third event will name its address
        conn.execute(insert(audit_event_addresses).values(seq=head_seq + 3, address="aws_instance.clash"))
    with SqlStore(db).session() as session:
        with pytest.raises(Exception, match="(?i)unique|duplicate"):
            session.audit.append_many([(SystemActor("erin"), "plan", {"applied": [f"aws_instance.{n}"]}, 1, ["app"])
                                       for n in ("a", "b", "clash", "d")])
        after = session.audit.append(SystemActor("erin"), "note", {"applied": ["aws_instance.e"]}, 1, ["app"])
    assert after.seq == head_seq + 1
    with db.transaction() as conn:
        assert conn.scalar(text("SELECT count(*) FROM audit_events")) == head_seq + 1
        assert conn.scalar(text("SELECT count(*) FROM audit_event_stacks")) == head_seq + 1
        conn.execute(text(f"DELETE FROM audit_event_addresses WHERE seq = {head_seq + 3}"))
    assert verify(db) is None


def test_an_inserted_event_and_a_moved_head_are_found(db: Database) -> None:
    some_events(db)
    with SqlStore(db).session(readonly=True) as session:
        head_seq, head_hash = session.audit.chain_head()
    forged = AuditEvent(head_seq + 1, "forged", "2026-01-01T00:00:00.000000+00:00", "mallory", "human", "approval", 1,
                        ("app",), {}, head_hash, "")
    canonical = json.dumps(forged.content(), sort_keys=True, separators=(",", ":"))
    with db.transaction() as conn:  # well chained onto the last event, but the head was not moved with it
        conn.execute(insert(audit_events).values(seq=forged.seq, id=forged.id, at=forged.at, actor=forged.actor,
                                                 actor_kind="human", kind="approval", proposal_id=1,
                                                 prev_hash=head_hash, hash=event_hash(head_hash, forged.content()),
                                                 canonical=canonical))
    broken = verify(db)
    assert broken is not None and "should end at event" in broken.reason
    with db.transaction() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE id = 'forged'"))
        conn.execute(update(audit_head).values(seq=head_seq - 1))  # the head moved back: the newest event "gone"
    broken = verify(db)
    assert broken is not None and f"should end at event {head_seq - 1}" in broken.reason


@pytest.mark.parametrize("forge", [
    lambda b: b.replace(b',"proposal_id":1,', b',"actor":"bob","proposal_id":1,'),  # a second actor: reads say bob
    lambda b: b.replace(b',"proposal_id":1,', b',"proposal_id":true,'),  # equal to 1 in Python, not in JSON
    lambda b: b.replace(b',"proposal_id":1,', b',"proposal_id":1.0,'),
    lambda b: b.replace(b',"proposal_id":1,', b','),  # no proposal key at all
    lambda b: b.replace(b',"seq":2,', b',"seq":18446744073709551618,'),  # an integer orjson reads as a float...
    lambda b: b"[" + b + b"]",  # ...not an object
    lambda b: b + b" trailing",  # not JSON
], ids=["duplicate key", "true for 1", "1.0 for 1", "missing key", "big integer", "an array", "not JSON"])
def test_bytes_forged_with_their_chain_rewritten_still_agree_with_the_columns(db: Database, forge: Any) -> None:
    """Whoever rewrites an event's bytes and every hash after it (and the head) still cannot make the bytes say
    other than the columns the filters search: verify reads the bytes as a read does (the last of two keys, JSON's
    types) and names the event."""
    some_events(db)
    with db.transaction() as conn:
        links = conn.execute(select(audit_events.c.seq, audit_events.c.canonical).order_by(audit_events.c.seq)).all()
        prev = GENESIS
        for seq, canonical in links:
            data = canonical.encode()
            if seq == 2:
                data = forge(data)
            digest = "sha256:" + hashlib.sha256(prev.encode() + data).hexdigest()
            conn.execute(update(audit_events).where(audit_events.c.seq == seq).values(
                canonical=data.decode(), prev_hash=prev, hash=digest))
            prev = digest
        conn.execute(update(audit_head).values(hash=prev))
    broken = verify(db)
    assert broken is not None and broken.seq == 2 and "edited after it was written" in broken.reason, broken


V17_AUDIT_EVENTS = """CREATE TABLE audit_events (seq {seq} PRIMARY KEY, id VARCHAR(36) NOT NULL UNIQUE,
    at VARCHAR(40) NOT NULL, actor VARCHAR(100) NOT NULL, actor_kind VARCHAR(10) NOT NULL, kind VARCHAR(40) NOT NULL,
    proposal_id INTEGER, stacks {json} NOT NULL, payload TEXT NOT NULL, prev_hash VARCHAR(71) NOT NULL,
    hash VARCHAR(71) NOT NULL, outcome VARCHAR(20))"""


def test_a_trail_written_before_canonical_bytes_migrates_and_still_verifies(db: Database) -> None:
    """Migration 18 on a trail as schema 17 kept it: same hashes, same events, an earlier edit still found."""
    postgres = db.engine.dialect.name == "postgresql"
    old: list[dict[str, Any]] = []
    prev = GENESIS
    for seq in range(1, 31):
        content = {"seq": seq, "id": f"id-{seq}", "at": f"2026-11-01T10:00:{seq:02}.000000+00:00",
                   "actor": "erin" if seq % 2 else "alice", "actor_kind": "human", "kind": "apply.failed",
                   "proposal_id": seq // 10 or None, "stacks": ["app", "data"][: 1 + seq % 2],
                   "payload": {"applied": [f"aws_instance.web{seq}"], "n": seq, "text": "ünïcode \"quoted\""}}
        old.append(content | {"prev_hash": prev, "hash": (prev := event_hash(prev, content))})
    with db.transaction() as conn:  # back to schema 17's audit_events, with a trail in it
        conn.execute(text("DROP TABLE audit_events"))
        conn.execute(text("DROP TABLE audit_proposal_addresses"))
        conn.execute(text(V17_AUDIT_EVENTS.format(seq="BIGINT" if postgres else "INTEGER",
                                                  json="JSON" if postgres else "TEXT")))
        conn.execute(text("DELETE FROM schema_version WHERE version = 18"))
        for e in old:
            conn.execute(text("INSERT INTO audit_events VALUES (:seq, :id, :at, :actor, :actor_kind, :kind, "
                              ":proposal_id, :stacks, :payload, :prev_hash, :hash, 'failed')"),
                         e | {"stacks": json.dumps(e["stacks"]), "payload": json.dumps(e["payload"])})
            conn.execute(insert(audit_event_addresses), [{"seq": e["seq"], "address": a}
                                                        for a in event_addresses(e["payload"])])
        conn.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 17"))  # edited before the upgrade
        conn.execute(update(audit_head).values(seq=30, hash=prev))
    assert 18 in dict(MIGRATIONS)  # the one undone above runs again; later ones (19: sign-in) are in place
    db.migrate()

    broken = verify(db)
    assert broken is not None and broken.seq == 17 and "edited" in broken.reason
    with SqlStore(db).session(readonly=True) as session:
        events = session.audit.query(EventQuery())
        assert [e.content() | {"prev_hash": e.prev_hash, "hash": e.hash} for e in events if e.seq != 17] == \
            [e for e in old if e["seq"] != 17]
        assert events[16].actor == "mallory"  # the bytes are made from the row as it was: the edit is kept, and found
        # the address filter brings the events of the proposals that name it, from the back-filled index
        assert [e.seq for e in session.audit.query(EventQuery(address="aws_instance.web12"))] == list(range(10, 20))
    with db.transaction() as conn:  # what the bytes repeat is gone
        assert {"payload", "stacks"} & {c["name"] for c in inspect(conn).get_columns("audit_events")} == set()


# --- every filter answered from an index ----------------------------------------------------------------------------

STACKS, PEOPLE = [f"s{i}" for i in range(8)], [f"p{i}" for i in range(12)]
KINDS = ["plan", "approval", "apply.started", "apply.succeeded", "apply.failed", "approve.refused", "merged"]
FILTERS: dict[str, dict[str, Any]] = {
    "stack": {"stack": "s3"}, "person": {"actor": "p5"}, "outcome": {"outcome": "refused"},
    "action": {"action": "apply"}, "kind": {"kind": "merged"}, "proposal": {"proposal_id": 40},
    "time": {"since": "2026-11-01T10:00:00.500000+00:00", "until": "2026-11-01T10:00:01.200000+00:00"},
    "address": {"address": "aws_instance.web7"}, "prefix": {"address": "aws_s3_bucket.b1*"},
    "broad prefix": {"address": "aws_*"},
    "stack+outcome": {"stack": "s1", "outcome": "failed"},
    "stack+outcome+prefix": {"stack": "s2", "outcome": "refused", "address": "aws_s3_bucket.b1*"},
    "person+address": {"actor": "p3", "address": "aws_instance.web7"},
    "action+prefix": {"action": "apply", "address": "aws_s3_bucket.b2*"},
    "person+action+stack": {"actor": "p1", "action": "apply", "stack": "s4"},
    "time+stack+person": {"since": "2026-11-01T10:00:00.100000+00:00", "stack": "s5", "actor": "p2"},
    "action+outcome": {"action": "apply", "outcome": "failed"}, "kind+outcome": {"kind": "approve.refused",
                                                                                "outcome": "refused"},
    "action+kind+stack": {"action": "apply", "kind": "apply.started", "stack": "s6"},
    "outcome+time": {"outcome": "succeeded", "until": "2026-11-01T10:00:00.900000+00:00"},
    "proposal+person": {"proposal_id": 40, "actor": "p7"}, "prefix+time": {"address": "aws_s3_bucket.b2*",
                                                                         "since": "2026-11-01T10:00:01.000000+00:00"},
    "address+action+person": {"address": "aws_instance.web7", "action": "apply", "actor": "p4"},
    "stack+time": {"stack": "s2", "since": "2026-11-01T10:00:00.300000+00:00"},
    "stack+prefix": {"stack": "s6", "address": "aws_s3_bucket.b1*"},
    "repository": {"repository": "data"},
    "repository+kind (rare)": {"repository": "data", "kind": "merged"},
    "repository+outcome (rare)": {"repository": "data", "outcome": "refused"},
    "repository+action": {"repository": "data", "action": "apply"},
    "repository+kind+outcome": {"repository": "data", "kind": "approve.refused", "outcome": "refused"},
    "repository+person+action": {"repository": "declarations", "actor": "p3", "action": "apply"},
    "repository+stack+time": {"repository": "data", "stack": "s2", "since": "2026-11-01T10:00:00.300000+00:00"},
    "repository+proposal": {"repository": "data", "proposal_id": 40},
}
# a repository with a kind, an action or an outcome, and nothing else: read from the (repository, kind) index alone
BY_REPOSITORY_AND_KIND = [name for name, q in FILTERS.items()
                          if "repository" in q and len(q) > 1 and set(q) <= {"repository", "kind", "action", "outcome"}]


@pytest.fixture
def busy_trail(db: Database) -> Database:
    """1,600 events: 160 proposals of 10, eight stacks, a dozen people, the addresses they name spread over them."""
    rng = random.Random(3)
    with SqlStore(db).session() as session:
        session.audit.append_many([(SystemActor(rng.choice(PEOPLE)), rng.choice(KINDS), {
            "applied": [f"aws_instance.web{i % 50}"], "changed": [f"aws_s3_bucket.b{i % 300}"] if i % 3 else []},
            1 + i // 10, [STACKS[i % 8]] + ([STACKS[(i + 3) % 8]] if i % 5 == 0 else [])) for i in range(1600)])
    with db.transaction() as conn:  # the events' times, evenly spread, so a time range is a slice of the trail
        conn.execute(text("UPDATE audit_events SET at = '2026-11-01T10:00:0' || "
                          "CAST(seq / 1000 AS VARCHAR) || '.' || substr(CAST(1000000 + (seq % 1000) * 1000 AS "
                          "VARCHAR), 2) || '+00:00'"))
        for row in conn.execute(select(audit_events.c.seq, audit_events.c.canonical, audit_events.c.at)).all():
            content = json.loads(row.canonical) | {"at": row.at}
            conn.execute(update(audit_events).where(audit_events.c.seq == row.seq).values(
                canonical=json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)))
        # a quarter of the events are repository data's, but hardly any merged or refused one: rare combinations
        conn.execute(update(audit_events).where(text("seq % 4 = 0 AND (kind NOT IN ('merged', 'approve.refused') "
                                                     "OR seq % 40 = 0)")).values(repository="data"))
        if db.engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE"))
    return db


def repositories(db: Database) -> dict[int, str]:
    """Each event's repository, as the trail keeps it (beside the bytes)."""
    with db.transaction(readonly=True) as conn:
        return {seq: name for seq, name in conn.execute(select(audit_events.c.seq, audit_events.c.repository))}


def expected(events: list[AuditEvent], q: dict[str, Any], repository: dict[int, str] | None = None) -> list[int]:
    """The filter's meaning, computed the slow way over every event (`repository`: each event's)."""
    def named(e: AuditEvent) -> bool:
        wanted = q["address"]
        return any(a == wanted or (wanted.endswith("*") and a.startswith(wanted[:-1]))
                   for a in event_addresses(e.payload))
    naming = {e.proposal_id for e in events if "address" in q and e.proposal_id is not None and named(e)}
    return [e.seq for e in events if all((
        "stack" not in q or q["stack"] in e.stacks, "actor" not in q or e.actor == q["actor"],
        "outcome" not in q or e.kind.rsplit(".", 1)[-1] == q["outcome"],
        "action" not in q or e.kind == q["action"] or e.kind.startswith(q["action"] + "."),
        "kind" not in q or e.kind == q["kind"], "proposal_id" not in q or e.proposal_id == q["proposal_id"],
        "since" not in q or e.at >= q["since"], "until" not in q or e.at <= q["until"],
        "address" not in q or named(e) or e.proposal_id in naming,
        "repository" not in q or (repository or {}).get(e.seq) == q["repository"]))]


@pytest.mark.parametrize("plan", ["estimated", "members", "windows"])
def test_every_filter_pages_through_exactly_its_events_from_an_index(busy_trail: Database, plan: str) -> None:
    """Each filter and combination, one page at a time from `after`, in each of the query's plans (the smallest
    filter's events; the filters' indexes intersected; one index read in order), gives exactly the events it means,
    and no statement it runs scans or sorts the trail."""
    statements = _statements(busy_trail)
    with SqlStore(busy_trail).session(readonly=True) as session:
        audit: SqlAuditLog = session.audit
        audit.medium, audit.window, audit.chunk = {"estimated": (audit.medium, audit.window, audit.chunk),
                                                   "members": (5000, 50, 100), "windows": (0, 30, 25)}[plan]
        everything = audit.query(EventQuery())
        assert len(everything) == 1600
        of = repositories(busy_trail)
        for name, q in FILTERS.items():
            want = expected(everything, q, of)
            assert want, name
            statements.clear()
            got, after = [], 0
            while page := audit.query(EventQuery(**q), after=after, limit=40):
                got += [e.seq for e in page]
                after = page[-1].seq
            assert got == want, name
            assert audit.query(EventQuery(**q), after=want[len(want) // 2], limit=7) == \
                [e for e in everything if e.seq in set(want[len(want) // 2 + 1:][:7])], name
            for statement, params in statements:
                assert_indexed(session.conn, statement, params, name)


def test_an_action_and_an_outcome_no_kind_has_match_nothing(busy_trail: Database) -> None:
    """`apply` and `refused` name no kind together: nothing matches (the brute-force filter agrees), counted as 0."""
    statements = _statements(busy_trail)
    with SqlStore(busy_trail).session(readonly=True) as session:
        everything = session.audit.query(EventQuery())
        q = {"action": "apply", "outcome": "refused", "stack": "s1"}
        statements.clear()
        assert expected(everything, q) == [] and session.audit.query(EventQuery(**q), limit=10) == []
        assert session.audit.count(EventQuery(**q)) == 0
        assert not [s for s, _ in statements if "min(kind)" not in s]  # the kinds were read; no event was
        assert expected(everything, {"action": "approve", "outcome": "refused"})  # one that does name a kind


@pytest.mark.parametrize("plan", ["estimated", "windows"])
def test_a_repository_with_a_kind_reads_only_the_events_that_match(busy_trail: Database, plan: str) -> None:
    """The repo filter with a kind, an action or an outcome, however rare the combination (a few of the repository's
    400 events), reads the (repository, kind) index: only the events that match, never every event of the repository
    checked for its kind (what made a rare combination take hundreds of ms at a million events)."""
    statements = _statements(busy_trail)
    with SqlStore(busy_trail).session(readonly=True) as session:
        audit: SqlAuditLog = session.audit
        if plan == "windows":
            audit.medium, audit.window, audit.chunk = 0, 30, 25
        everything, of = audit.query(EventQuery()), repositories(busy_trail)
        for name in BY_REPOSITORY_AND_KIND:
            q = FILTERS[name]
            statements.clear()
            assert [e.seq for e in audit.query(EventQuery(**q))] == expected(everything, q, of), name
            reads = [(s, p) for s, p in statements if "audit_events.repository" in s and not _listed(s)]
            assert reads, name
            for statement, params in reads:
                assert "audit_events_by_repository_kind" in " ".join(_plan(session.conn, statement, params)), \
                    f"{name}: {statement}"


def test_migration_34_indexes_each_repository_s_kinds_on_a_trail_at_schema_33(busy_trail: Database) -> None:
    """A trail at schema 33 (no (repository, kind) index) gets it from migration 34, and its repo + kind filters
    answer as before, from it."""
    with busy_trail.transaction() as conn:
        conn.execute(text("DROP INDEX audit_events_by_repository_kind"))
        conn.execute(text("DELETE FROM schema_version WHERE version = 34"))
    with busy_trail.transaction(readonly=True) as conn:
        assert "audit_events_by_repository_kind" not in {i["name"] for i in inspect(conn).get_indexes("audit_events")}
    with SqlStore(busy_trail).session(readonly=True) as session:
        before = {name: session.audit.query(EventQuery(**FILTERS[name])) for name in BY_REPOSITORY_AND_KIND}
    assert busy_trail.pending_migrations() == [34]

    assert busy_trail.migrate() == [34]

    with busy_trail.transaction(readonly=True) as conn:
        indexes = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("audit_events")}
    assert indexes["audit_events_by_repository_kind"] == ["repository", "kind", "seq"]
    with SqlStore(busy_trail).session(readonly=True) as session:
        assert {name: session.audit.query(EventQuery(**FILTERS[name])) for name in BY_REPOSITORY_AND_KIND} == before
        assert all(before.values())
    assert busy_trail.migrate() == []  # once


def _listed(statement: str) -> bool:
    """A statement that checks listed candidates by primary key (at most `chunk` seqs)."""
    listed = next((m for m in ("audit_events.seq IN (", "audit_events.seq = ANY (") if m in statement), None)
    return listed is not None and "SELECT" not in statement.split(listed)[1][:10]


def _plan(conn: Any, statement: str, params: Any) -> list[str]:
    """The statement's plan as the query runs it (on PostgreSQL under its settings, SqlAuditLog._probing)."""
    if conn.dialect.name == "sqlite":
        return [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)]
    settings = conn.begin_nested()  # rolled back: the settings go with it
    try:
        for setting, value in _IN_ORDER.items():
            conn.exec_driver_sql(f"SET LOCAL {setting} = {value}")
        return [row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params)]
    finally:
        settings.rollback()


def assert_indexed(conn: Any, statement: str, params: Any, name: str) -> None:
    """The statement's plan reads no audit table whole and sorts none of them: an index range or primary key. Only
    the statement that checks a chunk of candidates (at most `chunk` seqs, listed) may sort what it found."""
    listed = next((m for m in ("audit_events.seq IN (", "audit_events.seq = ANY (") if m in statement), None)
    bounded = listed is not None and "SELECT" not in statement.split(listed)[1][:10]
    if conn.dialect.name == "sqlite":
        plan = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)]
        scans = [p for p in plan if re.match(r"SCAN audit_\w+", p)]
        sorts = [p for p in plan if "TEMP B-TREE" in p and not bounded]
        assert not scans and not sorts, f"{name}: {statement}\n" + "\n".join(plan)
        return
    # a table this small is cheapest read whole: with scans and sorts priced out, the planner still takes one only
    # when no index can serve (at a million events it takes the index unprompted: benchmarks/audit_trail.py --plans)
    # (and bitmaps too, as the query turns them off for its windows: see SqlAuditLog._probing)
    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
    conn.exec_driver_sql("SET LOCAL enable_sort = off")
    conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
    try:
        plan = [row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params)]
    finally:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = on")
        conn.exec_driver_sql("SET LOCAL enable_sort = on")
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = on")
    scans = [p for p in plan if re.search(r"Seq Scan on audit_\w+", p)]
    sorts = [p for p in plan if re.match(r"\s*(->\s*)?(Incremental )?Sort\b(?! Key)", p) and not bounded]  # a node, not a key
    assert not scans and not sorts, f"{name}: {statement}\n" + "\n".join(plan)


def _statements(db: Database) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "audit_" in statement and statement.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", capture)
    return seen
