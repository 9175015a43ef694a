"""A worker's housekeeping: each step runs on its own, and racing workers never trip over each other."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gateway.domain.audit import Checkpoint
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.principals import GITHUB
from gateway.services.admin.audit import sign_checkpoint
from gateway.services.change.jobs import recover_abandoned_work
from gateway.services.change.recovery import HANDLING_ATTEMPTS
from gateway.services.workspace import Workspace
from gateway.worker import run_housekeeping

from .conftest import Clone, add_people


def test_two_workers_signing_the_same_checkpoint_at_once_keep_one_and_neither_fails(any_workspace: Workspace) -> None:
    ws = any_workspace
    first = sign_checkpoint(ws)
    twin = Checkpoint(first.seq + 1000, first.hash, first.at, first.public_key, first.signature)
    held, kept, errors = threading.Event(), [], []

    def sign_and_hold() -> None:
        with ws.store.session() as session:  # the first worker has written its checkpoint, not yet committed
            kept.append(session.audit.add_checkpoint(twin))
            held.wait(10)

    def sign_at_once() -> None:
        try:
            with ws.store.session() as session:
                kept.append(session.audit.add_checkpoint(twin))
        except Exception as exc:  # what the housekeeping pass would have died of
            errors.append(exc)

    holder = threading.Thread(target=sign_and_hold)
    holder.start()
    time.sleep(0.3)
    racer = threading.Thread(target=sign_at_once)
    racer.start()
    time.sleep(0.5)  # the second worker is waiting on the first's row (or its transaction)
    held.set()
    holder.join(10)
    racer.join(10)
    assert errors == []
    assert sorted(kept) == [False, True]
    with ws.store.session(readonly=True) as session:
        assert [c.seq for c in session.audit.checkpoints()].count(twin.seq) == 1


def test_a_broken_gateway_yaml_on_main_stops_no_other_housekeeping_step(workspace: Workspace, tmp_path: Path) -> None:
    ws = workspace
    add_people(ws)  # some events for a checkpoint to sign
    ws.settings = ws.settings.model_copy(update={"audit_checkpoint_minutes": 0})
    clone = Clone(ws, tmp_path / "c")
    clone.repo.git.checkout("-B", "main", "origin/main")
    clone.write("gateway.yaml", "stacks: [this is: not a mapping\n").push("broken settings, pushed outside the gateway")

    failed = run_housekeeping(ws)

    assert failed  # the steps that read main's settings say so in the log...
    assert "checkpoint" not in failed and "recover" not in failed and "break_glass_sweep" not in failed
    with ws.store.session(readonly=True) as session:  # ...and the others still ran: the chain's head is signed
        head, kept = session.audit.chain_head(), session.audit.checkpoints()
    assert head is not None and kept and kept[-1].seq == head[0]


def test_a_delivery_whose_worker_died_while_handling_it_is_handled_again_never_dropped(any_workspace: Workspace) -> None:
    ws = any_workspace
    with ws.store.session() as session:
        job_id = session.jobs.add(JobKind.WEBHOOK, None, GITHUB, {"delivery": "d-1"})
    dead = ws.store.queue.claim("dead-host:1", job_id=job_id)  # claimed, then the worker was killed
    assert dead is not None and dead.status is JobStatus.RUNNING
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": 0.2})
    time.sleep(0.3)  # its heartbeat lapses

    recovered = recover_abandoned_work(ws)

    again = ws.store.queue.get(job_id)
    assert again.status is JobStatus.QUEUED and f"job {job_id} of worker dead-host:1, queued again" in recovered
    assert "stopped heart-beating while handling it" in (again.error or "")
    with ws.store.session(readonly=True) as session:
        assert [e.kind for e in session.audit.events(kind="job.retrying")] == ["job.retrying"]
    for attempt in range(2, HANDLING_ATTEMPTS + 1):  # a delivery that keeps killing its worker is given up
        assert ws.store.queue.claim(f"dead-host:{attempt}", job_id=job_id) is not None
        time.sleep(0.3)
        recover_abandoned_work(ws)
    assert ws.store.queue.get(job_id).status is JobStatus.INTERRUPTED
