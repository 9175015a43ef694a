"""The notifications outbox: the trail is where every state change is written, in the same transaction as the
change itself, so notices are read from it and nothing that happened is left untold (nor anything told that was
rolled back).

Each pass reads the events after the outbox's place (a marker moved by compare-and-set, so of two workers one
reads a batch), makes each event's notices, routes them by main's gateway.yaml, and queues one notification and
one `notify` job per channel, all in one transaction with the move of the place. A notification's dedupe key
(event, subject, channel) is unique: one is never queued twice.

An event whose notice cannot be made (its records do not read as the notices expect) never holds back the others:
for each channel a route may send its kind to, a `skipped` notification and a `notification.skipped` trail event
are written, in the same transaction as the move of the place, once (the same dedupe key). `notification.*` events
tell nothing, so the outbox never tells of its own reports.
"""

from __future__ import annotations

from itertools import islice

from gateway.domain.audit import AuditEvent
from gateway.domain.errors import GatewayError
from gateway.domain.jobs import JobKind
from gateway.domain.notifications import (
    OUTBOX_MARKER,
    TRAIL_KINDS,
    Notice,
    NotificationSettings,
    dedupe_key,
    first_line,
)
from gateway.domain.principals import GATEWAY
from gateway.domain.repositories import DEFAULT_REPOSITORY, holds_stack
from gateway.logs import get_logger
from gateway.ports import UnitOfWork
from gateway.services.notifications.delivery import trail_payload
from gateway.services.notifications.notices import NoticeContext, notices_for
from gateway.services.workspace import Workspace

log = get_logger(__name__)

BATCH = 500  # trail events one pass reads


def queue_notifications(ws: Workspace) -> list[int]:
    """One pass of the outbox (workers run it in housekeeping); the notifications queued."""
    with ws.store.session(readonly=True) as session:
        place = session.main.marker(OUTBOX_MARKER)
        head = session.audit.chain_head()
    newest = head[0] if head else 0
    if place is not None and int(place) >= newest:
        return []
    settings = ws.repo_settings()  # main's: a gateway.yaml that does not parse stops here, the place kept
    notifications = settings.notifications
    queued: list[int] = []
    with ws.store.session() as session:
        if place is None:  # a workspace made before the outbox: it tells from now on
            session.main.swap_marker(OUTBOX_MARKER, None, str(newest))
            return []
        events = list(islice(session.audit.iter(batch=BATCH, after=int(place)), BATCH))
        if not events or not session.main.swap_marker(OUTBOX_MARKER, place, str(events[-1].seq)):
            return []  # another worker took this batch
        if not notifications.routes:
            return []
        context = NoticeContext(session, settings, ws.settings.public_url, ws.scrubber.scrub, ws.clock.now())
        events = _of_repository(session, ws.repository, events)
        for event in events:
            try:
                told = notices_for(context, event)
            except Exception as exc:  # one event that cannot be told never holds back the others
                log.exception("notifications.event_skipped", seq=event.seq, kind=event.kind)
                why = str(exc) if isinstance(exc, GatewayError) else f"internal error: {type(exc).__name__}: {exc}"
                _record_skipped(session, notifications, event, first_line(ws.scrubber.scrub(why), 300))
                continue
            for item in told:
                for channel in notifications.channels_for(item.notice.event, item.groups):
                    nid = session.notifications.add(dedupe_key(item.notice.event, item.subject, channel.name),
                                                    channel, item.notice, event.seq)
                    if nid is None:
                        continue
                    session.notifications.set_job(nid, session.jobs.add(JobKind.NOTIFY, None, GATEWAY,
                                                                        {"notification": nid}))
                    queued.append(nid)
    return queued


def _of_repository(session: UnitOfWork, repository: str, events: list[AuditEvent]) -> list[AuditEvent]:
    """The events of `repository`, which its own routes tell (each repository's outbox reads the whole trail): by
    their stacks, else by their proposal's repository; an event of neither is the default repository's to tell."""
    of_proposal: dict[int, str | None] = {}
    mine = []
    for event in events:
        if event.stacks:
            belongs = all(holds_stack(repository, stack) for stack in event.stacks)
        elif event.proposal_id is not None:
            if event.proposal_id not in of_proposal:
                of_proposal[event.proposal_id] = session.proposals.repository_of(event.proposal_id)
            belongs = of_proposal[event.proposal_id] == repository
        else:
            belongs = repository == DEFAULT_REPOSITORY
        if belongs:
            mine.append(event)
    return mine


def _record_skipped(session: UnitOfWork, notifications: NotificationSettings, event: AuditEvent, reason: str) -> None:
    """The event could not be told: a skipped notification and its trail event for each channel that may have
    wanted it (whom it concerns is what could not be read), once each."""
    kind = TRAIL_KINDS.get(event.kind)
    if kind is None:  # notices_for tells nothing of other kinds (its own notification.* events among them)
        return
    title = f"Not told: trail event {event.seq} ({event.kind}) could not be read"
    notice = Notice(kind, title, (("Why", reason),), None, event.proposal_id, tuple(event.stacks))
    for channel in notifications.channels_for_anyone(kind):
        nid = session.notifications.skip(dedupe_key(kind, f"trail-{event.seq}-skipped", channel.name), channel,
                                         notice, event.seq, reason)
        if nid is None:
            continue  # recorded by an earlier pass over this event
        payload = trail_payload(session.notifications.get(nid), 0, reason=reason, trail_event=event.seq,
                                trail_kind=event.kind)
        session.audit.append(GATEWAY, "notification.skipped", payload, None, notice.stacks)
