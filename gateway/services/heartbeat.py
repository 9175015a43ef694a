"""A thread that proves a runner is alive: it calls `beat` at an interval until stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)


class Heartbeat:
    """Calls `beat` every `interval` seconds; a failing beat is logged and the next one tries again."""

    def __init__(self, name: str, interval: float, beat: Callable[[], None]):
        self.name, self.interval, self._beat = name, interval, beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # what expires meanwhile is recorded by whoever breaks it
                log.exception("heartbeat.failed", heartbeat=self.name)
