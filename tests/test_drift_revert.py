"""Reverting drift, as it is true when said: an automatic revert is applied by the command on the embedded default
and said to be queued elsewhere; an open revert covers the drift it was planned against, and drift found after it
makes it stale (planned again, approved again where the new drift needs a person)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.domain.errors import Refused
from gateway.domain.jobs import JobStatus
from gateway.domain.proposal import Decision
from gateway.services.change.jobs import run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.drift import revert_drift
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, run_cli


def opt_in(clone: Clone, stack: str) -> str:
    """Main's gateway.yaml lets the gateway revert in-place drift of `stack` alone."""
    yaml = clone.read("gateway.yaml").replace(f"    path: stacks/{stack}\n",
                                             f"    path: stacks/{stack}\n    drift: {{auto_revert: true}}\n")
    return clone.write("gateway.yaml", yaml).push(f"revert drift alone on {stack}", author="admin")


def rename_in_console(ws: Workspace, stack: str = "app-staging", address: str = "aws_instance.web[0]") -> None:
    ws.simulator.edit_object(stack, address, {"tags": {"Name": "renamed-in-console"}})


def test_an_automatic_revert_is_applied_by_the_command_on_the_embedded_default(workspace: Workspace,
                                                                               people: People, clone: Clone) -> None:
    opt_in(clone, "app-staging")
    rename_in_console(workspace)
    reverted = run_cli(["drift", "revert", "--stack", "app-staging"], workspace.settings.home,
                       token=people.tokens["admin"])
    assert reverted.returncode == 0, reverted.stderr
    assert reverted.stdout.strip() == "app-staging: drift reverted automatically by proposal 1 (job 1)"
    assert get_proposal(workspace, 1).status.value == "applied"  # true when said: the console edit is undone
    assert workspace.store.queue.get(1).status == JobStatus.SUCCEEDED
    again = run_cli(["drift", "revert", "--stack", "app-staging"], workspace.settings.home,
                    token=people.tokens["admin"])
    assert again.stdout.strip() == "app-staging: no drift to revert"


@pytest.mark.postgres
def test_an_automatic_revert_is_said_to_be_queued_where_workers_run_jobs(postgres_url: str, tmp_path: Path) -> None:
    from .conftest import make_workspace

    ws = make_workspace(tmp_path / "home", postgres_url)
    try:
        people = add_people(ws)
        opt_in(Clone(ws, tmp_path / "clone"), "app-staging")
        rename_in_console(ws)
        said = run_cli(["drift", "revert", "--stack", "app-staging"], ws.settings.home,
                       token=people.tokens["admin"], database_url=postgres_url)
        assert said.returncode == 0, said.stderr
        assert said.stdout.strip() == (
            "app-staging: proposal 1 reverts the drift without approval (gateway.yaml sets drift.auto_revert): its "
            "apply is queued as job 1 for a worker; `gateway job 1 --wait` follows it")
        assert ws.store.queue.get(1).status == JobStatus.QUEUED and get_proposal(ws, 1).status.value == "open"
    finally:
        ws.close()


def test_drift_found_after_an_automatic_revert_was_planned_makes_it_stale(workspace: Workspace, people: People,
                                                                         clone: Clone) -> None:
    ws = workspace
    opt_in(clone, "app-prod")
    rename_in_console(ws, "app-prod")
    first = revert_drift(ws, people.admin, "app-prod")
    assert first.automatic and first.proposal is not None and first.job is not None  # queued, not yet run
    same = revert_drift(ws, people.admin, "app-prod")
    assert same.already and not same.replanned and same.automatic and same.job == first.job
    assert get_proposal(ws, first.proposal.id).current_digests == first.proposal.current_digests

    ws.simulator.edit_object("app-prod", "aws_lb.web", {"tags": {"owner": "someone"}})  # protected
    later = revert_drift(ws, people.admin, "app-prod")
    assert later.proposal is not None and later.proposal.id == first.proposal.id
    assert later.replanned and not later.automatic
    assert any("changes protected aws_lb.web" in r for r in later.reasons), later.reasons
    plan = get_proposal(ws, first.proposal.id).plans["app-prod"]
    assert {"aws_lb.web", "aws_instance.web[0]"} <= set(plan.drift)
    done = run_now_or_follow(ws, first.job, "test", lambda _: None)  # the apply queued for the older plan
    assert done.status == JobStatus.REFUSED and "needs" in (done.error or "")
    decide(ws, people.bob, first.proposal.id, Decision.APPROVE, "the lb tag goes back too")
    assert apply_proposal(ws, people.alice, first.proposal.id).succeeded
    assert revert_drift(ws, people.admin, "app-prod").reasons == ["no drift to revert"]


# `ws` is the sample repo in memory (conftest's, over tests/fakes.py's sandbox_workspace): a revert that needs a
# person queues nothing, so its rules run with no job queue; an automatic revert's job runs on a real workspace.


def test_drift_found_after_an_approved_revert_makes_its_approval_stale(ws: Workspace, team: People) -> None:
    rename_in_console(ws, "data", "aws_db_instance.orders")
    first = revert_drift(ws, team.admin, "data")
    assert first.proposal is not None and not first.automatic
    decide(ws, team.bob, first.proposal.id, Decision.APPROVE, "put the tag back")
    ws.simulator.edit_object("data", "aws_db_instance.orders", {"tags": {"owner": "someone-else"}})
    later = revert_drift(ws, team.admin, "data")
    assert later.replanned and later.proposal is not None and later.proposal.id == first.proposal.id
    assert later.proposal.current_approvals == [] and len(later.proposal.stale_decisions) == 1
    with pytest.raises(Refused, match="needs 1 approval"):
        apply_proposal(ws, team.admin, first.proposal.id)
    with ws.store.session(readonly=True) as session:
        kinds = [e.kind for e in session.audit.events(proposal_id=first.proposal.id)]
    assert kinds.count("drift.found") == 2 and "decisions.stale" in kinds
    with ws.store.session(readonly=True) as session:
        assert session.jobs.of_proposal(first.proposal.id) == []  # nothing queued: it needs a person


def test_the_command_says_an_open_revert_already_reverts_the_drift_or_was_planned_again(
        workspace: Workspace, people: People, clone: Clone) -> None:
    ws = workspace
    opt_in(clone, "app-prod")
    home, token = ws.settings.home, people.tokens["admin"]
    ws.simulator.edit_object("app-prod", "aws_lb.web", {"tags": {"owner": "someone"}})
    opened = run_cli(["drift", "revert", "--stack", "app-prod"], home, token=token)
    assert opened.stdout.startswith("app-prod: proposal 1 reverts the drift and needs approval: ")
    again = run_cli(["drift", "revert", "--stack", "app-prod"], home, token=token)
    assert again.stdout.startswith("app-prod: proposal 1 already reverts the drift and needs approval: ")
    rename_in_console(ws, "app-prod")
    replanned = run_cli(["drift", "revert", "--stack", "app-prod"], home, token=token)
    assert replanned.stdout.startswith(
        "app-prod: proposal 1 was planned before this drift; planned again, it reverts the drift and needs approval")
    assert [j.kind for j in ws.store.queue.of_proposal(1)] == []
