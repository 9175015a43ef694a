"""Where the command's jobs run. On PostgreSQL the workers run them: `gateway apply` and `gateway sync` queue the job
and follow the worker that runs it to its end (its progress, its outcome, the same exit codes), and with no worker
live they queue nothing and say so. (On the embedded default the command runs the job itself: tests/test_cli.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.workers import live_workers
from gateway.services.day_two.simulator import inject_delay
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People, add_people, make_workspace, run_cli

pytestmark = pytest.mark.postgres

STAGING = "stacks/app-staging/main.tf"
PROD = "stacks/app-prod/main.tf"


@pytest.fixture
def pg(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Workspace, People, Clone]]:
    ws = make_workspace(tmp_path / "home", postgres_url)
    try:
        yield ws, add_people(ws), Clone(ws, tmp_path / "clone")
    finally:
        ws.close()


def _proposal(ws: Workspace, people: People, clone: Clone, branch: str, path: str, old: str, new: str,
              approved: bool = True) -> int:
    clone.branch(branch).edit(path, old, new).push()
    pid = open_proposal(ws, people.alice, branch, f"change {branch}").id
    if approved:
        decide(ws, people.bob, pid, Decision.APPROVE, "ok")
    return pid


def _until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _cli(ws: Workspace, people: People, *args: str) -> tuple[int, str, str]:
    done = run_cli(list(args), ws.settings.home, token=people.tokens["alice"], database_url=ws.settings.database_url)
    return done.returncode, done.stdout, done.stderr


def test_with_a_busy_worker_the_command_queues_the_apply_and_follows_the_worker_to_its_end(
        pg: tuple[Workspace, People, Clone]) -> None:
    ws, people, clone = pg
    busy = _proposal(ws, people, clone, "staging", STAGING, '"t3.small"', '"t3.medium"')
    mine = _proposal(ws, people, clone, "prod", PROD, '"t3.large"', '"t3.medium"')
    unapproved = _proposal(ws, people, clone, "prod-tags", PROD, '"cc-3003"', '"cc-3004"', approved=False)
    inject_delay(ws, people.admin, "app-staging", "aws_instance.web[0]", 3)
    worker = Worker(ws, loops=1, poll_seconds=0.05, name="platform-worker").start()
    try:
        _until(lambda: live_workers(ws))
        first = enqueue_job(ws, people.alice, JobKind.APPLY, busy)
        _until(lambda: ws.store.queue.get(first.id).status == JobStatus.RUNNING)  # its one loop is taken

        code, out, err = _cli(ws, people, "apply", str(mine))
        assert code == 0, err
        assert "merged into main" in out and "stack app-prod: applied" in out
        [job] = [j for j in ws.store.queue.of_proposal(mine) if j.kind == JobKind.APPLY]
        assert job.runner == "platform-worker/0"  # the worker ran it, after the one in hand; never the command
        assert f"job {job.id} ran on worker platform-worker/0" in err and "  merging into main" in err
        assert ws.store.queue.get(first.id).finished_at <= job.started_at  # type: ignore[operator]

        code, out, err = _cli(ws, people, "apply", str(unapproved))
        assert code == 1 and "refused: needs 1 approval(s)" in err  # a refusal exits as it always did
        assert ws.store.queue.of_proposal(unapproved)[-1].runner == "platform-worker/0"
        code, out, err = _cli(ws, people, "sync", str(unapproved))
        assert code == 0 and "ran on worker platform-worker/0" in err
    finally:
        worker.stop()
    assert get_proposal(ws, mine).status.value == "applied"


def test_with_no_worker_live_the_command_queues_nothing_and_says_so(pg: tuple[Workspace, People, Clone]) -> None:
    ws, people, clone = pg
    pid = _proposal(ws, people, clone, "prod", PROD, '"t3.large"', '"t3.medium"')
    stopped = Worker(ws, loops=1, poll_seconds=0.05, name="gone-worker").start()
    _until(lambda: live_workers(ws))
    stopped.stop()  # registered once, stopped cleanly: not live

    code, out, err = _cli(ws, people, "apply", str(pid))
    assert code == 1
    assert err.strip().startswith("refused: no worker is live on this database") and "nothing was queued" in err
    assert "Traceback" not in err and ws.store.queue.of_proposal(pid) == []
    with ws.store.session(readonly=True) as session:
        assert not [e for e in session.audit.events(proposal_id=pid) if e.kind.startswith("job.")]
    assert get_proposal(ws, pid).status.value == "open"

    code, out, err = _cli(ws, people, "apply", str(pid), "--no-wait")  # queued for whichever worker comes
    assert code == 0 and "follow it with `gateway job 1 --wait`" in out
    assert ws.store.queue.get(1).status == JobStatus.QUEUED
    code, out, err = _cli(ws, people, "job", "1", "--wait")  # following it gives up while no worker is there
    assert code == 1 and "job 1 is still queued and no worker is live to take it: it runs when one starts" in err
    assert ws.store.queue.get(1).status == JobStatus.QUEUED


def test_the_command_stops_following_a_queued_job_once_no_worker_is_live(pg: tuple[Workspace, People, Clone]) -> None:
    ws, people, clone = pg
    pid = _proposal(ws, people, clone, "prod", PROD, '"t3.large"', '"t3.medium"')
    ws.store.workers.register("leaving-worker", 5.0)  # live as its beats say, and never claiming: it is leaving
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_TOKEN": people.tokens["alice"],
                "GATEWAY_DATABASE_URL": str(ws.settings.database_url)})
    following = subprocess.Popen([sys.executable, "-m", "gateway.cli", "apply", str(pid)], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _until(lambda: ws.store.queue.of_proposal(pid), timeout=60)
        ws.store.workers.stop("leaving-worker")
        _, err = following.communicate(timeout=60)
    finally:
        if following.poll() is None:
            following.kill()
    assert following.returncode == 1
    assert "job 1 is still queued and no worker is live any more to take it: it runs when one starts" in err
    assert ws.store.queue.get(1).status == JobStatus.QUEUED
