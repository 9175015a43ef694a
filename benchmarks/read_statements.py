"""What one read of a proposal costs in the process, on SQLite and on PostgreSQL, and what one statement costs: the
floor of a read on PostgreSQL.

Opens a small proposal (one queue) on each database and reads it as the API does (the token's check, then the
view, in one read unit of work), without HTTP: statements per read, and CPU per read (median and least of rounds).
Then, on PostgreSQL, one statement by primary key three ways: through psycopg alone (the driver's floor: a round
trip's syscalls and the protocol), through SQLAlchemy Core as the store runs it (a prebuilt select), and `SELECT 1`
through psycopg. A read on PostgreSQL costs about its statements times the Core figure more than the same read on
SQLite. It is not a test.

Usage: python benchmarks/read_statements.py [POSTGRES_ADMIN_URL]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import git
import psycopg
from reads import load, queues  # siblings: this script's directory is on the path
from scratch_db import scratch_database
from sqlalchemy import bindparam, create_engine, event, select, text

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.schema import principals
from gateway.api.routes import proposal_document
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal, token_read
from gateway.services.change.proposals import open_proposal

ROUNDS, PER_ROUND = 7, 300


def cpu_per_call(call: Callable[[], object], rounds: int = ROUNDS, per_round: int = PER_ROUND) -> tuple[float, float]:
    """Median and least CPU seconds per call over the rounds (after a warm-up round)."""
    for _ in range(per_round):
        call()
    figures = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(per_round):
            call()
        figures.append((time.process_time() - started) / per_round)
    return statistics.median(figures), min(figures)


def read_cost(home: Path, url: str | None, clone_dir: Path) -> None:
    ws = create_workspace(Settings(home=home, database_url=url))
    try:
        bootstrap_simulator(ws)
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}),
                                 PrincipalKind.PERSON)
        _, token = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}),
                                 PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), clone_dir)
        clone.git.checkout("-q", "-B", "small", "origin/main")
        Path(clone.working_dir, "stacks/app-staging/bench.tf").write_text(queues(1))
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", "one queue"], env=committer_env())
        clone.git.push("-q", "origin", "small")
        pid = open_proposal(ws, alice, "small", "one queue").id
        request = ws.for_request()

        def read() -> bytes:
            with token_read(request, token) as (actor, _):
                return proposal_document(request, actor, pid).body

        read()
        statements = []
        engine = ws.store.db.engine

        def counted(*_: object) -> None:
            statements.append(1)

        event.listen(engine, "before_cursor_execute", counted)  # counted apart: a listener costs every statement
        read()
        event.remove(engine, "before_cursor_execute", counted)
        median, least = cpu_per_call(read)
        name = "PostgreSQL" if url else "SQLite"
        print(f"{name:10} read of a small proposal: {len(statements)} statements (BEGIN among them) and a COMMIT, "
              f"CPU per read median {median * 1e3:.3f} ms, least {least * 1e3:.3f} ms ({load()})")
    finally:
        ws.close()


def statement_cost(url: str) -> None:
    engine = create_engine(url)
    by_id = select(principals).where(principals.c.id == bindparam("id"))  # the store's shape: prebuilt, cached
    with engine.connect() as conn:
        conn.exec_driver_sql(
            "CREATE TEMPORARY TABLE principals (id varchar(36) PRIMARY KEY, name varchar(100), kind varchar(10), "
            "roles json, groups json, token_hash varchar(64), acting_for varchar(36), created_at timestamptz, "
            "disabled_at timestamptz, token_expires_at timestamptz, last_used_at timestamptz)")
        conn.execute(text("INSERT INTO principals VALUES ('p1', 'alice', 'person', '[]', '[]', 'h', NULL, now(), "
                          "NULL, NULL, NULL)"))
        raw = conn.connection.dbapi_connection
        assert isinstance(raw, psycopg.Connection)
        cursor = raw.cursor()
        cases: list[tuple[str, Callable[[], object]]] = [
            ("psycopg alone: SELECT 1", lambda: cursor.execute("SELECT 1").fetchone()),
            ("psycopg alone: a principal by id", lambda: cursor.execute(
                "SELECT * FROM principals WHERE id = %s", ("p1",)).fetchone()),
            ("SQLAlchemy Core: a principal by id", lambda: conn.execute(by_id, {"id": "p1"}).mappings().first()),
        ]
        for label, call in cases:
            started = time.perf_counter()
            median, least = cpu_per_call(call, per_round=1000)
            wall = (time.perf_counter() - started) / ((ROUNDS + 1) * 1000)
            print(f"  one statement, {label:36}: CPU median {median * 1e6:5.0f} µs, least {least * 1e6:5.0f} µs; "
                  f"wall {wall * 1e6:5.0f} µs")
    engine.dispose()


def main() -> None:
    configure_logging("warning")
    admin_url = sys.argv[1] if len(sys.argv) > 1 else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    print(f"a read's statements and what each costs; {load()}")
    with scratch_database(admin_url, "reads") as url, tempfile.TemporaryDirectory() as tmp:
        read_cost(Path(tmp) / "sqlite-home", None, Path(tmp) / "clone-sqlite")
        read_cost(Path(tmp) / "pg-home", url, Path(tmp) / "clone-pg")
        assert url is not None
        statement_cost(url)
    print(f"done; {load()}")


if __name__ == "__main__":
    main()
