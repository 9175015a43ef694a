"""Webhook payloads parsed at the boundary: GitHub's own examples parse, a malformed one names its field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.domain.errors import MalformedDelivery
from gateway.services.forge.github_events import (
    CommentEvent,
    PullRequestEvent,
    PushEvent,
    ReviewEvent,
    parse_event,
)

from .conftest import FIXTURES

EXAMPLE_HEAD = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"  # Codertocat/Hello-World PR #2, per SOURCES.md


def example(name: str) -> Any:
    return json.loads((FIXTURES / "github" / name).read_text())


@pytest.mark.parametrize(
    ("name", "event", "action"),
    [
        ("pull_request__opened.payload.json", "pull_request", "opened"),
        ("pull_request__reopened.payload.json", "pull_request", "reopened"),
        ("pull_request__synchronize.payload.json", "pull_request", "synchronize"),
        ("pull_request__closed.payload.json", "pull_request", "closed"),
    ],
)
def test_githubs_pull_request_examples_parse(name: str, event: str, action: str) -> None:
    parsed = parse_event(event, example(name))
    assert isinstance(parsed, PullRequestEvent) and parsed.action == action
    pr = parsed.pull_request
    assert (pr.number, pr.head.sha, pr.base.ref, pr.user.login) == (2, EXAMPLE_HEAD, "master", "Codertocat")
    assert parsed.repository.full_name == "Codertocat/Hello-World" and pr.merged is False
    assert pr.head.repo is not None and pr.head.repo.full_name == "Codertocat/Hello-World"
    if action == "synchronize":
        assert parsed.after is not None and parsed.before is not None


@pytest.mark.parametrize(("name", "action", "state"), [
    ("pull_request_review__submitted.payload.json", "submitted", "commented"),
    ("pull_request_review__dismissed.payload.json", "dismissed", "dismissed"),
])
def test_githubs_review_examples_parse(name: str, action: str, state: str) -> None:
    parsed = parse_event("pull_request_review", example(name))
    assert isinstance(parsed, ReviewEvent) and (parsed.action, parsed.review.state) == (action, state)
    assert parsed.pull_request.number == 2 and parsed.review.commit_id == EXAMPLE_HEAD
    assert not parsed.review.user.facts().is_bot


@pytest.mark.parametrize(("name", "action", "on_pull_request"), [
    ("issue_comment__created.payload.json", "created", False),
    ("issue_comment__created.with-installation.payload.json", "created", False),
    ("issue_comment__edited.payload.json", "edited", False),
    ("atlantis_issue_comment_on_pr.created.json", "created", True),
])
def test_comment_examples_parse_and_say_whether_they_are_on_a_pull_request(name: str, action: str,
                                                                           on_pull_request: bool) -> None:
    parsed = parse_event("issue_comment", example(name))
    assert isinstance(parsed, CommentEvent) and parsed.action == action
    assert parsed.on_pull_request is on_pull_request and parsed.comment.body


def test_githubs_push_example_parses_and_ping_is_not_handled() -> None:
    parsed = parse_event("push", example("push__payload.json"))
    assert isinstance(parsed, PushEvent)
    assert (parsed.ref, parsed.after, parsed.sender.login) == ("refs/tags/simple-tag", "0" * 40, "Codertocat")
    assert parse_event("ping", example("ping__payload.json")) is None  # recorded, never acted on


def without(payload: Any, path: str) -> Any:
    changed = copy.deepcopy(payload)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    del node[last]
    return changed


def replaced(payload: Any, path: str, value: Any) -> Any:
    changed = copy.deepcopy(payload)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    node[last] = value
    return changed


OPENED = example("pull_request__opened.payload.json")
REVIEW = example("pull_request_review__submitted.payload.json")
COMMENT = example("atlantis_issue_comment_on_pr.created.json")
PUSH = example("push__payload.json")


@pytest.mark.parametrize(
    ("event", "payload", "reason"),
    [
        ("pull_request", without(OPENED, "pull_request.head.sha"), "field pull_request.head.sha is missing"),
        ("pull_request", without(OPENED, "sender"), "field sender is missing"),
        ("pull_request", replaced(OPENED, "pull_request.number", "2"),
         "field pull_request.number is not valid (input should be a valid integer"),  # strict: no "2" for 2
        ("pull_request", replaced(OPENED, "pull_request.merged", None), "field pull_request.merged is not valid"),
        ("pull_request_review", without(REVIEW, "review.user.id"), "field review.user.id is missing"),
        ("pull_request_review", without(REVIEW, "review.commit_id"), "field review.commit_id is missing"),
        ("pull_request_review", replaced(REVIEW, "review.user", None), "field review.user is not valid"),
        ("issue_comment", without(COMMENT, "comment.body"), "field comment.body is missing"),
        ("issue_comment", replaced(COMMENT, "issue.number", 2.5), "field issue.number is not valid"),
        ("push", without(PUSH, "after"), "field after is missing"),
        ("push", without(PUSH, "repository.full_name"), "field repository.full_name is missing"),
        ("push", [], "is not valid"),
    ],
)
def test_a_malformed_payload_is_refused_naming_the_field(event: str, payload: Any, reason: str) -> None:
    with pytest.raises(MalformedDelivery) as refused:
        parse_event(event, payload)
    assert refused.value.event == event
    assert any(reason in r for r in refused.value.reasons), refused.value.reasons
    assert str(refused.value).startswith(f"the {event} delivery is malformed: ")
