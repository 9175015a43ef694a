"""Merge requests on GitLab, end to end: the real app and its worker, python-gitlab talking to a fake GitLab over
real HTTP (its answers checked against GitLab's documented examples and python-gitlab's managers), webhook
deliveries built from the fake's state in the shape of GitLab's documented payloads, and real git on both sides.

The scenarios GitHub's path passes (tests/test_github.py), on GitLab; and one test per rule GitLab does otherwise:
approvals read back from the approvals API, group membership by numeric user id, X-Gitlab-Token, dedup by
X-Gitlab-Event-UUID (and Idempotency-Key), the merge with `sha`, commit statuses that only move by a change of state.
The decision rules themselves (approvals that do not count and why, a push to main outside the gateway, ...) run on
fakes in tests/test_forge_rules_on_fakes.py; each family keeps an end-to-end case here or in test_github.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from gateway import worker as worker_module
from gateway.api.app import create_app
from gateway.cli import cli
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.domain.github import plan_fingerprint
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.agents.agent_requests import agent_principal
from gateway.services.change.proposals import get_proposal
from gateway.services.forge import github as publishing
from gateway.services.forge.gitlab_webhooks import link_account
from gateway.services.workspace import Workspace

from .conftest import FIXTURES, Clone, People, add_people
from .gitlab_fake import FakeGitLab
from .model_stub import ModelStub, tool_call

SECRET = "a webhook secret token"
T = TypeVar("T")
QUEUE = '''resource "aws_sqs_queue" "refunds" {
  name = "refund-events"
  tags = { owner = "payments", "cost-centre" = "cc-42" }
}
'''
BRANCH = "feature/refunds"


@dataclass
class World:
    ws: Workspace
    gl: FakeGitLab
    client: TestClient
    people: People
    stub: ModelStub
    home: Path

    def deliver(self, event: str, payload: dict[str, Any], event_uuid: str | None = None, token: str | None = SECRET,
                idempotency_key: str | None = None) -> Any:
        headers = FakeGitLab.delivery_headers(event, token, event_uuid, idempotency_key)
        return self.client.post("/api/v1/gitlab/webhook", content=json.dumps(payload).encode(), headers=headers)

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.people.tokens[name]}"}

    def events(self, proposal_id: int | None = None, kind: str | None = None) -> list[Any]:
        with self.ws.store.session(readonly=True) as session:
            return session.audit.events(proposal_id=proposal_id, kind=kind)

    def sticky(self, iid: int) -> str:
        mine = [n["body"] for n in self.gl.notes(iid) if "change-gateway:proposal:" in n["body"]]
        return mine[-1] if mine else ""

    def mr_event(self, iid: int, action: str, by: str, **kwargs: Any) -> Any:
        return self.deliver("Merge Request Hook", self.gl.merge_request_event(iid, action, by, **kwargs))

    def approve(self, iid: int, who: str) -> Any:
        """`who` clicks Approve on GitLab; GitLab tells the gateway."""
        self.gl.approve(iid, who)
        return self.mr_event(iid, "approval", who)

    def note(self, iid: int, who: str, body: str) -> Any:
        return self.deliver("Note Hook", self.gl.note_event(self.gl.add_note(iid, who, body)))


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def make_gitlab_the_forge(ws: Workspace, gl: FakeGitLab, clone_dir: Path) -> None:
    """An admin commits `forge: gitlab` to main (groups: platform, app), and main becomes GitLab's main."""
    main = Clone(ws, clone_dir)
    main.write("gateway.yaml", main.read("gateway.yaml") + (
        f"\nforge: gitlab\ngitlab:\n  repository: {gl.full_name}\n  api_url: {gl.url}\n  git_url: {gl.git_url}\n"
        f"  groups: {{platform: acme/platform-team, app: acme/app-team}}\n"))
    main.push("GitLab is the forge", author="admin")
    ws.repo.repo.git.push(gl.git_url, "+main:main")


@contextmanager
def gitlab_world(root: Path, database_url: str | None = None) -> Iterator[World]:
    """A workspace whose gateway.yaml says `forge: gitlab`, its app and worker, GitLab's fake and a model stub."""
    with FakeGitLab(root / "gitlab") as gl, ModelStub() as stub:
        settings = Settings(home=root / "home", database_url=database_url, token=None, lock_wait_seconds=2,
                            gitlab_webhook_secret=SECRET, gitlab_token=gl.token, public_url="http://gateway.test",
                            openai_base_url=stub.base_url, openai_api_key="k", model="stub-model")
        ws = create_workspace(settings)
        bootstrap_simulator(ws)
        people = add_people(ws)
        make_gitlab_the_forge(ws, gl, root / "admin-clone")
        for name in ("alice", "bob", "carol", "erin", "dana"):
            link_account(ws, people.admin, name, name, gl.add_user(name))
        agent_principal(ws)
        link_account(ws, people.admin, "gateway-agent", "project_7_bot_4f2a", gl.bot_id)
        gl.add_user("mallory")
        gl.add_group("acme")
        gl.add_group("acme/platform-team", ["bob"])
        gl.add_member("acme", "carol")  # carol is in the parent group: a member of acme/platform-team by inheritance
        gl.add_group("acme/app-team", ["alice"])
        with TestClient(create_app(settings, workers=1)) as client:
            yield World(ws, gl, client, people, stub, settings.home)
        ws.close()
    assert not (gl.schema_errors or gl.request_errors or gl.unhandled), (gl.schema_errors, gl.request_errors,
                                                                         gl.unhandled)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    monkeypatch.setattr(publishing, "PUBLISH_RETRY_SECONDS", 0.5)
    with gitlab_world(tmp_path) as w:
        yield w


def open_mr_on_gitlab(world: World, branch: str = BRANCH, user: str = "alice", **kwargs: Any) -> int:
    """A person pushes a branch to GitLab and opens a merge request there; GitLab tells the gateway."""
    world.gl.push_commit(branch, {"stacks/app-staging/queue.tf": QUEUE}, "Add a refunds queue", author=user)
    iid = world.gl.open_merge_request(branch, "Add a queue for refund events", "Refunds need a queue.", user, **kwargs)
    assert world.mr_event(iid, "open", user).status_code == 202
    return iid


def proposal_of(world: World, iid: int) -> int:
    def probe() -> int | None:
        with world.ws.store.session(readonly=True) as session:
            return session.github.proposal_for_pull_request(world.gl.full_name, iid)
    return wait_for(f"a proposal for merge request !{iid}", probe)


# --- the scenarios GitHub's path passes ----------------------------------------------------------------------


def test_an_agent_request_becomes_a_merge_request_approved_applied_and_merged_with_the_approved_sha(
        world: World) -> None:
    world.stub.turns = [tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                        tool_call("run_preview", stack="app-staging"),
                        tool_call("finish", summary="Adds aws_sqs_queue.refunds; nothing is deleted.")]
    run = world.client.post("/api/v1/requests", json={"text": "Add a queue for refund events in staging"},
                            headers=world.auth("alice")).json()
    pid = wait_for("the agent's proposal", lambda: world.client.get(
        f"/api/v1/requests/{run['id']}", headers=world.auth("alice")).json().get("proposal_id"))
    proposal = get_proposal(world.ws, pid)
    [mr] = wait_for("the merge request", lambda: [m for m in world.gl.merge_requests()
                                                   if m["source_branch"] == proposal.branch])
    iid = mr["iid"]
    assert mr["sha"] == proposal.head_sha and mr["author"]["username"] == "project_7_bot_4f2a"
    note = wait_for("the sticky note", lambda: world.sticky(iid))
    assert "Requested by **alice**, proposed by **gateway-agent** (agent)" in note
    assert "aws_sqs_queue.refunds" in note and "group `acme/platform-team`" in note
    expected = {"gateway/plan": "success", "gateway/policy": "success", "gateway/approval": "pending",
                "gateway/apply": "pending"}
    wait_for("the four commit statuses", lambda: world.gl.statuses(proposal.head_sha) == expected)

    assert world.approve(iid, "bob").status_code == 202  # bob clicks Approve on GitLab
    [approval] = wait_for("bob's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    assert approval.auth == f"gitlab-approval:bob@{proposal.head_sha[:12]}"
    world.note(iid, "bob", "/gateway apply")
    wait_for("the apply", lambda: get_proposal(world.ws, pid).status.value == "applied")
    merged = world.gl.merge_request(iid)
    assert merged["state"] == "merged" and get_proposal(world.ws, pid).merge_sha == merged["merge_commit_sha"]
    [(_, _, merge_call)] = [r for r in world.gl.requests if r[1].endswith(f"/merge_requests/{iid}/merge")]
    assert merge_call["sha"] == proposal.head_sha  # merged exactly the approved head
    assert world.ws.repo.resolve("main") == merged["merge_commit_sha"]  # the gateway's main follows GitLab's
    wait_for("the outcome on the merge request", lambda: "Applied and merged into main" in world.sticky(iid)
             and world.gl.statuses(proposal.head_sha).get("gateway/apply") == "success")
    notes = [n for n in world.gl.notes(iid) if "change-gateway:proposal:" in n["body"]]
    assert len(notes) == 1  # one note, edited in place
    story = CliRunner().invoke(cli, ["audit", "show", str(pid)], env={
        "GATEWAY_HOME": str(world.home), "GATEWAY_TOKEN": world.people.tokens["dana"]})
    assert story.exit_code == 0, story.output
    assert "gitlab.group_check" in story.output and "on: gitlab #" in story.output


def test_the_merge_names_the_approved_sha_and_gitlab_refuses_a_moved_head(world: World) -> None:
    """GitLab's merge with `sha`: a push that lands between the gateway's checks and the merge is never merged."""
    from gateway.adapters.forges.gitlab import GitLabForge
    from gateway.domain.errors import Conflict

    iid = open_mr_on_gitlab(world)
    forge = GitLabForge(world.ws.repo_settings().gitlab, world.gl.token, world.ws.settings.repo_path)
    approved = world.gl.head(iid)
    world.gl.push_commit(BRANCH, {"stacks/app-staging/late.tf": QUEUE.replace("refunds", "late")}, "late")
    with pytest.raises(Conflict, match=f"head moved from {approved[:12]}"):
        forge.merge(iid, approved, "Merge", "Merge proposal")
    assert world.gl.merge_request(iid)["state"] == "opened"
    [(_, _, merge_call)] = [r for r in world.gl.requests if r[1].endswith("/merge")]
    assert merge_call["sha"] == approved
    forge.close()


def test_a_merge_request_opened_on_gitlab_is_a_proposal_and_a_push_makes_the_approval_stale(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    proposal = get_proposal(world.ws, proposal_of(world, iid))
    assert (proposal.requester.name, proposal.proposer.name, proposal.stacks) == ("alice", "alice", ("app-staging",))
    note = wait_for("the sticky note", lambda: world.sticky(iid))
    assert f"/gateway approve {plan_fingerprint(proposal.current_digests)[:12]}" in note
    assert "approve the merge request while that commit is its head" in note

    world.approve(iid, "bob")
    wait_for("the approval", lambda: get_proposal(world.ws, proposal.id).current_approvals)
    before = world.gl.head(iid)
    after = world.gl.push_commit(BRANCH, {"stacks/app-staging/queue2.tf": QUEUE.replace("refunds", "r2")}, "more",
                                 author="alice")
    world.mr_event(iid, "update", "alice", oldrev=before)
    wait_for("the re-plan", lambda: get_proposal(world.ws, proposal.id).head_sha == after)
    assert not get_proposal(world.ws, proposal.id).current_approvals  # GitLab still lists bob; the gateway does not
    approvals = world.gl._approvals_json(world.gl._mrs[iid])
    assert world.gl.user("bob").id in {entry["user"]["id"] for entry in approvals["approved_by"]}
    wait_for("the note to show the new plan", lambda: after[:12] in world.sticky(iid))

    world.gl.close_merge_request(iid)
    world.mr_event(iid, "close", "alice")
    wait_for("the abandon", lambda: get_proposal(world.ws, proposal.id).status.value == "abandoned")


def test_a_rejection_blocks_the_apply_and_an_unapproval_withdraws(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    world.approve(iid, "bob")
    wait_for("bob's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    world.gl.unapprove(iid, "bob")
    world.mr_event(iid, "unapproval", "bob")
    wait_for("the withdrawal", lambda: not get_proposal(world.ws, pid).current_approvals)
    assert world.events(pid, kind="decision.withdrawn")[0].payload["by"] == "bob"

    world.approve(iid, "bob")
    wait_for("bob's approval again", lambda: get_proposal(world.ws, pid).current_approvals)
    world.note(iid, "carol", "/gateway reject name the queue after the team")
    rejection = wait_for("carol's rejection", lambda: get_proposal(world.ws, pid).current_rejection)
    assert rejection.principal.name == "carol"
    wait_for("the note to say so", lambda: "rejected by **carol**: name the queue" in world.sticky(iid))
    world.note(iid, "bob", "/gateway apply")
    refusal = wait_for("the apply's refusal", lambda: world.events(pid, kind="apply.refused"))[0]
    assert "rejected by carol" in "; ".join(refusal.payload["reasons"])
    assert world.gl.merge_request(iid)["state"] == "opened"
    wait_for("the approval status", lambda: world.gl.statuses(world.gl.head(iid)).get("gateway/approval") == "failed")


def test_whoever_pushes_to_the_branch_and_an_approval_withdrawn_on_gitlab_do_not_count(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    world.gl.approve(iid, "bob")
    late = world.gl.merge_request_event(iid, "approval", "bob")
    world.gl.unapprove(iid, "bob")  # withdrawn on GitLab before the approval's delivery arrives
    world.deliver("Merge Request Hook", late)
    refusal = wait_for("bob's refusal", lambda: world.events(pid, kind="approve.refused"))[0]
    assert f"GitLab shows no approval by bob on !{iid} now" in refusal.payload["reasons"][0]

    before = world.gl.head(iid)
    after = world.gl.push_commit(BRANCH, {"stacks/app-staging/extra.tf": QUEUE.replace("refunds", "extra")},
                                 "carol's addition", author="carol")
    world.mr_event(iid, "update", "carol", oldrev=before)
    wait_for("the re-plan", lambda: get_proposal(world.ws, pid).head_sha == after)
    world.approve(iid, "carol")
    refusal = wait_for("carol's refusal", lambda: world.events(pid, kind="approve.refused")[1:])[0]
    assert f"carol pushed commit {after[:12]} to this merge request" in refusal.payload["reasons"][0]


@pytest.mark.postgres
def test_a_push_after_the_approval_stops_the_apply_and_the_merge_on_postgres(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with gitlab_world(tmp_path, database_url=postgres_url) as world:
        push_after_approval(world)


def test_a_push_after_the_approval_stops_the_apply_and_the_merge(world: World) -> None:
    push_after_approval(world)


def push_after_approval(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    fingerprint = plan_fingerprint(get_proposal(world.ws, pid).current_digests)[:12]
    world.note(iid, "bob", f"/gateway approve {fingerprint}")
    [approval] = wait_for("bob's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    assert approval.auth.startswith("gitlab-note:bob#")
    # a push slips in on GitLab; its webhook has not arrived when bob asks for the apply
    world.gl.push_commit(BRANCH, {"stacks/app-staging/sneaky.tf": QUEUE.replace("refunds", "sneaky")}, "sneaky",
                         author="alice")
    world.note(iid, "bob", "/gateway apply")
    refusal = wait_for("the apply's refusal", lambda: world.events(pid, kind="apply.refused"))[0]
    assert "needs 1 approval(s)" in "; ".join(refusal.payload["reasons"])
    assert world.gl.merge_request(iid)["state"] == "opened"
    assert not [r for r in world.gl.requests if r[1].endswith("/merge")]


LAPSED = ("bob's approval on GitLab no longer counts: bob is not an active member of an approver group of "
          "stack app-staging any more")


def test_group_membership_is_asked_by_numeric_id_at_the_decision_and_again_at_the_apply(world: World) -> None:
    """GitLab's members API by user id, inherited members included; a member who left (or whose membership awaits
    approval) no longer counts at the apply, and every view says so."""
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    world.approve(iid, "bob")
    wait_for("bob's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    member_calls = [r[1] for r in world.gl.requests if "/members/all/" in r[1]]
    assert member_calls and all(path.endswith(f"/members/all/{world.gl.user('bob').id}") for path in member_calls)
    world.gl.add_member("acme/platform-team", "bob", state="awaiting")  # on GitLab, after the approval counted
    world.note(iid, "carol", "/gateway apply")
    refusal = wait_for("the apply's refusal", lambda: world.events(pid, kind="apply.refused"))[0]
    assert LAPSED in "; ".join(refusal.payload["reasons"])
    shown = world.client.get(f"/api/v1/proposals/{pid}", headers=world.auth("carol")).json()
    assert shown["can_apply"] is False and LAPSED in shown["blocked_by"]
    wait_for("the note naming it", lambda: f":no_entry: {LAPSED}" in world.sticky(iid))
    assert world.gl.merge_request(iid)["state"] == "opened"

    world.note(iid, "carol", f"/gateway approve {plan_fingerprint(get_proposal(world.ws, pid).current_digests)}")
    wait_for("carol's approval, by inheritance", lambda: [
        d for d in get_proposal(world.ws, pid).current_approvals if d.principal.name == "carol"])


# --- the rules GitLab does otherwise -------------------------------------------------------------------------


def test_the_webhook_token_is_compared_and_a_delivery_is_recorded_once_by_its_event_uuid(world: World) -> None:
    world.gl.push_commit(BRANCH, {"stacks/app-staging/queue.tf": QUEUE}, "queue", author="alice")
    iid = world.gl.open_merge_request(BRANCH, "Add a queue", "", "alice")
    payload = world.gl.merge_request_event(iid, "open", "alice")
    assert world.deliver("Merge Request Hook", payload, token=None).status_code == 401
    assert world.deliver("Merge Request Hook", payload, token="not the secret").status_code == 401
    assert world.deliver("Merge Request Hook", payload, token=SECRET[:-1]).status_code == 401
    forged = world.client.post("/api/v1/gitlab/webhook", content=json.dumps(payload).encode(), headers={
        "X-Gitlab-Event": "Merge Request Hook", "X-Gitlab-Event-UUID": "x", "X-Gitlab-Token": "é".encode()})
    assert forged.status_code == 401
    assert world.ws.store.db.engine.connect().exec_driver_sql("select count(*) from webhook_deliveries").scalar() == 0

    event_uuid, key = str(uuid.uuid4()), str(uuid.uuid4())
    first = world.deliver("Merge Request Hook", payload, event_uuid=event_uuid, idempotency_key=key)
    again = world.deliver("Merge Request Hook", payload, event_uuid=event_uuid)  # the same event, redelivered
    resent = world.deliver("Merge Request Hook", payload, idempotency_key=key)  # GitLab's "Resend request"
    assert first.status_code == again.status_code == resent.status_code == 202
    assert (first.json()["duplicate"], again.json()["duplicate"], resent.json()["duplicate"]) == (False, True, True)
    assert again.json()["job"] == resent.json()["job"] == first.json()["job"]
    proposal_of(world, iid)
    assert len(world.events(kind="proposal.opened")) == 1


def test_a_gitlab_forge_without_a_webhook_secret_does_not_start(world: World) -> None:
    settings = world.ws.settings.model_copy(update={"gitlab_webhook_secret": None})
    with pytest.raises(ConfigError, match="GATEWAY_GITLAB_WEBHOOK_SECRET"):
        create_app(settings, workers=0)


def test_an_approval_given_while_gitlab_fails_is_retried_until_it_counts(world: World) -> None:
    approval_while_gitlab_fails(world)


@pytest.mark.postgres
def test_an_approval_given_while_gitlab_fails_is_retried_until_it_counts_on_postgres(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    monkeypatch.setattr(publishing, "PUBLISH_RETRY_SECONDS", 0.5)
    with gitlab_world(tmp_path, database_url=postgres_url) as world:
        approval_while_gitlab_fails(world)


def approval_while_gitlab_fails(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    wait_for("the sticky note", lambda: world.sticky(iid))
    world.gl.fail_requests(502)  # GitLab's API has a bad moment; its webhooks still arrive
    answer = world.approve(iid, "bob")
    assert answer.status_code == 202
    [retrying] = wait_for("the delivery's first retry", lambda: world.events(pid, kind="job.retrying"))
    assert retrying.payload["attempt"] == 1 and "502" in retrying.payload["error"], retrying.payload
    assert not get_proposal(world.ws, pid).current_approvals
    world.gl.recover()
    [approval] = wait_for("bob's approval", lambda: get_proposal(world.ws, pid).current_approvals)
    assert approval.principal.name == "bob"
    wait_for("the note to count it", lambda: "has 1 (bob)" in world.sticky(iid))
    wait_for("the approval status", lambda: world.gl.statuses(approval.head_sha).get("gateway/approval") == "success")
    job = world.ws.store.queue.get(answer.json()["job"])
    assert job.status.value == "succeeded" and job.attempts >= 2
    assert any("GitLab is unavailable" in line for line in job.progress), job.progress


def test_a_commit_status_is_written_only_when_its_state_changes(world: World) -> None:
    """GitLab refuses a status set to the state it has (400 "Cannot transition"): the gateway writes changes only."""
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    head = world.gl.head(iid)
    wait_for("the four statuses", lambda: len(world.gl.statuses(head)) == 4)
    world.note(iid, "dana", "/gateway approve 0000000")  # a refusal: the note changes, the statuses do not
    wait_for("the note to name dana", lambda: "**dana**" in world.sticky(iid))
    writes = [r for r in world.gl.requests if r[0] == "POST" and "/statuses/" in r[1]]
    assert len(writes) == 4, writes
    world.approve(iid, "bob")
    wait_for("the approval status", lambda: world.gl.statuses(head).get("gateway/approval") == "success")
    writes = [r for r in world.gl.requests if r[0] == "POST" and "/statuses/" in r[1]]
    assert [w[2]["name"] for w in writes[4:]] == ["gateway/approval"]
    assert not world.events(pid, kind="job.failed")


def test_people_link_their_gitlab_account_by_its_numeric_id(world: World) -> None:
    frank_id = world.gl.add_user("frank-gl")
    result = CliRunner().invoke(cli, ["users", "link", "frank", "--gitlab", "frank-gl"], env={
        "GATEWAY_HOME": str(world.home), "GATEWAY_TOKEN": world.people.tokens["admin"],
        "GATEWAY_GITLAB_TOKEN": world.gl.token})
    assert result.exit_code == 0, result.output
    assert f"linked frank to GitLab user frank-gl (id {frank_id})" in result.output
    with world.ws.store.session(readonly=True) as session:
        assert session.principals.by_gitlab_id(frank_id).name == "frank"


def test_system_notes_edited_notes_and_other_projects_do_nothing(world: World) -> None:
    iid = open_mr_on_gitlab(world)
    pid = proposal_of(world, iid)
    note = world.gl.add_note(iid, "bob", "looks good")
    world.gl.edit_note(note["id"], "/gateway apply")
    edited = world.gl.note_event({**note, "body": "/gateway apply"})
    edited["object_attributes"]["action"] = "update"
    system = world.gl.note_event(world.gl.add_note(iid, "bob", "/gateway apply"))
    system["object_attributes"]["system"] = True
    answers = [world.deliver("Note Hook", p).json() for p in (edited, system)]
    assert [a["job"] for a in answers] == [None, None]
    documented = json.loads((FIXTURES / "gitlab" / "webhooks" / "merge_request.json").read_text())
    other = world.deliver("Merge Request Hook", documented)  # GitLab's own example, another project
    assert other.status_code == 403 and "names GitLab project gitlabhq/gitlab-test" in other.json()["detail"]
    assert [e.payload["project"] for e in world.events(kind="gitlab.delivery.refused")] == ["gitlabhq/gitlab-test"]
    malformed = world.gl.merge_request_event(iid, "approval", "bob")
    malformed["object_attributes"]["iid"] = str(iid)
    answer = world.deliver("Merge Request Hook", malformed).json()
    assert answer["job"] is not None
    assert not [j for j in world.ws.store.queue.of_proposal(pid) if j.kind.value == "apply"]


def test_a_merge_request_from_a_fork_is_not_planned(world: World) -> None:
    world.gl.push_commit("feature/fork", {"stacks/app-staging/queue.tf": QUEUE}, "queue", author="alice")
    iid = world.gl.open_merge_request("feature/fork", "From a fork", "", "alice", fork=True)
    world.mr_event(iid, "open", "alice")
    reply = wait_for("the reply", lambda: [n["body"] for n in world.gl.notes(iid)])
    assert "comes from a fork" in reply[0]
    assert "comes from a fork" in world.events(kind="gitlab.merge_request.refused")[0].payload["reasons"][0]


