"""The rules of a decision made on GitHub or GitLab, run on tests/fakes.py: the deliveries are GitHub's and GitLab's
own example payloads (tests/fixtures/github, tests/fixtures/gitlab) made to name our people and commits, received
and handled through the webhook services' entry points (`receive_delivery`, then `handle_delivery` as the worker
runs it), with the code host a FakeGitHubForge or FakeGitLabForge and the records in the fake unit of work.

Which approvals do not count and why, what a review, an unapproval or a note command does, which deliveries are
ignored, redeliveries, and a push to main outside the gateway. What only the real path shows (HTTP and signatures
through the app, PyGithub and python-gitlab, git fetches, re-plans, the sticky comment, check runs, retries,
PostgreSQL) stays in tests/test_github.py and tests/test_gitlab.py.
"""

from __future__ import annotations

import copy
import json
import uuid
from functools import cache
from typing import Any

import pytest

from gateway.domain.errors import AuthError, GatewayError, Refused
from gateway.domain.github import plan_fingerprint
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import PlanSummary, Proposal
from gateway.services.change.proposals import get_proposal
from gateway.services.forge import github_webhooks, gitlab_webhooks

from .conftest import FIXTURES
from .fakes import FakeCodeHost, FakeGitHubForge, FakeGitLabForge, FakeHostedRepo, forge_workspace, person
from .github_fake import webhook_delivery
from .gitlab_fake import FakeGitLab as GitLabServer

BRANCH = "feature/refunds"
PLAN = "sha256:plan1"


@cache
def example(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def fixture(name: str) -> dict[str, Any]:
    """A fresh copy of one of the forges' own example payloads."""
    return copy.deepcopy(example(name))


class Forged:
    """A gateway on fakes whose main names a forge (the host a FakeGitHubForge or FakeGitLabForge), its people
    (linked to forge accounts by numeric id; mallory is not), the proposals `propose` opens, and what the handling of
    each delivery came to (`handled`: the job's result, or the refusal it ended with)."""

    forge_yaml = ""
    secrets: dict[str, str] = {}
    number = 0  # the pull (merge) request of every proposal here
    ids = {"alice": 101, "bob": 102, "carol": 103, "dana": 104, "gateway-agent": 199, "mallory": 666}

    def __init__(self) -> None:
        self.ws = forge_workspace(self.forge_yaml, self.secrets)
        assert isinstance(self.ws.repo, FakeHostedRepo)
        self.repo = self.ws.repo
        settings = self.ws.repo_settings().forge
        assert settings is not None
        host = self.ws.open_forge(settings)
        assert isinstance(host, FakeCodeHost)
        self.host = host

        def add(name: str, role: Role, *groups: str, kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
            return person(name, role, groups=groups, kind=kind, store=self.ws.store)

        self.people = {p.name: p for p in (
            add("alice", Role.REQUESTER, "app"), add("bob", Role.APPROVER, "platform"),
            add("carol", Role.APPROVER, "platform"), add("dana", Role.AUDITOR),
            add("gateway-agent", Role.REQUESTER, kind=PrincipalKind.AGENT))}
        self.handled: list[dict[str, Any] | GatewayError] = []

    def login(self, name: str) -> str:
        return name

    def propose(self, head: str = "head-1", requester: str = "alice", proposer: str | None = None) -> int:
        """An open proposal of BRANCH at `head` (there and on the host), planned, linked to pull request `number`."""
        self.repo.refs[BRANCH] = self.host.heads[BRANCH] = head
        with self.ws.store.session() as session:
            pid = session.proposals.add(BRANCH, "main-1", head, self.people[requester],
                                        self.people[proposer or requester], "a refunds queue", ["app-staging"],
                                        ["stacks/app-staging/queue.tf"])
            session.proposals.add_plan(pid, "app-staging", head, "main-1", PLAN, "{}", 0, "lineage",
                                       PlanSummary(counts={"create": 1}), "preview")
            session.github.link_pull_request(pid, self.host.settings.repository, self.number)
        return pid

    def run_job(self, job_id: int) -> dict[str, Any] | GatewayError:
        """What a worker does with the webhook job: handle the delivery; a refusal is the job's end."""
        row = self.ws.store.tables.jobs[job_id]  # type: ignore[attr-defined]
        job = Job(job_id, JobKind.WEBHOOK, row["proposal_id"], row["requested_by"], JobStatus.RUNNING,
                  args=row["args"])
        try:
            outcome: dict[str, Any] | GatewayError = self.handle(job)
        except GatewayError as exc:
            outcome = exc
        self.handled.append(outcome)
        return outcome

    def handle(self, job: Job) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, pid: int | None = None, kind: str | None = None) -> list[Any]:
        with self.ws.store.session(readonly=True) as session:
            return session.audit.events(proposal_id=pid, kind=kind)

    def refusal(self, pid: int) -> str:
        """The reasons of the newest refusal in the proposal's trail (and that nothing counts)."""
        refused = [e for e in self.events(pid) if e.kind.endswith(".refused")]
        assert refused, [e.kind for e in self.events(pid)]
        assert not get_proposal(self.ws, pid).current_approvals
        return "; ".join(refused[-1].payload["reasons"])

    def proposal(self, pid: int) -> Proposal:
        return get_proposal(self.ws, pid)


# --- GitHub -------------------------------------------------------------------------------------------------------

GITHUB_SECRET = "It's a Secret to Everybody"
REPOSITORY = "Codertocat/Hello-World"  # the repository of GitHub's own example deliveries


class GitHubWorld(Forged):
    forge_yaml = f"\nforge: github\ngithub:\n  repository: {REPOSITORY}\n  teams: {{platform: platform-team, app: app-team}}\n"
    secrets = {"github_webhook_secret": GITHUB_SECRET}
    number = 2  # the examples' pull request
    logins = {"gateway-agent": "gateway-bot"}
    agent_type = "Bot"  # what GitHub says the agent's account is

    def __init__(self) -> None:
        super().__init__()
        assert isinstance(self.host, FakeGitHubForge)
        self.gh: FakeGitHubForge = self.host
        with self.ws.store.session() as session:
            for name in ("alice", "bob", "carol", "dana", "gateway-agent"):
                session.principals.link_github(self.people[name], self.ids[name], self.login(name))
        self.gh.members = {"platform-team": {"bob", "carol"}, "app-team": {"alice"}}

    def login(self, name: str) -> str:
        return self.logins.get(name, name)

    def account(self, name: str) -> dict[str, Any]:
        user = fixture("github/pull_request__opened.payload.json")["sender"]
        user.update(login=self.login(name), id=self.ids[name], type=self.agent_type if name == "gateway-agent" else "User")
        return user

    def deliver(self, event: str, payload: dict[str, Any], delivery: str | None = None,
                secret: str = GITHUB_SECRET) -> dict[str, Any]:
        """GitHub sends a signed delivery; if it queued a job, a worker runs it (its outcome in `handled`)."""
        body, headers = webhook_delivery(event, payload, secret, delivery=delivery)
        received = github_webhooks.receive_delivery(self.ws, {k.lower(): v for k, v in headers.items()}, body)
        if received["job"] is not None and not received["duplicate"]:
            self.run_job(received["job"])
        return received

    def handle(self, job: Job) -> dict[str, Any]:
        return github_webhooks.handle_delivery(self.ws, job)

    def review(self, name: str, state: str = "APPROVED", commit: str | None = None, body: str | None = None,
               action: str = "submitted", sender: str | None = None, review_id: int | None = None) -> int:
        """`name` reviews on GitHub now (of the head by default) or `review_id` is delivered again (`action`);
        GitHub tells the gateway. Returns the review's id."""
        if review_id is None:
            review_id = self.gh.add_review(self.ids[name], state, commit or self.gh.heads[BRANCH])
        state_now, commit_id, _ = self.gh.reviews[review_id]
        payload = fixture(f"github/pull_request_review__{action}.payload.json")
        payload["action"] = action
        delivered = state if action == "submitted" else state_now  # as submitted; a dismissal: as it is now
        payload["review"].update(id=review_id, user=self.account(name), state=delivered.lower(), commit_id=commit_id,
                                 body=body)
        payload["pull_request"]["number"] = self.number
        payload["pull_request"]["head"].update(ref=BRANCH, sha=self.gh.heads[BRANCH])
        payload["sender"] = self.account(sender or name)
        self.deliver("pull_request_review", payload)
        return review_id

    def comment(self, name: str, body: str, action: str = "created") -> dict[str, Any]:
        """`name` comments on the pull request; GitHub tells the gateway."""
        return self.deliver("issue_comment", self.comment_payload(name, body, action))

    def comment_payload(self, name: str, body: str, action: str = "created") -> dict[str, Any]:
        """The `issue_comment` payload of a comment `name` writes on the pull request."""
        comment_id = self.gh.add_comment(body, self.ids[name])
        payload = fixture("github/issue_comment__created.payload.json")
        payload["action"] = action
        payload["issue"].update(number=self.number, pull_request={"url": f"https://api.github.com/repos/{REPOSITORY}"
                                                                         f"/pulls/{self.number}"})
        payload["comment"].update(id=comment_id, body=body, user=self.account(name))
        payload["sender"] = self.account(name)
        return payload

    def pull_request(self, action: str, name: str = "alice", head_repository: str = REPOSITORY,
                     **extra: Any) -> dict[str, Any]:
        payload = fixture(f"github/pull_request__{action}.payload.json")
        pr = payload["pull_request"]
        pr.update(number=self.number, user=self.account(name), merged=extra.pop("merged", False))
        pr["head"].update(ref=BRANCH, sha=self.gh.heads.get(BRANCH, "head-1"))
        pr["head"]["repo"]["full_name"] = head_repository
        pr["base"]["ref"] = "main"
        payload.update(number=self.number, sender=self.account(name), **extra)
        return self.deliver("pull_request", payload)


@pytest.fixture
def gh() -> GitHubWorld:
    return GitHubWorld()


def test_a_review_of_the_planned_head_by_an_approver_in_the_team_counts_without_fetching(gh: GitHubWorld) -> None:
    pid = gh.propose()
    gh.review("carol")
    [approval] = gh.proposal(pid).current_approvals
    assert (approval.principal.name, approval.head_sha, approval.digests) == ("carol", "head-1", {"app-staging": PLAN})
    assert approval.auth.startswith("github-review:carol#")
    [check] = gh.events(pid, kind="github.team_check")
    assert check.payload["active"] == ["platform"] and gh.gh.team_checks == [("platform-team", "carol")]
    assert gh.gh.fetches == []  # the review named the commit the plans are of: nothing to fetch


@pytest.mark.parametrize(("name", "reason"), [
    ("alice", "alice requested this change"),
    ("gateway-agent", "gateway-bot is a bot account"),
], ids=["requester", "agent"])
def test_the_requester_and_the_agent_never_count(gh: GitHubWorld, name: str, reason: str) -> None:
    pid = gh.propose()
    gh.review(name)
    assert reason in gh.refusal(pid)
    assert isinstance(gh.handled[-1], Refused)


def test_whoever_proposed_the_change_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose(requester="alice", proposer="bob")
    gh.review("bob")
    assert "bob proposed this change and cannot approve or reject it" in gh.refusal(pid)


def test_an_agent_whose_github_account_is_not_marked_a_bot_still_never_counts(gh: GitHubWorld) -> None:
    pid = gh.propose(proposer="gateway-agent")
    gh.gh.members["platform-team"].add("gateway-bot")
    gh.agent_type = "User"
    gh.review("gateway-agent")
    assert "gateway-agent is an agent; agents can never approve or reject a change" in gh.refusal(pid)


def test_an_account_not_linked_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose()
    gh.review("mallory")
    assert "GitHub user mallory is not linked" in gh.refusal(pid)
    [refused] = gh.events(pid, kind="approve.refused")
    assert refused.actor == "github:mallory" and refused.payload["authenticated_by"].startswith("github-review:")


def test_an_approver_no_longer_in_the_team_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose()
    gh.gh.members["platform-team"].discard("bob")
    gh.review("bob")
    assert "bob is not in an approver group of stack app-staging" in gh.refusal(pid)
    assert gh.events(pid, kind="github.team_check")[-1].payload["not_member"] == ["platform"]


def test_a_review_of_an_older_commit_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose(head="head-2")  # head-2 was pushed and planned after carol looked at head-1
    gh.review("carol", commit="head-1")
    assert "the review is of commit head-1, but the current plans are of head-2" in gh.refusal(pid)
    assert BRANCH in gh.gh.fetches  # a review of another commit is judged against the branch as GitHub has it


def test_a_review_github_dismissed_before_its_delivery_came_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose()
    review_id = gh.gh.add_review(gh.ids["bob"], "APPROVED", "head-1")
    gh.gh.dismiss_review(review_id)
    gh.review("bob", review_id=review_id, state="APPROVED")  # delivered late, still saying approved
    assert f"GitHub shows review {review_id} as dismissed" in gh.refusal(pid)


def test_whoever_pushed_to_the_branch_does_not_count(gh: GitHubWorld) -> None:
    pid = gh.propose(head="head-2")  # carol's commit head-2, planned
    gh.pull_request("synchronize", "carol", before="head-1", after="head-2")
    [pushed] = gh.events(pid, kind="github.pushed")
    assert (pushed.actor, pushed.payload["login"], pushed.payload["head_sha"]) == ("github:carol", "carol", "head-2")
    gh.review("carol")
    assert "carol pushed commit head-2 to this pull request and cannot approve or reject it" in gh.refusal(pid)


def test_a_dismissed_review_withdraws_the_approval_and_changes_requested_rejects(gh: GitHubWorld) -> None:
    pid = gh.propose()
    review_id = gh.review("carol")
    assert gh.proposal(pid).current_approvals
    gh.gh.dismiss_review(review_id)
    gh.review("carol", review_id=review_id, action="dismissed", sender="bob")
    assert not gh.proposal(pid).current_approvals
    [withdrawn] = gh.events(pid, kind="decision.withdrawn")
    assert withdrawn.actor == "github:bob" and withdrawn.payload["by"] == "carol"

    gh.review("bob", "CHANGES_REQUESTED", body="name the queue after the team")
    rejection = gh.proposal(pid).current_rejection
    assert rejection is not None
    assert (rejection.principal.name, rejection.comment) == ("bob", "name the queue after the team")


def test_a_gateway_approve_command_names_the_current_plan_and_needs_the_approver_role(gh: GitHubWorld) -> None:
    pid = gh.propose()
    gh.comment("dana", "/gateway approve 0000000")
    assert "does not name the current plan" in gh.refusal(pid)
    fingerprint = plan_fingerprint(gh.proposal(pid).current_digests)[:12]
    gh.comment("dana", f"/gateway approve {fingerprint}")
    assert "dana does not have the approver role" in gh.refusal(pid)
    gh.comment("carol", f"/gateway approve {fingerprint}")
    [approval] = gh.proposal(pid).current_approvals
    assert approval.principal.name == "carol" and approval.auth.startswith("github-comment:carol#")


def test_a_command_edited_on_github_since_it_was_delivered_is_not_a_command(gh: GitHubWorld) -> None:
    pid = gh.propose()
    fingerprint = plan_fingerprint(gh.proposal(pid).current_digests)[:12]
    payload = gh.comment_payload("carol", f"/gateway approve {fingerprint}")
    comment_id = payload["comment"]["id"]
    gh.gh.comments[comment_id] = ("/gateway approve 0000000", gh.ids["carol"])  # edited before the delivery came
    gh.deliver("issue_comment", payload)
    assert f"comment {comment_id} reads differently on GitHub now" in gh.refusal(pid)


def test_edited_comments_bot_comments_and_comment_only_reviews_are_recorded_and_left(gh: GitHubWorld) -> None:
    pid = gh.propose()
    edited = gh.comment("carol", "/gateway apply", action="edited")
    bot = gh.comment("gateway-agent", "/gateway apply")
    words = gh.comment("carol", "looks good to me")
    commented = gh.deliver("pull_request_review", fixture("github/pull_request_review__submitted.payload.json"))
    assert [r["job"] for r in (edited, bot, words, commented)] == [None, None, None, None]
    with gh.ws.store.session(readonly=True) as session:
        assert session.github.delivery(edited["delivery"]).event == "issue_comment"  # type: ignore[union-attr]
    assert gh.handled == [] and gh.events(pid) == []


def test_a_delivery_for_another_repository_is_refused_and_said_in_the_trail_once(gh: GitHubWorld) -> None:
    pid = gh.propose()
    payload = fixture("github/pull_request_review__submitted.payload.json")
    payload["review"].update(state="approved", user=gh.account("carol"))
    payload["repository"]["full_name"] = "someone/else"
    delivery = str(uuid.uuid4())
    for _ in range(2):  # GitHub redelivers it: refused again, recorded once
        with pytest.raises(Refused, match="no repository of this gateway names GitHub repository someone/else"):
            gh.deliver("pull_request_review", payload, delivery=delivery)
    assert gh.handled == [] and gh.events(pid) == []
    [refused] = gh.events(kind="github.delivery.refused")
    assert refused.payload["repository"] == "someone/else" and refused.payload["delivery"] == delivery


def test_a_pull_request_from_a_fork_is_not_planned(gh: GitHubWorld) -> None:
    gh.repo.refs[BRANCH] = gh.gh.heads[BRANCH] = "fork-1"
    gh.pull_request("opened", head_repository="mallory/Hello-World")
    [(number, reply)] = gh.gh.replies
    assert number == gh.number and "comes from the fork mallory/Hello-World" in reply
    [refusal] = gh.events(kind="github.pull_request.refused")
    assert "comes from the fork" in refusal.payload["reasons"][0]
    with gh.ws.store.session(readonly=True) as session:
        assert session.github.proposal_for_pull_request(REPOSITORY, gh.number) is None


def test_a_pull_request_by_someone_not_linked_is_not_planned(gh: GitHubWorld) -> None:
    gh.repo.refs[BRANCH] = gh.gh.heads[BRANCH] = "head-1"
    gh.pull_request("opened", "mallory")
    [(_, reply)] = gh.gh.replies
    assert "GitHub user mallory is not linked" in reply
    assert gh.handled == [{"refused": [gh.events(kind="github.pull_request.refused")[0].payload["reasons"][0]]}]


def test_a_redelivery_changes_nothing(gh: GitHubWorld) -> None:
    pid = gh.propose()
    review_id = gh.gh.add_review(gh.ids["carol"], "APPROVED", "head-1")
    payload = fixture("github/pull_request_review__submitted.payload.json")
    payload["review"].update(id=review_id, user=gh.account("carol"), state="approved", commit_id="head-1")
    payload["pull_request"].update(number=gh.number)
    payload["pull_request"]["head"]["sha"] = "head-1"
    payload["sender"] = gh.account("carol")
    first = gh.deliver("pull_request_review", payload, delivery="delivery-1")
    again = gh.deliver("pull_request_review", payload, delivery="delivery-1")
    assert (first["duplicate"], again["duplicate"], again["job"]) == (False, True, first["job"])
    assert len(gh.handled) == 1 and len(gh.events(pid, kind="approval")) == 1


def test_a_delivery_signed_with_another_secret_is_refused_and_records_nothing(gh: GitHubWorld) -> None:
    gh.propose()
    payload = fixture("github/pull_request__opened.payload.json")
    for secret in ("not the secret", ""):
        with pytest.raises(AuthError, match="X-Hub-Signature-256"):
            gh.deliver("pull_request", payload, secret=secret)
    assert gh.ws.store.tables.forge.deliveries == {}  # type: ignore[attr-defined]


def test_a_pull_request_closed_without_merging_abandons_and_a_merge_by_hand_is_reported(gh: GitHubWorld) -> None:
    pid = gh.propose()
    gh.pull_request("closed", "bob")
    assert gh.proposal(pid).status.value == "abandoned"
    assert "closed on GitHub by bob without merging" in gh.events(pid, kind="proposal.abandon")[0].payload["reason"]

    other = gh.propose()
    gh.pull_request("closed", "bob", merged=True)
    [warning] = gh.events(other, kind="github.merged_without_apply")
    assert "merged on GitHub by bob" in warning.payload["warning"] and "never applied" in warning.payload["warning"]
    assert gh.proposal(other).status.value == "abandoned"


def test_a_push_to_main_outside_the_gateway_is_recorded_loudly(gh: GitHubWorld) -> None:
    after = gh.gh.push_commit("main", ["stacks/app-staging/hotfix.tf"])
    payload = fixture("github/push__payload.json")
    payload.update(ref="refs/heads/main", before="main-1", after=after, sender=gh.account("bob"))
    gh.deliver("push", payload)
    [pushed] = gh.events(kind="github.main_pushed")
    assert pushed.actor == "github:bob" and pushed.payload["stacks"] == ["app-staging"]
    assert "bob pushed to main outside the gateway" in pushed.payload["warning"]
    assert "never applied" in pushed.payload["warning"]
    assert gh.ws.repo.resolve("main") == after  # GitHub's main is the truth


# --- GitLab -------------------------------------------------------------------------------------------------------

GITLAB_SECRET = "a webhook secret token"
PROJECT = "acme/infra"


class GitLabWorld(Forged):
    forge_yaml = (f"\nforge: gitlab\ngitlab:\n  repository: {PROJECT}\n"
                  "  groups: {platform: acme/platform-team, app: acme/app-team}\n")
    secrets = {"gitlab_webhook_secret": GITLAB_SECRET}
    number = 1  # the examples' merge request
    bot = "project_7_bot_4f2a"

    def __init__(self) -> None:
        super().__init__()
        assert isinstance(self.host, FakeGitLabForge)
        self.gl: FakeGitLabForge = self.host
        with self.ws.store.session() as session:
            for name in ("alice", "bob", "carol", "dana", "gateway-agent"):
                session.principals.link_gitlab(self.people[name], self.ids[name], self.login(name))
        for name, uid in self.ids.items():
            self.gl.add_user(uid, self.login(name), bot=name == "gateway-agent")
        self.gl.members = {"acme/platform-team": {self.ids["bob"], self.ids["carol"]},
                           "acme/app-team": {self.ids["alice"]}}

    def login(self, name: str) -> str:
        return self.bot if name == "gateway-agent" else name

    def user(self, name: str) -> dict[str, Any]:
        user = fixture("gitlab/webhooks/merge_request.json")["user"]
        user.update(id=self.ids[name], username=self.login(name), name=name)
        return user

    def project(self, payload: dict[str, Any], path: str = PROJECT) -> dict[str, Any]:
        payload["project"]["path_with_namespace"] = path
        return payload

    def deliver(self, event: str, payload: dict[str, Any], event_uuid: str | None = None,
                token: str | None = GITLAB_SECRET, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = GitLabServer.delivery_headers(event, token, event_uuid, idempotency_key)
        received = gitlab_webhooks.receive_delivery(self.ws, {k.lower(): v for k, v in headers.items()},
                                                    json.dumps(payload).encode())
        if received["job"] is not None and not received["duplicate"]:
            self.run_job(received["job"])
        return received

    def handle(self, job: Job) -> dict[str, Any]:
        return gitlab_webhooks.handle_delivery(self.ws, job)

    def merge_request_event(self, action: str, name: str, head: str | None = None, **attributes: Any
                            ) -> dict[str, Any]:
        """A `Merge Request Hook` payload of `name` doing `action`, the head as GitLab has it (or `head`)."""
        payload = self.project(fixture("gitlab/webhooks/merge_request.json"))
        payload["user"] = self.user(name)
        attrs = payload["object_attributes"]
        attrs.update(iid=self.number, source_branch=BRANCH, target_branch="main", author_id=self.ids["alice"],
                     action=action, **attributes)
        attrs["last_commit"]["id"] = head or self.gl.heads.get(BRANCH, "head-1")
        return payload

    def approve(self, name: str) -> dict[str, Any]:
        """`name` clicks Approve on GitLab; GitLab tells the gateway."""
        self.gl.approvals.setdefault(self.number, set()).add(self.ids[name])
        return self.deliver("Merge Request Hook", self.merge_request_event("approval", name))

    def note(self, name: str, body: str, **attributes: Any) -> dict[str, Any]:
        """`name` writes a note on the merge request; GitLab tells the gateway."""
        return self.deliver("Note Hook", self.note_payload(name, body, **attributes))

    def note_payload(self, name: str, body: str, **attributes: Any) -> dict[str, Any]:
        note_id = self.gl.add_comment(body, self.ids[name])
        payload = self.project(fixture("gitlab/webhooks/note_merge_request.json"))
        payload["user"] = self.user(name)
        payload["object_attributes"].update(id=note_id, note=body, **attributes)
        payload["merge_request"].update(iid=self.number, source_branch=BRANCH, target_branch="main")
        return payload


@pytest.fixture
def gl() -> GitLabWorld:
    return GitLabWorld()


def test_an_approval_on_gitlab_counts_its_group_asked_by_numeric_id(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.approve("bob")
    [approval] = gl.proposal(pid).current_approvals
    assert (approval.principal.name, approval.auth) == ("bob", "gitlab-approval:bob@head-1")
    assert gl.gl.team_checks == [("acme/platform-team", gl.ids["bob"])]  # by id: usernames change
    [check] = gl.events(pid, kind="gitlab.group_check")
    assert check.payload["active"] == ["platform"] and check.payload["gitlab_id"] == gl.ids["bob"]


@pytest.mark.parametrize(("name", "reason"), [
    ("alice", "alice requested this change"),
    ("gateway-agent", "project_7_bot_4f2a is a bot account"),
    ("mallory", "GitLab user mallory is not linked"),
], ids=["requester", "bot", "not-linked"])
def test_approvals_on_gitlab_that_do_not_count(gl: GitLabWorld, name: str, reason: str) -> None:
    pid = gl.propose()
    gl.approve(name)
    assert reason in gl.refusal(pid)


def test_an_approver_not_in_the_gitlab_group_does_not_count(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.gl.members["acme/platform-team"].discard(gl.ids["bob"])
    gl.approve("bob")
    assert "bob is not in an approver group of stack app-staging" in gl.refusal(pid)
    check = gl.events(pid, kind="gitlab.group_check")[-1].payload
    assert check["not_member"] == ["platform"] and check["gitlab_id"] == gl.ids["bob"]


def test_an_approval_given_on_an_older_head_does_not_count(gl: GitLabWorld) -> None:
    pid = gl.propose(head="head-2")
    gl.gl.approvals[gl.number] = {gl.ids["carol"]}
    gl.deliver("Merge Request Hook", gl.merge_request_event("approval", "carol", head="head-1"))
    assert "the approval was given on commit head-1, but the current plans are of head-2" in gl.refusal(pid)


def test_an_approval_withdrawn_on_gitlab_before_its_delivery_came_does_not_count(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.deliver("Merge Request Hook", gl.merge_request_event("approval", "bob"))  # GitLab lists no approval by bob
    assert f"GitLab shows no approval by bob on !{gl.number} now" in gl.refusal(pid)


def test_whoever_pushed_to_the_merge_request_does_not_count(gl: GitLabWorld) -> None:
    pid = gl.propose(head="head-2")
    gl.deliver("Merge Request Hook", gl.merge_request_event("update", "carol", oldrev="head-1"))
    [pushed] = gl.events(pid, kind="gitlab.pushed")
    assert (pushed.payload["gitlab_id"], pushed.payload["head_sha"]) == (gl.ids["carol"], "head-2")
    gl.approve("carol")
    assert "carol pushed commit head-2 to this merge request" in gl.refusal(pid)


def test_a_push_hook_to_the_branch_names_its_pusher(gl: GitLabWorld) -> None:
    pid = gl.propose(head="head-2")
    payload = gl.project(fixture("gitlab/webhooks/push.json"))
    payload.update(ref=f"refs/heads/{BRANCH}", before="head-1", after="head-2", user_id=gl.ids["bob"],
                   user_username="bob")
    gl.deliver("Push Hook", payload)
    assert gl.handled == [{"recorded_pusher": pid}]
    gl.approve("bob")
    assert "bob pushed commit head-2 to this merge request" in gl.refusal(pid)


def test_an_unapproval_withdraws_and_a_reject_note_rejects(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.approve("bob")
    assert gl.proposal(pid).current_approvals
    gl.gl.approvals[gl.number].discard(gl.ids["bob"])
    gl.deliver("Merge Request Hook", gl.merge_request_event("unapproval", "bob"))
    assert not gl.proposal(pid).current_approvals
    [withdrawn] = gl.events(pid, kind="decision.withdrawn")
    assert withdrawn.actor == "gitlab:bob" and withdrawn.payload["by"] == "bob"

    gl.note("carol", "/gateway reject name the queue after the team")
    rejection = gl.proposal(pid).current_rejection
    assert rejection is not None
    assert (rejection.principal.name, rejection.comment) == ("carol", "name the queue after the team")
    assert rejection.auth.startswith("gitlab-note:carol#")


def test_a_gateway_approve_note_names_the_current_plan_and_needs_the_approver_role(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.note("dana", "/gateway approve 0000000")
    assert "does not name the current plan" in gl.refusal(pid)
    fingerprint = plan_fingerprint(gl.proposal(pid).current_digests)[:12]
    gl.note("dana", f"/gateway approve {fingerprint}")
    assert "dana does not have the approver role" in gl.refusal(pid)
    gl.note("bob", f"/gateway approve {fingerprint}")
    [approval] = gl.proposal(pid).current_approvals
    assert approval.auth.startswith("gitlab-note:bob#")


def test_a_note_edited_on_gitlab_since_it_was_delivered_is_not_a_command(gl: GitLabWorld) -> None:
    pid = gl.propose()
    payload = gl.note_payload("bob", "/gateway reject not now")
    note_id = payload["object_attributes"]["id"]
    gl.gl.comments[note_id] = ("/gateway reject", gl.ids["bob"])
    gl.deliver("Note Hook", payload)
    assert f"note {note_id} reads differently on GitLab now" in gl.refusal(pid)
    assert gl.proposal(pid).current_rejection is None


def test_system_notes_edited_notes_other_projects_and_malformed_deliveries(gl: GitLabWorld) -> None:
    pid = gl.propose()
    edited = gl.note("bob", "/gateway apply", action="update")
    system = gl.note("bob", "/gateway apply", system=True)
    assert [edited["job"], system["job"]] == [None, None]
    documented = fixture("gitlab/webhooks/merge_request.json")  # GitLab's own example, another project
    with pytest.raises(Refused, match="no repository of this gateway names GitLab project gitlabhq/gitlab-test"):
        gl.deliver("Merge Request Hook", documented)
    assert gl.handled == []
    [refused] = gl.events(kind="gitlab.delivery.refused")
    assert refused.payload["project"] == "gitlabhq/gitlab-test"
    malformed = gl.merge_request_event("approval", "bob")
    malformed["object_attributes"]["iid"] = str(gl.number)
    assert gl.deliver("Merge Request Hook", malformed)["job"] is not None
    assert isinstance(gl.handled[-1], Refused)
    [refused] = gl.events(kind="gitlab.merge_request.refused")
    assert "field object_attributes.iid is not valid" in refused.payload["reasons"][0]
    assert not gl.proposal(pid).current_approvals


def test_a_merge_request_from_a_fork_is_not_planned(gl: GitLabWorld) -> None:
    gl.repo.refs[BRANCH] = gl.gl.heads[BRANCH] = "fork-1"
    gl.deliver("Merge Request Hook", gl.merge_request_event("open", "alice", source_project_id=99))
    [(number, reply)] = gl.gl.replies
    assert number == gl.number and "comes from a fork" in reply
    assert "comes from a fork" in gl.events(kind="gitlab.merge_request.refused")[0].payload["reasons"][0]
    with gl.ws.store.session(readonly=True) as session:
        assert session.github.proposal_for_pull_request(PROJECT, gl.number) is None


def test_the_token_is_compared_and_a_delivery_is_recorded_once_by_its_event_uuid(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.gl.approvals[gl.number] = {gl.ids["bob"]}
    payload = gl.merge_request_event("approval", "bob")
    for token in (None, "not the secret", GITLAB_SECRET[:-1]):
        with pytest.raises(AuthError, match="X-Gitlab-Token"):
            gl.deliver("Merge Request Hook", payload, token=token)
    assert gl.ws.store.tables.forge.deliveries == {}  # type: ignore[attr-defined]
    event_uuid, key = str(uuid.uuid4()), str(uuid.uuid4())
    first = gl.deliver("Merge Request Hook", payload, event_uuid=event_uuid, idempotency_key=key)
    again = gl.deliver("Merge Request Hook", payload, event_uuid=event_uuid)  # the same event, redelivered
    resent = gl.deliver("Merge Request Hook", payload, idempotency_key=key)  # GitLab's "Resend request"
    assert (first["duplicate"], again["duplicate"], resent["duplicate"]) == (False, True, True)
    assert again["job"] == resent["job"] == first["job"]
    assert len(gl.handled) == 1 and len(gl.events(pid, kind="approval")) == 1


def test_a_merge_request_closed_on_gitlab_abandons_its_proposal(gl: GitLabWorld) -> None:
    pid = gl.propose()
    gl.deliver("Merge Request Hook", gl.merge_request_event("close", "alice"))
    assert gl.proposal(pid).status.value == "abandoned"


def test_a_push_to_main_outside_the_gateway_is_recorded_loudly_on_gitlab(gl: GitLabWorld) -> None:
    after = gl.gl.push_commit("main", ["stacks/app-staging/hotfix.tf"])
    payload = gl.project(fixture("gitlab/webhooks/push.json"))
    payload.update(ref="refs/heads/main", before="main-1", after=after, user_id=gl.ids["bob"], user_username="bob")
    gl.deliver("Push Hook", payload)
    [pushed] = gl.events(kind="gitlab.main_pushed")
    assert pushed.payload["stacks"] == ["app-staging"] and "never applied" in pushed.payload["warning"]
    assert gl.ws.repo.resolve("main") == after  # GitLab's main is the truth
