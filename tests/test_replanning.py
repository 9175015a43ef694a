"""Re-planning by the workers: a proposal whose branch, main or state moved is planned again, once; one that cannot
be planned (its branch conflicts with main) is not planned again until its branch or main moves, and says why."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision
from gateway.services.change.breaker import open_breaker, reset_breaker
from gateway.services.change.jobs import enqueue_moved_proposals, run_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, run_cli, sign_in_client

STAGING = "stacks/app-staging/main.tf"


def housekeeping_pass(ws: Workspace) -> list[int]:
    """What a worker's housekeeping pass queues, each plan job then run to its end (as its loops would)."""
    queued = enqueue_moved_proposals(ws)
    for job_id in queued:
        claimed = ws.store.queue.claim("test-worker", job_id=job_id)
        assert claimed is not None
        run_job(ws, claimed, "test-worker")
    return queued


def job_events(ws: Workspace, proposal_id: int) -> list[str]:
    with ws.store.session(readonly=True) as session:
        return [e.kind for e in session.audit.events(proposal_id=proposal_id) if e.kind.startswith("job.")]


def conflicting_proposal(ws: Workspace, people: People, clone: Clone) -> int:
    """An open proposal whose branch no longer merges into main: another change of the same line was applied."""
    clone.branch("medium").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    clone.branch("large").edit(STAGING, '"t3.small"', '"t3.large"').push()
    first = open_proposal(ws, people.alice, "medium", "more memory").id
    second = open_proposal(ws, people.alice, "large", "much more memory").id
    decide(ws, people.bob, first, Decision.APPROVE, "ok")
    assert apply_proposal(ws, people.alice, first).succeeded
    return second


def test_a_proposal_that_conflicts_with_main_is_planned_once_per_move_of_its_branch_or_main(
        any_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "clone")
    conflicted = conflicting_proposal(ws, people, clone)

    passes = [housekeeping_pass(ws) for _ in range(5)]
    assert [len(p) for p in passes] == [1, 0, 0, 0, 0]  # it failed once; the same branch and main fail the same way
    [job] = ws.store.queue.of_proposal(conflicted)
    assert (job.kind, job.status) == (JobKind.PLAN, JobStatus.FAILED)
    assert "does not merge cleanly into main" in (job.error or "")
    assert job_events(ws, conflicted) == ["job.queued", "job.failed"]
    why = view_proposal(ws, people.dana, conflicted).cannot_plan
    assert why is not None and why.startswith("cannot be planned: the branch does not merge cleanly into main")
    assert f"plan job {job.id}" in why and f"gateway sync {conflicted}" in why

    clone.branch("network-note").write("stacks/network/note.tf", "# a note\n").push()  # main moves elsewhere
    other = open_proposal(ws, people.alice, "network-note", "a note").id
    decide(ws, people.bob, other, Decision.APPROVE, "ok")
    assert apply_proposal(ws, people.alice, other).succeeded
    assert [len(housekeeping_pass(ws)) for _ in range(3)] == [1, 0, 0]  # tried again on the new main, once
    assert job_events(ws, conflicted) == ["job.queued", "job.failed"] * 2

    clone.repo.git.fetch("-q", "origin")
    rebased = clone.branch("large").edit(STAGING, '"t3.medium"', '"t3.large"').push("rebased on main")
    assert [len(housekeeping_pass(ws)) for _ in range(2)] == [1, 0]  # the branch moved: planned, and it plans
    after = get_proposal(ws, conflicted)
    assert after.head_sha == rebased and ws.store.queue.of_proposal(conflicted)[-1].status == JobStatus.SUCCEEDED
    assert view_proposal(ws, people.dana, conflicted).cannot_plan is None


def test_why_a_proposal_cannot_be_planned_is_shown_by_the_command_the_api_and_the_page(
        workspace: Workspace, people: People, clone: Clone) -> None:
    ws = workspace
    conflicted = conflicting_proposal(ws, people, clone)
    housekeeping_pass(ws)

    shown = run_cli(["show", str(conflicted)], ws.settings.home, token=people.tokens["dana"])
    assert shown.returncode == 0, shown.stderr
    assert (f"note: proposal {conflicted} cannot be planned: the branch does not merge cleanly into main "
            f"(conflicts in {STAGING})") in shown.stdout
    as_json = run_cli(["show", str(conflicted), "--format", "json"], ws.settings.home, token=people.tokens["dana"])
    assert json.loads(as_json.stdout)["cannot_plan"].startswith("cannot be planned: the branch does not merge")

    with TestClient(create_app(ws.settings, workers=0)) as client:
        api = client.get(f"/api/v1/proposals/{conflicted}",
                         headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        assert api.status_code == 200 and "rebase it on main and push again" in api.json()["cannot_plan"]
        sign_in_client(client, people.tokens["dana"])
        page = client.get(f"/proposals/{conflicted}").text
    assert 'id="cannot-plan"' in page and "does not merge cleanly into main" in page

    sync = run_cli(["sync", str(conflicted)], ws.settings.home, token=people.tokens["alice"])
    assert sync.returncode == 1 and "does not merge cleanly into main" in sync.stderr  # a person may try again


def test_an_agents_change_its_open_breaker_refuses_is_tried_once_until_a_breaker_moves(
        workspace: Workspace, people: People, clone: Clone) -> None:
    clone.write("gateway.yaml", clone.read("gateway.yaml") + "\nbreaker:\n  resetters: [platform]\n")
    clone.push("a breaker", author="admin")
    clone.branch("agent-queue").write("stacks/app-staging/queue.tf", 'resource "aws_sqs_queue" "q" {}\n').push()
    agents = open_proposal(workspace, people.agent, "agent-queue", "a queue", requester=people.alice).id
    open_breaker(workspace, people.admin, None, "incident 7: agents off")
    moved = clone.write("stacks/app-staging/dlq.tf", 'resource "aws_sqs_queue" "dlq" {}\n').push("and a DLQ")

    assert [len(housekeeping_pass(workspace)) for _ in range(4)] == [1, 0, 0, 0]  # refused once, not every pass
    [job] = workspace.store.queue.of_proposal(agents)[-1:]
    assert job.status == JobStatus.REFUSED and "incident 7: agents off" in (job.error or "")
    with workspace.store.session(readonly=True) as session:
        assert len(session.audit.events(kind="breaker.refused")) == 1
    why = view_proposal(workspace, people.dana, agents).cannot_plan
    assert why is not None and "the circuit breaker for every agent is open" in why

    reset_breaker(workspace, people.bob, None, "incident 7 is over")
    assert [len(housekeeping_pass(workspace)) for _ in range(2)] == [1, 0]  # the breaker moved: planned, and it plans
    assert get_proposal(workspace, agents).head_sha == moved
