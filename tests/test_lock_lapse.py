"""Stack locks fail closed: a lock whose heartbeat could not renew it within its TTL is lost, and the runner stops.

The database is made to stop answering the heartbeat (PostgreSQL: another session holds the lock
table; SQLite: another connection holds the write lock) for longer than the TTL while the engine
applies. Another runner could have broken the lock in that window, so the runner must not merge:
it stops before the merge, keeps the applied change's stacks as an unmerged proposal, and says why.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, func, select, text

from gateway.adapters.store.schema import sandbox_faults
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import ApplyReport, apply_proposal, merge_unmerged
from gateway.services.day_two.simulator import inject_delay
from gateway.services.workspace import Workspace

from .conftest import Clone, add_people

TTL = 1.0
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-${local.env}"\n  tags = local.tags\n}\n'


@contextmanager
def _database_not_answering_lock_renewals(ws: Workspace) -> Iterator[None]:
    url = ws.settings.database_url
    if url is None or url.startswith("sqlite"):
        conn = sqlite3.connect(ws.settings.home / "gateway.db" if url is None else url.removeprefix("sqlite:///"),
                               isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")  # every writer waits: the heartbeat's renewals with them
        try:
            yield
        finally:
            conn.execute("COMMIT")
            conn.close()
        return
    engine = create_engine(url)
    with engine.connect() as conn, conn.begin():
        conn.execute(text("LOCK TABLE stack_locks IN ACCESS EXCLUSIVE MODE"))
        yield
    engine.dispose()


def _delay_taken(ws: Workspace) -> bool:
    with ws.store.db.transaction(readonly=True) as conn:
        return not conn.scalar(select(func.count()).select_from(sandbox_faults))


def test_a_lock_not_renewed_within_its_ttl_stops_the_runner_before_the_merge(any_workspace: Workspace,
                                                                              tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    Clone(ws, tmp_path / "c").branch("refunds").write("stacks/app-staging/queue.tf", QUEUE).push()
    pid = open_proposal(ws, people.alice, "refunds", "refund events").id
    decide(ws, people.bob, pid, Decision.APPROVE, "ok")
    inject_delay(ws, people.admin, "app-staging", "aws_sqs_queue.refunds", 2.5)
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": TTL})

    reports: list[ApplyReport] = []
    runner = threading.Thread(target=lambda: reports.append(apply_proposal(ws, people.alice, pid, "runner-a")))
    runner.start()
    deadline = time.monotonic() + 60
    while not _delay_taken(ws) and time.monotonic() < deadline:  # the engine is inside the slow step
        time.sleep(0.05)
    with _database_not_answering_lock_renewals(ws):
        time.sleep(TTL * 1.6)
    runner.join(60)

    report = reports[0]
    assert report.merge_sha is None and not report.succeeded
    assert "were not renewed within their TTL" in (report.unmerged or "")
    proposal = get_proposal(ws, pid)
    assert proposal.status == ProposalStatus.UNMERGED  # applied, never merged on top of a lock it lost
    assert "queue.tf" not in ws.repo.read_tree(ws.repo.resolve("main"), "stacks/app-staging")
    assert "aws_sqs_queue.refunds" in ws.simulator.read_state("app-staging").resources
    assert ws.store.locks.holder("app-staging").kept_for_unmerged
    with ws.store.session(readonly=True) as session:
        blocked = [e for e in session.audit.events(proposal_id=pid) if e.kind == "proposal.block_merge"]
    assert "stopped before the merge" in blocked[-1].payload["reason"]

    merge_unmerged(ws, people.bob, pid)  # the way out: a person merges exactly what was applied
    assert get_proposal(ws, pid).status == ProposalStatus.APPLIED
    assert "aws_sqs_queue" in ws.repo.read_file(ws.repo.resolve("main"), "stacks/app-staging/queue.tf")
    assert ws.store.locks.holder("app-staging") is None
