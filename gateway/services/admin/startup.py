"""How a long-running process (the API, `gateway worker`) lives with its database, whatever the database is doing.

The process starts at once. `bring_database_up` tries the database with a capped, jittered backoff, one log line per
attempt, and brings its schema to this code's version when it answers; until then readiness (`/api/v1/ready`, the
worker's ready file) says the database is down, which is what an orchestrator waits on. `Outage` is the same
discipline for a loop that loses the database later: one line per backoff step (never a traceback per poll), and one
line when it is back.
"""

from __future__ import annotations

import os
import threading
from importlib import metadata

from gateway.domain.backoff import Backoff
from gateway.domain.errors import BackendError
from gateway.logs import get_logger
from gateway.services.workspace import Identified, Records

log = get_logger(__name__)


def log_start(ws: Identified, process: str, **fields: object) -> None:
    """The line a process starts with: what runs, and the settings an operator checks first (never a secret: no
    URL that may hold credentials, no key, only whether a part is configured)."""
    s = ws.settings
    log.info("gateway.started", process=process, version=_version(), pid=os.getpid(), home=str(s.home),
             database=ws.store.dialect, schema_version=ws.store.schema_version, public_url=s.public_url,
             secure_cookies=s.cookies_secure, sign_in=sorted(ws.identity_providers), model_configured=bool(s.model),
             lock_ttl_seconds=s.lock_ttl_seconds, terraform_timeout_seconds=s.terraform_timeout_seconds, **fields)


def _version() -> str:
    try:
        return metadata.version("change-gateway")
    except metadata.PackageNotFoundError:
        return "unknown"


def bring_database_up(ws: Records, process: str, stop: threading.Event, backoff: Backoff | None = None,
                      attempts: int | None = None) -> bool:
    """Until the database answers at this code's schema (migrating it), `stop` is set, or `attempts` are spent;
    whether it answered."""
    backoff = backoff or Backoff()
    while not stop.is_set():
        try:
            ran = ws.store.migrate()
        except BackendError as exc:
            delay = backoff.next_delay()
            log.warning("database.waiting", process=process, attempt=backoff.failures,
                        retry_in_seconds=round(delay, 1), reason=str(exc))
            if attempts is not None and backoff.failures >= attempts:
                return False
            stop.wait(delay)
            continue
        log.info("database.ready", process=process, database=ws.store.dialect, schema_version=ws.store.schema_version,
                 migrated=ran, attempts=backoff.succeeded() + 1)
        return True
    return False


class Outage:
    """A loop's run of failures: each says how long to wait before the next try (capped, jittered), logged once per
    step; a database that stopped answering is a warning line, anything else an error with its traceback."""

    def __init__(self, loop: str, backoff: Backoff | None = None):
        self.loop = loop
        self._backoff = backoff or Backoff()

    def failed(self, exc: Exception) -> float:
        """The seconds to wait after `exc`, logged."""
        delay = self._backoff.next_delay()
        fields = {"loop": self.loop, "attempt": self._backoff.failures, "retry_in_seconds": round(delay, 1)}
        if isinstance(exc, BackendError):
            log.warning("loop.backend_unavailable", reason=str(exc), **fields)
        else:  # a fault of ours: its traceback, but at the same pace
            log.error("loop.failed", exc_info=exc, **fields)
        return delay

    def succeeded(self) -> None:
        """A turn went through: after failures, say so once and start the backoff over."""
        if failures := self._backoff.succeeded():
            log.info("loop.recovered", loop=self.loop, failures=failures)
