"""Waiting for you: the inbox of the API, the command and the proposals page is one list, from one function."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.services.workspace import Workspace

from .conftest import Clone, People, run_cli, sign_in_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def client(workspace: Workspace) -> Iterator[TestClient]:
    with TestClient(create_app(workspace.settings, workers=0)) as test_client:
        yield test_client


@pytest.fixture
def proposal_id(workspace: Workspace, people: People, clone: Clone) -> int:
    from gateway.services.change.proposals import open_proposal

    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    return open_proposal(workspace, people.alice, "bigger", "more memory").id


def test_the_inbox_says_why_each_proposal_needs_you(client: TestClient, people: People, proposal_id: int,
                                                    workspace: Workspace) -> None:
    inbox = client.get("/api/v1/inbox", headers=bearer(people.tokens["bob"]))
    assert inbox.status_code == 200
    [item] = inbox.json()
    assert item["id"] == proposal_id and item["requester"] == "alice" and item["stacks"] == ["app-staging"]
    assert item["groups"] == ["platform"] and item["required_approvals"] == 1 and item["current_approvals"] == 0
    assert item["why"] == ["you are in approver group platform of app-staging",
                           f"risk {item['risk']}: 1 approval(s) needed, 0 given so far"]
    # the proposals list marks the same one as waiting for bob
    listed = client.get("/api/v1/proposals", headers=bearer(people.tokens["bob"])).json()
    assert [p["id"] for p in listed if p["waiting_for_you"]] == [proposal_id]

    # nobody else's: not the requester's, not an approver outside the stack's groups, not an auditor's or agent's
    for name in ("alice", "erin", "dana", "infra-agent"):
        assert client.get("/api/v1/inbox", headers=bearer(people.tokens[name])).json() == [], name
    assert client.get("/api/v1/inbox").status_code == 401

    # the command prints the same document
    printed = run_cli(["inbox", "--format", "json"], workspace.settings.home, people.tokens["bob"])
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == inbox.json()
    text = run_cli(["inbox"], workspace.settings.home, people.tokens["bob"]).stdout
    assert f"{proposal_id:>4}" in text and "you are in approver group platform of app-staging" in text
    assert run_cli(["inbox"], workspace.settings.home, people.tokens["erin"]).stdout.strip() == "nothing waits for you"

    # and the page
    sign_in_client(client, people.tokens["bob"])
    page = client.get("/").text
    assert f'id="inbox-{proposal_id}"' in page and "you are in approver group platform of app-staging" in page


def test_a_decision_takes_a_proposal_out_of_your_inbox(client: TestClient, people: People, proposal_id: int) -> None:
    approved = client.post(f"/api/v1/proposals/{proposal_id}/approve", headers=bearer(people.tokens["bob"]),
                           json={"comment": "fine"})
    assert approved.status_code == 200, approved.text
    assert client.get("/api/v1/inbox", headers=bearer(people.tokens["bob"])).json() == []  # already approved
    [item] = client.get("/api/v1/inbox", headers=bearer(people.tokens["carol"])).json()
    assert item["current_approvals"] == 1 and item["why"][-1].endswith("1 approval(s) needed, 1 given so far")
    sign_in_client(client, people.tokens["bob"])
    assert not re.search(r'id="inbox"', client.get("/").text)
