"""Schemathesis against the served OpenAPI document: no 500s, no responses that break the schema.

Driven from hypothesis directly (one test, every operation) rather than through schemathesis'
pytest plugin, which does not load under the pytest this project pins.
"""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings

from gateway.api.app import create_app
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace
from .model_stub import ModelStub

EXAMPLES_PER_OPERATION = 25


def test_no_server_errors_and_responses_match_the_schema(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "home")
    people = add_people(ws)
    Clone(ws, tmp_path / "clone").branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    from gateway.services.change.proposals import open_proposal

    open_proposal(ws, people.alice, "bigger", "more memory")
    with ModelStub() as stub:  # a model that answers in words and changes nothing
        ws.settings.openai_base_url, ws.settings.model = stub.base_url, "stub-model"
        _fuzz(ws, people)
    ws.close()


def _fuzz(ws: Workspace, people: People) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ws.settings))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    exercised = []
    for operation in operations:
        who = "dana" if operation.path.startswith("/api/v1/audit") else "bob"
        _check_operation(operation, people.tokens[who])
        exercised.append(f"{operation.method.upper()} {operation.path}")
    assert "POST /api/v1/proposals/{proposal_id}/approve" in exercised


def _check_operation(operation: schemathesis.APIOperation, token: str) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, derandomize=True)  # the same examples on every run: CI must not flake
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"})

    check()
