"""Many declaration repositories under one gateway: the workspace's own (`declarations`, the sample) and `data`, added
with rules of its own. Each walks the whole path by its own rules, side by side, in the same database (SQLite and
PostgreSQL); no rule of one reaches the other (approver groups, protected paths, policies, overrides, break-glass,
the kill switch); the API and the CLI work in either; a workspace made by the release before repositories migrates
in place and walks a change."""

from __future__ import annotations

import shutil
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import git
import pygit2
import pytest
from fastapi.testclient import TestClient

from gateway.adapters.git.repo import GitDeclarationRepo
from gateway.api.app import create_app
from gateway.composition import add_repository, open_workspace
from gateway.config import Settings
from gateway.domain.apply_blockers import apply_blockers
from gateway.domain.approvals import approver_groups
from gateway.domain.errors import ConfigError, Conflict, InAnotherRepository, NotFound, Refused
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.proposal import Decision
from gateway.fault_points import ENVIRONMENT_VARIABLE, EXIT_STATUS
from gateway.services.admin.repositories import list_repositories, remove_repository
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.breaker import open_breaker, open_breaker_reason
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.main_watch import watch_main
from gateway.services.change.proposals import decide, get_proposal, open_proposal, override_finding
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.break_glass import open_break_glass
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People, add_people, make_workspace, run_cli, sign_in_client

FIXTURES = Path(__file__).parent / "fixtures"

DATA_GATEWAY_YAML = """\
engine: sandbox
approvals:
  required: 1
  config_approvers: [data]
stacks:
  network:                     # the same name as a stack of the workspace's own repository
    path: stacks/network
    approvers: [data]
protected_paths: [gateway.yaml, policies/, schemas/]
break_glass:
  groups: [data]
policy:
  owners: [data]
  required_tags: [team]
"""
DATA_POLICY = """\
package terraform.queues

import rego.v1

deny contains finding if {
	some rc in input.resource_changes
	rc.type == "aws_sqs_queue"
	not startswith(rc.change.after.name, "data-")
	finding := {"id": "queue-prefix", "address": rc.address, "msg": "data's queues are named data-..."}
}
"""
DATA_QUEUES = """\
resource "aws_sqs_queue" "events" {
  name = "data-events"
  tags = { team = "data" }
}
"""
QUEUE = """
resource "aws_sqs_queue" "extra" {
  name = "%s"
  tags = { owner = "platform", "cost-centre" = "cc-1", team = "data" }
}
"""


@dataclass
class Two:
    ws: Workspace  # the workspace's own repository, `declarations`
    data: Workspace  # repository `data`, added
    people: People
    tmp: Path

    def clone(self, ws: Workspace, name: str) -> Clone:
        return Clone(ws, self.tmp / name)


def _data_content(folder: Path) -> Path:
    (folder / "stacks" / "network").mkdir(parents=True)
    (folder / "policies").mkdir()
    (folder / "gateway.yaml").write_text(DATA_GATEWAY_YAML)
    (folder / "policies" / "queues.rego").write_text(DATA_POLICY)
    (folder / "stacks" / "network" / "main.tf").write_text(DATA_QUEUES)
    return folder


def _two(home: Path, tmp: Path, database_url: str | None = None) -> Two:
    ws = make_workspace(home, database_url)
    people = add_people(ws)
    add_repository(ws, people.admin, "data", _data_content(tmp / "data-content"))
    return Two(ws, ws.in_repository("data"), people, tmp)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Two]:
    world = _two(tmp_path / "home", tmp_path)
    yield world
    world.ws.close()


def gather_blockers(ws: Workspace, proposal_id: int) -> list[str]:
    """What stands before an apply of the proposal now, as the runner and the pages see it."""
    return apply_blockers(gather_apply_facts(ws, get_proposal(ws, proposal_id)))


def _propose(two: Two, ws: Workspace, branch: str, queue: str) -> int:
    clone = two.clone(ws, f"{ws.repository}-{branch}").branch(branch)
    clone.write("stacks/network/extra.tf", QUEUE % queue).push(f"a queue {queue}")
    return open_proposal(ws, two.people.alice, branch, f"a queue {queue}").id


def test_each_repository_walks_the_whole_path_by_its_own_rules_side_by_side(two: Two) -> None:
    mine = _propose(two, two.ws, "queue", "orders-extra")
    theirs = _propose(two, two.data, "queue", "data-extra")  # the same branch name, in the other repository

    assert get_proposal(two.ws, mine).stacks == ("network",)  # the workspace's own: names as they were
    assert get_proposal(two.data, theirs).stacks == ("data/network",)  # an added one's: repo/stack
    with two.ws.store.session(readonly=True) as session:
        assert [p.id for p in session.proposals.list()] == [mine]
    with two.data.store.session(readonly=True) as session:
        assert [p.id for p in session.proposals.list()] == [theirs]
    with pytest.raises(InAnotherRepository, match=f"no proposal {theirs} in repository declarations"):
        get_proposal(two.ws, theirs)

    with pytest.raises(Refused, match="bob is not in an approver group of stack data/network"):
        decide(two.data, two.people.bob, theirs, Decision.APPROVE, "ok")  # platform approves the sample, not data
    with pytest.raises(Refused, match="erin is not in an approver group of stack network"):
        decide(two.ws, two.people.erin, mine, Decision.APPROVE, "ok")
    decide(two.ws, two.people.bob, mine, Decision.APPROVE, "ok")
    decide(two.data, two.people.erin, theirs, Decision.APPROVE, "ok")

    assert apply_proposal(two.ws, two.people.alice, mine).succeeded
    job = enqueue_job(two.data, two.people.alice, JobKind.APPLY, theirs)
    assert job.args["repository"] == "data"
    worker = Worker(two.ws, loops=1, poll_seconds=0.05).start()  # a worker of the workspace's own repository
    try:
        deadline = time.monotonic() + 60
        while two.ws.store.queue.get(job.id).status in (JobStatus.QUEUED, JobStatus.RUNNING):
            assert time.monotonic() < deadline, "the apply job of repository data never finished"
            time.sleep(0.1)
    finally:
        worker.stop()
    assert two.ws.store.queue.get(job.id).status == JobStatus.SUCCEEDED, two.ws.store.queue.get(job.id).error
    assert get_proposal(two.data, theirs).status == ProposalStatus.APPLIED
    data_main = two.data.repo.read_files(two.data.repo.resolve("main"), "stacks/network", ".tf")
    own_main = two.ws.repo.read_files(two.ws.repo.resolve("main"), "stacks/network", ".tf")
    assert "data-extra" in "".join(data_main.values()) and "data-extra" not in "".join(own_main.values())
    assert "orders-extra" in "".join(own_main.values()) and "orders-extra" not in "".join(data_main.values())
    with two.ws.store.session(readonly=True) as session:
        trail = session.audit.events(proposal_id=theirs)
    assert {tuple(e.stacks) for e in trail if e.stacks} == {("data/network",)}


def test_no_rule_of_one_repository_reaches_the_other(two: Two) -> None:
    mine = get_proposal(two.ws, _propose(two, two.ws, "q", "orders-q"))
    theirs = get_proposal(two.data, _propose(two, two.data, "q", "orders-q"))

    # policies: data's own Rego rule and required tags judge its changes only
    def rules(proposal: object) -> set[str]:
        return {f.rule for plan in proposal.plans.values() for f in plan.findings}  # type: ignore[attr-defined]

    assert "queue-prefix" in rules(theirs) and "queue-prefix" not in rules(mine)

    # protected paths: `schemas/` is data's, not the workspace's own repository's
    data_settings, own_settings = two.data.repo_settings(), two.ws.repo_settings()
    assert data_settings.is_protected_path("schemas/queues.json")
    assert not own_settings.is_protected_path("schemas/queues.json")
    assert approver_groups(theirs, data_settings).stacks == {"data/network": frozenset({"data"})}

    # overrides: frank is a policy owner (security) in the workspace's repository, not in data's (owners: data)
    finding = next(f for plan in theirs.plans.values() for f in plan.findings if f.rule == "queue-prefix")
    with pytest.raises(Refused, match="frank"):
        override_finding(two.data, two.people.frank, theirs.id, finding.key, "fine",
                         datetime.now(UTC) + timedelta(hours=1))

    # break-glass: a window on data's network is not one on the workspace's network
    window = open_break_glass(two.data, two.people.erin, "data/network", "incident", timedelta(minutes=30))
    assert window.stack == "data/network"
    with two.ws.store.session(readonly=True) as session:
        assert session.day_two.break_glass_windows("network") == []
    with pytest.raises(Refused):  # erin is in data's break-glass group, not the workspace repository's
        open_break_glass(two.ws, two.people.erin, "network", "incident", timedelta(minutes=30))

    # a push to main outside the gateway holds data's applies, never the workspace repository's
    outside = two.clone(two.data, "outside")
    outside.repo.git.checkout("main")
    outside.write("stacks/network/hand.tf", QUEUE % "data-by-hand").push("by hand", author="mallory")
    assert watch_main(two.data) and not watch_main(two.ws)
    with two.data.store.session(readonly=True) as session:
        assert [p.stacks for p in session.main.unacknowledged_pushes()] == [frozenset({"data/network"})]
    with two.ws.store.session(readonly=True) as session:
        assert session.main.unacknowledged_pushes() == []
    assert any("pushed to main outside the gateway" in b for b in gather_blockers(two.data, theirs.id))
    assert not any("pushed to main outside the gateway" in b for b in gather_blockers(two.ws, mine.id))

    # the kill switch: opened in data, agents stop there only
    open_breaker(two.data, two.people.admin, None, "data's agents stop")
    with two.data.store.session(readonly=True) as session:
        assert "data's agents stop" in (open_breaker_reason(session, two.people.agent) or "")
    with two.ws.store.session(readonly=True) as session:
        assert open_breaker_reason(session, two.people.agent) is None


def test_repositories_are_added_by_admins_listed_and_removed_with_their_records_kept(two: Two) -> None:
    with pytest.raises(Refused, match="only admins add or remove repositories"):
        add_repository(two.ws, two.people.bob, "more", _data_content(two.tmp / "more-content"))
    assert not (two.ws.settings.home / "repos" / "more.git").exists()  # refused before anything was made
    with pytest.raises(Conflict, match="already registered"):
        add_repository(two.ws, two.people.admin, "data", _data_content(two.tmp / "again"))
    with pytest.raises(Exception, match="repository name"):
        add_repository(two.ws, two.people.admin, "Not/A/Name", _data_content(two.tmp / "bad"))

    theirs = _propose(two, two.data, "before", "data-before")
    remove_repository(two.ws, two.people.admin, "data")
    assert [(r.name, r.active) for r in list_repositories(two.ws)] == [("data", False), ("declarations", True)]
    assert get_proposal(two.data, theirs).id == theirs  # its records stay readable
    decide(two.data, two.people.erin, theirs, Decision.APPROVE, "ok")
    with pytest.raises(Refused, match="repository data was removed"):
        apply_proposal(two.data, two.people.alice, theirs)
    with pytest.raises(Refused, match="repository data was removed"):
        _propose(two, two.data, "after", "data-after")
    with pytest.raises(Conflict, match="cannot be removed"):
        remove_repository(two.ws, two.people.admin, "declarations")
    with pytest.raises(NotFound, match="no repository nope"):
        two.ws.in_repository("nope")
    with pytest.raises(NotFound, match="no repository '../declarations'"):  # a name, never a path
        two.ws.in_repository("../declarations")
    with pytest.raises(ConfigError, match="not a repository name"):
        Settings(home=two.ws.settings.home, repository="../declarations")


def test_a_repository_added_from_a_git_checkout_keeps_its_history_and_leaves_the_checkout_alone(two: Two) -> None:
    checkout = _data_content(two.tmp / "checkout")
    repo = git.Repo.init(checkout, initial_branch="main")
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com", "commit", "-qm", "data"])
    repo.create_remote("origin", str(two.tmp / "nowhere.git"))  # never pushed to
    (checkout / "stacks" / "network" / "draft.tf").write_text("# not committed\n")
    add_repository(two.ws, two.people.admin, "history", checkout)
    history = two.ws.in_repository("history")
    assert history.repo.resolve("main") == repo.head.commit.hexsha  # main is the checkout's HEAD, history and all
    assert list(history.repo.read_files("main", "stacks/network", ".tf")) == ["stacks/network/main.tf"]  # not the draft
    assert repo.head.commit.message.strip() == "data" and not (two.tmp / "nowhere.git").exists()
    with pytest.raises(Conflict, match="acme/history's main gateway.yaml does not name it as its forge"):
        add_repository(two.ws, two.people.admin, "history2", checkout, github="acme/history")
    assert not (two.ws.settings.home / "repos" / "history2.git").exists()


def test_the_api_works_in_either_repository_and_sends_a_proposal_to_where_it_is(two: Two) -> None:
    theirs = _propose(two, two.data, "api", "data-api")
    token = {"Authorization": f"Bearer {two.people.tokens['erin']}"}
    with TestClient(create_app(two.ws.settings, workers=0)) as client:
        names = [r["name"] for r in client.get("/api/v1/repos", headers=token).json()]
        assert names == ["data", "declarations"]
        assert client.get("/api/v1/proposals", headers=token).json() == []
        listed = client.get("/api/v1/repos/data/proposals", headers=token).json()
        assert [(p["id"], p["stacks"]) for p in listed] == [(theirs, ["data/network"])]
        assert [p["id"] for p in client.get("/api/v1/proposals?repo=data", headers=token).json()] == [theirs]

        moved = client.get(f"/api/v1/proposals/{theirs}", headers=token, follow_redirects=False)
        assert (moved.status_code, moved.headers["location"]) == (307, f"/api/v1/repos/data/proposals/{theirs}")
        approved = client.post(f"/api/v1/proposals/{theirs}/approve", headers=token, json={"comment": "ok"})
        assert approved.status_code == 200, approved.text  # the redirect kept the method and the body
        assert [(d["by"], d["decision"]) for d in approved.json()["decisions"]] == [("erin", "approve")]

        wrong = client.get(f"/api/v1/repos/declarations/proposals/{theirs}", headers=token)
        assert wrong.status_code == 404 and "it is in data" in wrong.json()["detail"]
        climbing = client.get("/api/v1/proposals?repo=../declarations", headers=token)
        assert climbing.status_code == 404 and "no repository '../declarations'" in climbing.json()["detail"]
        unknown = client.get("/api/v1/repos/nope/proposals", headers=token)
        assert unknown.status_code == 404 and "no repository nope" in unknown.json()["detail"]
        sign_in_client(client, two.people.tokens["erin"])
        page = client.get(f"/proposals/{theirs}", follow_redirects=False)  # a page's plain link
        assert (page.status_code, page.headers["location"]) == (307, f"/repos/data/proposals/{theirs}")
        shown = client.get(f"/proposals/{theirs}")
        assert shown.status_code == 200 and "data/network" in shown.text and "data-api" in shown.text


def test_the_cli_works_in_the_repository_of_the_clone_it_runs_in(two: Two) -> None:
    clone = two.clone(two.data, "cli-clone").branch("cli")
    clone.write("stacks/network/extra.tf", QUEUE % "data-cli").push("a queue")
    home = two.ws.settings.home
    proposed = run_cli(["--repo", "data", "propose", "--branch", "cli", "-m", "a queue"], home,
                       two.people.tokens["alice"])
    assert proposed.returncode == 0, proposed.stderr
    assert "stacks data/network" in proposed.stdout
    listed = run_cli(["list"], home, two.people.tokens["alice"])
    assert listed.returncode == 0 and "a queue" not in listed.stdout  # the workspace's own repository's list
    climbing = run_cli(["--repo", "../declarations", "list"], home, two.people.tokens["alice"])
    assert climbing.returncode == 1 and "not a repository name" in climbing.stderr and "Traceback" not in climbing.stderr
    repos = run_cli(["repos", "list"], home, two.people.tokens["alice"])
    assert repos.returncode == 0 and "data" in repos.stdout and "declarations" in repos.stdout


def test_the_repository_of_a_clone_is_found_from_its_origin(tmp_path: Path, two: Two) -> None:
    from gateway.cli.context import repository_of_clone

    clone = two.clone(two.data, "origin-clone")
    inside = clone.path / "stacks" / "network"
    assert repository_of_clone(two.ws.settings.home, inside) == "data"
    own = two.clone(two.ws, "own-clone")
    assert repository_of_clone(two.ws.settings.home, own.path) is None  # the workspace's own: the default
    assert repository_of_clone(two.ws.settings.home, tmp_path) is None


def test_two_repositories_side_by_side_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    world = _two(tmp_path / "home", tmp_path, postgres_url)
    try:
        mine = _propose(world, world.ws, "pg", "orders-pg")
        theirs = _propose(world, world.data, "pg", "data-pg")
        with world.ws.store.session(readonly=True) as session:
            assert [p.id for p in session.proposals.list()] == [mine]
            assert session.proposals.open_for_branch("pg") == mine
        with world.data.store.session(readonly=True) as session:
            assert [p.id for p in session.proposals.list()] == [theirs]
            assert session.proposals.open_for_branch("pg") == theirs
        open_breaker(world.data, world.people.admin, None, "stop data's agents")
        with world.ws.store.session(readonly=True) as session:
            assert session.breaker.states() == []
    finally:
        world.ws.close()


def test_a_workspace_made_before_repositories_migrates_in_place_and_walks_a_change(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with tarfile.open(FIXTURES / "workspaces" / "schema-30.tar.gz") as archive:
        archive.extractall(home, filter="data")
    ws = open_workspace(Settings(home=home, token=None, lock_wait_seconds=2))  # runs migration 32
    try:
        assert [r.name for r in list_repositories(ws)] == ["declarations"]
        assert ws.repository == "declarations"
        applied, still_open = get_proposal(ws, 1), get_proposal(ws, 2)
        assert applied.status == ProposalStatus.APPLIED and applied.stacks == ("network",)
        assert still_open.status == ProposalStatus.OPEN and still_open.repository == "declarations"
        with ws.store.session(readonly=True) as session:
            bob, alice = session.principals.by_name("bob"), session.principals.by_name("alice")
        assert bob is not None and alice is not None
        decide(ws, bob, 2, Decision.APPROVE, "after the upgrade")
        assert apply_proposal(ws, alice, 2).succeeded
        assert get_proposal(ws, 2).status == ProposalStatus.APPLIED
        shutil.rmtree(home / "parsed-hcl", ignore_errors=True)
    finally:
        ws.close()


def test_a_repository_add_killed_before_it_registered_is_begun_again_and_a_stranger_s_folder_is_left_alone(
        two: Two) -> None:
    home, admin, point = two.ws.settings.home, two.people.tokens["admin"], "add_repository.after_create"
    content = str(_data_content(two.tmp / "more-content"))
    killed = run_cli(["repos", "add", "more", "--from", content], home, admin, **{ENVIRONMENT_VARIABLE: point})
    assert killed.returncode == EXIT_STATUS and f"fault point {point} reached" in killed.stderr, killed.stderr
    path = two.ws.settings.in_repository("more").repo_path
    assert path.exists() and "more" not in [r.name for r in list_repositories(two.ws)]  # made, never registered

    retried = run_cli(["repos", "add", "more", "--from", content], home, admin)
    assert retried.returncode == 0, retried.stderr
    assert [(r.name, r.active) for r in list_repositories(two.ws)] == [("data", True), ("declarations", True),
                                                                       ("more", True)]
    more = two.ws.in_repository("more")
    proposal = get_proposal(more, _propose(two, more, "after-retry", "data-retry"))
    assert proposal.stacks == ("more/network",) and not proposal.findings  # more's own rules, from main
    assert not GitDeclarationRepo.left_unfinished(path, "more")  # registered: no longer unfinished work

    for name, make in [("plain", lambda p: p.mkdir(parents=True)),
                       ("bare", lambda p: pygit2.init_repository(str(p), bare=True)),
                       ("renamed", lambda p: shutil.copytree(two.tmp / "renamed-leftover", p))]:
        if name == "renamed":  # another name's unfinished repository, moved here: not this add's own work
            killed = run_cli(["repos", "add", "gone", "--from", content], home, admin,
                             **{ENVIRONMENT_VARIABLE: point})
            assert killed.returncode == EXIT_STATUS
            shutil.move(two.ws.settings.in_repository("gone").repo_path, two.tmp / "renamed-leftover")
        folder = two.ws.settings.in_repository(name).repo_path
        make(folder)
        (folder / "someone's.txt").write_text("kept")
        refused = run_cli(["repos", "add", name, "--from", content], home, admin)
        assert refused.returncode == 1 and "exists but is not a registered repository: move it away first" \
            in refused.stderr, (name, refused.stderr)
        assert (folder / "someone's.txt").read_text() == "kept", name  # refused, and left as it was


def test_every_way_in_opens_a_proposal_only_for_a_requester_who_may_request_in_its_repository(two: Two) -> None:
    clone = two.clone(two.data, "refusals").branch("refused")
    clone.write("stacks/network/extra.tf", QUEUE % "data-refused").push("a queue")
    with pytest.raises(Refused) as refused:  # an agent for a person who may not request: the table's sentence
        open_proposal(two.data, two.people.agent, "refused", "a queue", requester=two.people.dana)
    assert refused.value.reasons == ["dana has no role that may request changes"]

    remove_repository(two.ws, two.people.admin, "data")
    proposed = run_cli(["--repo", "data", "propose", "--branch", "refused", "-m", "a queue"],
                       two.ws.settings.home, two.people.tokens["alice"])
    assert proposed.returncode == 1, proposed.stdout
    assert "repository data was removed from the gateway by admin: nothing new is proposed, planned or applied " \
        "there" in proposed.stderr and "Traceback" not in proposed.stderr
    with pytest.raises(NotFound, match="no repository ghost is registered in this gateway"):  # fail closed
        open_proposal(replace(two.ws, store=two.ws.store.for_repository("ghost")), two.people.alice, "x", "x")
    with two.data.store.session(readonly=True) as session:
        assert session.proposals.list() == []
