"""Pull requests on GitHub, end to end: the real app and its worker, PyGithub talking to a fake GitHub over
real HTTP (its answers validated against GitHub's REST description), signed webhook deliveries built
from the fake's state (validated against the webhook description), and real git on both sides.

The decision rules themselves (which approvals do not count and why, dismissals, pushers, ignored deliveries, forks)
run on fakes in tests/test_forge_rules_on_fakes.py; each family keeps an end-to-end case here or in test_gitlab.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from gateway import worker as worker_module
from gateway.api.app import create_app
from gateway.cli import cli
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.audit import AuditEvent
from gateway.domain.errors import ConfigError
from gateway.domain.github import plan_fingerprint
from gateway.domain.jobs import RetryPolicy
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.agents.agent_requests import agent_principal
from gateway.services.change import jobs as jobs_service
from gateway.services.change.proposals import get_proposal, open_proposal
from gateway.services.forge import github as github_service
from gateway.services.forge.github import link_account
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people
from .github_fake import FakeGitHub
from .model_stub import ModelStub, tool_call

SECRET = "It's a Secret to Everybody"
T = TypeVar("T")

QUEUE = '''resource "aws_sqs_queue" "refunds" {
  name = "refund-events"
  tags = { owner = "payments", "cost-centre" = "cc-42" }
}
'''


@dataclass
class World:
    ws: Workspace
    gh: FakeGitHub
    client: TestClient
    people: People
    stub: ModelStub
    home: Path

    def deliver(self, event: str, payload: dict[str, Any], delivery: str | None = None,
                secret: str | None = SECRET) -> Any:
        body = json.dumps(payload).encode()
        headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
                   "Content-Type": "application/json"}
        if secret is not None:
            headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return self.client.post("/api/v1/github/webhook", content=body, headers=headers)

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.people.tokens[name]}"}

    def events(self, proposal_id: int | None = None, kind: str | None = None) -> list[Any]:
        with self.ws.store.session(readonly=True) as session:
            return session.audit.events(proposal_id=proposal_id, kind=kind)

    def sticky(self, number: int) -> str:
        mine = [c["body"] for c in self.gh.comments(number) if "change-gateway:proposal:" in c["body"]]
        return mine[-1] if mine else ""

    def statuses(self, sha: str) -> dict[str, str]:
        latest: dict[str, str] = {}
        for status in self.gh.statuses(sha):  # oldest first: the newest of each context wins
            latest[status["context"]] = status["state"]
        return latest


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def make_github_the_forge(ws: Workspace, gh: FakeGitHub, clone_dir: Path) -> None:
    """An admin commits `forge: github` to main (teams: platform, app), and main becomes GitHub's main."""
    main = Clone(ws, clone_dir)
    main.write("gateway.yaml", main.read("gateway.yaml") + (
        f"\nforge: github\ngithub:\n  repository: {gh.full_name}\n  api_url: {gh.url}\n"
        f"  git_url: {gh.git_url}\n  teams: {{platform: platform-team, app: app-team}}\n"))
    main.push("GitHub is the forge", author="admin")
    ws.repo.repo.git.push(gh.git_url, "+main:main")


@contextmanager
def github_world(root: Path, app: bool = False, database_url: str | None = None) -> Iterator[World]:
    """A workspace whose gateway.yaml says `forge: github`, its app and worker, GitHub's fake and a model stub."""
    with FakeGitHub(root / "github") as gh, ModelStub() as stub:
        credentials: dict[str, Any] = ({"github_app_id": gh.app_id, "github_app_private_key": gh.app_private_key_pem,
                                        "github_installation_id": gh.installation_id} if app
                                       else {"github_token": "ghp_test_token"})
        settings = Settings(home=root / "home", database_url=database_url, token=None, lock_wait_seconds=2,
                            github_webhook_secret=SECRET, github_write_interval_seconds=0,
                            public_url="http://gateway.test", openai_base_url=stub.base_url, openai_api_key="k",
                            model="stub-model", **credentials)
        ws = create_workspace(settings)
        bootstrap_simulator(ws)
        people = add_people(ws)
        make_github_the_forge(ws, gh, root / "admin-clone")
        for name in ("alice", "bob", "carol", "erin", "dana"):
            link_account(ws, people.admin, name, name, gh.add_user(name))
        agent_principal(ws)
        link_account(ws, people.admin, "gateway-agent", "gateway-bot", gh.add_user("gateway-bot", user_type="Bot"))
        gh.add_user("mallory")
        gh.add_team("platform-team", ["bob", "carol"])
        gh.add_team("app-team", ["alice"])
        with TestClient(create_app(settings, workers=1)) as client:
            yield World(ws, gh, client, people, stub, settings.home)
        ws.close()
    assert not (gh.schema_errors or gh.request_errors or gh.unhandled), (gh.schema_errors, gh.request_errors,
                                                                         gh.unhandled)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with github_world(tmp_path) as w:
        yield w


def open_pull_on_github(world: World, branch: str = "feature/refunds", user: str = "alice", **kwargs: Any) -> int:
    """A person pushes a branch to GitHub and opens a pull request there; GitHub tells the gateway."""
    world.gh.push_commit(branch, {"stacks/app-staging/queue.tf": QUEUE}, "Add a refunds queue", author_login=user)
    number = world.gh.open_pull(branch, "Add a queue for refund events", "Refunds need a queue.", user, **kwargs)
    assert world.deliver("pull_request", world.gh.pull_request_event(number, "opened", sender=user)).status_code == 202
    return number


def proposal_of(world: World, number: int) -> int:
    def probe() -> int | None:
        with world.ws.store.session(readonly=True) as session:
            return session.github.proposal_for_pull_request(world.gh.full_name, number)
    return wait_for(f"a proposal for pull request #{number}", probe)


def test_an_agent_request_becomes_a_pull_request_approved_applied_and_merged_on_github(world: World) -> None:
    world.stub.turns = [
        tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Adds aws_sqs_queue.refunds; nothing is deleted."),
    ]
    run = world.client.post("/api/v1/requests", json={"text": "Add a queue for refund events in staging"},
                            headers=world.auth("alice")).json()
    proposal_id = wait_for("the agent's proposal", lambda: world.client.get(
        f"/api/v1/requests/{run['id']}", headers=world.auth("alice")).json().get("proposal_id"))
    proposal = get_proposal(world.ws, proposal_id)

    [pull] = wait_for("the pull request", lambda: [p for p in world.gh.pulls() if p["head"]["ref"] == proposal.branch])
    number = pull["number"]
    assert pull["head"]["sha"] == proposal.head_sha  # the agent's branch was pushed as it is
    comment = wait_for("the sticky comment", lambda: world.sticky(number))
    assert "Requested by **alice**, proposed by **gateway-agent** (agent)" in comment
    assert "aws_sqs_queue.refunds" in comment and "the plan agrees with what the agent says" in comment
    assert "needs **1** approval(s)" in comment and "team `platform-team`" in comment
    expected = {"gateway/plan": "success", "gateway/policy": "success", "gateway/approval": "pending",
                "gateway/apply": "pending"}
    wait_for("the four checks", lambda: world.statuses(proposal.head_sha) == expected)
    assert set(world.gh.review_requests(number)["teams"]) == {"platform-team", "app-team"}

    review = world.gh.add_review(number, "carol", "APPROVED", body="looks right")
    assert world.deliver("pull_request_review", world.gh.review_event(review)).status_code == 202
    wait_for("carol's approval", lambda: get_proposal(world.ws, proposal_id).current_approvals)

    command = world.gh.add_comment(number, "carol", "/gateway apply")
    assert world.deliver("issue_comment", world.gh.comment_event(command)).status_code == 202
    wait_for("the apply", lambda: get_proposal(world.ws, proposal_id).status.value == "applied")
    merged = world.gh.pull(number)
    assert merged["merged"] and get_proposal(world.ws, proposal_id).merge_sha == merged["merge_commit_sha"]
    [merge_call] = [body for method, path, body in world.gh.requests if path.endswith(f"/pulls/{number}/merge")]
    assert merge_call["sha"] == proposal.head_sha  # merged exactly the approved head
    assert world.ws.repo.resolve("main") == merged["merge_commit_sha"]  # the gateway's main follows GitHub's

    wait_for("the outcome on the pull request", lambda: "Applied and merged into main" in world.sticky(number)
             and world.statuses(proposal.head_sha).get("gateway/apply") == "success")
    assert world.statuses(proposal.head_sha)["gateway/approval"] == "success"

    story = CliRunner().invoke(cli, ["audit", "show", str(proposal_id)], env={
        "GATEWAY_HOME": str(world.home), "GATEWAY_TOKEN": world.people.tokens["dana"]})
    assert story.exit_code == 0, story.output
    approval = next(line for line in story.output.splitlines() if " approval" in line)
    assert "carol" in approval
    assert f"authenticated_by: github-review:carol#{review['id']}" in story.output
    assert "github.team_check" in story.output and "platform" in story.output


def test_a_change_to_a_protected_path_asks_the_config_approvers_team_on_github(world: World, tmp_path: Path) -> None:
    admin = Clone(world.ws, tmp_path / "teams")
    admin.edit("gateway.yaml", "teams: {platform: platform-team, app: app-team}",
               "teams: {platform: platform-team, app: app-team, security: security-team}")
    admin.push("security approves protected paths on GitHub", author="admin")
    world.ws.repo.repo.git.push(world.gh.git_url, "+main:main")
    world.gh.add_team("security-team", ["frank"])
    change = Clone(world.ws, tmp_path / "change").branch("feature/queue-policy")
    change.write("stacks/app-staging/queue.tf", QUEUE).write("policies/README.md", "Queues carry an owner tag.\n")
    change.push("A refunds queue, and the rule it follows")
    open_proposal(world.ws, world.people.alice, "feature/queue-policy", "A refunds queue and its rule")

    [pull] = wait_for("the pull request", lambda: [p for p in world.gh.pulls() if p["head"]["ref"] == change.repo.
                                                   active_branch.name])
    # the config approvers (platform, security) approve the protected path: security's team is asked too
    teams = wait_for("the review requests", lambda: world.gh.review_requests(pull["number"])["teams"])
    assert set(teams) == {"platform-team", "app-team", "security-team"}
    paths = ("- protected paths `policies/README.md`: from platform (team `platform-team`), "
             "security (team `security-team`)")
    comment = wait_for("the sticky comment", lambda: world.sticky(pull["number"]))
    assert paths in comment, comment
    assert "- `app-staging`: from app (team `app-team`), platform (team `platform-team`)" in comment


def test_a_pull_request_opened_on_github_is_a_proposal_of_its_author(world: World) -> None:
    number = open_pull_on_github(world)
    proposal = get_proposal(world.ws, proposal_of(world, number))
    assert (proposal.requester.name, proposal.proposer.name, proposal.stacks) == ("alice", "alice", ("app-staging",))
    assert proposal.head_sha == world.gh.pull(number)["head"]["sha"]
    comment = wait_for("the sticky comment", lambda: world.sticky(number))
    assert f"/gateway approve {plan_fingerprint(proposal.current_digests)[:12]}" in comment

    # a push re-plans, and the approval given before it is stale
    review = world.gh.add_review(number, "carol", "APPROVED")
    world.deliver("pull_request_review", world.gh.review_event(review))
    wait_for("the approval", lambda: get_proposal(world.ws, proposal.id).current_approvals)
    before = world.gh.pull(number)["head"]["sha"]
    after = world.gh.push_commit("feature/refunds", {"stacks/app-staging/queue2.tf": QUEUE.replace("refunds", "r2")},
                                 "Another queue", author_login="alice")
    world.deliver("pull_request", world.gh.pull_request_event(number, "synchronize", sender="alice",
                                                              before=before, after=after))
    wait_for("the re-plan", lambda: get_proposal(world.ws, proposal.id).head_sha == after)
    assert not get_proposal(world.ws, proposal.id).current_approvals
    wait_for("the comment to show the new plan", lambda: after[:12] in world.sticky(number))

    # closed without merging: abandoned
    world.gh.close_pull(number)
    world.deliver("pull_request", world.gh.pull_request_event(number, "closed", sender="alice"))
    wait_for("the abandon", lambda: get_proposal(world.ws, proposal.id).status.value == "abandoned")


def test_people_link_their_github_account_by_its_numeric_id(world: World) -> None:
    frank_id = world.gh.add_user("frank-gh")
    result = CliRunner().invoke(cli, ["users", "link", "frank", "--github", "frank-gh"], env={
        "GATEWAY_HOME": str(world.home), "GATEWAY_TOKEN": world.people.tokens["admin"],
        "GATEWAY_GITHUB_TOKEN": "ghp_admin"})
    assert result.exit_code == 0, result.output
    assert f"linked frank to GitHub user frank-gh (id {frank_id})" in result.output
    with world.ws.store.session(readonly=True) as session:
        assert session.principals.by_github_id(frank_id).name == "frank"
    refused = CliRunner().invoke(cli, ["users", "link", "frank", "--github", "frank-gh", "--github-id", "5"], env={
        "GATEWAY_HOME": str(world.home), "GATEWAY_TOKEN": world.people.tokens["carol"]})
    assert refused.exit_code != 0 and "only admins link accounts" in str(refused.exception)


def test_signatures_and_redeliveries(world: World) -> None:
    world.gh.push_commit("feature/refunds", {"stacks/app-staging/queue.tf": QUEUE}, "queue", author_login="alice")
    number = world.gh.open_pull("feature/refunds", "Add a queue", "", "alice")
    payload = world.gh.pull_request_event(number, "opened", sender="alice")
    assert world.deliver("pull_request", payload, secret=None).status_code == 401
    assert world.deliver("pull_request", payload, secret="not the secret").status_code == 401
    forged = world.client.post("/api/v1/github/webhook", content=json.dumps(payload).encode(), headers={
        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "x", "X-Hub-Signature-256": "sha256=é".encode()})
    assert forged.status_code == 401
    with world.ws.store.session(readonly=True) as session:
        assert session.github.proposal_for_pull_request(world.gh.full_name, number) is None
    assert world.ws.store.db.engine.connect().exec_driver_sql("select count(*) from webhook_deliveries").scalar() == 0

    first = world.deliver("pull_request", payload, delivery="delivery-1")
    again = world.deliver("pull_request", payload, delivery="delivery-1")
    assert first.status_code == again.status_code == 202
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    assert again.json()["job"] == first.json()["job"]
    proposal_of(world, number)
    opened = [e for e in world.events(kind="proposal.opened")]
    assert len(opened) == 1


def test_a_forge_without_a_webhook_secret_does_not_start(world: World) -> None:
    settings = world.ws.settings.model_copy(update={"github_webhook_secret": None})
    with pytest.raises(ConfigError, match="GATEWAY_GITHUB_WEBHOOK_SECRET"):
        create_app(settings, workers=0)


def test_approvals_that_do_not_count_are_refused_with_the_reason_in_the_trail_and_the_comment(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    gh = world.gh

    def refused(login: str, event: str, payload: dict[str, Any], reason: str) -> None:
        count = len([e for e in world.events(pid) if e.kind.endswith(".refused")])
        assert world.deliver(event, payload).status_code == 202
        event_ = wait_for(f"the refusal of {login}", lambda: [
            e for e in world.events(pid) if e.kind.endswith(".refused")][count:])[0]
        assert reason in "; ".join(event_.payload["reasons"]), event_.payload
        wait_for(f"the comment to say why {login} does not count", lambda: reason in world.sticky(number))
        assert not get_proposal(world.ws, pid).current_approvals

    refused("alice", "pull_request_review", gh.review_event(gh.add_review(number, "alice", "APPROVED")),
            "alice requested this change")
    refused("gateway-bot", "pull_request_review", gh.review_event(gh.add_review(number, "gateway-bot", "APPROVED")),
            "gateway-bot is a bot account")
    refused("mallory", "pull_request_review", gh.review_event(gh.add_review(number, "mallory", "APPROVED")),
            "GitHub user mallory is not linked")
    gh.remove_member("platform-team", "bob")
    refused("bob", "pull_request_review", gh.review_event(gh.add_review(number, "bob", "APPROVED")),
            "bob is not in an approver group of stack app-staging")
    assert world.events(pid, kind="github.team_check")[-1].payload["not_member"] == ["platform"]
    old = gh.pull(number)["head"]["sha"]
    gh.push_commit("feature/refunds", {"stacks/app-staging/more.tf": QUEUE.replace("refunds", "more")}, "more",
                   author_login="alice")
    refused("carol", "pull_request_review", gh.review_event(gh.add_review(number, "carol", "APPROVED", commit_id=old)),
            f"the review is of commit {old[:12]}")
    refused("dana", "issue_comment", gh.comment_event(gh.add_comment(number, "dana", "/gateway approve 0000000")),
            "does not name the current plan")
    proposal = get_proposal(world.ws, pid)
    fingerprint = plan_fingerprint(proposal.current_digests)[:12]
    refused("dana", "issue_comment", gh.comment_event(gh.add_comment(number, "dana", f"/gateway approve {fingerprint}")),
            "dana does not have the approver role")


@pytest.mark.postgres
def test_a_push_after_the_approval_stops_the_apply_and_the_merge_on_postgres(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with github_world(tmp_path, database_url=postgres_url) as world:
        push_after_approval(world)


def test_a_push_after_the_approval_stops_the_apply_and_the_merge(world: World) -> None:
    push_after_approval(world)


LAPSED = ("carol's approval on GitHub no longer counts: carol is not an active member of an approver team of "
          "stack app-staging any more")


def _approved_by_carol_who_then_leaves_the_team(world: World, before_leaving: Callable[[int], None] = lambda _: None,
                                                ) -> tuple[int, int, AuditEvent]:
    """carol approves on GitHub, leaves the team on GitHub, then bob asks for the apply: (pull, proposal, refusal)."""
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    fingerprint = plan_fingerprint(get_proposal(world.ws, pid).current_digests)[:12]
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(
        number, "carol", f"/gateway approve {fingerprint}")))
    wait_for("carol's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    before_leaving(pid)
    world.gh.remove_member("platform-team", "carol")  # on GitHub, after her approval was recorded
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(number, "bob", "/gateway apply")))
    return number, pid, wait_for("the apply's refusal", lambda: world.events(pid, kind="apply.refused"))[0]


def test_an_approver_who_left_the_team_after_approving_no_longer_counts_at_apply(world: World) -> None:
    number, pid, refusal = _approved_by_carol_who_then_leaves_the_team(world)
    assert LAPSED in "; ".join(refusal.payload["reasons"])
    assert not world.gh.pull(number)["merged"] and get_proposal(world.ws, pid).status.value == "open"


def test_after_the_apply_found_a_lapsed_team_membership_every_view_says_so(world: World) -> None:
    """The apply asks GitHub and records the answer; the views (which never ask GitHub) then show what it found."""
    def applicable_before(pid: int) -> None:
        assert world.client.get(f"/api/v1/proposals/{pid}", headers=world.auth("bob")).json()["can_apply"] is True

    number, pid, refusal = _approved_by_carol_who_then_leaves_the_team(world, applicable_before)
    lapsed = LAPSED
    shown = world.client.get(f"/api/v1/proposals/{pid}", headers=world.auth("bob")).json()
    assert shown["can_apply"] is False and lapsed in shown["blocked_by"]
    assert shown["apply_blockers"] == refusal.payload["reasons"]
    wait_for("the sticky comment naming it", lambda: f":no_entry: {lapsed}" in world.sticky(number))


def push_after_approval(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    proposal = get_proposal(world.ws, pid)
    fingerprint = plan_fingerprint(proposal.current_digests)[:12]
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(
        number, "carol", f"/gateway approve {fingerprint}")))
    approval = wait_for("carol's approval", lambda: get_proposal(world.ws, pid).current_approvals)[0]
    assert approval.auth.startswith("github-comment:carol#")
    # a push slips in on GitHub; its webhook has not arrived when carol asks for the apply
    world.gh.push_commit("feature/refunds", {"stacks/app-staging/sneaky.tf": QUEUE.replace("refunds", "sneaky")},
                         "sneaky", author_login="alice")
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(number, "carol", "/gateway apply")))
    refusal = wait_for("the apply's refusal", lambda: world.events(pid, kind="apply.refused"))[0]
    assert "needs 1 approval(s)" in "; ".join(refusal.payload["reasons"])
    assert not world.gh.pull(number)["merged"]
    assert not [body for _, path, body in world.gh.requests if path.endswith("/merge")]
    assert get_proposal(world.ws, pid).status.value == "open"


def test_with_a_github_app_the_checks_are_check_runs_and_the_whole_plan_is_in_the_plan_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with github_world(tmp_path, app=True) as world:
        number = open_pull_on_github(world)
        head = world.gh.pull(number)["head"]["sha"]
        runs = wait_for("four check runs", lambda: (lambda r: r if len(r) == 4 else None)(
            {run["name"]: run for run in world.gh.check_runs(head)}))
        assert (runs["gateway/plan"]["status"], runs["gateway/plan"]["conclusion"]) == ("completed", "success")
        assert "aws_sqs_queue.refunds" in runs["gateway/plan"]["output"]["text"]
        assert runs["gateway/approval"]["status"] == "in_progress"
        assert runs["gateway/apply"]["status"] == "in_progress"
        assert runs["gateway/plan"]["details_url"].startswith("http://gateway.test/proposals/")
        assert not world.gh.statuses(head)  # an App writes checks, not statuses
        assert any(body and body.get("permissions") is not None for method, path, body in world.gh.requests
                   if path.endswith("/access_tokens"))  # authenticated as the App's installation


def test_a_merge_by_hand_on_github_before_any_apply_is_reported_loudly(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    world.gh.add_token("ghp_bob", "bob")
    response = httpx.put(f"{world.gh.url}/repos/{world.gh.full_name}/pulls/{number}/merge",
                         headers={"Authorization": "token ghp_bob"}, json={"merge_method": "merge"})
    assert response.status_code == 200, response.text
    world.deliver("pull_request", world.gh.pull_request_event(number, "closed", sender="bob"))
    [warning] = wait_for("the warning", lambda: world.events(pid, kind="github.merged_without_apply"))
    assert "main now describes changes that were never applied" in warning.payload["warning"]
    assert get_proposal(world.ws, pid).status.value == "abandoned"
    wait_for("the comment to say so", lambda: "were never applied" in world.sticky(number))


def test_gateway_plain_words_ask_the_agent_to_revise_its_branch_and_only_the_requester_may(world: World) -> None:
    world.stub.turns = [tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                        tool_call("run_preview", stack="app-staging"),
                        tool_call("finish", summary="Adds aws_sqs_queue.refunds.")]
    run = world.client.post("/api/v1/requests", json={"text": "Add a queue for refund events in staging"},
                            headers=world.auth("alice")).json()
    pid = wait_for("the proposal", lambda: world.client.get(f"/api/v1/requests/{run['id']}",
                                                            headers=world.auth("alice")).json().get("proposal_id"))
    first = get_proposal(world.ws, pid)
    [pull] = wait_for("the pull request", lambda: [p for p in world.gh.pulls() if p["head"]["ref"] == first.branch])
    number = pull["number"]

    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(number, "carol", "/gateway add a DLQ")))
    refusal = wait_for("carol's refusal", lambda: world.events(pid, kind="ask.refused"))[0]
    assert "only the person who asked the agent" in refusal.payload["reasons"][0]

    dlq = QUEUE.replace("refunds", "refunds_dlq").replace("refund-events", "refund-events-dlq")
    world.stub.turns = [tool_call("write_file", path="stacks/app-staging/dlq.tf", content=dlq),
                        tool_call("run_preview", stack="app-staging"),
                        tool_call("finish", summary="Adds aws_sqs_queue.refunds_dlq as a dead-letter queue.")]
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(
        number, "alice", "/gateway also add a dead-letter queue")))
    revised = wait_for("the revision", lambda: (lambda p: p if p.head_sha != first.head_sha else None)(
        get_proposal(world.ws, pid)))
    assert set(revised.changed_paths) == {"stacks/app-staging/queue.tf", "stacks/app-staging/dlq.tf"}
    wait_for("the push to GitHub", lambda: world.gh.pull(number)["head"]["sha"] == revised.head_sha)
    assert "also add a dead-letter queue" in json.dumps(world.stub.requests[-2]["messages"])  # same conversation
    assert "Add a queue for refund events" in json.dumps(world.stub.requests[-2]["messages"])

    world.stub.turns = [tool_call("ask_user", question="How many days should dead letters be kept?")]
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(
        number, "alice", "/gateway keep dead letters longer")))
    wait_for("the agent's question on the pull request", lambda: any(
        "The agent asks @alice: How many days should dead letters be kept?" in c["body"]
        for c in world.gh.comments(number)))


def test_a_push_to_main_outside_the_gateway_is_recorded_loudly(world: World) -> None:
    before = world.gh.branch_sha("main")
    after = world.gh.push_commit("main", {"stacks/app-staging/hotfix.tf": QUEUE.replace("refunds", "hotfix")},
                                 "hotfix straight to main", author_login="bob")
    world.deliver("push", world.gh.push_event("main", before, after, sender="bob"))
    [pushed] = wait_for("the warning", lambda: world.events(kind="github.main_pushed"))
    assert pushed.payload["stacks"] == ["app-staging"] and "never applied" in pushed.payload["warning"]
    assert world.ws.repo.resolve("main") == after  # GitHub's main is the truth


def gateway_comments(world: World, number: int) -> list[str]:
    return [c["body"] for c in world.gh.comments(number) if "change-gateway:proposal:" in c["body"]]


def not_counted(comment: str) -> list[str]:
    """The lines of the sticky comment's "Not counted" list."""
    section = comment.partition("**Not counted:**\n")[2]
    return [line for line in section.split("\n\n", 1)[0].splitlines() if line.startswith("- ")]


def test_an_approval_given_while_githubs_api_fails_is_retried_until_it_counts(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(github_service, "PUBLISH_RETRY_SECONDS", 0.5)
    approval_while_github_fails(world)


@pytest.mark.postgres
def test_an_approval_given_while_githubs_api_fails_is_retried_until_it_counts_on_postgres(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    monkeypatch.setattr(github_service, "PUBLISH_RETRY_SECONDS", 0.5)
    with github_world(tmp_path, database_url=postgres_url) as world:
        approval_while_github_fails(world)


def approval_while_github_fails(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    wait_for("the sticky comment", lambda: world.sticky(number))
    world.gh.fail_requests(500)  # GitHub's API has a bad moment; its webhooks still arrive
    review = world.gh.add_review(number, "carol", "APPROVED")
    answer = world.deliver("pull_request_review", world.gh.review_event(review))
    assert answer.status_code == 202
    [retrying] = wait_for("the delivery's first retry", lambda: world.events(pid, kind="job.retrying"))
    assert retrying.payload["attempt"] == 1 and "500" in retrying.payload["error"], retrying.payload
    assert retrying.payload["job"] == answer.json()["job"] and retrying.payload["retry_in_seconds"] > 0
    assert not get_proposal(world.ws, pid).current_approvals
    world.gh.recover()
    [approval] = wait_for("carol's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    assert approval.principal.name == "carol" and approval.auth == f"github-review:carol#{review['id']}"
    wait_for("the comment to count it", lambda: "has 1 (carol)" in world.sticky(number))
    wait_for("the approval check", lambda: world.statuses(approval.head_sha).get("gateway/approval") == "success")
    job = world.ws.store.queue.get(answer.json()["job"])
    assert job.status.value == "succeeded" and job.attempts == 2
    assert any("GitHub is unavailable" in line and "attempt 1" in line for line in job.progress), job.progress
    assert not world.events(pid, kind="job.failed")


def test_a_delivery_that_keeps_failing_is_given_up_and_says_so(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_service, "WEBHOOK_RETRY", RetryPolicy(
        first_delay_seconds=0.05, max_delay_seconds=0.1, max_attempts=3, max_age_seconds=600))
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    wait_for("the sticky comment", lambda: world.sticky(number))
    world.gh.fail_requests(403, rate_limited=True)
    answer = world.deliver("pull_request_review", world.gh.review_event(world.gh.add_review(number, "carol")))
    [failed] = wait_for("the delivery to be given up", lambda: world.events(pid, kind="job.failed"))
    assert [e.payload["attempt"] for e in world.events(pid, kind="job.retrying")] == [1, 2]
    assert "gave up after 3 attempts" in failed.payload["error"] and "rate limit" in failed.payload["error"]
    assert world.ws.store.queue.get(answer.json()["job"]).status.value == "failed"
    world.gh.recover()
    assert not get_proposal(world.ws, pid).current_approvals


@pytest.mark.parametrize("app", [False, True], ids=["statuses", "check-runs"])
def test_a_publish_that_fails_after_commenting_keeps_one_sticky_comment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app: bool) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    monkeypatch.setattr(github_service, "PUBLISH_RETRY_SECONDS", 0.5)
    with github_world(tmp_path, app=app) as world:
        publish_failing_after_the_comment(world, app)


def publish_failing_after_the_comment(world: World, app: bool) -> None:
    # the comment is posted, then writing the first check fails
    world.gh.fail_requests(500, times=1, method="POST", path=r"/check-runs" if app else r"/statuses/")
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    head = world.gh.pull(number)["head"]["sha"]
    wait_for("the four checks", lambda: len(world.gh.check_runs(head) if app else world.statuses(head)) == 4)
    assert [r.status for r in world.gh.faults_served] == [500]
    assert len(gateway_comments(world, number)) == 1
    world.deliver("pull_request_review", world.gh.review_event(world.gh.add_review(number, "carol", "APPROVED")))
    wait_for("carol's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    wait_for("the comment to count it", lambda: "has 1 (carol)" in world.sticky(number))
    assert len(gateway_comments(world, number)) == 1


def test_the_not_counted_list_names_each_refused_decision_once_with_who_and_why(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    gh = world.gh
    reviews = [("alice", "alice requested this change"), ("gateway-bot", "is a bot account")] + \
        [("mallory", "GitHub user mallory is not linked")] * 4  # and every one of them a refused job
    for login, _ in reviews:
        world.deliver("pull_request_review", gh.review_event(gh.add_review(number, login, "APPROVED")))
    wait_for("every refusal", lambda: len(world.events(pid, kind="approve.refused")) == len(reviews))
    # each job's end is recorded just after its refusal, in a transaction of its own
    wait_for("every job's end", lambda: len(world.events(pid, kind="job.refused")) == len(reviews))

    def listed() -> list[str] | None:
        lines = not_counted(world.sticky(number))
        return lines if all(any(login in line and why in line for line in lines) for login, why in reviews) else None

    try:
        lines = wait_for("the comment to list alice, gateway-bot and mallory", listed)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the list reads {not_counted(world.sticky(number))}") from exc
    assert len(lines) == 3, lines  # each person's refused approval, once
    assert all(line.split(":", 1)[1].strip() for line in lines), lines
    assert any(line.startswith("- **alice**") and "alice requested this change" in line for line in lines), lines


def test_a_command_after_an_approval_that_waits_for_github_runs_after_it(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(github_service, "PUBLISH_RETRY_SECONDS", 0.5)
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    wait_for("the sticky comment", lambda: world.sticky(number))
    world.gh.fail_requests(502, method="GET", path=r"/reviews/\d+$")  # only reading the review fails
    world.deliver("pull_request_review", world.gh.review_event(world.gh.add_review(number, "carol", "APPROVED")))
    wait_for("the review's retry", lambda: world.events(pid, kind="job.retrying"))
    world.deliver("issue_comment", world.gh.comment_event(world.gh.add_comment(number, "carol", "/gateway apply")))
    time.sleep(1.5)  # the apply command's delivery could run now; it waits behind the review GitHub sent first
    assert not world.events(pid, kind="apply.refused") and get_proposal(world.ws, pid).status.value == "open"
    world.gh.recover()
    wait_for("the apply", lambda: get_proposal(world.ws, pid).status.value == "applied", timeout=60)
    assert not world.events(pid, kind="apply.refused")
    assert world.gh.pull(number)["merged"]
