"""The pages of a gateway serving two repositories (the workspace's own `declarations` and the added `data`): a picker
in the header names the one a page is in and leads to the same page in the other; a page of `data` links within
`data`, so moving about never goes through a redirect; the front page's inbox shows what waits for the person in
both, each entry naming its repository and linking straight to it; the proposal page names its repository."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.services.admin.repositories import remove_repository
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import run_cli, sign_in_client
from .test_repositories import QUEUE, Two, _two

LINK = re.compile(r'(?:href|action)="(/[^"]*)"')


@pytest.fixture
def two(tmp_path):  # type: ignore[no-untyped-def]
    world = _two(tmp_path / "home", tmp_path)
    yield world
    world.ws.close()


@pytest.fixture
def erin(two: Two) -> Iterator[TestClient]:
    """Erin, signed in: an approver of stack data (declarations) and of data/network (repository data)."""
    with TestClient(create_app(two.ws.settings, workers=0)) as client:
        sign_in_client(client, two.people.tokens["erin"])
        yield client


def _propose(two: Two, ws: Workspace, stack: str, queue: str) -> int:
    branch = f"queue-{queue}"
    two.clone(ws, f"{ws.repository}-{branch}").branch(branch).write(
        f"stacks/{stack}/extra.tf", QUEUE % queue).push(f"a queue {queue}")
    return open_proposal(ws, two.people.alice, branch, f"a queue {queue}").id


def _picker(page: str) -> str:
    found = re.search(r'<nav class="repos" id="repositories".*?</nav>', page, re.S)
    assert found, "no repository picker on the page"
    return found.group(0)


def test_the_picker_names_the_repository_a_page_is_in_and_leads_to_the_same_page_in_the_other(
        two: Two, erin: TestClient) -> None:
    front = _picker(erin.get("/").text)
    assert '<strong aria-current="page">declarations</strong>' in front and '<a href="/repos/data/">data</a>' in front

    drift = erin.get("/repos/data/drift")
    assert drift.status_code == 200
    assert '<strong aria-current="page">data</strong>' in _picker(drift.text)
    assert '<a href="/drift">declarations</a>' in _picker(drift.text)

    theirs = _propose(two, two.data, "network", "data-picked")
    page = erin.get(f"/repos/data/proposals/{theirs}").text  # one proposal: the other repository's front page
    assert '<a href="/">declarations</a>' in _picker(page)
    assert erin.get("/repos/data").status_code == 200  # the front page of data, without its slash too

    remove_repository(two.ws, two.people.admin, "data")
    assert 'id="repositories"' not in erin.get("/").text  # one repository left: no picker


def test_the_inbox_shows_what_waits_in_every_repository_with_links_that_open_without_a_redirect(
        two: Two, erin: TestClient) -> None:
    mine = _propose(two, two.ws, "data", "orders-inbox")  # declarations' stack data: approvers platform, data
    theirs = _propose(two, two.data, "network", "data-inbox")  # data's data/network: approvers data

    for front in (erin.get("/").text, erin.get("/repos/data/").text):  # the same inbox from either repository
        inbox = front[front.index('<section id="inbox">'):front.index("</section>")]
        mine_entry = inbox[inbox.index(f'id="inbox-{mine}"'):inbox.index(f'id="inbox-{theirs}"')]
        theirs_entry = inbox[inbox.index(f'id="inbox-{theirs}"'):]
        assert '<span class="repository">declarations</span>' in mine_entry
        assert f'href="/proposals/{mine}"' in mine_entry
        assert '<span class="repository">data</span>' in theirs_entry and "data/network" in theirs_entry
        assert f'href="/repos/data/proposals/{theirs}"' in theirs_entry
        for link in (f"/proposals/{mine}", f"/repos/data/proposals/{theirs}"):
            opened = erin.get(link, follow_redirects=False)
            assert opened.status_code == 200, (link, opened.status_code, opened.headers.get("location"))


def test_a_page_of_data_links_within_data_and_names_it(two: Two, erin: TestClient) -> None:
    theirs = _propose(two, two.data, "network", "data-links")
    for path in ("/repos/data/", f"/repos/data/proposals/{theirs}", "/repos/data/drift", "/repos/data/requests/new"):
        page = erin.get(path)
        assert page.status_code == 200, path
        own = set(LINK.findall(page.text.replace(_picker(page.text), ""))) - {"/logout"}
        assert own and all(link.startswith("/repos/data/") for link in own), (path, own)

    page = erin.get(f"/repos/data/proposals/{theirs}").text
    assert '<strong id="repository">data</strong>' in page
    assert f'action="/repos/data/proposals/{theirs}/decide"' in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    sha = re.search(r'name="sha" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    decided = erin.post(f"/repos/data/proposals/{theirs}/decide", follow_redirects=False,
                        data={"csrf": csrf, "sha": sha, "decision": "approve", "comment": "ok"})
    assert (decided.status_code, decided.headers["location"]) == (303, f"/repos/data/proposals/{theirs}")


def test_a_proposal_page_of_the_workspace_own_repository_names_it_when_there_are_two(
        two: Two, erin: TestClient) -> None:
    mine = _propose(two, two.ws, "data", "orders-named")
    page = erin.get(f"/proposals/{mine}").text
    assert '<strong id="repository">declarations</strong>' in page
    assert not [link for link in LINK.findall(page.replace(_picker(page), "")) if link.startswith("/repos/")]


def test_the_api_inbox_names_the_repository_and_gathers_every_one_when_asked(two: Two, erin: TestClient) -> None:
    mine = _propose(two, two.ws, "data", "orders-api")
    theirs = _propose(two, two.data, "network", "data-api-inbox")
    token = {"Authorization": f"Bearer {two.people.tokens['erin']}"}

    def listed(path: str) -> list[tuple[int, str]]:
        answer = erin.get(path, headers=token)
        assert answer.status_code == 200, answer.text
        return [(i["id"], i["repository"]) for i in answer.json()]

    assert listed("/api/v1/inbox") == [(mine, "declarations")]  # the repository asked, as before
    assert listed("/api/v1/repos/data/inbox") == [(theirs, "data")]
    everywhere = [(mine, "declarations"), (theirs, "data")]
    assert listed("/api/v1/inbox?all_repositories=true") == everywhere
    assert listed("/api/v1/repos/data/inbox?all_repositories=true") == everywhere

    printed = run_cli(["inbox", "--all-repositories", "--format", "json"], two.ws.settings.home,
                      two.people.tokens["erin"])  # the command prints the same document
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == erin.get("/api/v1/inbox?all_repositories=true", headers=token).json()
