"""What reads keep in memory never shows an old state, never writes, and never lets a secret through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from gateway.adapters.store.schema import metadata
from gateway.api.app import create_app
from gateway.domain.scrubbing import REDACTED, Scrubber
from gateway.services.change.proposals import open_proposal, sync_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People, add_people, sign_in_client

QUEUE = 'resource "aws_sqs_queue" "orders" {\n  name = "orders-staging"\n  tags = local.tags\n}\n'


def _bearer(people: People, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {people.tokens[name]}"}


def _preview_text(document: dict[str, Any]) -> str:
    return str([plan["preview"] for plan in document["plans"]])


def test_the_next_read_shows_an_approval_and_a_new_plan(any_workspace: Workspace, tmp_path: Path) -> None:
    workspace, people, clone = any_workspace, add_people(any_workspace), Clone(any_workspace, tmp_path / "clone")
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    url = f"/api/v1/proposals/{proposal.id}"
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["carol"])
        first = client.get(url, headers=_bearer(people, "bob")).json()
        client.get(url, headers=_bearer(people, "bob"))  # read twice: whatever a read keeps is kept by now
        page_first = client.get(f"/proposals/{proposal.id}").text
        approved = client.post(f"{url}/approve", json={"comment": "fine", "sha": first["head_sha"]},
                               headers=_bearer(people, "bob"))
        after_approval = client.get(url, headers=_bearer(people, "bob")).json()
        page_after_approval = client.get(f"/proposals/{proposal.id}").text

        new_head = (clone.edit("stacks/app-staging/orders.tf", '"orders-staging"', '"orders-v2-staging"')
                    .push("rename the queue"))
        pushed = client.get(url, headers=_bearer(people, "bob")).json()
        sync_proposal(workspace, proposal.id)  # what the plan job does: a read never re-plans
        replanned = client.get(url, headers=_bearer(people, "bob")).json()
        page_replanned = client.get(f"/proposals/{proposal.id}").text

    assert first["decisions"] == [] and approved.status_code == 200
    assert [(d["by"], d["decision"], d["current"]) for d in after_approval["decisions"]] == [("bob", "approve", True)]
    assert "bob" not in page_first and "bob" in page_after_approval
    assert pushed["pending"] == [f"new commit {new_head[:12]} on orders"]
    assert pushed["plans"][0]["digest"] == first["plans"][0]["digest"]  # the read told, it did not re-plan
    assert replanned["pending"] == [] and replanned["head_sha"] == new_head
    assert replanned["plans"][0]["digest"] != first["plans"][0]["digest"]
    assert "orders-v2-staging" in _preview_text(replanned) and "orders-v2-staging" not in _preview_text(first)
    assert [(d["by"], d["current"]) for d in replanned["decisions"]] == [("bob", False)]  # stale, still listed
    assert "orders-v2-staging" in page_replanned


def _every_row(workspace: Workspace) -> dict[str, list[tuple[Any, ...]]]:
    with workspace.store.db.transaction(readonly=True) as conn:
        return {table.name: sorted(map(tuple, conn.execute(select(table))), key=repr)
                for table in metadata.sorted_tables}


def test_reads_write_nothing_however_often_they_repeat(workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    reads = [f"/api/v1/proposals/{proposal.id}", f"/proposals/{proposal.id}", f"/proposals/{proposal.id}/diff",
             f"/api/v1/proposals/{proposal.id}/preview", "/api/v1/proposals", "/"]
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["bob"])
        client.get(reads[0], headers=_bearer(people, "bob"))  # a token's first use of the minute is noted
        before = _every_row(workspace)
        statuses = [client.get(path, headers=_bearer(people, "bob")).status_code for _ in range(3) for path in reads]
        after = _every_row(workspace)
    assert set(statuses) == {200}
    assert after == before


def test_a_secret_in_a_stored_preview_is_scrubbed_from_every_read(workspace: Workspace, people: People,
                                                                   clone: Clone) -> None:
    password = str(stack_secrets(workspace.settings, "data")["db_password"])
    leaky = QUEUE.replace('"orders-staging"', f'"orders-{password}"')  # a literal: past the masking by origin
    clone.branch("leaky").write("stacks/app-staging/orders.tf", leaky).push("a queue")
    proposal = open_proposal(workspace, people.alice, "leaky", f"named after {password}")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["bob"])
        documents = [client.get(f"/api/v1/proposals/{proposal.id}", headers=_bearer(people, "bob")) for _ in range(2)]
        page = client.get(f"/proposals/{proposal.id}")
    view = view_proposal(workspace, people.bob, proposal.id)
    assert password in view.public_json()  # what the stored preview and the reason hold, before the scrubber
    for response in documents:
        assert password not in response.text and response.json()["reason"] == f"named after {REDACTED}"
        assert f"orders-{REDACTED}" in _preview_text(response.json())
    assert password not in page.text
    # scrubbing the document in pieces (previews kept by content) gives exactly what scrubbing it whole gives
    for scrubber in (workspace.scrubber, Scrubber([password, "orders", "aws_sqs_queue"]), Scrubber(['{"a": 1}']),
                     Scrubber()):
        assert view.public_body(scrubber) == scrubber.scrub(view.public_json()).encode()
