"""GitLab's webhook deliveries the gateway acts on, parsed at the boundary into models of only the fields it reads.

The fields are those of GitLab's documented payloads (`Merge Request Hook`, `Note Hook`, `Push Hook`; see
tests/fixtures/gitlab/SOURCES.md). A delivery carries the right token, so it comes from GitLab, but its shape is
still input: a field missing or of the wrong type is a `MalformedDelivery` naming the field. Models are strict
(no "5" for 5) and ignore every field the gateway does not read.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.domain.errors import MalformedDelivery
from gateway.domain.github import Delivery

MAX_REASONS = 10
EVENT_NAMES = {"Merge Request Hook": "merge_request", "Note Hook": "note", "Push Hook": "push"}


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class User(_Model):
    id: int
    username: str


class Project(_Model):
    id: int
    path_with_namespace: str


class LastCommit(_Model):
    id: str


class MergeRequestAttributes(_Model):
    iid: int
    source_branch: str
    target_branch: str
    source_project_id: int
    target_project_id: int
    author_id: int
    title: str
    description: str | None = None
    state: str
    action: str | None = None  # open, close, reopen, update, approved, unapproved, approval, unapproval, merge
    last_commit: LastCommit | None = None  # the head when GitLab sent the delivery
    oldrev: str | None = None  # only when commits were pushed
    merge_commit_sha: str | None = None


class MergeRequestEvent(_Model):
    object_kind: str
    user: User  # who did it: opened, pushed, approved, merged
    project: Project
    object_attributes: MergeRequestAttributes

    @property
    def number(self) -> int:
        return self.object_attributes.iid


class NoteAttributes(_Model):
    id: int
    note: str
    noteable_type: str
    system: bool = False  # GitLab's own notes ("approved this merge request", "added 1 commit")
    action: str | None = None  # create or update (GitLab 16.11 and later; absent: a new note)


class NotedMergeRequest(_Model):
    iid: int


class NoteEvent(_Model):
    object_kind: str
    user: User
    project: Project
    object_attributes: NoteAttributes
    merge_request: NotedMergeRequest | None = None  # present on a note on a merge request

    @property
    def on_merge_request(self) -> bool:
        return self.object_attributes.noteable_type == "MergeRequest" and self.merge_request is not None


class PushEvent(_Model):
    object_kind: str
    ref: str
    before: str
    after: str
    user_id: int
    user_username: str
    project: Project


GitLabEvent = MergeRequestEvent | NoteEvent | PushEvent
EVENT_MODELS: dict[str, type[GitLabEvent]] = {
    "Merge Request Hook": MergeRequestEvent, "Note Hook": NoteEvent, "Push Hook": PushEvent,
}


def parse_event(event: str, payload: Any) -> GitLabEvent | None:
    """The delivery as its model; None for an event the gateway does not handle (issues, pipelines, ...)."""
    model = EVENT_MODELS.get(event)
    if model is None:
        return None
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise MalformedDelivery(EVENT_NAMES[event], [_reason(e) for e in exc.errors()[:MAX_REASONS]]) from exc


def parse_delivery(delivery: Delivery) -> GitLabEvent | None:
    """A recorded delivery as its model (see `parse_event`); it is recorded under the event's short name."""
    hooks = {name: hook for hook, name in EVENT_NAMES.items()}
    return parse_event(hooks.get(delivery.event, delivery.event), json.loads(delivery.payload))


def repository_of(event: GitLabEvent) -> str:
    """The project a delivery is about."""
    return event.project.path_with_namespace


def _reason(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(the body)"
    if error["type"] == "missing":
        return f"field {field} is missing"
    return f"field {field} is not valid ({error['msg'][:1].lower()}{error['msg'][1:]})"
