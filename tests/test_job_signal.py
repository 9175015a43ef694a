"""An idle worker claims a job as soon as it is queued, not at its next poll: from this process on SQLite and
PostgreSQL, and from another process on PostgreSQL (NOTIFY); a worker stops without sitting out its poll; and a
publish job, which only mirrors what is recorded, waits behind the others."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.principals import GATEWAY
from gateway.services.workspace import Workspace
from gateway.worker import Worker

POLL = 30.0  # a worker that waited out its poll would miss every deadline below by far


def queue_publish(ws: Workspace) -> int:
    """A job this process queues through a unit of work (a publish naming no proposal: it fails at once)."""
    with ws.store.session() as session:
        return session.jobs.add(JobKind.PUBLISH, None, GATEWAY)


def wait_finished(ws: Workspace, job_id: int, seconds: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if ws.store.queue.get(job_id).finished:
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} was not run within {seconds} s (the worker polls every {POLL} s)")


def idle_worker(ws: Workspace) -> Worker:
    worker = Worker(ws, loops=1, poll_seconds=POLL).start()
    time.sleep(0.5)  # it has found the queue empty and waits
    return worker


def test_a_job_queued_in_this_process_is_claimed_at_once(any_workspace: Workspace) -> None:
    ws = any_workspace
    worker = idle_worker(ws)
    try:
        for _ in range(3):  # each wait is woken, not only the first
            job_id = queue_publish(ws)
            assert wait_finished(ws, job_id, 5.0) < 5.0
            job = ws.store.queue.get(job_id)
            assert job.status == JobStatus.FAILED and "names no proposal" in (job.error or "")
            time.sleep(0.2)
    finally:
        started = time.monotonic()
        worker.stop()
        assert time.monotonic() - started < 5.0  # the stop wakes the waiting loop too


def test_a_publish_queued_first_is_claimed_after_the_work_people_wait_for(workspace: Workspace) -> None:
    publish = queue_publish(workspace)
    with workspace.store.session() as session:
        delivery = session.jobs.add(JobKind.WEBHOOK, None, GATEWAY, {"delivery": "d-1"})
    first, second = workspace.store.queue.claim("a"), workspace.store.queue.claim("b")
    assert first is not None and second is not None
    assert (first.id, second.id) == (delivery, publish)


def test_a_rolled_back_job_wakes_no_one_into_running_it(workspace: Workspace) -> None:
    with pytest.raises(RuntimeError):
        with workspace.store.session() as session:
            session.jobs.add(JobKind.PUBLISH, None, GATEWAY)
            raise RuntimeError("the use case failed")
    assert workspace.store.queue.claim("test") is None


@pytest.mark.postgres
def test_a_job_queued_by_another_process_wakes_the_worker_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    from tests.conftest import make_workspace

    ws = make_workspace(tmp_path / "home", postgres_url)
    worker = idle_worker(ws)
    try:
        script = textwrap.dedent(f"""
            from gateway.adapters.store.schema import Database
            from gateway.adapters.store.unit_of_work import SqlStore
            from gateway.domain.jobs import JobKind
            from gateway.domain.principals import GATEWAY
            store = SqlStore(Database({postgres_url!r}))
            with store.session() as session:
                print(session.jobs.add(JobKind.PUBLISH, None, GATEWAY))
            store.close()
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        job_id = int(done.stdout.strip())
        assert wait_finished(ws, job_id, 5.0) < 5.0
    finally:
        worker.stop()
        ws.close()


@pytest.mark.postgres
def test_the_listener_ends_when_no_one_waits_and_a_wait_starts_it_again(postgres_url: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from gateway.adapters.store import job_signal

    monkeypatch.setattr(job_signal, "IDLE_SECONDS", 0.3)
    conninfo = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    signal = job_signal.JobSignal()

    def notified_from_elsewhere() -> bool:
        seen = signal.count()
        signal.listen(conninfo)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # NOTIFY until the listener, connecting meanwhile, hears one
            with psycopg.connect(conninfo, autocommit=True) as other:
                other.execute(f"NOTIFY {job_signal.CHANNEL}")
            if signal.wait(seen, 0.5):
                return True
        return False

    assert notified_from_elsewhere()
    time.sleep(0.3 + 2 * job_signal.LISTEN_POLL_SECONDS)  # no one waits: it ends
    assert not any(listener.is_alive() for listener in signal._listeners)
    assert notified_from_elsewhere()  # the next wait listens again
    signal.stop_listening(conninfo)
