"""A thread that proves a runner is alive: it calls `beat` at an interval until stopped.

A beat that fails (the database is down, or too busy to answer) is not swallowed: the heartbeat
keeps when its last beat succeeded and what the last failure was, so whoever depends on it (a
runner holding stack locks) can tell that what it renews has lapsed, and stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gateway.logs import get_logger

log = get_logger(__name__)


class Heartbeat:
    """Calls `beat` every `interval` seconds; `silent_for` says how long since a beat last went through."""

    def __init__(self, name: str, interval: float, beat: Callable[[], None]):
        self.name, self.interval, self._beat = name, interval, beat
        self.last_error: str | None = None
        self._last_success = time.monotonic()  # starting counts: what it renews was just taken or claimed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._last_success = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def silent_for(self) -> float:
        """Seconds since the start of the last beat that succeeded (what it renewed was valid from then)."""
        return time.monotonic() - self._last_success

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.monotonic()
            try:
                self._beat()
            except Exception as exc:  # kept, not swallowed: silent_for() keeps growing until a beat succeeds
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("heartbeat.failed", heartbeat=self.name, error=self.last_error)
            else:
                self._last_success, self.last_error = started, None
