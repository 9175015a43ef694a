"""The apply runner: exactly the approved plan, one writer per stack, every outcome recorded.

Before touching anything it re-checks, under the stack locks, that the proposal is approved for
its current commit and plans, that each saved plan still hashes to the approved digest, and that
no stack's state moved since its plan. Any mismatch refuses and re-plans; a different plan needs
new approvals. A runner that dies leaves its lock to expire; the next runner breaks it and records
the interrupted apply as such.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gateway.adapters.records import now
from gateway.domain.approvals import apply_refusals
from gateway.domain.errors import LockTimeout, Refused
from gateway.domain.plan import decode_plan_bytes, plan_digest
from gateway.domain.principals import Principal
from gateway.domain.proposal import Decision, Proposal, ProposalStatus
from gateway.services.proposals import decide, get_proposal, replan_proposal, sync_proposal
from gateway.services.workspace import Workspace

log = structlog.get_logger(__name__)


@dataclass
class StackOutcome:
    stack: str
    succeeded: bool
    applied: tuple[str, ...]
    error: str | None = None


@dataclass
class ApplyReport:
    proposal_id: int
    outcomes: list[StackOutcome] = field(default_factory=list)
    merge_sha: str | None = None

    @property
    def succeeded(self) -> bool:
        return bool(self.merge_sha) and all(o.succeeded for o in self.outcomes)


def runner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def apply_proposal(ws: Workspace, actor: Principal, proposal_id: int, runner: str | None = None) -> ApplyReport:
    """Apply an approved proposal stack by stack, then merge its branch into main."""
    runner = runner or runner_name()
    proposal = get_proposal(ws, proposal_id)
    if actor.is_agent:
        _refuse(ws, actor, proposal, [f"{actor.name} is an agent; agents can never apply a change"])
    with _stack_locks(ws, proposal, runner):
        _preflight(ws, actor, proposal_id)
        report = ApplyReport(proposal_id)
        with ws.store.session() as session:
            proposal = session.get_proposal(proposal_id, lock=True)
            session.update_proposal(proposal_id, status=ProposalStatus.APPLYING)
        for stack in proposal.stacks:
            outcome = _apply_stack(ws, actor, proposal, stack, runner)
            report.outcomes.append(outcome)
            if not outcome.succeeded:
                with ws.store.session() as session:
                    session.update_proposal(proposal_id, status=ProposalStatus.FAILED)
                return report
    report.merge_sha = _merge(ws, actor, proposal)
    return report


def _refuse(ws: Workspace, actor: Principal, proposal: Proposal, reasons: list[str]) -> None:
    with ws.store.session() as session:
        session.append_event(actor, "apply.refused", {"reasons": reasons, "head_sha": proposal.head_sha},
                             proposal.id, proposal.stacks)
    raise Refused(reasons)


def _preflight(ws: Workspace, actor: Principal, proposal_id: int) -> None:
    """Under the locks: approvals, saved-plan digests and state serials, or refuse and re-plan."""
    proposal, changes = sync_proposal(ws, proposal_id)
    reasons = apply_refusals(actor, proposal, ws.repo_settings(), now())
    if reasons and changes:  # say what moved; an identical re-plan keeps its approvals and proceeds
        reasons = [f"{c}; re-planned" for c in changes] + reasons
    with ws.store.session() as session:
        tampered = [stack for stack, plan in proposal.plans.items()
                    if plan_digest(decode_plan_bytes(session.plan_document(plan.plan_id).encode())) != plan.digest]
    reasons += [f"the saved plan of stack {stack} does not hash to the approved digest "
                f"({proposal.plans[stack].digest[:19]}…); it was altered after approval" for stack in tampered]
    if tampered:
        # plan again from the approved commit: only a plan that hashes to an approved digest can ever run
        replan_proposal(ws, proposal)
    if reasons:
        _refuse(ws, actor, proposal, reasons)


def _apply_stack(ws: Workspace, actor: Principal, proposal: Proposal, stack: str, runner: str) -> StackOutcome:
    plan = proposal.plans[stack]
    with ws.store.session() as session:
        document = decode_plan_bytes(session.plan_document(plan.plan_id).encode())
        apply_id = session.start_apply(proposal.id, stack, plan.plan_id, runner, proposal.head_sha)
        session.append_event(actor, "apply.started", {
            "apply_id": apply_id, "runner": runner, "head_sha": proposal.head_sha, "digest": plan.digest,
            "state_serial": plan.state_serial}, proposal.id, [stack])
    ws.store.set_lock_apply(stack, runner, apply_id)
    settings = ws.repo_settings()
    with tempfile.TemporaryDirectory(prefix=f"gw-apply-{stack}-") as tmp:
        directory = ws.repo.export(proposal.head_sha, settings.stacks[stack].path, Path(tmp) / stack)
        result = ws.engine.apply(stack, directory, document, plan.state_serial, ws.stack_inputs(stack))
    status = "succeeded" if result.succeeded else "failed"
    with ws.store.session() as session:
        session.finish_apply(apply_id, status, result.applied, result.error)
        session.append_event(actor, f"apply.{status}", {
            "apply_id": apply_id, "applied": list(result.applied), "failed_address": result.failed_address,
            "error": result.error, "state_serial": result.state_serial, "digest": plan.digest,
            "head_sha": proposal.head_sha}, proposal.id, [stack])
    log.info("apply.finished", proposal=proposal.id, stack=stack, status=status, applied=len(result.applied))
    return StackOutcome(stack, result.succeeded, result.applied, result.error)


def _merge(ws: Workspace, actor: Principal, proposal: Proposal) -> str:
    main = ws.main_branch()
    merge_sha = ws.repo.merge(proposal.branch, main, f"Merge proposal {proposal.id}: {proposal.reason.splitlines()[0][:72]}\n\n"
                              f"Applied by the change gateway from {proposal.head_sha}.")
    with ws.store.session() as session:
        session.update_proposal(proposal.id, status=ProposalStatus.APPLIED, merge_sha=merge_sha)
        session.append_event(actor, "merged", {
            "branch": proposal.branch, "into": main, "merge_sha": merge_sha,
            "applied_commit": {stack: proposal.head_sha for stack in proposal.stacks}}, proposal.id, proposal.stacks)
    return merge_sha


@contextmanager
def _stack_locks(ws: Workspace, proposal: Proposal, runner: str) -> Iterator[None]:
    """Hold every stack's lock (taken in name order, so two runners cannot deadlock)."""
    held: list[str] = []
    try:
        for stack in sorted(proposal.stacks):
            _acquire(ws, stack, runner, proposal)
            held.append(stack)
        yield
    finally:
        for stack in held:
            ws.store.release_lock(stack, runner)


def _acquire(ws: Workspace, stack: str, runner: str, proposal: Proposal) -> None:
    deadline = time.monotonic() + ws.settings.lock_wait_seconds
    while True:
        taken, broken = ws.store.acquire_lock(stack, runner, ws.settings.lock_ttl_seconds)
        if broken is not None:
            _record_interrupted(ws, stack, broken)
        if taken:
            return
        if time.monotonic() >= deadline:
            holder = ws.store.lock_holder(stack) or {}
            raise LockTimeout(
                f"stack {stack} is locked by runner {holder.get('holder', '?')} "
                f"(apply {holder.get('apply_id') or 'starting'}, since {holder.get('acquired_at')}); try again later"
            )
        time.sleep(0.2)


def _record_interrupted(ws: Workspace, stack: str, broken: dict) -> None:
    """A runner died holding the lock: its apply is recorded as interrupted, never as success."""
    with ws.store.session() as session:
        apply_id = broken.get("apply_id")
        record = session.get_apply(apply_id) if apply_id else None
        if record and record["status"] == "running":
            session.finish_apply(apply_id, "interrupted", record["applied"],
                                 f"runner {broken['holder']} stopped before finishing; its lock expired")
            session.update_proposal(record["proposal_id"], status=ProposalStatus.FAILED)
        session.append_event("gateway", "apply.interrupted", {
            "stack": stack, "runner": broken["holder"], "apply_id": apply_id,
            "lock_acquired_at": str(broken["acquired_at"])}, record["proposal_id"] if record else None, [stack])


def approve(ws: Workspace, actor: Principal, proposal_id: int, comment: str, seen_sha: str | None = None,
            auth: str = "api-token") -> tuple[Proposal, ApplyReport | None]:
    """Record an approval; when gateway.yaml sets `auto_apply` and it was the last one needed, apply now."""
    proposal = decide(ws, actor, proposal_id, Decision.APPROVE, comment, seen_sha, auth)
    settings = ws.repo_settings()
    if not settings.auto_apply or apply_refusals(actor, proposal, settings, now()):
        return proposal, None
    report = apply_proposal(ws, actor, proposal_id, runner=f"auto-apply:{runner_name()}")
    return get_proposal(ws, proposal_id), report
