"""A proposal's stacks planned as jobs any worker may claim: progress per stack, one stack's failure named, the plans
written once by whichever job ends the round (two workers racing on PostgreSQL), and a worker killed mid-plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.domain.errors import ConfigError
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.plan_rounds import RoundState, StackStatus
from gateway.fault_points import ENVIRONMENT_VARIABLE, EXIT_STATUS
from gateway.services.change.jobs import enqueue_job, recover_abandoned_work, run_now_or_follow
from gateway.services.change.plan_rounds import assemble_round, help_and_wait, record_stack_end, stage, start_round
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.proposals import get_proposal, open_proposal, stored_previews, sync_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, run_cli, sign_in_client

STACKS = ["app-prod", "app-staging"]
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-${local.env}"\n  tags = local.tags\n}\n'
TTL = 1.5


def _open(ws: Workspace, people: People, clone: Clone) -> int:
    clone.branch("refunds")
    for stack in STACKS:
        clone.write(f"stacks/{stack}/queue.tf", QUEUE)
    clone.push("a queue for refunds")
    return open_proposal(ws, people.alice, "refunds", "refund events").id


def _new_commit(clone: Clone, name: str = "refunds-dlq") -> str:
    for stack in STACKS:
        clone.write(f"stacks/{stack}/queue.tf", QUEUE.replace('"refunds-', f'"{name}-'))
    return clone.push("renamed")


def _new_round(ws: Workspace, clone: Clone, pid: int, name: str = "refunds-dlq") -> tuple[str, str, int]:
    """A new commit on the branch and a planning round started for it: its head, the merge planned and the round."""
    head = _new_commit(clone, name)
    main_sha = ws.repo.resolve(ws.main_branch())
    merged = ws.repo.merge_preview(main_sha, head)
    return head, merged, start_round(ws, STACKS, head, main_sha, merged, ChangeOrigin(), pid, ["new commit"])


def _events(ws: Workspace, pid: int, kind: str) -> list:
    with ws.store.session(readonly=True) as session:
        return [e for e in session.audit.events(proposal_id=pid) if e.kind == kind]


def _latest(ws: Workspace, pid: int):  # type: ignore[no-untyped-def]
    with ws.store.session(readonly=True) as session:
        return session.plan_rounds.latest(pid)


def test_a_proposal_of_several_stacks_is_planned_as_a_job_per_stack_here_when_no_worker_runs(
        any_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "clone")
    pid = _open(ws, people, clone)
    proposal = get_proposal(ws, pid)
    assert sorted(proposal.plans) == STACKS  # opened with every stack planned, as before
    head = _new_commit(clone)
    job = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.PLAN, pid), "cli", lambda _: None)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert f"new commit {head[:12]} on refunds" in job.result["changes"]
    proposal = get_proposal(ws, pid)
    assert {p.head_sha for p in proposal.plans.values()} == {head}
    ended = _latest(ws, pid)
    assert ended.state == RoundState.ASSEMBLED and ended.summary() == "planned 2 of 2 stacks"
    with ws.store.session(readonly=True) as session:
        assert session.plan_rounds.staged(ended.id) == []  # the plans are the proposal's now, held nowhere else
    stack_jobs = [ws.store.queue.get(s.job_id) for s in ended.stacks if s.job_id]
    assert [j.kind for j in stack_jobs] == [JobKind.PLAN_STACK] * 2 and all(j.finished for j in stack_jobs)
    assert len(_events(ws, pid, "plan")) == 4  # two at the opening, two now: each stack's plan once


def test_a_stack_whose_plan_fails_is_named_with_why_and_the_proposal_keeps_its_plans(
        workspace: Workspace, tmp_path: Path) -> None:
    ws, people = workspace, add_people(workspace)
    clone = Clone(ws, tmp_path / "clone")
    pid = _open(ws, people, clone)
    before = get_proposal(ws, pid).current_digests
    clone.write("stacks/app-staging/override.tf", "# overrides\n").push("an override file")
    with pytest.raises(ConfigError, match="stack app-staging: override.tf"):  # as a plan in one process raised it
        sync_proposal(ws, pid)
    job = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.PLAN, pid), "cli", lambda _: None)
    assert job.status == JobStatus.FAILED and job.error.startswith("stack app-staging: override.tf: JSON configuration")
    failed = _latest(ws, pid)
    assert failed.state == RoundState.FAILED
    assert {s.stack: s.status for s in failed.stacks} == {"app-prod": StackStatus.PLANNED,
                                                          "app-staging": StackStatus.FAILED}
    assert failed.reasons()[0].startswith("stack app-staging: override.tf: JSON configuration and override files")
    assert get_proposal(ws, pid).current_digests == before  # half a round is never written

    shown = run_cli(["show", str(pid)], ws.settings.home, people.tokens["bob"])
    assert shown.returncode == 0, shown.stderr
    assert "plans: planned 1 of 2 stacks, 1 failed: planning failed, the proposal keeps its earlier plans" \
        in shown.stdout
    assert "  stack app-staging: override.tf: JSON configuration" in shown.stdout
    with TestClient(create_app(ws.settings, workers=0)) as client:
        headers = {"Authorization": f"Bearer {people.tokens['bob']}"}
        planning = client.get(f"/api/v1/proposals/{pid}", headers=headers).json()["planning"]
        sign_in_client(client, people.tokens["bob"])
        page = client.get(f"/proposals/{pid}").text
    assert planning["state"] == "failed" and (planning["planned"], planning["failed"], planning["total"]) == (1, 1, 2)
    assert [s["status"] for s in planning["stacks"]] == ["planned", "failed"]
    assert "planned 1 of 2 stacks, 1 failed" in page and "stack app-staging: override.tf" in page

    clone.remove("stacks/app-staging/override.tf").push("no override")
    sync_proposal(ws, pid)  # the next round that succeeds writes the plans; nothing of the failure is shown then
    assert _latest(ws, pid).state == RoundState.ASSEMBLED
    with TestClient(create_app(ws.settings, workers=0)) as client:
        headers = {"Authorization": f"Bearer {people.tokens['bob']}"}
        assert client.get(f"/api/v1/proposals/{pid}", headers=headers).json()["planning"] is None


def test_progress_shows_how_many_stacks_are_planned_while_the_others_wait(workspace: Workspace, tmp_path: Path) -> None:
    ws, people = workspace, add_people(workspace)
    clone = Clone(ws, tmp_path / "clone")
    pid = _open(ws, people, clone)
    head, merged, round_id = _new_round(ws, clone, pid)
    record_stack_end(ws, round_id, "app-prod", stage(plan_stack(ws, "app-prod", merged)))
    shown = run_cli(["show", str(pid)], ws.settings.home, people.tokens["bob"])
    assert "plans: planned 1 of 2 stacks" in shown.stdout, shown.stdout + shown.stderr
    ended = help_and_wait(ws, round_id)  # plans the stack no worker took, then writes the round's plans
    assert ended.state == RoundState.ASSEMBLED
    assert {p.head_sha for p in get_proposal(ws, pid).plans.values()} == {head}


def test_a_plan_staged_without_its_summary_and_preview_is_written_as_one_staged_with_them(
        workspace: Workspace, tmp_path: Path) -> None:
    """A round a gateway of the release before staged a stack of (its document as the engine wrote it, no summary,
    no preview) is written as this release writes it: the same digest, summary, preview and trail event."""
    ws, people = workspace, add_people(workspace)
    clone = Clone(ws, tmp_path / "clone")
    pid = _open(ws, people, clone)
    head, merged, round_id = _new_round(ws, clone, pid)
    record_stack_end(ws, round_id, "app-prod", stage(plan_stack(ws, "app-prod", merged)))
    result = plan_stack(ws, "app-staging", merged)
    now = stage(result)
    older = replace(now, document=json.dumps(result.engine_plan.document), summary=None, preview=None, engine="")
    assert older.document != now.document  # not the canonical bytes the digest is of
    record_stack_end(ws, round_id, "app-staging", older)  # the round's last stack: its plans are written

    assert _latest(ws, pid).state == RoundState.ASSEMBLED
    plan = get_proposal(ws, pid).plans["app-staging"]
    assert (plan.head_sha, plan.digest, plan.counts) == (head, now.digest, now.summary.counts)
    assert stored_previews(ws, get_proposal(ws, pid))["app-staging"] == now.preview
    with ws.store.session(readonly=True) as session:
        assert session.proposals.plan_document(plan.plan_id) == now.document  # the bytes its digest is of
    written = [e.payload for e in _events(ws, pid, "plan") if e.payload["head_sha"] == head]
    assert {e["merged_sha"] for e in written} == {merged} and {e["engine"] for e in written} == {now.engine}
    assert now.engine and written[-1]["digest"] == now.digest


def test_two_workers_ending_a_round_at_once_write_its_plans_once(postgres_url: str, tmp_path: Path) -> None:
    from .conftest import make_workspace

    ws = make_workspace(tmp_path / "home", postgres_url)
    try:
        people = add_people(ws)
        clone = Clone(ws, tmp_path / "clone")
        pid = _open(ws, people, clone)
        for attempt in range(3):
            head, merged, round_id = _new_round(ws, clone, pid, f"try{attempt}")
            staged = {stack: stage(plan_stack(ws, stack, merged)) for stack in STACKS}
            plans_before = len(_events(ws, pid, "plan"))
            gate = threading.Barrier(4)
            errors: list[BaseException] = []

            def end(stack: str) -> None:
                try:
                    gate.wait()
                    record_stack_end(ws.for_request(), round_id, stack, staged[stack])
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            def assemble() -> None:  # a round's asker taking over at the same moment
                try:
                    gate.wait()
                    assemble_round(ws.for_request(), round_id)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

            threads = [threading.Thread(target=end, args=(s,)) for s in STACKS]
            threads += [threading.Thread(target=assemble) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert errors == []
            assert _latest(ws, pid).state == RoundState.ASSEMBLED
            assert len(_events(ws, pid, "plan")) == plans_before + 2, f"attempt {attempt}"
            assert {p.head_sha for p in get_proposal(ws, pid).plans.values()} == {head}
    finally:
        ws.close()


def test_a_worker_killed_mid_stack_plan_leaves_the_stack_to_plan_again(workspace: Workspace, tmp_path: Path) -> None:
    ws, people = workspace, add_people(workspace)
    clone = Clone(ws, tmp_path / "clone")
    pid = _open(ws, people, clone)
    head = _new_commit(clone)
    point = "plan.after_stack:app-staging"
    enqueue_job(ws, people.alice, JobKind.PLAN, pid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_TOKEN": people.tokens["admin"],
                "GATEWAY_LOCK_TTL_SECONDS": str(TTL), ENVIRONMENT_VARIABLE: point})
    worker = subprocess.run([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.1"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert worker.returncode == EXIT_STATUS and f"fault point {point} reached" in worker.stderr, worker.stderr
    stuck = _latest(ws, pid)
    assert stuck.state == RoundState.PLANNING
    assert {s.stack: s.status for s in stuck.stacks}["app-staging"] == StackStatus.RUNNING

    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": TTL})
    time.sleep(TTL + 0.2)
    recovered = recover_abandoned_work(ws)  # a surviving worker's housekeeping
    assert any("queued again" in line for line in recovered), recovered
    staging_job = next(s.job_id for s in stuck.stacks if s.stack == "app-staging")
    assert ws.store.queue.get(staging_job).status == JobStatus.QUEUED
    ended = help_and_wait(ws, stuck.id)  # a survivor plans it again from the start, and the round ends
    assert ended.state == RoundState.ASSEMBLED, ended
    assert ws.store.queue.get(staging_job).attempts == 2
    assert {p.head_sha for p in get_proposal(ws, pid).plans.values()} == {head}
