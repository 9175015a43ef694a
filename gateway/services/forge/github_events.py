"""The webhook deliveries the gateway acts on, parsed at the boundary into models of only the fields it uses.

A delivery is signed, so it comes from GitHub, but its shape is still input: a field that is missing or of
the wrong type is a `MalformedDelivery` naming the field, never a KeyError deep in a handler. Models are
strict (no "5" for 5) and ignore every field the gateway does not read.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.domain.errors import MalformedDelivery
from gateway.domain.github import Delivery
from gateway.domain.github_rules import GitHubAccount, ReviewState

MAX_REASONS = 10  # a payload wrong everywhere is not worth more lines than this


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class Account(_Model):
    id: int
    login: str
    type: str

    def facts(self) -> GitHubAccount:
        return GitHubAccount(self.id, self.login, self.type)


class Repository(_Model):
    full_name: str


class Ref(_Model):
    ref: str
    sha: str
    repo: Repository | None = None  # null when a fork's repository was deleted


class PullRequest(_Model):
    number: int
    user: Account
    head: Ref
    base: Ref
    title: str
    body: str | None = None
    merged: bool
    merge_commit_sha: str | None = None


class _Delivery(_Model):
    repository: Repository
    sender: Account


class PullRequestEvent(_Delivery):
    action: str
    pull_request: PullRequest
    before: str | None = None  # synchronize only
    after: str | None = None


class Review(_Model):
    id: int
    user: Account
    state: str  # lower-case in webhooks
    commit_id: str | None  # null when GitHub no longer has the commit reviewed
    body: str | None = None

    def as_delivered(self) -> ReviewState:
        return ReviewState(self.state.lower(), self.commit_id, self.user.id)


class ReviewedHead(_Model):
    sha: str


class ReviewedPull(_Model):
    number: int
    head: ReviewedHead | None = None  # GitHub's head when it sent the delivery (always sent; not relied on)


class ReviewEvent(_Delivery):
    action: str
    review: Review
    pull_request: ReviewedPull


class IssuePullLink(_Model):
    """Present on an issue that is a pull request; its fields are not needed."""


class Issue(_Model):
    number: int
    pull_request: IssuePullLink | None = None


class Comment(_Model):
    id: int
    user: Account
    body: str


class CommentEvent(_Delivery):
    action: str
    issue: Issue
    comment: Comment

    @property
    def on_pull_request(self) -> bool:
        return self.issue.pull_request is not None


class PushEvent(_Delivery):
    ref: str
    before: str
    after: str


GitHubEvent = PullRequestEvent | ReviewEvent | CommentEvent | PushEvent
EVENT_MODELS: dict[str, type[GitHubEvent]] = {
    "pull_request": PullRequestEvent, "pull_request_review": ReviewEvent, "issue_comment": CommentEvent,
    "push": PushEvent,
}
HANDLED_EVENTS = frozenset(EVENT_MODELS)


def parse_event(event: str, payload: Any) -> GitHubEvent | None:
    """The delivery as its model; None for an event the gateway does not handle (ping, labels, …)."""
    model = EVENT_MODELS.get(event)
    if model is None:
        return None
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise MalformedDelivery(event, [_reason(error) for error in exc.errors()[:MAX_REASONS]]) from exc


def parse_delivery(delivery: Delivery) -> GitHubEvent | None:
    """A recorded delivery as its model (see `parse_event`)."""
    return parse_event(delivery.event, json.loads(delivery.payload))


def repository_of(event: GitHubEvent) -> str:
    """The repository a delivery is about."""
    return event.repository.full_name


def _reason(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(the body)"
    if error["type"] == "missing":
        return f"field {field} is missing"
    return f"field {field} is not valid ({error['msg'][:1].lower()}{error['msg'][1:]})"
