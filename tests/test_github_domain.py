"""The pure parts of the GitHub integration, on GitHub's own test material: signatures, commands, the sticky
comment's size budget and the checks' text limit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gateway.domain.approvals import ApproverGroups
from gateway.domain.audit import AuditEvent
from gateway.domain.github import (
    CHECK_TEXT_LIMIT,
    COMMENT_LIMIT,
    Command,
    CommandKind,
    NotCounted,
    PullRequestView,
    not_counted,
    parse_command,
    pull_request_checks,
    render_comment,
    repository_allowed,
    signature_valid,
)
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.plan import load_plan
from gateway.domain.preview import build_preview
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Proposal, StackPlan

from .conftest import FIXTURES


def test_githubs_published_signature_vector() -> None:
    vector = json.loads((FIXTURES / "github" / "signature_test_vector.json").read_text())
    body = vector["payload"].encode()
    assert signature_valid(vector["secret"], body, vector["x_hub_signature_256"])
    assert not signature_valid(vector["secret"], body + b" ", vector["x_hub_signature_256"])
    assert not signature_valid("another secret", body, vector["x_hub_signature_256"])
    assert not signature_valid(vector["secret"], body, None)
    assert not signature_valid(vector["secret"], body, "sha1=" + vector["signature_hex"])
    assert not signature_valid("", body, vector["x_hub_signature_256"])  # an empty secret verifies nothing


def test_commands() -> None:
    atlantis = json.loads((FIXTURES / "github" / "atlantis_issue_comment_on_pr.created.json").read_text())
    assert "pull_request" in atlantis["issue"]  # a real comment on a pull request
    assert parse_command(atlantis["comment"]["body"]) is None  # not ours
    assert parse_command("/gateway plan") == Command(CommandKind.PLAN)
    assert parse_command("  /gateway apply\n") == Command(CommandKind.APPLY)
    assert parse_command("/gateway approve 1a2b3c4d") == Command(CommandKind.APPROVE, "1a2b3c4d")
    assert parse_command("/gateway reject too big\nsee the cost") == Command(CommandKind.REJECT, "too big\nsee the cost")
    assert parse_command("/gateway make the queue FIFO") == Command(CommandKind.ASK, "make the queue FIFO")
    assert parse_command("/gateway apply now please") == Command(CommandKind.ASK, "apply now please")
    assert parse_command("please /gateway apply") is None
    assert parse_command("/gatewayapply") is None


def big_view(resources: int) -> PullRequestView:
    changes = [{"address": f"aws_sqs_queue.q{i}", "mode": "managed", "type": "aws_sqs_queue", "name": f"q{i}",
                "provider_name": "registry.terraform.io/hashicorp/aws",
                "change": {"actions": ["create"], "before": None,
                           "after": {"name": f"queue-{i}-" + "x" * 60, "tags": {"owner": "payments"}},
                           "after_unknown": {"arn": True}}} for i in range(resources)]
    plan = load_plan({"format_version": "1.2", "terraform_version": "1.9.0", "resource_changes": changes})
    person = Principal("p1", "alice", PrincipalKind.PERSON, frozenset({Role.REQUESTER}))
    proposal = Proposal(1, "feature/many", "a" * 40, "b" * 40, person, person, "Many queues", ("app",),
                        ProposalStatus.OPEN, plans={"app": StackPlan(1, "app", "b" * 40, "sha256:" + "c" * 64, 3,
                                                                     {"create": resources}, ())})
    return PullRequestView(proposal, {"app": build_preview(plan)}, 1, ["needs 1 approval(s)"], [], [],
                           ApproverGroups({"app": frozenset({"platform"})}, (), frozenset()),
                           {"platform": "platform-team"}, [], "http://gateway.test/proposals/1",
                           datetime.now(UTC))


def test_the_sticky_comment_stays_under_githubs_limit_and_says_what_it_left_out() -> None:
    small = render_comment(big_view(3))
    assert "aws_sqs_queue.q2" in small and "not listed here" not in small
    large = render_comment(big_view(3000))
    assert len(large) < COMMENT_LIMIT
    assert "3000 resource change(s) and the outputs are not listed here" in large and "gateway/plan" in large
    assert "3000 to create" in large and "<!-- change-gateway:proposal:1 -->" in large


def test_the_plan_check_holds_the_whole_plan_or_says_where_it_is() -> None:
    [plan, policy, approval, apply] = pull_request_checks(big_view(3))
    assert "aws_sqs_queue.q2" in (plan.text or "")
    assert (approval.state.value, apply.state.value) == ("pending", "pending")
    [plan, *_] = pull_request_checks(big_view(5000))
    assert plan.text is not None and len(plan.text) <= CHECK_TEXT_LIMIT
    assert plan.text.endswith("review page: http://gateway.test/proposals/1)")


def event(seq: int, actor: str, event_kind: str, **payload: object) -> AuditEvent:
    return AuditEvent(seq, str(seq), "2025-01-01T00:00:00+00:00", actor, "person", event_kind, 1, ("app",), payload,
                      "", "")


def test_not_counted_lists_each_persons_refused_decision_once_and_nothing_else() -> None:
    head = "b" * 40
    events = [
        event(1, "alice", "approve.refused", reasons=["alice requested this change"], head_sha=head),
        event(2, "gateway", "job.refused", job=7, kind="webhook", error="alice requested this change"),
        event(3, "github:gateway-bot", "approve.refused", reasons=["gateway-bot is a bot account"], head_sha=head),
        event(4, "github:mallory", "approve.refused", reasons=["mallory is not linked"], head_sha=head),
        event(5, "github:mallory", "approve.refused", reasons=["mallory is not linked"], head_sha=head),
        event(6, "carol", "approve.refused", reasons=["the review is of an older commit"], head_sha="a" * 40),
        event(7, "dana", "apply.refused", reasons=[""], head_sha=head),
        event(8, "carol", "apply.refused", reasons=["needs 1 approval(s)"], head_sha=head),
        event(9, "github:gateway-bot", "breaker.refused", reason="stopped"),
    ]
    assert not_counted(events, head) == [
        NotCounted("alice", "approve", ("alice requested this change",)),
        NotCounted("gateway-bot", "approve", ("gateway-bot is a bot account",)),
        NotCounted("mallory", "approve", ("mallory is not linked",)),
        NotCounted("carol", "apply", ("needs 1 approval(s)",)),
    ]


def test_an_allowed_repository_matches_an_owner_name_pattern_whatever_its_case() -> None:
    patterns = ["acme/*", "other/infra"]
    assert repository_allowed(patterns, "acme/data") and repository_allowed(patterns, "ACME/Data")
    assert repository_allowed(patterns, "Other/Infra")
    assert not repository_allowed(patterns, "other/infra-2") and not repository_allowed(patterns, "evil/acme")
    assert not repository_allowed(["acme*"], "acme/data")  # a pattern without its slash admits nothing
    assert not repository_allowed([], "acme/data")
