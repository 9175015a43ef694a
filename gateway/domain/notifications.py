"""Notifications: who is told what when a change needs someone, and what the message may carry.

    event                 from the trail                                 whose groups it concerns
    approval_wanted       a plan that waits for approvers                the approvers of its stacks
    rejected              a rejection                                    the approvers of its stacks
    applied               finish, merge, acknowledge_merge               the approvers of its stacks
    apply_failed          fail, interrupt                                the approvers of its stacks
    unmerged              block_merge                                    the approvers of its stacks
    drift_found           a drift record opened                          the stack's approvers
    break_glass_overdue   a window's drift not codified in time          the stack's approvers, break-glass groups
    breaker_tripped       the circuit breaker on agent changes tripped   its resetters

Routing is main's gateway.yaml (`notifications:`): named channels and routes from groups and events to channels.
The repo only names a channel; its secret (a webhook URL, an HMAC key, an SMTP password) is the gateway's own
setting. A `Notice` is the whole message: a masked summary (counts, stacks, the proposal's id and title) and a
link, never a plan body or a value.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class NotificationEvent(StrEnum):
    APPROVAL_WANTED = "approval_wanted"
    REJECTED = "rejected"
    APPLIED = "applied"
    APPLY_FAILED = "apply_failed"
    UNMERGED = "unmerged"
    DRIFT_FOUND = "drift_found"
    BREAK_GLASS_OVERDUE = "break_glass_overdue"
    BREAKER_TRIPPED = "breaker_tripped"


# the trail's event kinds each notification event comes from (approval_wanted: when the plan still needs approvers)
TRAIL_KINDS: Mapping[str, NotificationEvent] = {
    "proposal.opened": NotificationEvent.APPROVAL_WANTED,
    "plan": NotificationEvent.APPROVAL_WANTED,
    "rejection": NotificationEvent.REJECTED,
    "proposal.finish": NotificationEvent.APPLIED,
    "proposal.merge": NotificationEvent.APPLIED,
    "proposal.acknowledge_merge": NotificationEvent.APPLIED,
    "proposal.fail": NotificationEvent.APPLY_FAILED,
    "proposal.interrupt": NotificationEvent.APPLY_FAILED,
    "proposal.block_merge": NotificationEvent.UNMERGED,
    "drift.opened": NotificationEvent.DRIFT_FOUND,
    "break_glass.overdue": NotificationEvent.BREAK_GLASS_OVERDUE,
    "breaker.tripped": NotificationEvent.BREAKER_TRIPPED,
}


OUTBOX_MARKER = "notified_seq"  # the newest trail event the notifications outbox has read


class ChannelKind(StrEnum):
    SLACK = "slack"  # an incoming webhook, or chat.postMessage to `slack_channel` with a bot token
    EMAIL = "email"  # SMTP with STARTTLS to `to`
    WEBHOOK = "webhook"  # a JSON POST signed with HMAC-SHA256


@dataclass(frozen=True)
class Channel:
    """A channel as main's gateway.yaml names it: where, never with what secret."""

    name: str
    kind: ChannelKind
    to: tuple[str, ...] = ()  # email recipients
    slack_channel: str | None = None  # chat.postMessage instead of an incoming webhook

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "to": list(self.to), "slack_channel": self.slack_channel}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Channel:
        return cls(data["name"], ChannelKind(data["kind"]), tuple(data.get("to") or ()), data.get("slack_channel"))


@dataclass(frozen=True)
class Route:
    """Events (all when empty) concerning any of `groups` (every event when empty) go to `channels`."""

    channels: tuple[str, ...]
    groups: frozenset[str] = frozenset()
    events: frozenset[NotificationEvent] = frozenset()

    def matches(self, event: NotificationEvent, groups: frozenset[str]) -> bool:
        return (not self.events or event in self.events) and (not self.groups or bool(self.groups & groups))


@dataclass(frozen=True)
class NotificationSettings:
    channels: Mapping[str, Channel] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()

    def channels_for(self, event: NotificationEvent, groups: frozenset[str]) -> list[Channel]:
        """Each channel a route sends this event to, once however many routes name it, in the order named."""
        names: dict[str, None] = {}
        for route in self.routes:
            if route.matches(event, groups):
                names.update(dict.fromkeys(route.channels))
        return [self.channels[name] for name in names]

    def channels_for_anyone(self, event: NotificationEvent) -> list[Channel]:
        """Each channel a route may send this event to, whomever it concerns (when that cannot be read)."""
        names: dict[str, None] = {}
        for route in self.routes:
            if not route.events or event in route.events:
                names.update(dict.fromkeys(route.channels))
        return [self.channels[name] for name in names]


@dataclass(frozen=True)
class Notice:
    """The whole message a channel carries: a masked summary and a link."""

    event: NotificationEvent
    title: str  # one line: what happened and what is wanted
    facts: tuple[tuple[str, str], ...] = ()  # (label, text) lines: stacks, counts, who, why
    link: str | None = None  # the review page
    proposal_id: int | None = None
    stacks: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.title, *(f"{label}: {value}" for label, value in self.facts)]
        if self.link:
            lines.append(f"Review: {self.link}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event.value, "title": self.title, "facts": [list(f) for f in self.facts],
                "link": self.link, "proposal_id": self.proposal_id, "stacks": list(self.stacks)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notice:
        return cls(NotificationEvent(data["event"]), data["title"], tuple((str(a), str(b)) for a, b in data["facts"]),
                   data.get("link"), data.get("proposal_id"), tuple(data.get("stacks") or ()))


class NotificationStatus(StrEnum):
    QUEUED = "queued"  # waiting for its delivery job (again, after a failed attempt)
    DELIVERED = "delivered"  # the channel took it: never sent again
    FAILED = "failed"  # refused by the channel, or retries exhausted: reported in the trail
    SKIPPED = "skipped"  # the outbox could not make its notice: never sent, reported in the trail


@dataclass(frozen=True)
class Notification:
    """One notice for one channel: the unit delivered exactly once (its dedupe key is unique)."""

    id: int
    dedupe_key: str
    event: NotificationEvent
    channel: Channel
    notice: Notice
    status: NotificationStatus
    attempts: int
    created_at: datetime
    delivered_at: datetime | None = None
    error: str | None = None
    job_id: int | None = None

    @property
    def delivery_id(self) -> str:
        """What a receiver dedupes on: the same on every retry of this notification."""
        return hashlib.sha256(self.dedupe_key.encode()).hexdigest()[:32]


def dedupe_key(event: NotificationEvent, subject: str, channel: str) -> str:
    """One notification per (event, subject, channel): `subject` is what happened once (a trail event, a plan)."""
    return f"{event.value}:{subject}:{channel}"


def plan_subject(proposal_id: int, head_sha: str, digests: Mapping[str, str]) -> str:
    """An approval is wanted once per commit and set of plans, however many trail events led to them."""
    basis = head_sha + "".join(f"|{stack}={digest}" for stack, digest in sorted(digests.items()))
    return f"proposal-{proposal_id}-plan-{hashlib.sha256(basis.encode()).hexdigest()[:16]}"


def summary_counts(counts: Mapping[str, int]) -> str:
    """Terraform's summary line: a replacement both adds and destroys."""
    replaced = counts.get("replace", 0) + counts.get("replace-create-first", 0)
    add = counts.get("create", 0) + counts.get("create-forget", 0) + replaced
    destroy = counts.get("delete", 0) + replaced
    return f"{add} to add, {counts.get('update', 0)} to change, {destroy} to destroy"


def first_line(text: str, limit: int = 120) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


SIGNATURE_HEADER = "X-Gateway-Signature-256"
DELIVERY_HEADER = "X-Gateway-Delivery"
TIMESTAMP_HEADER = "X-Gateway-Timestamp"
EVENT_HEADER = "X-Gateway-Event"


def webhook_signature(key: bytes, body: bytes) -> str:
    """As GitHub signs its deliveries: `sha256=` and the hex HMAC-SHA256 of the raw body (which carries the
    delivery id and the time it was sent, so a replayed delivery is told by its id or its age)."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def webhook_body(notice: Notice, delivery_id: str, sent_at: str) -> dict[str, Any]:
    return {"delivery": delivery_id, "sent_at": sent_at, **notice.to_json(), "text": notice.text()}


def slack_body(notice: Notice, slack_channel: str | None = None) -> dict[str, Any]:
    """Slack's message: `text` for notifications, blocks for the message itself."""
    body: dict[str, Any] = {"text": _slack_escape(notice.title), "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_slack_escape(notice.title)}*"}},
        *([{"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{_slack_escape(label)}*\n{_slack_escape(value)}"}
                                          for label, value in notice.facts[:10]]}] if notice.facts else []),
        *([{"type": "section", "text": {"type": "mrkdwn", "text": f"<{notice.link}|Review>"}}] if notice.link else []),
    ]}
    if slack_channel:
        body["channel"] = slack_channel
    return body


def _slack_escape(text: str) -> str:
    """Slack's three control characters (a title cannot become a link or a mention)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def email_subject(notice: Notice) -> str:
    return f"[change gateway] {first_line(notice.title, 150)}"


def groups_of_stacks(approvers: Mapping[str, frozenset[str]], stacks: Sequence[str]) -> frozenset[str]:
    """The approver groups of `stacks` (`approvers`: stack -> its approver groups)."""
    return frozenset().union(*(approvers.get(stack, frozenset()) for stack in stacks))
