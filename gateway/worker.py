"""`gateway worker`: loops that claim plan and apply jobs from the database and run them.

Each loop has its own git handle and claims one job at a time; any number of worker processes on
any number of machines can share one PostgreSQL. A housekeeping thread beside the loops records
the work of workers that stopped heart-beating as interrupted, and queues a plan job for every open
proposal whose branch, main or stack state moved (reads never re-plan), and a publish job for every
pull request that shows less than its proposal's trail; it also signs a checkpoint of the audit chain when one
is due, and queues the notifications of what the trail recorded since its last pass.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from gateway.logs import get_logger
from gateway.services.admin.audit import checkpoint_if_due
from gateway.services.change.jobs import enqueue_moved_proposals, recover_abandoned_work, run_job
from gateway.services.change.main_watch import watch_main
from gateway.services.day_two.break_glass import sweep_break_glass
from gateway.services.day_two.drift_records import check_scheduled_drift
from gateway.services.forge.github import queue_behind
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace

log = get_logger(__name__)

HOUSEKEEPING_SECONDS = 2.0


class Worker:
    """`loops` threads claiming jobs until stopped."""

    def __init__(self, ws: Workspace, loops: int = 1, poll_seconds: float = 0.5, name: str | None = None):
        self.ws = ws
        self.loops = loops
        self.poll_seconds = poll_seconds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"worker-{i}", daemon=True)
                         for i in range(loops)]
        self._threads.append(threading.Thread(target=self._housekeeping_loop, name="housekeeping", daemon=True))

    def start(self) -> Worker:
        for thread in self._threads:
            thread.start()
        log.info("worker.started", worker=self.name, loops=self.loops)
        return self

    def stop(self) -> None:
        """Finish the jobs in hand, claim no more."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()

    def _loop(self, index: int) -> None:
        ws = self.ws.for_request()
        runner = f"{self.name}/{index}"
        while not self._stop.is_set():
            try:
                job = ws.store.queue.claim(runner)
                if job is None:
                    self._stop.wait(self.poll_seconds)
                    continue
                log.info("job.claimed", job=job.id, kind=job.kind.value, runner=runner)
                run_job(ws, job, runner)
            except Exception:  # a loop never dies of one bad turn; the database may be restarting
                log.exception("worker.loop_error", runner=runner)
                self._stop.wait(self.poll_seconds)

    def _housekeeping_loop(self) -> None:
        """Apart from the job loops, so a long scan never delays a claim."""
        ws = self.ws.for_request()
        while not self._stop.is_set():
            run_housekeeping(ws)
            self._stop.wait(HOUSEKEEPING_SECONDS)


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
    main, a database hiccup, a race lost) is logged and never stops the others. The steps that failed."""
    failed = []
    for name, step in HOUSEKEEPING:
        try:
            step(ws)
        except Exception:
            log.exception("worker.housekeeping_error", step=name)
            failed.append(name)
    return failed
