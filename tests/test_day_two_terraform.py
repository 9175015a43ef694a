"""Day two on the Terraform engine (a real Terraform 1.0.3 and the test provider, whose objects are JSON files):
drift found and recorded, codified by the gateway, proven by a plan with no changes, and the record closed.
A rollback of an applied change ends with the objects as they were. Skipped, saying why, only where
`make terraform` has not run. Import blocks do not exist in Terraform 1.0.3: the import command says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.domain.errors import InputError
from gateway.domain.proposal import Decision
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift_records import check_drift, list_drift_records
from gateway.services.day_two.rollback import rollback_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, add_people


def edit_behind_terraforms_back(ws: Workspace, name: str, **changes: str) -> None:
    [path] = [p for p in (ws.settings.home / "sim-objects").glob("*.json") if json.loads(p.read_text())["name"] == name]
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_drift_recorded_codified_and_closed_on_terraform(tf_workspace: Workspace) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    assert check_drift(ws, people.admin, "files").outcome == "clean"
    edit_behind_terraforms_back(ws, "app-config", content="replicas=5")
    check = check_drift(ws, people.admin, "files")
    assert check.outcome == "opened" and check.record is not None
    [entry] = check.record.resources
    assert entry.address == "sim_object.config"
    assert [(a.path, a.before, a.after) for a in entry.attributes] == [("content", '"replicas=2"', '"replicas=5"')]
    proposal = codify_drift(ws, people.alice, "files")
    assert not proposal.plans["files"].has_changes
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "keep the incident's setting")
    assert apply_proposal(ws, people.alice, proposal.id).succeeded
    [closed] = list_drift_records(ws, people.bob)
    assert closed.status.value == "closed" and closed.closed_by_proposal == proposal.id
    assert check_drift(ws, people.admin, "files").outcome == "clean"


def test_import_is_refused_on_terraform_1_0(tf_workspace: Workspace) -> None:
    from gateway.services.day_two.imports import import_resource

    people = add_people(tf_workspace)
    with pytest.raises(InputError, match="Terraform 1.0.3 has no import blocks"):
        import_resource(tf_workspace, people.alice, "files", "sim_object.extra", "some-id")


def objects(ws: Workspace) -> dict[str, dict]:
    return {o["name"]: o for o in (json.loads(p.read_text()) for p in (ws.settings.home / "sim-objects").glob("*.json"))}


def test_a_rollback_on_terraform_ends_with_the_objects_as_before(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    before = objects(ws)
    Clone(ws, tmp_path / "clone").branch("more").edit("stacks/files/main.tf", "replicas=2", "replicas=3").push()
    change = open_proposal(ws, people.alice, "more", "three replicas")
    decide(ws, people.bob, change.id, Decision.APPROVE, "ok")
    assert apply_proposal(ws, people.alice, change.id).succeeded
    assert objects(ws)["app-config"]["content"] == "replicas=3"
    rollback = rollback_proposal(ws, people.alice, change.id, "three was too many")
    assert rollback.plans["files"].counts == {"update": 1}
    decide(ws, people.bob, rollback.id, Decision.APPROVE, "back to two")
    assert apply_proposal(ws, people.alice, rollback.id).succeeded
    assert objects(ws) == before
