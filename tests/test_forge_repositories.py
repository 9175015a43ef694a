"""One webhook endpoint for every repository of the gateway: a delivery goes to the repository whose main
gateway.yaml names the delivery's forge repository, and is recorded and handled there.

Two repositories of one gateway, each with `forge: github` naming a GitHub repository of its own (acme/infra for the
workspace's own, acme/data for `data`), both on one fake GitHub over real HTTP with real git, one GitHub App installed
on both (the gateway is given the App's id and key, not its installation: it asks GitHub which installation holds each
repository); the real app and its worker. A pull request opened and
approved on each lands on the right proposal in the right repository, by that repository's rules. A delivery for a
GitHub repository no gateway.yaml names, or one GATEWAY_GITHUB_REPOSITORIES leaves out, is refused and said in the
trail once; the App's installation events are recorded and admit nothing; a gateway.yaml that does not parse stops
routing to no other repository. GitLab's deliveries go the same way: to a repository whose gateway.yaml names the
project, though the workspace's own repository has no forge at all.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway import worker as worker_module
from gateway.api.app import create_app
from gateway.composition import add_repository, create_workspace
from gateway.config import Settings
from gateway.domain.errors import BackendError, InAnotherRepository, Unavailable
from gateway.domain.github import Delivery
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.proposals import get_proposal
from gateway.services.forge import installed, routing
from gateway.services.forge.github import link_account
from gateway.services.forge.gitlab_webhooks import link_account as link_gitlab_account
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people
from .fakes import sandbox_workspace
from .github_fake import FakeGitHub
from .gitlab_fake import FakeGitLab
from .test_github import QUEUE, make_github_the_forge, wait_for

SECRET = "one secret for the App's deliveries"
DATA_QUEUE = """resource "aws_sqs_queue" "extra" {
  name = "data-extra"
  tags = { team = "data", owner = "data", "cost-centre" = "cc-7" }
}
"""
DATA_MAIN_QUEUE = """resource "aws_sqs_queue" "events" {
  name = "data-events"
  tags = { team = "data", owner = "data", "cost-centre" = "cc-7" }
}
"""


DATA_RULES = """\
engine: sandbox
approvals:
  required: 1
  config_approvers: [data]
stacks:
  network:
    path: stacks/network
    approvers: [data]
protected_paths: [gateway.yaml]
"""


def _data_yaml(gh: FakeGitHub) -> str:
    return DATA_RULES + (f"forge: github\ngithub:\n  repository: {gh.full_name}\n  api_url: {gh.url}\n"
                         f"  git_url: {gh.git_url}\n  teams: {{data: data-team}}\n")


@dataclass
class Both:
    ws: Workspace  # the workspace's own repository, `declarations`: acme/infra
    data: Workspace  # repository `data`: acme/data
    infra_gh: FakeGitHub
    data_gh: FakeGitHub
    client: TestClient
    people: People
    root: Path

    def deliver(self, event: str, payload: dict[str, Any], delivery: str | None = None) -> Any:
        body = json.dumps(payload).encode()
        headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
                   "Content-Type": "application/json",
                   "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()}
        return self.client.post("/api/v1/github/webhook", content=body, headers=headers)

    def events(self, kind: str) -> list[Any]:
        with self.ws.store.session(readonly=True) as session:
            return session.audit.events(kind=kind)

    def add_repository(self, name: str, gateway_yaml: str) -> Workspace:
        folder = self.root / f"{name}-content"
        (folder / "stacks" / "network").mkdir(parents=True)
        (folder / "gateway.yaml").write_text(gateway_yaml)
        (folder / "stacks" / "network" / "main.tf").write_text(DATA_MAIN_QUEUE)
        add_repository(self.ws, self.people.admin, name, folder)
        return self.ws.in_repository(name)


@pytest.fixture
def both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Both]:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with FakeGitHub(tmp_path / "github", "acme", "infra") as infra_gh:
        data_gh = infra_gh.add_repository("data")  # the same organisation: the App's one installation holds both
        settings = Settings(home=tmp_path / "home", token=None, lock_wait_seconds=2, github_webhook_secret=SECRET,
                            github_write_interval_seconds=0, public_url="http://gateway.test",
                            github_app_id=infra_gh.app_id, github_app_private_key=infra_gh.app_private_key_pem,
                            github_repositories=["acme/*", "globex/*", "initech/*"], github_api_url=infra_gh.url,
                            github_git_url=str(tmp_path / "github" / "{repository}" / "github.git"))
        ws = create_workspace(settings)
        bootstrap_simulator(ws)
        people = add_people(ws)
        make_github_the_forge(ws, infra_gh, tmp_path / "admin-clone")
        folder = tmp_path / "data-content"
        (folder / "stacks" / "network").mkdir(parents=True)
        (folder / "gateway.yaml").write_text(_data_yaml(data_gh))
        (folder / "stacks" / "network" / "main.tf").write_text(DATA_MAIN_QUEUE)
        add_repository(ws, people.admin, "data", folder)
        ws.in_repository("data").repo.repo.git.push(data_gh.git_url, "+main:main")  # type: ignore[attr-defined]
        for name in ("alice", "bob", "carol", "erin"):
            link_account(ws, people.admin, name, name, infra_gh.add_user(name))
        infra_gh.add_team("platform-team", ["bob", "carol"])
        infra_gh.add_team("app-team", ["alice"])
        data_gh.add_team("data-team", ["erin"])
        with TestClient(create_app(settings, workers=1)) as client:
            yield Both(ws, ws.in_repository("data"), infra_gh, data_gh, client, people, tmp_path)
        ws.close()
    for gh in (infra_gh, data_gh):
        assert not (gh.schema_errors or gh.request_errors or gh.unhandled), (gh.schema_errors, gh.request_errors,
                                                                             gh.unhandled)


def _proposal(ws: Workspace, forge_repository: str, number: int) -> int:
    def probe() -> int | None:
        with ws.store.session(readonly=True) as session:
            return session.github.proposal_for_pull_request(forge_repository, number)
    return wait_for(f"a proposal for {forge_repository}#{number}", probe, timeout=60)


def test_each_repositorys_pull_request_and_review_land_in_that_repository(both: Both) -> None:
    both.infra_gh.push_commit("feature/queue", {"stacks/app-staging/queue.tf": QUEUE}, "a queue", author_login="alice")
    both.data_gh.push_commit("feature/queue", {"stacks/network/extra.tf": DATA_QUEUE}, "a queue", author_login="alice")
    infra_pull = both.infra_gh.open_pull("feature/queue", "A queue", "", "alice")
    data_pull = both.data_gh.open_pull("feature/queue", "A data queue", "", "alice")
    assert infra_pull == data_pull == 1  # the same number, in two GitHub repositories
    answers = [both.deliver("pull_request", gh.pull_request_event(1, "opened", sender="alice"))
               for gh in (both.infra_gh, both.data_gh)]
    assert [a.status_code for a in answers] == [202, 202]
    jobs = [both.ws.store.queue.get(a.json()["job"]) for a in answers]
    assert [j.args.get("repository") for j in jobs] == [None, "data"]  # the webhook job works where it was routed

    mine, theirs = _proposal(both.ws, "acme/infra", 1), _proposal(both.data, "acme/data", 1)
    assert get_proposal(both.ws, mine).stacks == ("app-staging",)
    assert get_proposal(both.data, theirs).stacks == ("data/network",)  # planned by data's own gateway.yaml
    with pytest.raises(InAnotherRepository):
        get_proposal(both.ws, theirs)
    with both.data.store.session(readonly=True) as session:
        delivered = session.github.delivery(answers[1].json()["delivery"])
    assert delivered is not None and delivered.job_id == jobs[1].id

    wait_for("both plans", lambda: get_proposal(both.ws, mine).plans and get_proposal(both.data, theirs).plans,
             timeout=60)
    for gh in (both.infra_gh, both.data_gh):  # the App's check run on each pull request's head: only an App writes one
        runs = wait_for(f"the check run on {gh.full_name}", lambda g=gh: g.check_runs(g.pull(1)["head"]["sha"]),
                        timeout=60)
        assert {r["app"]["id"] for r in runs} == {gh.app_id}
    [infra_comment], [data_comment] = both.infra_gh.comments(1), both.data_gh.comments(1)
    assert f"proposal [{theirs}](http://gateway.test/proposals/{theirs}) in repository `data`" \
        in data_comment["body"] and "`data/network`" in data_comment["body"]
    assert f"proposal [{mine}](http://gateway.test/proposals/{mine}):" in infra_comment["body"]  # the default's
    installations = [r.path for gh in (both.infra_gh, both.data_gh) for r in gh.request_log  # each repository's own
                     if r.path.endswith("/installation")]
    assert sorted(set(installations)) == ["/repos/acme/data/installation", "/repos/acme/infra/installation"]
    carol = both.infra_gh.add_review(1, "carol", "APPROVED", body="ok")  # platform approves the sample's stacks
    erin = both.data_gh.add_review(1, "erin", "APPROVED", body="ok")  # data approves data's
    for gh, review in ((both.infra_gh, carol), (both.data_gh, erin)):
        assert both.deliver("pull_request_review", gh.review_event(review)).status_code == 202
    for ws, pid, person in ((both.ws, mine, "carol"), (both.data, theirs, "erin")):
        approved = wait_for(f"{person}'s approval", lambda w=ws, p=pid: get_proposal(w, p).current_approvals,
                            timeout=60)
        assert [d.principal.name for d in approved] == [person]


def test_a_delivery_for_a_repository_the_gateway_may_not_take_is_refused_in_the_trail_once(both: Both) -> None:
    payload = both.infra_gh.pull_request_event(_open(both.infra_gh), "opened", sender="alice")
    unknown = json.loads(json.dumps(payload).replace('"acme/infra"', '"acme/unknown"')) | {"action": "closed"}
    delivery = str(uuid.uuid4())
    for _ in range(2):  # a redelivery is refused again, silently
        refused = both.deliver("pull_request", unknown, delivery)
        assert refused.status_code == 403
        assert "no repository of this gateway names GitHub repository acme/unknown" in refused.json()["detail"]
    [event] = both.events("github.delivery.refused")
    assert event.payload["repository"] == "acme/unknown" and event.payload["delivery"] == delivery

    both.add_repository("legacy", _data_yaml(both.data_gh).replace(both.data_gh.full_name, "elsewhere/legacy"))
    outside = json.loads(json.dumps(payload).replace('"acme/infra"', '"elsewhere/legacy"'))
    refused = both.deliver("pull_request", outside)  # a gateway.yaml names it, the allow-list does not
    assert refused.status_code == 403 and "not in GATEWAY_GITHUB_REPOSITORIES (acme/*, globex/*, initech/*)" in refused.json()["detail"]
    assert [e.payload["repository"] for e in both.events("github.delivery.refused")] == [
        "acme/unknown", "elsewhere/legacy"]
    with both.ws.store.session(readonly=True) as session:
        assert session.github.proposal_for_pull_request("acme/unknown", 1) is None
        assert session.github.proposal_for_pull_request("elsewhere/legacy", 1) is None

    # the App was on acme/unknown before a repository of the gateway named it: GitHub's redelivery is taken now
    late = both.add_repository("late", _data_yaml(both.data_gh).replace(both.data_gh.full_name, "acme/unknown"))
    taken = both.deliver("pull_request", unknown, delivery)
    assert taken.status_code == 202 and taken.json()["duplicate"] is False
    assert both.ws.store.queue.get(taken.json()["job"]).args["repository"] == "late"
    with late.store.session(readonly=True) as session:
        assert session.github.delivery(delivery) is not None
    job = wait_for("the job", lambda: (lambda j: j if j.finished else None)(both.ws.store.queue.get(
        taken.json()["job"])), timeout=60)
    assert job.result == {"ignored": "pull request #1 has no proposal"}  # handled in late, by late's gateway.yaml


def test_a_gateway_yaml_that_does_not_parse_stops_routing_to_no_other_repository(both: Both) -> None:
    broken = both.add_repository("broken", _data_yaml(both.data_gh).replace(both.data_gh.full_name, "acme/broken"))
    Clone(broken, both.root / "broken-clone").write("gateway.yaml", "stacks: [").push("oops", author="admin")
    names = dict(routing.forge_names(both.ws))
    assert names["broken"].broken and names["broken"].github is None
    assert routing.route_delivery(both.ws, "github", "acme/data").repository == "data"
    assert routing.route_delivery(both.ws, "github", "ACME/Infra").repository == "declarations"  # names ignore case
    assert both.ws.forge_names is both.data.forge_names  # one cache for the process, by repository and main commit
    assert {key[0] for key in both.ws.forge_names} == {"declarations", "data", "broken"}
    routing.route_delivery(both.ws, "github", "acme/data")
    assert len(both.ws.forge_names) == 3  # main did not move: nothing read again


def test_the_apps_installation_events_are_recorded_and_admit_nothing(both: Both) -> None:
    installation = {"id": both.infra_gh.installation_id, "account": {"login": "acme", "id": 1}}
    payload = {"action": "added", "installation": installation, "repository_selection": "selected",
               "repositories_added": [{"id": 1, "full_name": "acme/data"}, {"id": 2, "full_name": "evil/repo"}],
               "repositories_removed": [{"id": 3, "full_name": "acme/old"}], "sender": {"login": "alice", "id": 1}}
    delivery = str(uuid.uuid4())
    answers = [both.deliver("installation_repositories", payload, delivery) for _ in range(2)]
    assert [a.status_code for a in answers] == [202, 202]
    assert [(a.json()["job"], a.json()["duplicate"]) for a in answers] == [(None, False), (None, True)]
    [event] = both.events("github.installation_repositories")
    assert event.payload | {"delivery": None} == {
        "delivery": None, "action": "added", "installation": both.infra_gh.installation_id, "account": "acme",
        "added": ["acme/data", "evil/repo"], "removed": ["acme/old"], "not_allowed": ["evil/repo"],
        "to_add": []}  # acme/data is served already
    created = {"action": "created", "installation": installation, "repositories": [{"full_name": "acme/infra"}]}
    assert both.deliver("installation", created).json()["job"] is None
    [event] = both.events("github.installation")
    assert event.payload["added"] == ["acme/infra"] and event.payload["removed"] == []


def test_the_app_works_in_each_organisation_it_is_installed_in_and_nowhere_else(both: Both) -> None:
    """A repository in another organisation is in another installation of the same App: the gateway finds that
    installation and works there with its token; on a repository the App is not installed on, the pull request's
    comment and checks fail to publish, saying why (and are retried, as any failed publish is)."""
    legacy_gh = both.infra_gh.add_repository("legacy", owner="globex", installation_id=78)
    legacy = both.add_repository("legacy", _data_yaml(legacy_gh))
    legacy.repo.repo.git.push(legacy_gh.git_url, "+main:main")  # type: ignore[attr-defined]
    legacy_gh.add_team("data-team", ["erin"])
    legacy_gh.push_commit("feature/queue", {"stacks/network/extra.tf": DATA_QUEUE}, "a queue", author_login="alice")
    number = legacy_gh.open_pull("feature/queue", "A legacy queue", "", "alice")
    opened = both.deliver("pull_request", legacy_gh.pull_request_event(number, "opened", sender="alice"))
    assert opened.status_code == 202
    pid = _proposal(legacy, "globex/legacy", number)
    wait_for("the plan", lambda: get_proposal(legacy, pid).plans, timeout=60)
    runs = wait_for("the check run", lambda: legacy_gh.check_runs(legacy_gh.pull(number)["head"]["sha"]), timeout=60)
    assert {r["app"]["id"] for r in runs} == {legacy_gh.app_id}
    assert [r.path for r in legacy_gh.request_log if r.path.endswith("/installation")] == [
        "/repos/globex/legacy/installation"]
    assert [r.path for r in both.infra_gh.request_log if r.path.startswith("/app/installations/")] == [
        "/app/installations/78/access_tokens"]  # globex's installation, not acme's

    outside_gh = both.infra_gh.add_repository("outside", owner="initech", installed=False)
    outside = both.add_repository("outside", _data_yaml(outside_gh))
    outside.repo.repo.git.push(outside_gh.git_url, "+main:main")  # type: ignore[attr-defined]
    outside_gh.push_commit("feature/queue", {"stacks/network/extra.tf": DATA_QUEUE}, "a queue", author_login="alice")
    number = outside_gh.open_pull("feature/queue", "A queue", "", "alice")
    payload = outside_gh.pull_request_event(number, "opened", sender="alice")
    accepted = both.deliver("pull_request", payload)  # the allow-list admits it: the App's absence is what stops it
    assert accepted.status_code == 202, accepted.text
    refused = _proposal(outside, "initech/outside", number)  # its branch is git's: the proposal is planned

    def publish_error() -> str | None:
        with outside.store.session(readonly=True) as session:
            link = session.github.pull_request_of(refused)
        return link.publish_error if link else None
    assert "the GitHub App 4242 is not installed on initech/outside: install it there" in wait_for(
        "the publish to fail", publish_error, timeout=60)


def test_installing_the_app_on_an_admitted_repository_adds_it_from_githubs_main(both: Both) -> None:
    """The App given acme/network (whose main's gateway.yaml names it) is a repository of the gateway at once, its main
    GitHub's, its pull requests planned by its own rules; given one with no gateway.yaml or one naming another
    repository, nothing is added and the trail says why; a redelivery adds nothing twice."""
    network_gh = both.infra_gh.add_repository("network")
    network_gh.seed_main({"gateway.yaml": _data_yaml(network_gh), "stacks/network/main.tf": DATA_MAIN_QUEUE})
    bare_gh = both.infra_gh.add_repository("bare")
    bare_gh.seed_main({"README.md": "nothing declared here\n"})
    other_gh = both.infra_gh.add_repository("other")
    other_gh.seed_main({"gateway.yaml": _data_yaml(network_gh), "stacks/network/main.tf": DATA_MAIN_QUEUE})
    payload = {"action": "added", "installation": {"id": both.infra_gh.installation_id, "account": {"login": "acme"}},
               "repository_selection": "selected", "repositories_removed": [], "sender": {"login": "alice", "id": 1},
               "repositories_added": [{"full_name": name} for name in ("acme/network", "acme/bare", "acme/other",
                                                                       "evil/repo")]}
    delivery = str(uuid.uuid4())
    answer = both.deliver("installation_repositories", payload, delivery)
    assert answer.status_code == 202 and answer.json()["job"] is not None
    job = wait_for("the repositories to be added", lambda: (lambda j: j if j.finished else None)(
        both.ws.store.queue.get(answer.json()["job"])), timeout=60)
    assert job.result is not None and job.result["added"] == {"acme/network": "network"}, job
    assert sorted(job.result["not_added"]) == ["acme/bare", "acme/other"]
    reasons = {e.payload["github_repository"]: e.payload["reason"] for e in both.events("github.repository_not_added")}
    assert "acme/bare's main holds no gateway.yaml" in reasons["acme/bare"]
    assert "acme/other's main gateway.yaml does not name it as its forge" in reasons["acme/other"]
    [added] = [e for e in both.events("repository.added") if e.payload["repository"] == "network"]
    assert added.actor == "github" and added.payload["main"] == network_gh.branch_sha("main")  # GitHub's main, as is
    again = both.deliver("installation_repositories", payload, delivery)
    assert again.json() == {"delivery": delivery, "duplicate": True, "job": job.id}

    network = both.ws.in_repository("network")
    network_gh.push_commit("feature/queue", {"stacks/network/extra.tf": DATA_QUEUE}, "a queue", author_login="alice")
    number = network_gh.open_pull("feature/queue", "A network queue", "", "alice")
    opened = both.deliver("pull_request", network_gh.pull_request_event(number, "opened", sender="alice"))
    assert opened.status_code == 202 and both.ws.store.queue.get(opened.json()["job"]).args["repository"] == "network"
    pid = _proposal(network, "acme/network", number)
    assert get_proposal(network, pid).stacks == ("network/network",)
    wait_for("the check run", lambda: network_gh.check_runs(network_gh.pull(number)["head"]["sha"]), timeout=60)


def test_an_installation_github_cannot_be_reached_for_is_tried_again_and_a_refused_one_is_recorded(
        tmp_path: Path) -> None:
    """GitHub down while a repository is cloned: the job fails as Unavailable (a webhook job is retried), nothing is
    recorded as refused and nothing added; a repository that cannot be added (git refuses) is recorded with why."""
    base = sandbox_workspace(tmp_path / "home")
    ws = replace(base, settings=base.settings.model_copy(update={"github_repositories": ["acme/*"]}))
    added: list[str] = []
    ws.add_repository = lambda actor, name, content, github: added.append(name)  # type: ignore[assignment,misc,return-value]

    class Clones:
        settings: Any = None

        def clone_main(self, into: Path) -> None:
            if self.settings.repository == "acme/flaky":
                raise Unavailable("GitHub is unavailable (git clone): failed to connect")
            raise BackendError("git clone with GitHub failed: repository not found")

    def open_forge(settings: Any) -> Clones:
        clones = Clones()
        clones.settings = settings
        return clones
    ws.open_forge = open_forge  # type: ignore[assignment]

    def delivery(names: list[str]) -> Delivery:
        payload = {"action": "added", "repositories_added": [{"full_name": n} for n in names]}
        return Delivery(str(uuid.uuid4()), "installation_repositories", "added", json.dumps(payload), None,
                        ws.clock.now())

    with pytest.raises(Unavailable, match="failed to connect"):
        installed.add_installed(ws, delivery(["acme/flaky"]))
    assert added == [] and _kinds(ws, "github.repository_not_added") == []
    assert installed.add_installed(ws, delivery(["acme/gone", "other/x"])) == {
        "added": {}, "not_added": {"acme/gone": "git clone with GitHub failed: repository not found"}}
    assert _kinds(ws, "github.repository_not_added") == [{
        "delivery": _kinds(ws, "github.repository_not_added")[0]["delivery"], "github_repository": "acme/gone",
        "reason": "git clone with GitHub failed: repository not found"}]  # other/x: not admitted, not tried


def _kinds(ws: Workspace, kind: str) -> list[dict[str, Any]]:
    with ws.store.session(readonly=True) as session:
        return [dict(e.payload) for e in session.audit.events(kind=kind)]


def _open(gh: FakeGitHub) -> int:
    gh.push_commit("feature/queue", {"stacks/app-staging/queue.tf": QUEUE}, "a queue", author_login="alice")
    return gh.open_pull("feature/queue", "A queue", "", "alice")


def test_a_gitlab_delivery_goes_to_the_repository_naming_its_project(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with FakeGitLab(tmp_path / "gitlab", "acme", "lake") as gl:
        settings = Settings(home=tmp_path / "home", token=None, lock_wait_seconds=2, gitlab_webhook_secret=SECRET,
                            gitlab_token=gl.token, public_url="http://gateway.test")
        ws = create_workspace(settings)  # its own repository, the sample, names no forge
        bootstrap_simulator(ws)
        people = add_people(ws)
        folder = tmp_path / "lake-content"
        (folder / "stacks" / "network").mkdir(parents=True)
        (folder / "gateway.yaml").write_text(DATA_RULES + (
            f"forge: gitlab\ngitlab:\n  repository: {gl.full_name}\n  api_url: {gl.url}\n  git_url: {gl.git_url}\n"
            "  groups: {data: acme/data-team}\n"))
        (folder / "stacks" / "network" / "main.tf").write_text(DATA_MAIN_QUEUE)
        add_repository(ws, people.admin, "lake", folder)
        lake = ws.in_repository("lake")
        lake.repo.repo.git.push(gl.git_url, "+main:main")  # type: ignore[attr-defined]
        for name in ("alice", "erin"):
            link_gitlab_account(ws, people.admin, name, name, gl.add_user(name))
        gl.add_group("acme")
        gl.add_group("acme/data-team", ["erin"])
        gl.push_commit("feature/queue", {"stacks/network/extra.tf": DATA_QUEUE}, "a queue", author="alice")
        iid = gl.open_merge_request("feature/queue", "A data queue", "", "alice")
        with TestClient(create_app(settings, workers=1)) as client:
            def deliver(payload: dict[str, Any]) -> Any:
                headers = FakeGitLab.delivery_headers("Merge Request Hook", SECRET)
                return client.post("/api/v1/gitlab/webhook", content=json.dumps(payload).encode(), headers=headers)

            opened = deliver(gl.merge_request_event(iid, "open", "alice"))
            assert opened.status_code == 202, opened.text
            assert ws.store.queue.get(opened.json()["job"]).args["repository"] == "lake"
            pid = _proposal(lake, gl.full_name, iid)
            assert get_proposal(lake, pid).stacks == ("lake/network",)
            wait_for("the plan", lambda: get_proposal(lake, pid).plans, timeout=60)
            gl.approve(iid, "erin")
            assert deliver(gl.merge_request_event(iid, "approval", "erin")).status_code == 202
            approved = wait_for("erin's approval", lambda: get_proposal(lake, pid).current_approvals, timeout=60)
            assert [d.principal.name for d in approved] == ["erin"]
        ws.close()
    assert not (gl.schema_errors or gl.request_errors or gl.unhandled), (gl.schema_errors, gl.request_errors,
                                                                         gl.unhandled)
