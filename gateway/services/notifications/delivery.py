"""A notification's delivery: one `notify` job, retried with backoff while the channel cannot take it, recorded
once delivered, reported (`notification.failed` in the trail) when the channel refuses it or retries run out.

A receiver may see a delivery twice (an attempt it took whose answer never came back); the delivery id is the
same on every attempt, so it can tell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.domain.errors import GatewayError, NotConfigured, RetryLater, Unavailable
from gateway.domain.jobs import Job, JobStatus, RetryPolicy
from gateway.domain.notifications import Notification, NotificationStatus
from gateway.domain.permissions import Action, require
from gateway.domain.principals import GATEWAY, Principal
from gateway.services.workspace import Configured, Delivering, Records

Result = tuple[JobStatus, dict[str, Any], str | None]


def retry_policy(ws: Configured) -> RetryPolicy:
    s = ws.settings
    return RetryPolicy(s.notify_retry_seconds, s.notify_retry_max_seconds, s.notify_attempts, s.notify_max_age_seconds)


def run_notify_job(ws: Delivering, job: Job, runner: str, progress: Callable[[str], None]) -> Result:
    """Deliver the job's notification, unless it was delivered or reported already."""
    notification_id = int(job.args["notification"])
    with ws.store.session(readonly=True) as session:
        notification = session.notifications.get(notification_id)
    if notification.status != NotificationStatus.QUEUED:
        return JobStatus.SUCCEEDED, {"notification": notification_id, "status": notification.status.value}, None
    attempt = max(1, job.attempts)
    channel = notification.channel
    progress(f"notification {notification_id} ({notification.event.value}) to {channel.kind.value} channel "
             f"{channel.name}: attempt {attempt}")
    try:
        if ws.notifier is None:
            raise NotConfigured("this process has no notification sender")
        receipt = ws.notifier.send(channel, notification.notice, notification.delivery_id)
    except Unavailable as exc:
        policy = retry_policy(ws)
        wait = policy.delay(attempt, exc.retry_after)
        age = ws.clock.now() - notification.created_at
        if policy.gives_up(attempt, age, wait):
            return _report(ws, notification, attempt, f"gave up after {attempt} attempt(s) over "
                                                      f"{int(age.total_seconds())} s: {exc}")
        with ws.store.session() as session:
            session.notifications.record_attempt(notification_id, attempt, str(exc))
        progress(f"  {exc}; again in {wait.total_seconds():g} s")
        ws.metrics.notification_delivered(channel.kind.value, "retried")
        raise RetryLater(str(exc), wait.total_seconds()) from exc
    except GatewayError as exc:  # refused, or not configured: another attempt would not do better
        return _report(ws, notification, attempt, str(exc))
    except Exception as exc:  # recorded whatever happens, then the queue records the crash
        _report(ws, notification, attempt, f"internal error: {type(exc).__name__}: {exc}")
        raise
    with ws.store.session() as session:
        if session.notifications.finish(notification_id, NotificationStatus.DELIVERED, attempt, receipt=receipt):
            session.audit.append(GATEWAY, "notification.delivered",
                                 trail_payload(notification, attempt, receipt=receipt), None, notification.notice.stacks)
    progress(f"  delivered: {receipt}")
    ws.metrics.notification_delivered(channel.kind.value, "delivered")
    return JobStatus.SUCCEEDED, {"notification": notification_id, "receipt": receipt}, None


def _report(ws: Delivering, notification: Notification, attempt: int, error: str) -> Result:
    with ws.store.session() as session:
        if session.notifications.finish(notification.id, NotificationStatus.FAILED, attempt, error=error):
            session.audit.append(GATEWAY, "notification.failed", trail_payload(notification, attempt, error=error),
                                 None, notification.notice.stacks)
    ws.metrics.notification_delivered(notification.channel.kind.value, "failed")
    return JobStatus.FAILED, {"notification": notification.id}, error


def trail_payload(notification: Notification, attempts: int, **extra: Any) -> dict[str, Any]:
    """What the trail keeps of a delivery: which notice, where, how many attempts (the proposal is named in the
    payload, not as the event's proposal: a delivery is not a step of the change)."""
    return {"notification": notification.id, "event": notification.event.value,
            "channel": notification.channel.kind.value, "target": notification.channel.name,
            "proposal": notification.notice.proposal_id, "attempts": attempts, "delivery": notification.delivery_id,
            **extra}


def list_notifications(ws: Records, actor: Principal, status: NotificationStatus | None = None,
                       limit: int = 100) -> list[Notification]:
    """Notifications, newest first (who may read the trail may read these)."""
    require(actor, Action.READ_TRAIL)
    with ws.store.session(readonly=True) as session:
        return session.notifications.list(status, limit)

