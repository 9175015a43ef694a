"""A worker killed at every step of an apply: each kill lands in a recorded state with a way out, and converges.

The worker is a real `gateway worker` process; GATEWAY_FAULT_POINT makes it end at the named step
exactly as `kill -9` would (gateway/fault_points.py). A surviving worker's recovery then reads what
the stacks really hold, and a person's retry or merge brings main and the cloud to the change,
applied once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.adapters.store.schema import sandbox_objects
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.fault_points import ENVIRONMENT_VARIABLE, EXIT_STATUS
from gateway.services.change.jobs import enqueue_job, recover_abandoned_work, run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import merge_unmerged
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people

TTL = 1.5
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-${local.env}"\n  tags = local.tags\n}\n'


def _propose(ws: Workspace, people: People, clone: Clone, stacks: list[str]) -> int:
    clone.branch("refunds")
    for stack in stacks:
        clone.write(f"stacks/{stack}/queue.tf", QUEUE)
    clone.push("a queue for refunds")
    proposal = open_proposal(ws, people.alice, "refunds", "refund events")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    return proposal.id


def _run_worker_until_the_fault(ws: Workspace, people: People, point: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_TOKEN": people.tokens["admin"],
                "GATEWAY_LOCK_TTL_SECONDS": str(TTL), ENVIRONMENT_VARIABLE: point})
    if ws.settings.database_url:
        env["GATEWAY_DATABASE_URL"] = ws.settings.database_url
    process = subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.1"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == EXIT_STATUS, stderr
    assert f"fault point {point} reached" in stderr


def _recover(ws: Workspace) -> list[str]:
    """What a surviving worker's housekeeping does once the dead worker's heartbeats have lapsed."""
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": TTL})
    time.sleep(TTL + 0.2)
    return recover_abandoned_work(ws)


def _apply_again(ws: Workspace, people: People, proposal_id: int) -> JobStatus:
    job = enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id)
    return run_now_or_follow(ws, job, "survivor", lambda _: None).status


def _queues_in_the_cloud(ws: Workspace) -> int:
    with ws.store.db.transaction() as conn:
        return int(conn.scalar(select(func.count()).select_from(sandbox_objects)
                               .where(sandbox_objects.c.type == "aws_sqs_queue")) or 0)


def _events(ws: Workspace, proposal_id: int) -> list:
    with ws.store.session(readonly=True) as session:
        return session.audit.events(proposal_id=proposal_id)


def _assert_converged(ws: Workspace, proposal_id: int, stacks: list[str]) -> None:
    """Main describes what runs: the queue is on main and in the cloud, once per stack; no lock is left."""
    assert get_proposal(ws, proposal_id).status == ProposalStatus.APPLIED
    main = ws.repo.resolve("main")
    for stack in stacks:
        assert "aws_sqs_queue" in ws.repo.read_file(main, f"stacks/{stack}/queue.tf")
        assert "aws_sqs_queue.refunds" in ws.simulator.read_state(stack).resources
        assert ws.store.locks.holder(stack) is None
    assert _queues_in_the_cloud(ws) == len(stacks)
    assert ws.store.locks.expired() == []


# (fault point, what recovery records the proposal as, the way out a person takes)
ONE_STACK = [
    ("apply.after_lock", ProposalStatus.OPEN, "retry"),
    ("apply.after_start_apply", ProposalStatus.FAILED, "retry"),
    ("apply.after_engine:app-staging", ProposalStatus.UNMERGED, "merge"),
    ("apply.after_stack:app-staging", ProposalStatus.UNMERGED, "merge"),
    ("apply.before_merge", ProposalStatus.UNMERGED, "merge"),
    ("apply.after_merge", ProposalStatus.APPLIED, None),
    ("apply.after_finish", ProposalStatus.APPLIED, None),
]


@pytest.mark.parametrize(("point", "recorded", "way_out"), ONE_STACK, ids=[p for p, _, _ in ONE_STACK])
def test_a_worker_killed_at_each_step_of_an_apply_leaves_a_state_with_a_way_out(
        any_workspace: Workspace, tmp_path: Path, point: str, recorded: ProposalStatus, way_out: str | None) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    proposal_id = _propose(ws, people, Clone(ws, tmp_path / "c"), ["app-staging"])
    job = enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id)

    _run_worker_until_the_fault(ws, people, point)
    _recover(ws)

    proposal = get_proposal(ws, proposal_id)
    assert proposal.status == recorded
    assert ws.store.queue.get(job.id).status == JobStatus.INTERRUPTED
    kinds = [e.kind for e in _events(ws, proposal_id)]
    assert "job.interrupted" in kinds
    if recorded == ProposalStatus.UNMERGED:
        # the queue runs but main lacks it: nothing else may plan or apply the stack until a person merges
        assert _queues_in_the_cloud(ws) == 1
        assert "aws_sqs_queue" not in ws.repo.read_tree(ws.repo.resolve("main"), "stacks/app-staging").get(
            "queue.tf", "")
        assert ws.store.locks.holder("app-staging").kept_for_unmerged
        settled = [e for e in _events(ws, proposal_id) if e.kind == "proposal.block_merge"][-1]
        assert "every stack was applied" in settled.payload["reason"]
        assert f"gateway merge {proposal_id}" in settled.payload["reason"]
        merge_unmerged(ws, people.bob, proposal_id)
    elif recorded == ProposalStatus.FAILED:
        settled = [e for e in _events(ws, proposal_id) if e.kind == "proposal.interrupt"][-1]
        assert "nothing was applied" in settled.payload["error"]
        assert _queues_in_the_cloud(ws) == 0
    if way_out == "retry":  # nothing ran: the same plans and approvals still hold
        assert _apply_again(ws, people, proposal_id) == JobStatus.SUCCEEDED
    _assert_converged(ws, proposal_id, ["app-staging"])


def test_a_worker_killed_between_two_stacks_is_recorded_failed_naming_what_was_done(
        any_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    proposal_id = _propose(ws, people, Clone(ws, tmp_path / "c"), ["app-prod", "app-staging"])
    enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id)

    _run_worker_until_the_fault(ws, people, "apply.after_engine:app-prod")
    _recover(ws)

    assert get_proposal(ws, proposal_id).status == ProposalStatus.FAILED
    settled = [e for e in _events(ws, proposal_id) if e.kind == "proposal.interrupt"][-1]
    assert "part-way" in settled.payload["error"]
    assert "stack app-prod: applied" in settled.payload["error"]
    assert "stack app-staging: not started" in settled.payload["error"]
    assert settled.payload["stacks"] == {"app-prod": "applied", "app-staging": "not started"}
    assert ws.store.locks.holder("app-prod") is None and ws.store.locks.holder("app-staging") is None

    # a retry re-plans (app-prod's state moved: its new plan changes nothing) and needs a fresh approval
    assert _apply_again(ws, people, proposal_id) == JobStatus.REFUSED
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "again")
    assert _apply_again(ws, people, proposal_id) == JobStatus.SUCCEEDED
    _assert_converged(ws, proposal_id, ["app-prod", "app-staging"])
