"""`gateway worker` as a service: a real worker process, its metrics port, its ready file, the registry, and SIGTERM.

Asked to stop in the middle of a slow apply, the worker claims nothing more, lets the apply run to its recorded
end (applied and merged), and exits 0: a stop never leaves an apply half-recorded, even with no grace at all. The
ready file is there while the database answers, gone while it does not, and gone once the worker stops (one a
killed worker left behind is gone when the next one starts). A running worker is counted alive in the registry
until it stops, or, killed, until it misses three beats.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.day_two.simulator import inject_delay
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.1)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def _start_worker(ws: Workspace, *args: str, database_url: str | None = None,
                  **settings: str) -> subprocess.Popen[str]:
    """The worker, its stderr in a file (a pipe nobody reads would block its logging, and so the worker)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_DATABASE_URL": database_url or ws.settings.db_url})
    env.update({f"GATEWAY_{name.upper()}": value for name, value in settings.items()})
    log = (ws.settings.home / "worker.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.1", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)


@pytest.fixture
def stopped_at_end() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_sigterm_during_an_apply_lets_it_finish_recorded_then_exits(
        workspace: Workspace, people: People, clone: Clone, tmp_path: Path,
        stopped_at_end: list[subprocess.Popen[str]]) -> None:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    decide(workspace, people.bob, proposal.id, Decision.APPROVE, "ok")
    inject_delay(workspace, people.admin, "app-staging", "aws_instance.web[0]", 3)  # a slow provider
    port, ready = _free_port(), tmp_path / "worker.ready"
    worker = _start_worker(workspace, "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                           "--ready-file", str(ready), "--grace", "0")
    stopped_at_end.append(worker)
    _until("the ready file", ready.exists)

    job = enqueue_job(workspace, people.alice, JobKind.APPLY, proposal.id)
    _until("the apply to reach its stack",
           lambda: any("applying stack" in line for line in workspace.store.queue.get(job.id).progress))
    running = _scrape(port)
    assert running[("gateway_jobs", (("kind", "apply"), ("status", "running")))] == 1

    worker.send_signal(signal.SIGTERM)
    worker.wait(60)
    err = (workspace.settings.home / "worker.log").read_text()
    assert worker.returncode == 0, err
    stopping = [json.loads(line) for line in err.splitlines() if "worker.stopping" in line]
    assert len(stopping) == 1 and len(stopping[0]["in_hand"]) == 1 and "worker.stopped" in err
    finished = workspace.store.queue.get(job.id)
    assert finished.status == JobStatus.SUCCEEDED, finished
    after = get_proposal(workspace, proposal.id)
    assert after.status == ProposalStatus.APPLIED and after.merge_sha
    assert not ready.exists()  # gone on stop: nothing routes work to a worker that is leaving


def test_a_stopped_worker_claims_nothing_more(workspace: Workspace, people: People, clone: Clone, tmp_path: Path,
                                              stopped_at_end: list[subprocess.Popen[str]]) -> None:
    ready = tmp_path / "worker.ready"
    worker = _start_worker(workspace, "--ready-file", str(ready))
    stopped_at_end.append(worker)
    _until("the ready file", ready.exists)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    clone.branch("later").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.large"').push()
    proposal = open_proposal(workspace, people.alice, "later", "queued after the stop")
    job = enqueue_job(workspace, people.alice, JobKind.PLAN, proposal.id)
    time.sleep(0.5)
    assert workspace.store.queue.get(job.id).status == JobStatus.QUEUED


def test_the_ready_file_follows_the_database(tmp_path: Path, postgres_url: str,
                                             stopped_at_end: list[subprocess.Popen[str]]) -> None:
    ws = make_workspace(tmp_path / "home", postgres_url)
    add_people(ws)
    ready = tmp_path / "worker.ready"
    worker = _start_worker(ws, "--ready-file", str(ready))
    stopped_at_end.append(worker)
    _until("the ready file", ready.exists)
    name = postgres_url.rsplit("/", 1)[1]
    admin = create_engine(postgres_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    ws.close()
    try:
        with admin.connect() as conn:  # the database stops taking connections, and drops the ones it had
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        _until("the ready file to go", lambda: not ready.exists(), timeout=30)
        assert worker.poll() is None  # not ready, still alive: it comes back by itself
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()
    _until("the ready file to come back", ready.exists, timeout=30)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0 and not ready.exists()


def test_past_its_grace_a_stopping_worker_hands_back_a_replan_but_never_an_apply(
        workspace: Workspace, people: People, clone: Clone) -> None:
    from dataclasses import replace

    from gateway.worker import Worker

    release = threading.Event()

    def slow_plan(ws: Workspace, job: Job, runner: str, progress: Callable[[str], None]) -> Any:
        progress("planning slowly")
        release.wait(30)  # a plan that outlasts the grace
        return JobStatus.SUCCEEDED, {}, None

    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    slow = replace(workspace, job_handlers={**workspace.job_handlers, JobKind.PLAN: slow_plan})
    worker = Worker(slow, loops=1, poll_seconds=0.05).start()
    plan = enqueue_job(workspace, people.alice, JobKind.PLAN, proposal.id)
    _until("the plan to run", lambda: workspace.store.queue.get(plan.id).status == JobStatus.RUNNING)
    started = time.monotonic()
    assert worker.stop(grace_seconds=0.5) == [plan.id]
    assert time.monotonic() - started < 5  # it did not wait for the plan
    handed = workspace.store.queue.get(plan.id)
    assert handed.status == JobStatus.QUEUED and handed.runner is None  # another worker takes it from here
    with workspace.store.session(readonly=True) as session:
        assert any(e.kind == "job.handed_back" for e in session.audit.events(proposal_id=proposal.id))
    release.set()

    decide(workspace, people.bob, proposal.id, Decision.APPROVE, "ok")
    with workspace.store.session() as session:  # the handed-back plan is someone else's now; an apply comes first
        session.jobs.finish(plan.id, JobStatus.SUCCEEDED, only_if_running=False)
    inject_delay(workspace, people.admin, "app-staging", "aws_instance.web[0]", 2)
    worker = Worker(workspace, loops=1, poll_seconds=0.05).start()
    apply = enqueue_job(workspace, people.alice, JobKind.APPLY, proposal.id)
    _until("the apply to run", lambda: workspace.store.queue.get(apply.id).status == JobStatus.RUNNING)
    assert worker.stop(grace_seconds=0.1) == []  # past the grace, and still waited for
    assert workspace.store.queue.get(apply.id).status == JobStatus.SUCCEEDED
    assert get_proposal(workspace, proposal.id).status == ProposalStatus.APPLIED


def test_a_worker_is_counted_alive_while_it_runs_and_not_once_stopped_or_killed(
        workspace: Workspace, stopped_at_end: list[subprocess.Popen[str]]) -> None:
    from gateway.services.change.workers import live_workers

    port = _free_port()
    first = _start_worker(workspace, "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                          worker_beat_seconds="0.2")
    stopped_at_end.append(first)
    _until("the worker to register", lambda: len(live_workers(workspace)) == 1)
    assert live_workers(workspace)[0].name.endswith(f":{first.pid}")
    _until("its metrics port", lambda: _scrape_or_none(port) is not None)
    time.sleep(1.0)  # past three beat intervals: still alive, because it beats
    assert [w.name for w in live_workers(workspace)] == [f"{socket.gethostname()}:{first.pid}"]
    assert _scrape(port)[("gateway_workers_alive", ())] == 1

    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert live_workers(workspace) == []  # a clean stop counts at once

    killed = _start_worker(workspace, worker_beat_seconds="0.2")
    stopped_at_end.append(killed)
    _until("the second worker to register", lambda: len(live_workers(workspace)) == 1)
    killed.kill()
    killed.wait(10)
    gone = time.monotonic()
    _until("the killed worker to be counted out", lambda: live_workers(workspace) == [], timeout=5)
    assert time.monotonic() - gone < 1.5  # three missed beats of 0.2 s, give or take a beat


def _scrape_or_none(port: int) -> dict | None:
    try:
        return _scrape(port)
    except httpx.HTTPError:
        return None


def test_a_ready_file_a_killed_worker_left_is_gone_before_the_next_worker_is_ready(
        workspace: Workspace, tmp_path: Path, stopped_at_end: list[subprocess.Popen[str]]) -> None:
    ready = tmp_path / "worker.ready"
    killed = _start_worker(workspace, "--ready-file", str(ready))
    stopped_at_end.append(killed)
    _until("the ready file", ready.exists)
    killed.kill()
    killed.wait(10)
    assert ready.exists()  # SIGKILL: nobody removed it

    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/gateway"  # a database that does not answer
    waiting = _start_worker(workspace, "--ready-file", str(ready), database_url=nowhere)
    stopped_at_end.append(waiting)
    _until("the stale ready file to go", lambda: not ready.exists(), timeout=30)
    time.sleep(1.0)
    assert not ready.exists() and waiting.poll() is None  # not ready (no database), and still waiting for it
