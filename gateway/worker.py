"""`gateway worker`: loops that claim plan and apply jobs from the database and run them.

Each loop has its own git handle and claims one job at a time; any number of worker processes on
any number of machines can share one PostgreSQL. A housekeeping thread beside the loops records
the work of workers that stopped heart-beating as interrupted, and queues a plan job for every open
proposal whose branch, main or stack state moved (reads never re-plan), and a publish job for every
pull request that shows less than its proposal's trail; it also signs a checkpoint of the audit chain when one
is due, and queues the notifications of what the trail recorded since its last pass. A worker is in the worker
registry from when its database answers until it stops (`Presence`), and its ready file is there only while its
loops run and the database answers.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.domain.backoff import Backoff
from gateway.domain.errors import DatabaseUnavailable, GatewayError
from gateway.domain.jobs import Job, JobKind
from gateway.domain.operations import failed_checks
from gateway.domain.principals import GATEWAY
from gateway.logs import get_logger
from gateway.services.admin.audit import checkpoint_if_due
from gateway.services.admin.operations import check_readiness
from gateway.services.admin.startup import Outage, bring_database_up
from gateway.services.change.jobs import enqueue_moved_proposals, recover_abandoned_work, run_job
from gateway.services.change.main_watch import watch_main
from gateway.services.change.workers import Presence
from gateway.services.day_two.break_glass import sweep_break_glass
from gateway.services.day_two.drift_records import check_scheduled_drift
from gateway.services.forge.github import queue_behind
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace

log = get_logger(__name__)

HOUSEKEEPING_SECONDS = 2.0
READINESS_SECONDS = 2.0


# Jobs a stopping worker may give back to the queue unfinished: running them again from the start is what they are
# made for (a re-plan catches up with whatever it finds; a publish converges). An apply is never handed back: it
# runs to a recorded end (applied, failed naming what was done, unmerged), so the grace must outlast it.
HAND_BACK = frozenset({JobKind.PLAN, JobKind.PLAN_STACK, JobKind.PUBLISH})


class Worker:
    """`loops` threads claiming jobs until stopped."""

    def __init__(self, ws: Workspace, loops: int = 1, poll_seconds: float = 0.5, name: str | None = None,
                 ready_file: Path | None = None):
        self.ws = ws
        self.loops = loops
        self.poll_seconds = poll_seconds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.ready_file = ready_file
        self.presence = Presence(ws, self.name)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._working = threading.Event()  # the database came up and the loops run: only then can it be ready
        self._in_hand: dict[int, Job] = {}  # loop index -> the job it runs
        self._work = [threading.Thread(target=self._loop, args=(i,), name=f"worker-{i}", daemon=True)
                      for i in range(loops)]
        self._work.append(threading.Thread(target=self._housekeeping_loop, name="housekeeping", daemon=True))
        self._threads = [threading.Thread(target=self._start_work, name="database", daemon=True)]
        if ready_file is not None:
            self._threads.append(threading.Thread(target=self._readiness_loop, name="readiness", daemon=True))

    def start(self) -> Worker:
        """Start at once, whatever the database is doing: the loops begin when it answers at this code's schema
        (brought up, and migrated, by the first thread); until then the ready file is absent (one a killed worker left
        behind is removed first), and the worker is not in the registry."""
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        for thread in self._threads:
            thread.start()
        log.info("worker.started", worker=self.name, loops=self.loops)
        return self

    def _start_work(self) -> None:
        if bring_database_up(self.ws, f"worker {self.name}", self._stop):
            self.presence.start()
            for thread in self._work:
                thread.start()
            self._working.set()

    def in_hand(self) -> list[Job]:
        return list(self._in_hand.values())

    def stop(self, grace_seconds: float | None = None) -> list[int]:
        """Claim no more; finish the jobs in hand. Past `grace_seconds` (None: no limit), hand back the jobs that
        may run again from the start and stop waiting for them; an apply is always waited for. The ids handed back."""
        self._stop.set()
        self.ws.store.queue.wake()  # loops waiting for work look up and see the stop
        self._set_ready(False)
        deadline = None if grace_seconds is None else time.monotonic() + grace_seconds
        handed: list[int] = []
        past_grace = False
        while any(thread.is_alive() for thread in self._threads + self._work):
            if not past_grace and deadline is not None and time.monotonic() >= deadline:
                past_grace, handed = True, self._hand_back()
            if past_grace and all(job.kind in HAND_BACK for job in self.in_hand()):
                break  # nothing left that must reach its end in this process
            time.sleep(0.05)
        self.presence.stop()
        self._stopped.set()
        log.info("worker.stopped", worker=self.name, handed_back=handed)
        return handed

    def wait(self) -> None:
        """Until `stop` has finished (in small steps, so Ctrl-C reaches the main thread)."""
        while not self._stopped.wait(0.5):
            pass

    def _hand_back(self) -> list[int]:
        """Put the replayable jobs in hand back in the queue for another worker (this process is about to end, and
        their threads with it: whatever a re-plan had not committed is simply done again)."""
        handed = []
        for job in self.in_hand():
            if job.kind not in HAND_BACK:
                continue
            with self.ws.store.session() as session:
                if session.jobs.retry(job.id, self.ws.clock.now(), f"handed back by worker {self.name}, stopping"):
                    session.audit.append(GATEWAY, "job.handed_back", {"job": job.id, "kind": job.kind.value,
                                                                      "runner": job.runner}, job.proposal_id)
                    handed.append(job.id)
            self.ws.metrics.job_retried(job.kind.value)
        return handed

    def _loop(self, index: int) -> None:
        ws = self.ws.for_request()
        runner = f"{self.name}/{index}"
        outage = Outage(runner, Backoff(first=self.poll_seconds))
        while not self._stop.is_set():
            try:
                seen = ws.store.queue.moves()
                job = ws.store.queue.claim(runner)
                outage.succeeded()
                if job is None:  # woken by a job queued (or finished) anywhere; the poll is the fallback
                    ws.store.queue.wait(seen, self.poll_seconds)
                    continue
                log.info("job.claimed", job=job.id, kind=job.kind.value, runner=runner)
                self._in_hand[index] = job
                try:
                    run_job(ws, job, runner)
                finally:
                    self._in_hand.pop(index, None)
            except Exception as exc:  # a loop never dies of one bad turn; the database may be restarting
                self._stop.wait(outage.failed(exc))

    def _housekeeping_loop(self) -> None:
        """Apart from the job loops, so a long scan never delays a claim."""
        ws = self.ws.for_request()
        outage = Outage(f"{self.name}/housekeeping", Backoff(first=HOUSEKEEPING_SECONDS))
        while not self._stop.is_set():
            try:
                run_housekeeping(ws)
            except DatabaseUnavailable as exc:
                self._stop.wait(outage.failed(exc))
                continue
            outage.succeeded()
            self._stop.wait(HOUSEKEEPING_SECONDS)

    def _readiness_loop(self) -> None:
        """Keep the ready file true: there while the database answers at this schema and the workspace reads, from
        when the loops run (a database that answered a readiness check is not yet one the loops were started on)."""
        ws = self.ws.for_request()
        while not self._stop.is_set():
            failed = failed_checks(check_readiness(ws))
            if failed and self._ready:
                log.warning("worker.not_ready", reason="; ".join(f"{c.name}: {c.failure}" for c in failed))
            self._set_ready(not failed and self._working.is_set() and not self._stop.is_set())
            self._stop.wait(READINESS_SECONDS)

    _ready = False

    def _set_ready(self, ready: bool) -> None:
        if self.ready_file is None or ready == self._ready:
            return
        self._ready = ready
        if ready:  # written whole, then renamed: a probe never reads half a file
            partial = self.ready_file.with_name(self.ready_file.name + ".partial")
            partial.write_text(json.dumps({"worker": self.name, "loops": self.loops}) + "\n")
            partial.replace(self.ready_file)
        else:
            self.ready_file.unlink(missing_ok=True)


def _recover(ws: Workspace) -> None:
    for what in recover_abandoned_work(ws):
        log.warning("worker.recovered", what=what)


HOUSEKEEPING: tuple[tuple[str, Callable[[Workspace], object]], ...] = (
    ("recover", _recover),
    ("watch_main", watch_main),
    ("replan_moved", enqueue_moved_proposals),
    ("publish_behind", queue_behind),
    ("checkpoint", checkpoint_if_due),
    ("drift_check", check_scheduled_drift),
    ("break_glass_sweep", sweep_break_glass),
    ("notify", queue_notifications),  # last: what the steps above recorded is told in the same pass
)


def run_housekeeping(ws: Workspace) -> list[str]:
    """One pass of every housekeeping step, each on its own: one that fails (a broken gateway.yaml pushed to
    main, a database hiccup, a race lost) is logged and never stops the others. A step of one repository's (its
    main, its proposals, its stacks) runs in each active repository in turn. The steps that failed."""
    failed = []
    for name, step in HOUSEKEEPING:
        for target in [ws] if name in GATEWAY_WIDE else _active_repositories(ws):
            try:
                step(target)
            except DatabaseUnavailable:
                raise  # no step runs without it: the loop waits it out, saying so once per backoff step
            except Exception:
                log.exception("worker.housekeeping_error", step=name, repository=target.repository)
                failed.append(name if target is ws else f"{name} ({target.repository})")
    return failed


GATEWAY_WIDE = frozenset({"recover", "checkpoint"})  # the queue, the locks and the trail are the gateway's


def _active_repositories(ws: Workspace) -> list[Workspace]:
    """This workspace, and that of every other active repository of the gateway."""
    with ws.store.session(readonly=True) as session:
        names = [r.name for r in session.repositories.list() if r.active and r.name != ws.repository]
    others = []
    for name in names:
        try:
            others.append(ws.in_repository(name))
        except GatewayError as exc:  # its folder gone: said once a pass, the others go on
            log.warning("worker.repository_unavailable", repository=name, error=str(exc))
    return [ws, *others]
