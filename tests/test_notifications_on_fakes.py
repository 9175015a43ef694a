"""A notification's delivery on tests/fakes.py's unit of work: retried with backoff while its channel cannot take it
(the same delivery id each time), reported once it gives up, reported at once when the channel refuses or the
gateway has no settings for it, and delivered once. The receivers are a FakeNotificationSender, the clock a
FakeClock. Real receivers (HTTP, SMTP), the worker's queue and what a receiver sees of a secret stay in
test_notifications.py."""

from __future__ import annotations

import pytest

from gateway.domain.errors import BackendError, ConfigError, Refused, RetryLater, Unavailable
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.notifications import Notification, NotificationStatus
from gateway.domain.principals import GATEWAY, Principal, Role
from gateway.services.notifications.delivery import list_notifications, run_notify_job
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace

from .fakes import SAMPLE_GATEWAY_YAML, FakeNotificationSender, fake_workspace, later, person

NOTIFYING = SAMPLE_GATEWAY_YAML + """
notifications:
  channels:
    ops-slack: {slack: {}}
    platform-mail: {email: {to: [platform@example.com]}}
    audit-hook: {webhook: {}}
  routes:
    - events: [breaker_tripped]
      channels: [ops-slack, platform-mail, audit-hook]
"""


@pytest.fixture
def ws() -> Workspace:
    ws = fake_workspace(NOTIFYING)
    ws.settings.notify_retry_seconds, ws.settings.notify_attempts = 5, 3
    assert queue_notifications(ws) == []  # the outbox tells from now on
    return ws


def tripped(ws: Workspace) -> dict[str, int]:
    """A breaker trips: the outbox queues one notification per channel, each with its job. {channel: id}"""
    with ws.store.session() as session:
        session.audit.append(GATEWAY, "breaker.tripped", {"agent": "infra-agent", "reason": "too many changes",
                                                          "scope": "*", "proposal": None})
    ids = queue_notifications(ws)
    with ws.store.session(readonly=True) as session:
        return {session.notifications.get(i).channel.name: i for i in ids}


def attempt(ws: Workspace, notification_id: int, n: int) -> tuple[JobStatus, dict, str | None]:
    """The n-th attempt of the notification's job, as a worker runs it."""
    with ws.store.session(readonly=True) as session:
        job_id = session.notifications.get(notification_id).job_id
    job = Job(job_id or 0, JobKind.NOTIFY, None, GATEWAY.name, JobStatus.RUNNING, args={"notification": notification_id},
              attempts=n)
    return run_notify_job(ws, job, "worker-1", lambda _: None)


def row(ws: Workspace, notification_id: int) -> Notification:
    with ws.store.session(readonly=True) as session:
        return session.notifications.get(notification_id)


def trail(ws: Workspace) -> list[tuple[str, str, int]]:
    with ws.store.session(readonly=True) as session:
        return [(e.kind, e.payload["target"], e.payload["attempts"]) for e in session.audit.events()
                if e.kind.startswith("notification.")]


def test_a_delivery_is_made_once_and_recorded(ws: Workspace) -> None:
    ws.notifier = sender = FakeNotificationSender()
    ids = tripped(ws)
    assert sorted(ids) == ["audit-hook", "ops-slack", "platform-mail"]
    status, result, error = attempt(ws, ids["audit-hook"], 1)
    assert (status, result["receipt"], error) == (JobStatus.SUCCEEDED, "ok audit-hook", None)
    delivered = row(ws, ids["audit-hook"])
    assert (delivered.status, delivered.attempts, delivered.delivered_at) == (NotificationStatus.DELIVERED, 1,
                                                                             ws.clock.now())
    again, _, _ = attempt(ws, ids["audit-hook"], 2)  # the job run again (its worker died after sending)
    assert again == JobStatus.SUCCEEDED and len(sender.attempts) == 1  # not sent twice
    assert trail(ws) == [("notification.delivered", "audit-hook", 1)]


def test_a_failing_delivery_is_retried_with_backoff_then_reported(ws: Workspace) -> None:
    ws.notifier = sender = FakeNotificationSender({
        "ops-slack": [Unavailable("HTTP 503"), Unavailable("HTTP 503"), "ok"],  # the third attempt gets through
        "audit-hook": [Unavailable("HTTP 500")]})  # down for good
    ids = tripped(ws)
    waits = []
    for n in (1, 2):
        for channel in ("ops-slack", "audit-hook"):
            with pytest.raises(RetryLater) as retry:
                attempt(ws, ids[channel], n)
            waits.append(retry.value.retry_after)
        later(ws, 10)
    assert waits == [5, 5, 10, 10]  # doubling from notify_retry_seconds
    waiting = row(ws, ids["audit-hook"])
    assert (waiting.status, waiting.attempts, waiting.error) == (NotificationStatus.QUEUED, 2, "HTTP 500")
    assert attempt(ws, ids["ops-slack"], 3)[0] == JobStatus.SUCCEEDED
    status, _, error = attempt(ws, ids["audit-hook"], 3)
    assert status == JobStatus.FAILED and error is not None
    assert error.startswith("gave up after 3 attempt(s) over 20 s: HTTP 500")
    assert (row(ws, ids["audit-hook"]).status, row(ws, ids["audit-hook"]).attempts) == (NotificationStatus.FAILED, 3)
    tried = [delivery for channel, _, delivery in sender.attempts if channel == "audit-hook"]
    assert len(tried) == 3 and len(set(tried)) == 1  # a receiver can tell a retry
    assert trail(ws) == [("notification.delivered", "ops-slack", 3), ("notification.failed", "audit-hook", 3)]


def test_a_refusal_and_a_channel_without_settings_are_reported_not_retried(ws: Workspace) -> None:
    ws.notifier = sender = FakeNotificationSender({
        "platform-mail": [BackendError("SMTP 535: authentication failed")],
        "audit-hook": [ConfigError("webhook channel audit-hook: the gateway has no settings for it")]})
    ids = tripped(ws)
    for channel, says in (("platform-mail", "SMTP 535"), ("audit-hook", "no settings for it")):
        status, _, error = attempt(ws, ids[channel], 1)
        assert status == JobStatus.FAILED and says in (error or "")
        assert (row(ws, ids[channel]).status, row(ws, ids[channel]).attempts) == (NotificationStatus.FAILED, 1)
    assert [c for c, _, _ in sender.attempts] == ["platform-mail", "audit-hook"]
    assert trail(ws) == [("notification.failed", "platform-mail", 1), ("notification.failed", "audit-hook", 1)]


def test_a_process_without_a_sender_reports_the_notification(ws: Workspace) -> None:
    ids = tripped(ws)
    status, _, error = attempt(ws, ids["ops-slack"], 1)
    assert status == JobStatus.FAILED and "this process has no notification sender" in (error or "")


def test_who_reads_the_notifications(ws: Workspace) -> None:
    ws.notifier = FakeNotificationSender({"audit-hook": [BackendError("HTTP 403")]})
    ids = tripped(ws)
    for n in ids.values():
        attempt(ws, n, 1)
    dana: Principal = person("dana", Role.AUDITOR, store=ws.store)
    assert [n.channel.name for n in list_notifications(ws, dana, NotificationStatus.FAILED)] == ["audit-hook"]
    assert len(list_notifications(ws, dana)) == 3
    with pytest.raises(Refused, match="alice is not an auditor"):
        list_notifications(ws, person("alice", Role.REQUESTER, store=ws.store))



def test_a_receivers_asked_wait_is_kept_within_the_cap(ws: Workspace) -> None:
    ws.settings.notify_retry_max_seconds = 120
    ws.notifier = FakeNotificationSender({"ops-slack": [Unavailable("HTTP 429", 60), Unavailable("HTTP 429", 3600),
                                                        "ok"]})
    ids = tripped(ws)
    waits = []
    for n in (1, 2):
        with pytest.raises(RetryLater) as retry:
            attempt(ws, ids["ops-slack"], n)
        waits.append(retry.value.retry_after)
    assert waits == [60, 120]  # what the rate limit asked for, never more than notify_retry_max_seconds
    assert attempt(ws, ids["ops-slack"], 3)[0] == JobStatus.SUCCEEDED


def test_a_delivery_too_old_to_try_again_is_reported(ws: Workspace) -> None:
    ws.settings.notify_attempts, ws.settings.notify_max_age_seconds = 10, 60
    ws.notifier = FakeNotificationSender({"audit-hook": [Unavailable("cannot connect")]})
    ids = tripped(ws)
    with pytest.raises(RetryLater):
        attempt(ws, ids["audit-hook"], 1)
    later(ws, 58)  # the next wait would end past the notification's age limit
    status, _, error = attempt(ws, ids["audit-hook"], 2)
    assert status == JobStatus.FAILED and (error or "").startswith("gave up after 2 attempt(s) over 58 s")


def test_a_sender_that_crashes_leaves_the_notification_reported_and_the_crash_to_the_queue(ws: Workspace) -> None:
    ws.notifier = FakeNotificationSender({"ops-slack": [KeyError("channel")]})
    ids = tripped(ws)
    with pytest.raises(KeyError):
        attempt(ws, ids["ops-slack"], 1)
    crashed = row(ws, ids["ops-slack"])
    assert crashed.status == NotificationStatus.FAILED and crashed.error == "internal error: KeyError: 'channel'"
    assert trail(ws) == [("notification.failed", "ops-slack", 1)]
