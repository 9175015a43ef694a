"""The audit trail at scale on PostgreSQL: N events (default 1,000,000) appended through the real append path
(`UnitOfWork.append_events`, which `append_event` is: the hash chain, the head row lock, the stack and address
index rows), 2,000 to a transaction, then the auditor's filters and verify.

Prints appends per second, p50/p95 of each filter for one page of 100 events (as the API serves them), verify's
throughput and the process's peak memory while verifying. It is not a test.

Usage: python benchmarks/audit_trail.py [EVENTS] [POSTGRES_ADMIN_URL]
"""

from __future__ import annotations

import random
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.adapters.sql_store import Database  # noqa: E402
from gateway.adapters.store.unit_of_work import SqlStore  # noqa: E402
from gateway.domain.audit import (
    EventQuery,  # noqa: E402
    verify_chain,  # noqa: E402
)
from gateway.domain.principals import SystemActor  # noqa: E402

STACKS = [f"stack-{i:02}" for i in range(40)]
PEOPLE = [SystemActor(f"person-{i:03}") for i in range(200)]
KINDS = ["plan", "approval", "apply.started", "apply.succeeded", "apply.failed", "approve.refused", "merged",
         "proposal.opened", "job.succeeded", "commit"]
BATCH = 2000


def payload(i: int) -> dict:
    address = f"aws_instance.web{i % 5000}"
    return {"head_sha": f"{i:040x}", "digest": f"sha256:{i:064x}", "applied": [address, f"{address}-volume"],
            "changed": [f"aws_s3_bucket.b{i % 9000}"], "comment": "benchmark event"}


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    admin_url = sys.argv[2] if len(sys.argv) > 2 else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    name = f"gw_bench_audit_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(admin_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        db.migrate()
        store = SqlStore(db)
        rng = random.Random(7)
        started = time.perf_counter()
        for first in range(0, events, BATCH):
            with store.session() as session:
                session.audit.append_many([(rng.choice(PEOPLE), rng.choice(KINDS), payload(i), 1 + i // 10,
                                        [STACKS[i % len(STACKS)]]) for i in range(first, min(first + BATCH, events))])
        appended = time.perf_counter() - started
        with db.engine.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
        print(f"{events:,} events appended in {appended:.0f} s ({events / appended:,.0f} events/s, "
              f"{BATCH} a transaction, through append_events)")

        filters = {
            "stack": lambda: EventQuery(stack=rng.choice(STACKS)),
            "address (exact)": lambda: EventQuery(address=f"aws_instance.web{rng.randrange(5000)}"),
            "address (prefix*)": lambda: EventQuery(address=f"aws_s3_bucket.b{rng.randrange(900)}*"),
            "person": lambda: EventQuery(actor=rng.choice(PEOPLE)),
            "action": lambda: EventQuery(action="apply"),
            "outcome": lambda: EventQuery(outcome="refused"),
            "proposal": lambda: EventQuery(proposal_id=1 + rng.randrange(events // 10)),
            "time range": lambda: EventQuery(since="2000-01-01", until="2999-01-01"),
        }
        for label, make in filters.items():
            timings = []
            for _ in range(40):
                query = make()
                after = rng.randrange(events)
                begun = time.perf_counter()
                with store.session(readonly=True) as session:
                    session.audit.query(query, after=after, limit=100)
                timings.append((time.perf_counter() - begun) * 1000)
            timings.sort()
            print(f"  {label:18} p50 {statistics.median(timings):7.1f} ms   p95 {timings[int(0.95 * len(timings)) - 1]:7.1f} ms")

        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        begun = time.perf_counter()
        with store.session(readonly=True) as session:
            broken = verify_chain(session.audit.iter(), session.audit.chain_head())
        took = time.perf_counter() - begun
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert broken is None, broken
        print(f"verify: {events / took:,.0f} events/s ({took:.1f} s); peak memory {rss_after / 1024:.0f} MB "
              f"(it was {rss_before / 1024:.0f} MB before verifying)")
    finally:
        db.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
