"""Workers: jobs claimed from the database, heart-beaten, and every end recorded, even a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.adapters.store.schema import sandbox_faults
from gateway.domain.applies import ApplyRecord
from gateway.domain.errors import Refused
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.services.change.jobs import enqueue_job, follow_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.day_two.simulator import inject_delay
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People, add_people

STAGING = "stacks/app-staging/main.tf"
PROD = "stacks/app-prod/main.tf"


def _approved(ws: Workspace, people: People, clone: Clone, branch: str, path: str, old: str, new: str) -> int:
    clone.branch(branch).edit(path, old, new).push(branch)
    proposal = open_proposal(ws, people.alice, branch, f"change {branch}")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    return proposal.id


def _wait_until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_two_worker_loops_apply_two_proposals_and_merge_both(any_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "c")
    staging = _approved(ws, people, clone, "staging", STAGING, '"t3.small"', '"t3.medium"')
    prod = _approved(ws, people, clone, "prod", PROD, '"t3.large"', '"t3.medium"')
    jobs = [enqueue_job(ws, people.alice, JobKind.APPLY, pid) for pid in (staging, prod)]
    assert enqueue_job(ws, people.alice, JobKind.APPLY, staging).id == jobs[0].id  # one unfinished apply each
    worker = Worker(ws, loops=2, poll_seconds=0.05).start()
    try:
        done = [follow_job(ws, j.id, lambda _: None, timeout_seconds=60) for j in jobs]
    finally:
        worker.stop()
    assert [j.status for j in done] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED], [j.error for j in done]
    assert all("merging into main" in j.progress for j in done)
    assert {get_proposal(ws, pid).status for pid in (staging, prod)} == {ProposalStatus.APPLIED}
    main = ws.repo.resolve("main")
    assert '"t3.medium"' in ws.repo.read_file(main, STAGING)


def test_a_worker_killed_mid_apply_is_recorded_interrupted_never_success(any_workspace: Workspace,
                                                                        tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "c")
    proposal_id = _approved(ws, people, clone, "bigger", STAGING, '"t3.small"', '"t3.medium"')
    inject_delay(ws, people.admin, "app-staging", "aws_instance.web[0]", 60)
    job = enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_TOKEN": people.tokens["admin"],
                "GATEWAY_LOCK_TTL_SECONDS": "1.5"})
    if ws.settings.database_url:
        env["GATEWAY_DATABASE_URL"] = ws.settings.database_url
    process = subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.1"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # the worker is inside the slow step: its apply is running and it has taken the delay
        _wait_until(lambda: any(a.status == "running" for a in _applies(ws, proposal_id)) and not _faults(ws))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
    assert get_proposal(ws, proposal_id).status == ProposalStatus.APPLYING  # what the dead worker left
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": 1.5})
    time.sleep(1.6)  # past the dead worker's last heartbeat
    survivor = Worker(ws, loops=1, poll_seconds=0.05).start()
    try:
        _wait_until(lambda: ws.store.queue.get(job.id).finished)
    finally:
        survivor.stop()
    assert ws.store.queue.get(job.id).status == JobStatus.INTERRUPTED
    assert [a.status for a in _applies(ws, proposal_id)] == ["interrupted"]
    assert get_proposal(ws, proposal_id).status == ProposalStatus.FAILED
    assert ws.store.locks.holder("app-staging") is None
    with ws.store.session() as session:
        kinds = [e.kind for e in session.audit.events(proposal_id=proposal_id)]
    assert "apply.succeeded" not in kinds and "proposal.interrupt" in kinds and "job.interrupted" in kinds
    # a person retries: nothing of it was applied, so the same plan and approval still hold
    retry = enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id)
    again = Worker(ws, loops=1, poll_seconds=0.05).start()
    try:
        finished = follow_job(ws, retry.id, lambda _: None, timeout_seconds=60)
    finally:
        again.stop()
    assert finished.status == JobStatus.SUCCEEDED, finished.error
    assert get_proposal(ws, proposal_id).status == ProposalStatus.APPLIED


def test_a_worker_replans_a_proposal_whose_branch_moved(workspace: Workspace, people: People, clone: Clone) -> None:
    ws = workspace
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(ws, people.alice, "bigger", "more memory")
    new_head = clone.edit(STAGING, '"t3.medium"', '"t3.large"').push()
    worker = Worker(ws, loops=1, poll_seconds=0.05).start()
    try:
        _wait_until(lambda: get_proposal(ws, proposal.id).head_sha == new_head)
    finally:
        worker.stop()
    jobs = ws.store.queue.of_proposal(proposal.id)
    assert [(j.kind, j.status) for j in jobs] == [(JobKind.PLAN, JobStatus.SUCCEEDED)]
    assert any("new commit" in line for line in jobs[0].progress)


def test_an_auditor_or_an_agent_cannot_queue_an_apply(workspace: Workspace, people: People, clone: Clone) -> None:
    proposal_id = _approved(workspace, people, clone, "bigger", STAGING, '"t3.small"', '"t3.medium"')
    for who, reason in ((people.dana, "dana has no role"), (people.agent, "agents can never apply")):
        with pytest.raises(Refused, match=reason):
            enqueue_job(workspace, who, JobKind.APPLY, proposal_id)
    assert workspace.store.queue.of_proposal(proposal_id) == []


def _faults(ws: Workspace) -> int:
    with ws.store.db.transaction() as conn:
        return int(conn.scalar(select(func.count()).select_from(sandbox_faults)) or 0)


def _applies(ws: Workspace, proposal_id: int) -> list[ApplyRecord]:
    with ws.store.session() as session:
        return session.proposals.applies_of(proposal_id)


def test_the_registry_tells_the_live_workers_on_both_databases(any_workspace: Workspace) -> None:
    from gateway.services.change.workers import live_workers

    registry = any_workspace.store.workers
    registry.register("host-a:1", beat_seconds=60)
    registry.register("host-b:2", beat_seconds=0.1)  # beats fast: dead after three missed beats
    registry.register("host-c:3", beat_seconds=60)
    registry.stop("host-c:3")
    assert [w.name for w in live_workers(any_workspace)] == ["host-a:1", "host-b:2"]
    time.sleep(0.4)
    assert [w.name for w in live_workers(any_workspace)] == ["host-a:1"]
    assert not registry.beat("host-c:3", 60)  # a stopped worker's late beat does not bring it back
    assert registry.beat("host-b:2", 0.1)  # a slow one that beats again is live again
    assert [w.name for w in live_workers(any_workspace)] == ["host-a:1", "host-b:2"]
    registry.register("host-c:3", beat_seconds=60)  # a name used before starts afresh
    found = {w.name: w for w in live_workers(any_workspace)}
    assert set(found) == {"host-a:1", "host-b:2", "host-c:3"} and found["host-c:3"].stopped_at is None
