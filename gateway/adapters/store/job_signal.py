"""Waking idle workers when a job is queued, instead of letting them sleep out their poll interval.

In one process (the app with its embedded worker, a CLI that queues and runs), a unit of work that queued or
finished a job moves a counter after its commit and wakes the waiters. Across processes on PostgreSQL, the same
transaction sends `NOTIFY gateway_jobs` (PostgreSQL delivers it at the commit, never for a rolled-back one), and a
waiting worker process listens on one connection of its own. Polling stays the fallback: a notification lost with a
dropped connection, SQLite across processes, or a retry whose time has come are all found at the next poll.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gateway.logs import get_logger

log = get_logger(__name__)

CHANNEL = "gateway_jobs"
LISTEN_POLL_SECONDS = 0.5  # how often the listener looks up from its connection to see whether it should stop
IDLE_SECONDS = 10.0  # no one waited this long (workers stopped, or all busy): the listener ends; a wait restarts it


class JobSignal:
    """A counter that moves whenever a job may have become claimable, and a wait for it to move."""

    def __init__(self) -> None:
        self._moved = threading.Condition()
        self._count = 0
        self._listeners: list[_Listener] = []
        self.last_wait = time.monotonic()
        self._waiting = 0

    def count(self) -> int:
        with self._moved:
            return self._count

    def notify(self) -> None:
        with self._moved:
            self._count += 1
            self._moved.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Until the counter has moved past `seen` (at once if it already has) or `timeout`; whether it moved."""
        with self._moved:
            self._waiting += 1
            try:
                return self._moved.wait_for(lambda: self._count != seen, timeout)
            finally:
                self._waiting -= 1
                self.last_wait = time.monotonic()

    def idle(self) -> bool:
        """No one waits now, nor has for IDLE_SECONDS."""
        with self._moved:
            return not self._waiting and time.monotonic() - self.last_wait > IDLE_SECONDS

    def listen(self, conninfo: str) -> None:
        """Also move on PostgreSQL's notifications (once per conninfo: other processes' queued jobs)."""
        with self._moved:
            self.last_wait = time.monotonic()  # the caller is about to wait: not idle
            self._listeners = [listener for listener in self._listeners if listener.is_alive()]
            if any(listener.conninfo == conninfo for listener in self._listeners):
                return
            listener = _Listener(conninfo, self)
            self._listeners.append(listener)
        listener.start()

    def stop_listening(self, conninfo: str) -> None:
        with self._moved:
            stopping = [listener for listener in self._listeners if listener.conninfo == conninfo]
            self._listeners = [listener for listener in self._listeners if listener.conninfo != conninfo]
        for listener in stopping:
            listener.stop()


class _Listener(threading.Thread):
    """`LISTEN gateway_jobs` on a connection of its own; reconnects with a growing pause after a failure."""

    def __init__(self, conninfo: str, signal: JobSignal):
        super().__init__(name="job-signal", daemon=True)
        self.conninfo = conninfo
        self.signal = signal
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        import psycopg  # only where PostgreSQL is the store

        pause = 1.0
        while not self._stopping.is_set() and not self.signal.idle():
            conn: Any = None
            try:
                conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10)
                conn.execute(f"LISTEN {CHANNEL}")
                pause = 1.0
                self.signal.notify()  # whatever was queued while no one listened is looked for now
                while not self._stopping.is_set() and not self.signal.idle():
                    for _ in conn.notifies(timeout=LISTEN_POLL_SECONDS):
                        self.signal.notify()
            except Exception as exc:  # the database restarting: polling carries on meanwhile
                if not self._stopping.is_set():
                    log.warning("job_signal.listen_failed", error=f"{type(exc).__name__}: {exc}", retry_in=pause)
                    self._stopping.wait(pause)
                    pause = min(30.0, pause * 2)
            finally:
                if conn is not None:
                    conn.close()


_signals: dict[str, JobSignal] = {}
_signals_lock = threading.Lock()


def signal_for(database_key: str) -> JobSignal:
    """The one signal of a database in this process, whichever engine or workspace queued the job."""
    with _signals_lock:
        return _signals.setdefault(database_key, JobSignal())
