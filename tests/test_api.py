"""The HTTP API: the real app over a real database, bearer tokens, and errors mapped to statuses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace
from .model_stub import ModelStub, tool_call

QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for_job(client: TestClient, job_id: int, token: str, timeout: float = 60) -> dict:
    """Poll a job as a client would until the app's in-process worker finishes it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(token)).json()
        if job["finished"]:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


@pytest.fixture
def client(workspace: Workspace) -> Iterator[TestClient]:
    with TestClient(create_app(workspace.settings)) as test_client:
        yield test_client


@pytest.fixture
def proposal_id(workspace: Workspace, people: People, clone: Clone, client: TestClient) -> int:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    from gateway.services.change.proposals import open_proposal

    return open_proposal(workspace, people.alice, "bigger", "more memory").id


def test_health_and_openapi(client: TestClient) -> None:
    assert client.get("/api/v1/health").json() == {"status": "ok", "database": "sqlite", "engine": "sandbox"}
    spec = client.get("/openapi.json").json()
    assert "/api/v1/proposals/{proposal_id}/approve" in spec["paths"]
    assert "bearer" in str(spec["components"]["securitySchemes"]).lower()


def test_missing_or_wrong_token_is_401(client: TestClient, people: People) -> None:
    assert client.get("/api/v1/proposals").status_code == 401
    response = client.get("/api/v1/proposals", headers=bearer("gw_nope"))
    assert response.status_code == 401 and response.json()["detail"] == "the token is not valid"


def test_the_change_path_over_http(client: TestClient, people: People, proposal_id: int) -> None:
    t = people.tokens
    listed = client.get("/api/v1/proposals", headers=bearer(t["alice"])).json()
    assert [p["id"] for p in listed] == [proposal_id]
    shown = client.get(f"/api/v1/proposals/{proposal_id}", headers=bearer(t["bob"])).json()
    assert shown["plans"][0]["counts"] == {"update": 1} and shown["required_approvals"] == 1
    own = client.post(f"/api/v1/proposals/{proposal_id}/approve", json={}, headers=bearer(t["alice"]))
    assert own.status_code == 403
    assert "alice requested this change and cannot approve or reject it" in own.json()["reasons"]
    auditor = client.post(f"/api/v1/proposals/{proposal_id}/approve", json={}, headers=bearer(t["dana"]))
    assert auditor.status_code == 403 and "dana does not have the approver role" in auditor.json()["reasons"]
    ok = client.post(f"/api/v1/proposals/{proposal_id}/approve", json={"comment": "fine", "sha": shown["head_sha"]},
                     headers=bearer(t["bob"]))
    assert ok.status_code == 200 and ok.json()["decisions"][0]["current"] is True
    queued = client.post(f"/api/v1/proposals/{proposal_id}/apply", headers=bearer(t["alice"]))
    assert queued.status_code == 202 and queued.json()["kind"] == "apply"
    applied = wait_for_job(client, queued.json()["id"], t["alice"])
    assert applied["status"] == "succeeded" and applied["result"]["merge_sha"], applied
    preview = client.get(f"/api/v1/proposals/{proposal_id}/preview?format=markdown", headers=bearer(t["bob"]))
    assert "instance_type" in preview.text
    assert "t3.medium" in client.get(f"/api/v1/proposals/{proposal_id}/diff", headers=bearer(t["bob"])).text


def test_unknown_proposal_is_404_and_bad_bodies_are_422(client: TestClient, people: People, proposal_id: int) -> None:
    t = people.tokens
    assert client.get("/api/v1/proposals/999", headers=bearer(t["bob"])).status_code == 404
    assert client.post("/api/v1/proposals/999/approve", json={}, headers=bearer(t["bob"])).status_code == 404
    assert client.post(f"/api/v1/proposals/{proposal_id}/reject", json={}, headers=bearer(t["bob"])).status_code == 422
    assert client.post(f"/api/v1/proposals/{proposal_id}/approve", json={"sha": "xyz"},
                       headers=bearer(t["bob"])).status_code == 422
    assert client.post(f"/api/v1/proposals/{proposal_id}/approve", content=b"{not json",
                       headers={**bearer(t["bob"]), "Content-Type": "application/json"}).status_code == 422
    assert client.get("/api/v1/proposals/abc", headers=bearer(t["bob"])).status_code == 422
    assert client.get("/api/v1/audit/events?since=yesterday", headers=bearer(t["dana"])).status_code == 422


def test_audit_over_http(client: TestClient, people: People, proposal_id: int) -> None:
    t = people.tokens
    assert client.get("/api/v1/audit/events", headers=bearer(t["bob"])).status_code == 403
    events = client.get("/api/v1/audit/events", params={"address": "aws_instance.web[0]"}, headers=bearer(t["dana"])).json()
    assert {e["kind"] for e in events} >= {"proposal.opened", "plan"}
    assert {e["proposal_id"] for e in events} == {proposal_id, None}  # the change, and the bootstrap that created it
    assert all(e["proposal_id"] == proposal_id or "aws_instance.web[0]" in str(e["payload"]) for e in events)
    csv = client.get("/api/v1/audit/export", params={"format": "csv", "proposal": proposal_id}, headers=bearer(t["dana"]))
    assert csv.headers["content-type"].startswith("text/csv") and "proposal.opened" in csv.text
    assert client.get("/api/v1/audit/verify", headers=bearer(t["dana"])).json()["intact"] is True


def test_a_request_to_the_agent_and_its_progress(client: TestClient, workspace: Workspace, people: People) -> None:
    with ModelStub([tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                    tool_call("run_preview", stack="app-staging"),
                    tool_call("finish", summary="Added the refunds queue.")]) as stub:
        workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub-model"
        created = client.post("/api/v1/requests", json={"text": "Add a refunds queue"}, headers=bearer(people.tokens["alice"]))
        assert created.status_code == 202
        run = created.json()
        deadline = time.monotonic() + 60
        while not run["finished"] and time.monotonic() < deadline:
            time.sleep(0.2)
            run = client.get(f"/api/v1/requests/{run['id']}", headers=bearer(people.tokens["alice"])).json()
    assert run["status"] == "done", run
    assert any("write_file" in step for step in run["progress"])
    proposal = client.get(f"/api/v1/proposals/{run['proposal_id']}", headers=bearer(people.tokens["bob"])).json()
    assert proposal["proposer"] == "gateway-agent" and proposal["requester"] == "alice"
    other = client.get(f"/api/v1/requests/{run['id']}", headers=bearer(people.tokens["bob"]))
    assert other.status_code == 404  # someone else's request is not yours to follow


def test_no_model_configured_is_503_with_the_settings_named(client: TestClient, people: People) -> None:
    response = client.post("/api/v1/requests", json={"text": "x"}, headers=bearer(people.tokens["alice"]))
    assert response.status_code == 503 and "OPENAI_BASE_URL" in response.json()["detail"]


def test_the_api_runs_on_postgresql_too(tmp_path: Path, postgres_url: str) -> None:
    ws = make_workspace(tmp_path / "home", postgres_url)
    people = add_people(ws)
    Clone(ws, tmp_path / "clone").branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    with TestClient(create_app(ws.settings)) as client:
        assert client.get("/api/v1/health").json()["database"] == "postgresql"
        from gateway.services.change.proposals import open_proposal

        pid = open_proposal(ws, people.alice, "bigger", "x").id
        assert client.post(f"/api/v1/proposals/{pid}/approve", json={}, headers=bearer(people.tokens["bob"])).status_code == 200
        queued = client.post(f"/api/v1/proposals/{pid}/apply", headers=bearer(people.tokens["alice"])).json()
        assert wait_for_job(client, queued["id"], people.tokens["alice"])["status"] == "succeeded"
    ws.close()


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999999"]  # Python's json reads all four; JSON allows none


def _json_body_routes(client: TestClient) -> list[tuple[str, list[str]]]:
    """Every route that takes a JSON body, and the top-level fields of that body, from the app's own OpenAPI."""
    spec = client.app.openapi()  # type: ignore[attr-defined]
    found = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                name = content["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
                found.append((f"{method.upper()} {path}", sorted(spec["components"]["schemas"][name]["properties"])))
    return found


@pytest.mark.parametrize("number", NON_FINITE)
def test_a_number_json_does_not_allow_is_a_readable_422_on_every_route_with_a_body(
        workspace: Workspace, people: People, proposal_id: int, number: str) -> None:
    routes = _json_body_routes(TestClient(create_app(workspace.settings, workers=0)))
    assert len(routes) >= 4 and "POST /api/v1/proposals/{proposal_id}/approve" in dict(routes)
    headers = {**bearer(people.tokens["bob"]), "Content-Type": "application/json"}
    with TestClient(create_app(workspace.settings, workers=0), raise_server_exceptions=False) as client:
        bodies = [("POST /api/v1/proposals/{proposal_id}/approve",
                   f'{{"comment": "x", "digests": {{"app-staging": {number}}}}}', "digests")]
        bodies += [(route, f'{{"{field}": {number}}}', field) for route, fields in routes for field in fields]
        for route, body, field in bodies:
            method, path = route.split(" ", 1)
            answer = client.request(method, path.replace("{proposal_id}", str(proposal_id)), content=body,
                                    headers=headers)
            assert answer.status_code == 422, (route, body, answer.status_code, answer.text[:300])
            said = answer.json()
            assert said["error"] == "InputError" and field in said["detail"], (route, body, said)
            assert "Traceback" not in answer.text
    from gateway.services.change.proposals import get_proposal

    assert get_proposal(workspace, proposal_id).decisions == []  # nothing was decided
