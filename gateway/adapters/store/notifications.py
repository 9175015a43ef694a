"""Notifications: one row per (event, subject, channel), from queued to delivered or failed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.store.rows import MAX_ID, Records, aware, now
from gateway.adapters.store.schema import notifications
from gateway.domain.errors import NotFound
from gateway.domain.notifications import (
    Channel,
    Notice,
    Notification,
    NotificationEvent,
    NotificationStatus,
)


def as_notification(row: Mapping[str, Any]) -> Notification:
    return Notification(
        id=row["id"], dedupe_key=row["dedupe_key"], event=NotificationEvent(row["event"]),
        channel=Channel.from_json(row["spec"]), notice=Notice.from_json(row["notice"]),
        status=NotificationStatus(row["status"]), attempts=int(row["attempts"] or 0),
        created_at=aware(row["created_at"]),
        delivered_at=aware(row["delivered_at"]) if row["delivered_at"] else None,
        error=row["error"], job_id=row["job_id"])


class SqlNotifications(Records):
    """Notifications queued, delivered once, or reported failed."""

    def add(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None) -> int | None:
        """Queue a notification; None when one with this dedupe key exists (it is never sent twice)."""
        return self._insert(key, channel, notice, audit_seq, NotificationStatus.QUEUED, None)

    def skip(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None, reason: str) -> int | None:
        """Record a notification the outbox could not make, never sent; None when this dedupe key exists."""
        return self._insert(key, channel, notice, audit_seq, NotificationStatus.SKIPPED, reason)

    def _insert(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None,
                status: NotificationStatus, error: str | None) -> int | None:
        if self.conn.scalar(select(notifications.c.id).where(notifications.c.dedupe_key == key)) is not None:
            return None
        try:
            with self.conn.begin_nested():  # another worker's outbox pass may have queued it a moment ago
                result = self.conn.execute(insert(notifications).values(
                    dedupe_key=key, event=notice.event.value, channel=channel.kind.value, target=channel.name,
                    spec=channel.to_json(), notice=self.scrubber.scrub_data(notice.to_json()),
                    proposal_id=notice.proposal_id, audit_seq=audit_seq, status=status.value, attempts=0,
                    error=self.scrubber.scrub(error) if error else None, created_at=now()))
        except IntegrityError:
            return None
        return int(result.inserted_primary_key[0])

    def set_job(self, notification_id: int, job_id: int) -> None:
        self.conn.execute(update(notifications).where(notifications.c.id == notification_id).values(job_id=job_id))

    def get(self, notification_id: int) -> Notification:
        row = self.conn.execute(select(notifications).where(notifications.c.id == notification_id)).mappings().first()
        if row is None or not 0 < notification_id <= MAX_ID:
            raise NotFound(f"no notification {notification_id}")
        return as_notification(row)

    def record_attempt(self, notification_id: int, attempts: int, error: str | None) -> None:
        """An attempt failed and another follows: it stays queued, saying why it waits."""
        self.conn.execute(update(notifications).where(
            notifications.c.id == notification_id, notifications.c.status == NotificationStatus.QUEUED.value)
            .values(attempts=attempts, error=self.scrubber.scrub(error) if error else None))

    def finish(self, notification_id: int, status: NotificationStatus, attempts: int, error: str | None = None,
               receipt: str | None = None) -> bool:
        """Delivered or failed, once: False when it had already ended (another attempt recorded it)."""
        done = self.conn.execute(update(notifications).where(
            notifications.c.id == notification_id, notifications.c.status == NotificationStatus.QUEUED.value)
            .values(status=status.value, attempts=attempts, error=self.scrubber.scrub(error) if error else None,
                    receipt=self.scrubber.scrub(receipt)[:500] if receipt else None,
                    delivered_at=now() if status == NotificationStatus.DELIVERED else None))
        return done.rowcount == 1

    def list(self, status: NotificationStatus | None = None, limit: int = 100) -> list[Notification]:
        query = select(notifications).order_by(notifications.c.id.desc()).limit(limit)
        if status is not None:
            query = query.where(notifications.c.status == status.value)
        return [as_notification(r) for r in self.conn.execute(query).mappings()]
