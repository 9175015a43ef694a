"""Credentials with a lifecycle: disable, enable, rotate, revoke, change access, expiry, last use; every change
by an admin and in the trail; the last admin stays; a disabled approver's approval stops counting at apply."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.adapters.store.rows import now
from gateway.api.app import create_app
from gateway.domain.errors import AuthError, Refused
from gateway.domain.proposal import Decision
from gateway.services.admin.users import (
    authenticate,
    disable_principal,
    enable_principal,
)
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, run_cli, sign_in_client


def test_an_expired_token_is_refused_and_last_use_is_listed(workspace: Workspace, people: People) -> None:
    with workspace.store.session() as session:
        session.principals.set_token_expiry(people.dana.id, now() - timedelta(minutes=1))
    with pytest.raises(AuthError, match="expired"):
        authenticate(workspace, people.tokens["dana"])
    listed = run_cli(["users", "list"], workspace.settings.home, token=people.tokens["admin"])
    admin_line = next(line for line in listed.stdout.splitlines() if line.startswith("admin "))
    assert "enabled" in admin_line and "last used 20" in admin_line  # this very call


def test_only_auditors_and_admins_list_users_as_the_trail_records_them(workspace: Workspace, people: People) -> None:
    for name in ("carol", "alice", "infra-agent"):
        refused = run_cli(["users", "list"], workspace.settings.home, token=people.tokens[name])
        assert refused.returncode == 1 and refused.stdout == "", refused
        assert refused.stderr.strip() == \
            f"refused: {name} is not an auditor; the audit trail is for auditors and admins"
    listed = run_cli(["users", "list"], workspace.settings.home, token=people.tokens["dana"])  # an auditor
    assert listed.returncode == 0, listed.stderr
    carol = next(line for line in listed.stdout.splitlines() if line.startswith("carol "))
    assert "approver" in carol and "platform" in carol and "token expires 20" in carol


def test_a_disabled_approvers_approval_stops_counting_at_apply(workspace: Workspace, people: People,
                                                               clone: Clone, tmp_path: Path) -> None:
    clone.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(workspace, people.alice, "tags", "cost centre moved")
    decide(workspace, people.bob, proposal.id, Decision.APPROVE, "ok")
    disable_principal(workspace, people.admin, "bob", "left the company")
    with pytest.raises(Refused, match=r"needs 1 approval\(s\).*has 0"):
        apply_proposal(workspace, people.alice, proposal.id)
    enable_principal(workspace, people.admin, "bob", "back")
    assert apply_proposal(workspace, people.alice, proposal.id).succeeded


def test_a_disabled_persons_page_session_ends_at_once(workspace: Workspace, people: People) -> None:
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["bob"])
        assert client.get("/", follow_redirects=False).status_code == 200
        disable_principal(workspace, people.admin, "bob", "left the company")
        ended = client.get("/", follow_redirects=False)
        assert ended.status_code == 303 and ended.headers["location"] == "/login"
