"""Notifications over HTTP: what was told to whom, delivered, waiting for a retry, failed, or skipped (the outbox
could not make its notice)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from gateway.api.deps import ActorDep, WorkspaceDep
from gateway.api.routes import ERRORS
from gateway.domain.notifications import NotificationStatus
from gateway.services.notifications.delivery import list_notifications

api = APIRouter(prefix="/api/v1", responses=ERRORS)


class NotificationPublic(BaseModel):
    id: int
    event: str  # approval_wanted | rejected | applied | apply_failed | unmerged | drift_found | ...
    channel: str  # slack | email | webhook
    target: str  # the channel's name in gateway.yaml
    status: str  # queued | delivered | failed | skipped
    attempts: int
    proposal_id: int | None
    title: str  # the masked message's first line
    created_at: str
    delivered_at: str | None
    error: str | None
    job_id: int | None


@api.get("/notifications", response_model=list[NotificationPublic], tags=["audit"])
def notifications(ws: WorkspaceDep, actor: ActorDep,
                  status: Annotated[Literal["queued", "delivered", "failed", "skipped"] | None, Query()] = None,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[NotificationPublic]:
    """Notifications, newest first (auditors and admins)."""
    return [NotificationPublic(
        id=n.id, event=n.event.value, channel=n.channel.kind.value, target=n.channel.name, status=n.status.value,
        attempts=n.attempts, proposal_id=n.notice.proposal_id, title=n.notice.title,
        created_at=n.created_at.isoformat(), delivered_at=n.delivered_at.isoformat() if n.delivered_at else None,
        error=n.error, job_id=n.job_id)
        for n in list_notifications(ws, actor, NotificationStatus(status) if status else None, limit)]
