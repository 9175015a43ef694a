"""One writer per stack, across processes; a dead runner's lock is recovered and its apply recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert

from gateway.adapters.store.rows import now
from gateway.adapters.store.schema import stack_locks
from gateway.domain.errors import LockTimeout
from gateway.domain.principals import SystemActor
from gateway.domain.proposal import Decision, ProposalStatus, Transition
from gateway.services.change.planning import plan_stack
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.change.workers import live_workers
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, add_people

STAGING = "stacks/app-staging/main.tf"


def spawn_apply(ws: Workspace, token: str, proposal_id: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_TOKEN": token, "GATEWAY_LOCK_WAIT_SECONDS": "60"})
    if ws.settings.database_url:
        env["GATEWAY_DATABASE_URL"] = ws.settings.database_url
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "apply", str(proposal_id)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_processes_applying_to_one_stack(any_workspace: Workspace, tmp_path: Path) -> None:
    ws = any_workspace
    people = add_people(ws)
    clone = Clone(ws, tmp_path / "clone")
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    clone.branch("cost-centre").edit(STAGING, '"cc-3003"', '"cc-3004"').push()
    ids = [open_proposal(ws, people.alice, b, b).id for b in ("bigger", "cost-centre")]
    for pid in ids:
        decide(ws, people.bob, pid, Decision.APPROVE, "")
    serial_before = ws.engine.state_serial("app-staging")

    worker = None
    if ws.store.dialect != "sqlite":  # there the workers run the jobs the commands queue, two at once here
        ws.settings = ws.settings.model_copy(update={"lock_wait_seconds": 60})
        worker = Worker(ws, loops=2, poll_seconds=0.05).start()
        deadline = time.monotonic() + 30
        while not live_workers(ws) and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        runs = [spawn_apply(ws, people.tokens["alice"], pid) for pid in ids]
        results = [(p.wait(timeout=180), *p.communicate()) for p in runs]
    finally:
        if worker is not None:
            worker.stop()

    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, _, err in results if code == 1)
    assert "state of stack app-staging moved since its plan" in loser
    winner = ids[[code for code, _, _ in results].index(0)]
    assert get_proposal(ws, winner).status == ProposalStatus.APPLIED
    # state is consistent: exactly the winner's change, and main (now the winner's branch) plans clean
    assert ws.engine.state_serial("app-staging") > serial_before
    assert not plan_stack(ws, "app-staging", "main").plan.has_changes
    assert ws.store.locks.holder("app-staging") is None


def test_the_same_proposal_applied_twice_at_once_applies_once(workspace: Workspace, tmp_path: Path) -> None:
    people = add_people(workspace)
    Clone(workspace, tmp_path / "clone").branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    pid = open_proposal(workspace, people.alice, "bigger", "x").id
    decide(workspace, people.bob, pid, Decision.APPROVE, "")
    # another runner holds the stack, so the job waits for it until both callers have asked
    assert workspace.store.locks.acquire("app-staging", "other-host:1", ttl_seconds=600).taken
    runs = [spawn_apply(workspace, people.tokens["alice"], pid) for _ in range(2)]
    asked = [p.stderr.readline() for p in runs if p.stderr]
    workspace.store.locks.release("app-staging", "other-host:1")
    results = [(p.wait(timeout=180), *p.communicate()) for p in runs]
    # both asked for the same apply: one job, run once, and both callers see its end
    assert [code for code, _, _ in results] == [0, 0], results
    assert asked == ["job 1 queued: apply of proposal 1\n"] * 2, results
    assert all("merged into main" in out for _, out, _ in results), results
    with workspace.store.session() as session:
        assert [a.status for a in session.proposals.applies_of(pid)] == ["succeeded"]
    assert [j.status.value for j in workspace.store.queue.of_proposal(pid)] == ["succeeded"]

    # asked once more after it ended: refused at once, and no job is queued to refuse it later
    late = spawn_apply(workspace, people.tokens["alice"], pid)
    code, _, err = late.wait(timeout=180), *late.communicate()
    assert (code, err) == (1, "refused: proposal 1 is applied\n")
    assert len(workspace.store.queue.of_proposal(pid)) == 1


def test_a_live_lock_makes_the_apply_wait_then_refuse_naming_the_holder(workspace: Workspace, tmp_path: Path) -> None:
    people = add_people(workspace)
    Clone(workspace, tmp_path / "clone").branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    pid = open_proposal(workspace, people.alice, "bigger", "x").id
    decide(workspace, people.bob, pid, Decision.APPROVE, "")
    taken = workspace.store.locks.acquire("app-staging", "other-host:4242", ttl_seconds=600).taken
    assert taken
    with pytest.raises(LockTimeout, match="stack app-staging is locked by runner other-host:4242"):
        apply_proposal(workspace, people.alice, pid)
    assert get_proposal(workspace, pid).status == ProposalStatus.OPEN


def test_a_dead_runners_lock_is_recovered_and_its_apply_recorded_as_interrupted(workspace: Workspace, tmp_path: Path) -> None:
    people = add_people(workspace)
    clone = Clone(workspace, tmp_path / "clone")
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    first = open_proposal(workspace, people.alice, "bigger", "x").id
    decide(workspace, people.bob, first, Decision.APPROVE, "")
    # a runner started applying `first`, then died: its apply is "running" and its lock has expired
    plan_id = get_proposal(workspace, first).plans["app-staging"].plan_id
    with workspace.store.session() as session:
        dead_apply = session.proposals.start_apply(first, "app-staging", plan_id, "dead-host:1", "0" * 40)
        held = session.proposals.get(first, lock=True)
        held.move(Transition.START_APPLY, SystemActor("dead-host:1"), {})
        session.proposals.save(held)
        session.conn.execute(insert(stack_locks).values(
            stack="app-staging", holder="dead-host:1", apply_id=dead_apply,
            acquired_at=now() - timedelta(hours=2), expires_at=now() - timedelta(hours=1)))
    clone.branch("cost-centre").edit(STAGING, '"cc-3003"', '"cc-3004"').push()
    second = open_proposal(workspace, people.alice, "cost-centre", "y").id
    decide(workspace, people.bob, second, Decision.APPROVE, "")

    assert apply_proposal(workspace, people.alice, second).succeeded
    with workspace.store.session() as session:
        record = session.proposals.get_apply(dead_apply)
        interrupted = [e for e in session.audit.events() if e.kind == "apply.interrupted"]
    assert record.status == "interrupted" and "dead-host:1" in record.error
    assert interrupted and interrupted[0].payload["runner"] == "dead-host:1"
    assert get_proposal(workspace, first).status == ProposalStatus.FAILED


def test_two_workers_setting_one_marker_at_once_both_succeed(any_workspace: Workspace) -> None:
    """Two workers that both saw main move set its marker in the same moment: neither fails on the other's row (a
    delete then an insert did, on PostgreSQL), and the marker holds one of their values."""
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        for i in range(40):
            barrier.wait(10)
            try:
                with any_workspace.store.session() as session:
                    session.main.set_marker("main_seen", f"{name}-{i}")
            except BaseException as exc:  # noqa: BLE001 - the test reports any failure
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with any_workspace.store.session(readonly=True) as session:
        assert session.main.marker("main_seen") in {"a-39", "b-39"}
