"""The audit trail at scale: N events (default 1,000,000) appended through the real append path
(`append_many`: the hash chain, the head row lock, the stack, address and proposal-address index rows), 2,000 to
a transaction; then the auditor's filters through the API (`GET /api/v1/audit/events`, one page of 100 from a
random `after`), and `verify` over the whole trail. On PostgreSQL (default) or SQLite (`sqlite`). One event in ten is
of an added declaration repository, `data` (its stacks `data/stack-NN`), one in a thousand of `rare`: the `repo` filter
finds them.

Every figure is printed beside its floor, measured in the same run, and the machine's load:
- append: events/s, and the CPU the process spent per event beside what encoding and hashing one event costs;
- filters: p50/p95 per filter and combination, beside the p95 of `GET /api/v1/health` (the API's own floor), and
  the query plan of every statement one page of each ran (`--plans`);
- verify: events/s and per CPU-second (of this process, and of the PostgreSQL backend that streams the trail), peak
  memory, beside `hashlib.sha256` over the same stored bytes.
It is not a test.

Usage: python benchmarks/audit_trail.py [EVENTS] [POSTGRES_ADMIN_URL | sqlite] [--plans] [--no-filters]
(`--no-filters`: append and verify only, for quicker runs)
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch_db import scratch_database  # noqa: E402  (a sibling: this script's directory is on the path)

from gateway.adapters.store.audit import canonical_bytes  # noqa: E402
from gateway.api.app import create_app  # noqa: E402
from gateway.composition import add_repository, create_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.domain.principals import PrincipalKind, Role, SystemActor  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.admin import audit as audit_service  # noqa: E402
from gateway.services.admin.users import add_principal  # noqa: E402

STACKS = [f"stack-{i:02}" for i in range(40)]
PEOPLE = [SystemActor(f"person-{i:03}") for i in range(200)]
KINDS = ["plan", "approval", "apply.started", "apply.succeeded", "apply.failed", "approve.refused", "merged",
         "proposal.opened", "job.succeeded", "commit"]
BATCH = 2000
PAGE = 100
SAMPLES = 40


def payload(i: int) -> dict[str, Any]:
    address = f"aws_instance.web{i % 5000}"
    return {"head_sha": f"{i:040x}", "digest": f"sha256:{i:064x}", "applied": [address, f"{address}-volume"],
            "changed": [f"aws_s3_bucket.b{i % 9000}"], "comment": "benchmark event"}


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    configure_logging("warning")
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    events = int(args[0]) if args else 1_000_000
    target = args[1] if len(args) > 1 else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    with tempfile.TemporaryDirectory() as tmp, scratch_database(None if target == "sqlite" else target, "audit") as url:
        run(Path(tmp) / "home", url, events, "--plans" in sys.argv, "--no-filters" not in sys.argv)


def run(home: Path, url: str | None, events: int, plans: bool, filtered: bool = True) -> None:
    ws = create_workspace(Settings(home=home, database_url=url))
    print(f"{events:,} events on {ws.store.db.engine.dialect.name}; {load()}")
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
    _, token = add_principal(ws, admin, "dana", frozenset({Role.AUDITOR}), frozenset(), PrincipalKind.PERSON)
    add_repository(ws, admin, "data")
    add_repository(ws, admin, "rare")
    append(ws, events)
    with ws.store.db.transaction() as conn:  # a write: a pooled SQLite connection that served reads is query_only
        conn.execute(text("ANALYZE"))
    if filtered:
        with TestClient(create_app(ws.settings, workers=0)) as client:
            logging.disable(logging.INFO)  # not a line per request
            client.headers["Authorization"] = f"Bearer {token}"
            filters(ws, client, events, plans)
    verify(ws, events)
    ws.close()


def append(ws: Any, events: int) -> None:
    rng = random.Random(7)
    wall = cpu = server = 0.0  # the store's work only: making up the events is not timed
    for first in range(0, events, BATCH):
        batch = [(rng.choice(PEOPLE), rng.choice(KINDS), payload(i), 1 + i // 10, [stack_of(i)])
                 for i in range(first, min(first + BATCH, events))]
        started, begun = time.perf_counter(), time.process_time()
        with ws.store.session() as session:
            backend = backend_cpu(session.conn)
            session.audit.append_many(batch)
        wall, cpu = wall + time.perf_counter() - started, cpu + time.process_time() - begun
        if backend is not None:
            server += backend()
    sample = min(events, 20_000)  # the floor: encoding and hashing each event once, nothing written
    floor = time.process_time()
    prev = "sha256:" + "0" * 64
    for i in range(sample):
        content = {"seq": i, "id": str(uuid.uuid4()), "at": "2026-12-02T07:00:00.000000+00:00", "actor": PEOPLE[0].name,
                   "actor_kind": "system", "kind": KINDS[0], "proposal_id": i, "stacks": [STACKS[0]],
                   "payload": payload(i)}
        prev = "sha256:" + hashlib.sha256(prev.encode() + canonical_bytes(content, floats=False)).hexdigest()
    floor_us = (time.process_time() - floor) / sample * 1e6
    backend = f", the PostgreSQL backend {server / events * 1e6:.1f} µs" if server else ""
    print(f"append: {events / wall:,.0f} events/s ({wall:.1f} s wall, {BATCH:,} a transaction); CPU per event: this "
          f"process {cpu / events * 1e6:.1f} µs{backend}; floor (encode + hash one event) {floor_us:.1f} µs; {load()}")


def stack_of(i: int) -> str:
    """Event i's stack: one in ten of repository `data`'s, one in a thousand of `rare`'s."""
    return ("data/" if i % 10 == 0 else "rare/" if i % 1000 == 1 else "") + STACKS[i % len(STACKS)]


def backend_cpu(conn: Any) -> Callable[[], float] | None:
    """On a PostgreSQL server of this machine: a function giving the CPU seconds its backend for `conn` has spent
    since now (from /proc; None where that cannot be read)."""
    if conn.dialect.name != "postgresql":
        return None
    pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()

    def spent() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        start = spent()
    except OSError:
        return None
    return lambda: spent() - start


def database_cpu(ws: Any) -> Callable[[], float]:
    """On PostgreSQL: a function giving the CPU seconds the backends of this database (those there now, and any that
    start) have spent since now, from /proc (0 on SQLite, or where that cannot be read)."""
    if ws.store.db.is_sqlite:
        return lambda: 0.0

    def pids() -> set[int]:
        with ws.store.db.engine.connect() as conn:
            return set(conn.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                                           ).scalars())

    def spent(pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = {pid: spent(pid) for pid in pids()}
    return lambda: sum(spent(pid) - before.get(pid, 0.0) for pid in pids() | set(before))


def filters(ws: Any, client: TestClient, events: int, plans: bool) -> None:
    rng = random.Random(11)
    last_proposal = 1 + (events - 1) // 10

    def stack() -> dict[str, Any]:
        return {"stack": rng.choice(STACKS)}

    def address() -> dict[str, Any]:
        return {"address": f"aws_instance.web{rng.randrange(5000)}"}

    def prefix() -> dict[str, Any]:
        return {"address": f"aws_s3_bucket.b{rng.randrange(100, 900)}*"}

    def person() -> dict[str, Any]:
        return {"person": rng.choice(PEOPLE).name}

    cases: dict[str, Callable[[], dict[str, Any]]] = {
        "stack": stack, "address (exact)": address, "address (prefix*)": prefix, "person": person,
        "outcome": lambda: {"outcome": "refused"}, "action": lambda: {"action": "apply"},
        "proposal": lambda: {"proposal": 1 + rng.randrange(last_proposal)},
        "time range": lambda: {"since": "2000-01-01T00:00", "until": "2999-01-01T00:00"},
        "stack+outcome": lambda: stack() | {"outcome": "refused"},
        "stack+person": lambda: stack() | person(),
        "stack+outcome+prefix": lambda: stack() | {"outcome": "refused"} | prefix(),
        "person+address": lambda: person() | address(),
        "action+prefix": lambda: {"action": "apply"} | prefix(),
        "outcome+time+stack": lambda: {"outcome": "failed", "since": "2000-01-01T00:00"} | stack(),
        "person+action+stack": lambda: person() | {"action": "apply"} | stack(),
        "repo (data, 10%)": lambda: {"repo": "data"},
        "repo (declarations)": lambda: {"repo": "declarations"},
        "repo (rare, 0.1%)": lambda: {"repo": "rare"},
        "repo (rare)+action": lambda: {"repo": "rare", "action": "apply"},
        "repo+person": lambda: {"repo": "data"} | person(),
        "repo+action": lambda: {"repo": "data", "action": "apply"},
        "repo+outcome": lambda: {"repo": "data", "outcome": "refused"},
        "repo+prefix": lambda: {"repo": "data"} | prefix(),
        "repo+stack": lambda: {"repo": "data", "stack": f"data/{STACKS[rng.randrange(0, len(STACKS), 10)]}"},
    }
    cpu = time.process_time()
    health = sorted(timed(lambda: client.get("/api/v1/health")) for _ in range(SAMPLES))
    health_cpu = (time.process_time() - cpu) / SAMPLES * 1000
    print(f"filters, one page of {PAGE} through GET /api/v1/audit/events from a random `after` (floor: GET "
          f"/api/v1/health p50 {statistics.median(health):.1f} ms, p95 {p95(health):.1f} ms, {health_cpu:.1f} ms CPU); "
          f"{load()}")
    for label, make in cases.items():
        timings, cpus, sizes = [], [], []
        for _ in range(SAMPLES):
            params = make() | {"after": rng.randrange(events), "limit": PAGE}
            cpu = time.process_time()
            begun = time.perf_counter()
            response = client.get("/api/v1/audit/events", params=params)
            timings.append((time.perf_counter() - begun) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
            assert response.status_code == 200, response.text
            sizes.append(len(response.json()))
        timings.sort()
        print(f"  {label:22} p50 {statistics.median(timings):6.1f} ms  p95 {p95(timings):6.1f} ms  "
              f"(CPU p50 {statistics.median(cpus):5.1f} ms; {statistics.mean(sizes):5.1f} events a page)")
        if plans:
            print_plans(ws, make() | {"after": rng.randrange(events)})


def print_plans(ws: Any, params: dict[str, Any]) -> None:
    """EXPLAIN (QUERY PLAN) of every statement one page of this filter runs."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and ("audit_" in statement
                                                                         or "set_config(" in statement):
            seen.append((statement, parameters))

    event.listen(ws.store.db.engine, "before_cursor_execute", capture)
    try:
        with ws.store.session(readonly=True) as session:
            dana = session.principals.by_name("dana")
        audit_service.list_events(ws, dana, params.get("proposal"), params.get("person"), params.get("stack"),
                                  params.get("since"), params.get("until"), params.get("address"),
                                  params.get("action"), params.get("outcome"), params["after"], PAGE,
                                  params.get("repo"))
    finally:
        event.remove(ws.store.db.engine, "before_cursor_execute", capture)
    explain = "EXPLAIN QUERY PLAN " if ws.store.db.is_sqlite else "EXPLAIN "
    with ws.store.db.engine.connect() as conn:  # one transaction: the planner settings the query set hold here too
        for statement, parameters in seen:
            if "set_config(" in statement:
                conn.exec_driver_sql(statement, parameters)
                continue
            if "min(kind)" in statement:
                continue
            rows = conn.exec_driver_sql(explain + statement, parameters).fetchall()
            print("      " + " ".join(statement.split())[:160])
            for row in rows:
                line = row[-1] if ws.store.db.is_sqlite else row[0]
                print("        " + re.sub(r"'\{([^,}]*,){3}[^}]*\}'", "'{…candidates…}'", line))


def verify(ws: Any, events: int) -> None:
    with ws.store.session(readonly=True) as session:
        auditor = session.principals.by_name("dana")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    backends = database_cpu(ws)
    started, cpu = time.perf_counter(), time.process_time()
    count, broken = audit_service.verify_trail(ws, auditor)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    server = backends()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert broken is None and count >= events, (count, broken)
    with ws.store.session(readonly=True) as session:  # the floor: sha256 over the same stored bytes, in memory
        stored = [p.encode() + c for _, p, _, c, *_ in session.audit.links(upto=min(events, 200_000))]
    floor = time.perf_counter()
    for data in stored:
        "sha256:" + hashlib.sha256(data).hexdigest()
    floor_rate = len(stored) / (time.perf_counter() - floor)
    backend = f", {count / server:,.0f} per CPU-second of the PostgreSQL backends" if server else ""
    print(f"verify: {count / wall:,.0f} events/s ({wall:.1f} s wall, {count / cpu:,.0f} per CPU-second of this "
          f"process{backend}); floor hashlib.sha256 over the same bytes {floor_rate:,.0f}/s (verify takes "
          f"{floor_rate / (count / wall):.1f}x it); peak memory {rss_after / 1024:.0f} MB, "
          f"{rss_before / 1024:.0f} MB before verifying; {load()}")


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def p95(timings: list[float]) -> float:
    return timings[int(0.95 * len(timings)) - 1]


if __name__ == "__main__":
    main()
