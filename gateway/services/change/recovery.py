"""Recovery: what a runner that stopped heart-beating left behind, read and settled (DESIGN rules 4 and 9).

A runner can die anywhere in an apply (see gateway/fault_points.py for every step). Whoever finds
its locks expired (the next runner that needs a stack, or a worker's housekeeping) takes them
over in one transaction, so no one else can write to those stacks meanwhile, and reads what
really happened on each of the proposal's stacks: the apply record, the engine's state serial,
and, when the state moved but no record says how far, a plan of the applied commit against the
state as it is now (no changes left means the whole plan landed). `domain/applies.py` decides
how that ends; this module records it, keeps the locks of an applied change main lacks, and
releases the rest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from gateway.domain.applies import ApplyStatus, Settlement, StackReading, StackResult, settle_interrupted_apply
from gateway.domain.errors import GatewayError
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.lifecycle import Transition
from gateway.domain.locks import StackLock, recovery_holder, unmerged_holder
from gateway.domain.plan import load_plan
from gateway.domain.principals import GATEWAY
from gateway.domain.proposal import Proposal, ProposalStatus
from gateway.logs import get_logger
from gateway.ports import UnitOfWork
from gateway.services.change.code_host import forge_of
from gateway.services.change.locks import HeldLocks, runner_name
from gateway.services.change.plan_rounds import requeue_stack_job
from gateway.services.change.proposals import get_proposal
from gateway.services.workspace import Records, Workspace

log = get_logger(__name__)


def recover_expired_locks(ws: Workspace) -> list[str]:
    """Settle the applies of every holder whose locks expired; what was recovered, in words."""
    recovered = []
    for holder in sorted({lock.holder for lock in ws.store.locks.expired()}):
        recovered += recover_holder(ws, holder)
    return recovered


HANDLING_ATTEMPTS = 5  # a delivery whose handling kills its worker this often is given up, recorded interrupted


def interrupt_stale_jobs(ws: Workspace) -> list[str]:
    """Jobs whose worker stopped heart-beating end interrupted (after their applies were settled, above)."""
    recovered: list[str] = []
    for job in ws.store.queue.stale(ws.settings.lock_ttl_seconds):
        if job.kind == JobKind.PLAN_STACK:  # planned again from the start; its round waits for it
            done = requeue_stack_job(ws.for_job(job), job)
            recovered += [done] if done else []
            continue
        with ws.store.session() as session:
            if job.kind in (JobKind.WEBHOOK, JobKind.NOTIFY) and job.attempts < HANDLING_ATTEMPTS:
                # a delivery was answered 202, so GitHub never sends it again: a dead worker's delivery is handled
                # again (read back from GitHub each time), never dropped; so is a notification a worker died sending
                why = f"worker {job.runner} stopped heart-beating while handling it"
                if session.jobs.retry(job.id, ws.clock.now(), why):
                    session.audit.append(GATEWAY, "job.retrying", {"job": job.id, "kind": job.kind.value,
                                                                     "runner": job.runner, "attempt": job.attempts,
                                                                     "error": why}, job.proposal_id)
                    recovered.append(f"job {job.id} of worker {job.runner}, queued again")
                    ws.metrics.job_retried(job.kind.value)
                continue
            if session.jobs.finish(job.id, JobStatus.INTERRUPTED, error=f"worker {job.runner} stopped heart-beating"):
                session.audit.append(GATEWAY, "job.interrupted", {"job": job.id, "kind": job.kind.value,
                                                                    "runner": job.runner}, job.proposal_id)
                recovered.append(f"job {job.id} of worker {job.runner}")
    return recovered


def recover_holder(ws: Workspace, dead: str) -> list[str]:
    """Take over `dead`'s expired locks, settle the apply they served, then release or keep them."""
    me = recovery_holder(runner_name())
    taken = ws.store.locks.take_over_expired(dead, me, ws.settings.lock_ttl_seconds)
    if not taken:
        return []  # renewed meanwhile, or another recoverer got them first
    ws.metrics.lock_broken(len(taken))
    held = HeldLocks(ws.store.locks, me, ws.settings.lock_ttl_seconds, [lock.stack for lock in taken])
    held.start()
    try:
        for proposal_id in sorted({pid for pid in (_proposal_of(ws, lock) for lock in taken) if pid is not None}):
            if _settle(ws, proposal_id, dead, taken) is ProposalStatus.UNMERGED:
                held.keep_as(unmerged_holder(proposal_id))
    finally:
        held.stop()
    return [f"lock of stack {lock.stack} held by {dead}" for lock in taken]


def _proposal_of(ws: Records, lock: StackLock) -> int | None:
    if lock.proposal_id is not None:
        return lock.proposal_id
    if lock.apply_id is None:  # a lock taken before locks named their proposal, and before its apply started
        return None
    with ws.store.session(readonly=True) as session:
        record = session.proposals.get_apply(lock.apply_id)
    return record.proposal_id if record else None


def _settle(ws: Workspace, proposal_id: int, dead: str, locks: list[StackLock]) -> ProposalStatus:
    """Record how the dead runner's apply of `proposal_id` ended; the proposal's status afterwards."""
    ws = ws.for_proposal(proposal_id)  # read and settled in its own repository
    proposal = get_proposal(ws, proposal_id)
    settlement = None
    readings: list[StackReading] = []
    if proposal.status == ProposalStatus.APPLYING:
        readings = [read_stack(ws, proposal, stack) for stack in proposal.stacks]
        applied = all(r.result is StackResult.APPLIED for r in readings)
        settlement = settle_interrupted_apply(proposal.id, dead, readings, _merged_as(ws, proposal) if applied else None)
    with ws.store.session() as session:
        for record in session.proposals.applies_of(proposal_id):
            if record.status == ApplyStatus.RUNNING and record.runner == dead:
                reading = next((r for r in readings if r.stack == record.stack), None)
                session.proposals.finish_apply(record.id, ApplyStatus.INTERRUPTED, record.applied,
                                     f"runner {dead} stopped heart-beating before finishing; its lock expired"
                                     + (f"; {reading.describe()}" if reading else ""))
        current = session.proposals.get(proposal_id, lock=True)
        if settlement is not None and current.status == ProposalStatus.APPLYING:
            _record_settlement(session, current, dead, settlement, readings)
        session.audit.append(GATEWAY, "apply.interrupted", {
            "runner": dead, "stacks": [lock.stack for lock in locks],
            "apply_ids": [lock.apply_id for lock in locks if lock.apply_id],
            "lock_acquired_at": str(min(lock.acquired_at for lock in locks)),
            "read": {r.stack: {"result": r.result.value, "detail": r.detail} for r in readings},
            "settled_as": settlement.transition.value if settlement else None,
            "reason": settlement.reason if settlement else f"proposal {proposal_id} was {current.status.value}"},
            proposal_id, proposal.stacks)
        status = session.proposals.get(proposal_id).status
    log.warning("apply.recovered", proposal=proposal_id, runner=dead, status=status.value)
    if settlement is not None and settlement.transition is Transition.FINISH:
        ws.reactions.applied(ws, get_proposal(ws, proposal_id))
    return status


def _record_settlement(session: UnitOfWork, proposal: Proposal, dead: str, settlement: Settlement,
                       readings: list[StackReading]) -> None:
    detail = "reason" if settlement.transition is Transition.BLOCK_MERGE else "error"
    payload = {"runner": dead, detail: settlement.reason, "recovered": True,
               "stacks": {r.stack: r.result.value for r in readings}}
    proposal.move(settlement.transition, GATEWAY, payload, merge_sha=settlement.merge_sha)
    session.proposals.save(proposal)
    if settlement.merge_sha:
        session.audit.append(GATEWAY, "merged", {
            "branch": proposal.branch, "merge_sha": settlement.merge_sha, "on": "recovery",
            "applied_commit": {stack: proposal.head_sha for stack in proposal.stacks}}, proposal.id, proposal.stacks)


def read_stack(ws: Workspace, proposal: Proposal, stack: str) -> StackReading:
    """What `stack` holds of the proposal's approved plan now, read from the records and the engine."""
    plan = proposal.plans[stack]
    with ws.store.session(readonly=True) as session:
        records = [r for r in session.proposals.applies_of(proposal.id) if r.stack == stack and r.plan_id == plan.plan_id]
    if any(r.status == ApplyStatus.SUCCEEDED for r in records):
        return StackReading(stack, StackResult.APPLIED, "its apply was recorded as succeeded")
    if not plan.has_changes:
        return StackReading(stack, StackResult.APPLIED, "its plan changes nothing")
    try:
        serial = ws.engine.state_serial(stack)
    except GatewayError as exc:
        return StackReading(stack, StackResult.PARTLY, f"its state could not be read: {exc}")
    if serial == plan.state_serial:
        return StackReading(stack, StackResult.NOT_STARTED, f"state serial {serial}, as planned")
    moved = f"state serial {plan.state_serial} → {serial}"
    if not proposal.applied_sha:
        return StackReading(stack, StackResult.PARTLY, f"{moved}; no record of the commit it applied")
    try:
        remaining = _remaining_changes(ws, stack, proposal.applied_sha)
    except GatewayError as exc:  # fail closed: what cannot be read is never taken as applied
        return StackReading(stack, StackResult.PARTLY, f"{moved}; a new plan could not be made: {exc}")
    if not remaining:
        return StackReading(stack, StackResult.APPLIED, f"{moved}; a new plan of the applied commit changes nothing")
    shown = ", ".join(remaining[:5]) + (f" and {len(remaining) - 5} more" if len(remaining) > 5 else "")
    return StackReading(stack, StackResult.PARTLY, f"{moved}; still to change: {shown}")


def _remaining_changes(ws: Workspace, stack: str, sha: str) -> list[str]:
    """The addresses a plan of `sha` would still change on `stack`, against its state as it is now."""
    settings = ws.repo_settings()
    with tempfile.TemporaryDirectory(prefix=f"gw-recover-{stack.replace('/', '-')}-") as tmp:
        directory = ws.repo.export_stack(sha, settings.stacks[stack].path, Path(tmp) / "repo")
        document = ws.engine.plan(stack, directory, ws.stack_inputs(stack)).document
    return [rc.address for rc in load_plan(document).changes]


def _merged_as(ws: Workspace, proposal: Proposal) -> str | None:
    """The commit on main that merged the proposal's head, if the dead runner got that far."""
    forge = forge_of(ws)
    if forge is not None:
        try:
            forge.fetch_main(ws.main_branch())
        except GatewayError as exc:  # fail closed: not seen merged is not merged; `gateway merge` looks again
            log.warning("recovery.fetch_failed", proposal=proposal.id, error=str(exc))
    return ws.repo.merged_as(proposal.head_sha, ws.main_branch())
