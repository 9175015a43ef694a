"""The worker registry in SQL: one row per worker name, committed on its own (every process reads it at once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, insert, select, update

from gateway.adapters.store.rows import aware, now
from gateway.adapters.store.schema import Database, workers
from gateway.domain.workers import FORGET_AFTER, WorkerRecord, live_until


class SqlWorkerRegistry:
    """Workers' registrations and beats; the live ones are those whose last beat still counts."""

    def __init__(self, db: Database):
        self.db = db

    def register(self, name: str, beat_seconds: float) -> None:
        """`name` starts now (a name used before, by a process that ended, starts afresh); workers gone for longer
        than `FORGET_AFTER` are dropped."""
        moment = now()
        values = {"started_at": moment, "beat_at": moment, "live_until": live_until(moment, beat_seconds),
                  "stopped_at": None}
        with self.db.transaction() as conn:
            conn.execute(delete(workers).where(workers.c.live_until < moment - FORGET_AFTER))
            if conn.execute(update(workers).where(workers.c.name == name).values(**values)).rowcount == 0:
                conn.execute(insert(workers).values(name=name, **values))

    def beat(self, name: str, beat_seconds: float) -> bool:
        """`name` is alive now; False when it is not registered or was marked stopped (nothing is written)."""
        moment = now()
        with self.db.transaction() as conn:
            beaten = conn.execute(
                update(workers)
                .where(workers.c.name == name, workers.c.stopped_at.is_(None))
                .values(beat_at=moment, live_until=live_until(moment, beat_seconds))
            )
        return beaten.rowcount == 1

    def stop(self, name: str) -> None:
        """`name` stopped cleanly: no longer live, at once."""
        with self.db.transaction() as conn:
            conn.execute(update(workers).where(workers.c.name == name).values(stopped_at=now()))

    def live(self) -> list[WorkerRecord]:
        """The workers running now (registered, not stopped, last beat still counting), by name."""
        query = (select(workers).where(workers.c.stopped_at.is_(None), workers.c.live_until > now())
                 .order_by(workers.c.name))
        with self.db.transaction(readonly=True) as conn:
            return [_as_worker(row) for row in conn.execute(query).mappings()]


def _as_worker(row: Mapping[str, Any]) -> WorkerRecord:
    return WorkerRecord(name=row["name"], started_at=aware(row["started_at"]), beat_at=aware(row["beat_at"]),
                        live_until=aware(row["live_until"]),
                        stopped_at=aware(row["stopped_at"]) if row["stopped_at"] else None)
