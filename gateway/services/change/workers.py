"""The worker registry as the services use it: who runs now, and a worker's own presence in it.

`live_workers` answers whether anyone is there to claim a queued job (metrics' `gateway_workers_alive`, and a
command deciding whether to wait for a worker or run the job itself). `Presence` is what a worker process holds:
registered at start, beaten by a `Heartbeat`, marked stopped on a clean stop.
"""

from __future__ import annotations

from gateway.domain.errors import GatewayError
from gateway.domain.workers import WorkerRecord
from gateway.logs import get_logger
from gateway.services.change.heartbeat import Heartbeat
from gateway.services.workspace import Configured, Records

log = get_logger(__name__)


def live_workers(ws: Records) -> list[WorkerRecord]:
    """The workers running now (registered, not stopped, beaten within `LIVE_BEATS` of their intervals), by name."""
    return ws.store.workers.live()


class Presence:
    """One worker's entry in the registry, kept alive by its beats from `start` until `stop`."""

    def __init__(self, ws: Configured, name: str):
        self.ws, self.name = ws, name
        self.beat_seconds = ws.settings.worker_beat_seconds
        self._beat = Heartbeat(f"presence-{name}", self.beat_seconds, self._renew)
        self._started = False

    def start(self) -> None:
        """Register, then beat until `stop` (a registration the database refused is made by the next beat)."""
        self._started = True
        try:
            self.ws.store.workers.register(self.name, self.beat_seconds)
        except GatewayError as exc:
            log.warning("worker.register_failed", worker=self.name, error=f"{type(exc).__name__}: {exc}")
        self._beat.start()

    def _renew(self) -> None:
        if not self.ws.store.workers.beat(self.name, self.beat_seconds):  # dropped meanwhile: register again
            self.ws.store.workers.register(self.name, self.beat_seconds)

    def stop(self) -> None:
        """No more beats, and marked stopped (a worker that cannot reach the database to say so is counted out once
        its last beat no longer counts)."""
        if not self._started:
            return
        self._beat.stop()
        try:
            self.ws.store.workers.stop(self.name)
        except GatewayError as exc:  # stopping never fails for want of the database
            log.warning("worker.unregister_failed", worker=self.name, error=f"{type(exc).__name__}: {exc}")
