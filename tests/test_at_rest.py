"""Secrets at rest: after a change that plans and applies a stack with a secret, neither the database file nor
anything else in the workspace (the secret store and the keys apart) holds the secret in clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters.sealing import Sealer
from gateway.domain.errors import BackendError
from gateway.domain.proposal import Decision
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People

KEPT_APART = ("secrets", "data.key", "audit-signing.key", "session.key")  # the secret store and the keys


def test_the_database_and_the_workspace_hold_no_secret_in_clear(workspace: Workspace, people: People,
                                                               clone: Clone) -> None:
    secret = str(stack_secrets(workspace.settings, "data")["db_password"]).encode()
    clone.branch("pg").edit("stacks/data/main.tf", '"16.3"', '"17.2"').push()
    proposal = open_proposal(workspace, people.alice, "pg", "PostgreSQL 17")
    decide(workspace, people.erin, proposal.id, Decision.APPROVE, "tested")
    assert apply_proposal(workspace, people.alice, proposal.id).succeeded
    with workspace.store.session(readonly=True) as session:  # the gateway itself still reads what it sealed
        assert secret.decode() in session.proposals.plan_document(proposal.plans["data"].plan_id)
    workspace.store.db.dispose()  # everything on disk, the WAL included
    home = workspace.settings.home
    leaks = [str(path.relative_to(home)) for path in sorted(home.rglob("*"))
             if path.is_file() and path.relative_to(home).parts[0] not in KEPT_APART and secret in path.read_bytes()]
    assert leaks == []
    assert oct((home / "data.key").stat().st_mode)[-3:] == "600"


def test_sealed_values_need_the_key(workspace: Workspace, tmp_path: Path) -> None:
    sealed = Sealer.from_key_file(workspace.settings.data_key_path).seal_text("hunter2")
    assert "hunter2" not in sealed
    with pytest.raises(BackendError, match="does not open with this data key"):
        Sealer.from_key_file(tmp_path / "other.key").open_text(sealed)
