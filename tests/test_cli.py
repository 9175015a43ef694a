"""The `gateway` command as a person runs it: a subprocess, real files, real exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import FIXTURES, Clone, People, run_cli

PLAN = FIXTURES / "tfplan/tf-plan-format_sensitive.tfplan.json"


def audit_count(ws: Workspace) -> int:
    with ws.store.session() as session:
        return len(session.audit.events())


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_preview_renders_a_plan_file(tmp_path: Path, fmt: str) -> None:
    result = run_cli(["preview", str(PLAN), "--format", fmt], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "random_bytes.test" in result.stdout
    assert "(sensitive)" in result.stdout


@pytest.mark.parametrize("content,message", [
    (None, "cannot read"),
    ("{not json", "plan is not valid JSON"),
    ('{"format_version": "3.0"}', "format_version 3.0 is not supported"),
])
def test_preview_of_a_bad_file_is_one_clear_line(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = run_cli(["preview", str(path)], tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_init_then_plan_a_stack(tmp_path: Path) -> None:
    home = tmp_path / "home"
    init = run_cli(["init"], home)
    assert init.returncode == 0, init.stderr
    assert "simulated cloud" in init.stdout
    token = run_cli(["users", "add", "root", "--role", "admin"], home).stdout.strip()
    plan = run_cli(["plan", "--stack", "network"], home, token=token)
    assert plan.returncode == 0, plan.stderr
    assert "No changes" in plan.stdout
    assert run_cli(["plan", "--stack", "network"], home).returncode == 1  # no token, no plan
    again = run_cli(["init"], home)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_plan_of_an_unknown_stack_or_ref(workspace: Workspace, people: People) -> None:
    home, token = workspace.settings.home, people.tokens["bob"]
    result = run_cli(["plan", "--stack", "nope"], home, token=token)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: unknown stack 'nope' (stacks: app-prod, app-staging, data, network, platform)"
    result = run_cli(["plan", "--stack", "network", "--ref", "no-such-branch"], home, token=token)
    assert result.stderr.strip() == "error: unknown git ref 'no-such-branch' in the declaration repo"


def test_missing_workspace_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli(["plan", "--stack", "network"], tmp_path / "nowhere")
    assert result.returncode == 1
    assert "no gateway workspace" in result.stderr and "gateway init" in result.stderr


def test_missing_and_wrong_tokens_are_refused_with_nothing_written(workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    before = audit_count(workspace)
    home = workspace.settings.home
    missing = run_cli(["propose", "--branch", "bigger", "-m", "x"], home)
    assert missing.returncode == 1 and "no token: set GATEWAY_TOKEN" in missing.stderr
    wrong = run_cli(["propose", "--branch", "bigger", "-m", "x"], home, token="gw_forged")
    assert wrong.returncode == 1 and "the token is not valid" in wrong.stderr
    assert audit_count(workspace) == before


def test_unknown_proposal_and_malformed_hcl(workspace: Workspace, people: People, clone: Clone) -> None:
    home = workspace.settings.home
    before = audit_count(workspace)
    unknown = run_cli(["approve", "42"], home, token=people.tokens["bob"])
    assert unknown.returncode == 1 and unknown.stderr.strip() == "error: no proposal 42"
    clone.branch("broken").write("stacks/app-staging/broken.tf", 'resource "aws_s3_bucket" "b" {\n  bucket = \n}\n').push()
    broken = run_cli(["propose", "--branch", "broken", "-m", "x"], home, token=people.tokens["alice"])
    assert broken.returncode == 1
    assert broken.stderr.strip() == "error: app-staging/broken.tf:2:12: malformed HCL near 'bucket ='"
    assert len(broken.stderr.strip().splitlines()) == 1
    assert audit_count(workspace) == before
    with workspace.store.session() as session:
        assert session.proposals.list() == []


def test_the_whole_path_through_the_command(workspace: Workspace, people: People, clone: Clone) -> None:
    home = workspace.settings.home
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposed = run_cli(["propose", "--branch", "bigger", "-m", "more memory"], home, token=people.tokens["alice"])
    assert proposed.returncode == 0, proposed.stderr
    assert 'instance_type: "t3.small" -> "t3.medium"' in proposed.stdout
    own = run_cli(["approve", "1"], home, token=people.tokens["alice"])
    assert own.returncode == 1
    assert "refused: alice requested this change and cannot approve or reject it" in own.stderr
    approved = run_cli(["approve", "1", "-m", "ok"], home, token=people.tokens["bob"])
    assert approved.returncode == 0 and "ready to apply" in approved.stdout
    shown = run_cli(["show", "1", "--format", "json"], home, token=people.tokens["dana"])
    assert json.loads(shown.stdout)["decisions"][0]["current"] is True
    applied = run_cli(["apply", "1"], home, token=people.tokens["alice"])
    assert applied.returncode == 0, applied.stderr
    assert "merged into main" in applied.stdout
    after = run_cli(["show", "1"], home, token=people.tokens["dana"])
    assert "status: applied, merged as" in after.stdout and "ready to apply" not in after.stdout
    story = run_cli(["audit", "show", "1"], home, token=people.tokens["dana"])
    assert "approval" in story.stdout and "merged" in story.stdout
    verify = run_cli(["audit", "verify"], home, token=people.tokens["dana"])
    assert verify.returncode == 0 and "chain verified" in verify.stdout
    export = run_cli(["audit", "export", "--format", "csv"], home, token=people.tokens["dana"])
    assert export.stdout.startswith("seq,id,at,actor")


def test_verify_exits_1_naming_the_broken_event(workspace: Workspace, people: People) -> None:
    from sqlalchemy import update

    from gateway.adapters.store.schema import audit_events

    with workspace.store.session() as session:
        session.conn.execute(update(audit_events).where(audit_events.c.seq == 3).values(actor="mallory"))
    result = run_cli(["audit", "verify"], workspace.settings.home, token=people.tokens["dana"])
    assert result.returncode == 1
    assert "audit trail BROKEN at event 3" in result.stderr


def test_first_user_needs_no_token_later_ones_need_an_admin(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run_cli(["init"], home).returncode == 0
    first = run_cli(["users", "add", "root", "--role", "admin"], home)
    assert first.returncode == 0 and first.stdout.strip().startswith("gw_")
    second = run_cli(["users", "add", "eve", "--role", "approver"], home)
    assert second.returncode == 1 and "admin's token" in second.stderr
    agent = run_cli(["users", "add", "bot", "--role", "approver", "--agent"], home, token=first.stdout.strip())
    assert agent.returncode == 1 and "an agent cannot hold the approver role" in agent.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed")
def test_demo_runs_the_whole_path() -> None:
    result = run_cli(["demo"], Path("/nonexistent-home-not-used"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused: alice requested this change and cannot approve or reject it" in result.stdout
    assert "STALE" in result.stdout
    assert "merged into main" in result.stdout
    assert "audit trail intact" in result.stdout


def test_simulator_controls_are_for_admins(workspace: Workspace, people: People) -> None:
    home = workspace.settings.home
    refused = run_cli(["sandbox", "edit", "--stack", "network", "aws_vpc.main", "enable_dns_hostnames=false"], home,
                      token=people.tokens["alice"])
    assert refused.returncode == 1 and "alice is not an admin" in refused.stderr
    edited = run_cli(["sandbox", "edit", "--stack", "network", "aws_vpc.main", "enable_dns_hostnames=false"], home,
                     token=people.tokens["admin"])
    assert edited.returncode == 0, edited.stderr
    plan = run_cli(["plan", "--stack", "network"], home, token=people.tokens["bob"])
    assert "aws_vpc.main: changed outside the gateway; this apply would revert it" in plan.stdout


def test_one_list_for_the_command_and_the_api_waiting_for_you_first(workspace: Workspace, people: People,
                                                                    clone: Clone) -> None:
    clone.branch("staging").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    staging = open_proposal(workspace, people.alice, "staging", "cost centre moved")
    clone.branch("data").edit("stacks/data/main.tf", '"16.3"', '"17.2"').push()
    data = open_proposal(workspace, people.alice, "data", "PostgreSQL 17")
    listed = run_cli(["list"], workspace.settings.home, token=people.tokens["erin"])  # erin approves data only
    lines = [line for line in listed.stdout.splitlines() if not line.startswith(" " * 8)]
    assert lines[0].startswith(f"*{data.id:>4}") and lines[1].startswith(f" {staging.id:>4}")
    assert "blocked: needs 1 approval(s)" in listed.stdout
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        rows = client.get("/api/v1/proposals", headers={"Authorization": f"Bearer {people.tokens['erin']}"}).json()
    assert [(r["id"], r["waiting_for_you"]) for r in rows] == [(data.id, True), (staging.id, False)]
    assert rows[0]["risk"] and rows[0]["created_at"].endswith(("Z", "+00:00"))  # a time with its zone


def schema_versions(ws: Workspace) -> set[int]:
    from sqlalchemy import select

    from gateway.adapters.store.schema import schema_version

    with ws.store.session(readonly=True) as session:
        return set(session.conn.scalars(select(schema_version.c.version)))


def test_a_read_of_a_database_behind_the_gateway_says_so_and_migrates_nothing(workspace: Workspace,
                                                                             people: People) -> None:
    home, token = workspace.settings.home, people.tokens["dana"]
    with workspace.store.session() as session:  # as if this gateway were newer than the database's schema
        session.conn.exec_driver_sql("DELETE FROM schema_version WHERE version = 20")
    for read in (["list"], ["show", "1"], ["audit", "verify"], ["notifications"]):
        refused = run_cli(read, home, token=token)
        assert refused.returncode == 1, read
        assert refused.stderr.strip() == ("error: the database is behind this gateway: migration(s) 20 not run, and "
                                          "a read changes nothing; run `gateway migrate` (or any command that "
                                          "changes something)")
    assert 20 not in schema_versions(workspace)  # no read ran it
    migrated = run_cli(["migrate"], home)
    assert migrated.returncode == 0 and migrated.stdout.strip() == "ran migration(s) 20"
    assert 20 in schema_versions(workspace)
    assert run_cli(["migrate"], home).stdout.strip() == "the database schema is current"
    listed = run_cli(["list"], home, token=token)
    assert listed.returncode == 0, listed.stderr


def test_a_read_does_not_wait_for_a_writer(workspace: Workspace, people: People, clone: Clone) -> None:
    """On SQLite a read takes no write lock: `gateway show` answers while another process holds one."""
    import sqlite3

    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "bigger staging instance")
    home, token = workspace.settings.home, people.tokens["dana"]
    assert run_cli(["list"], home, token=token).returncode == 0  # dana's first use is kept (a write, once a minute)
    writer = sqlite3.connect(workspace.settings.home / "gateway.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the write lock, held as a long apply's transaction would hold it
        shown = run_cli(["show", str(proposal.id)], home, token=token, timeout=30)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert shown.returncode == 0, shown.stderr
    assert f"proposal {proposal.id} [open] bigger" in shown.stdout
