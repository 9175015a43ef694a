"""The apply runner: exactly the approved plan, one writer per stack, every outcome recorded.

Before touching anything it re-checks, under the stack locks, that the proposal is approved for
its current commit and plans (made from the merge of its branch into the current main), that each
saved plan still hashes to the approved digest, and that no stack's state moved since its plan.
Any mismatch refuses and re-plans; a different plan needs new approvals. While it runs, a
heartbeat renews its locks; a runner that stops heart-beating loses them to the next one, which
records the apply as interrupted, never as success. Every way out (refused, failed, crashed,
applied but unmergeable, merged) is a recorded lifecycle transition a person can act on.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from gateway import fault_points
from gateway.domain.applies import ApplyStatus
from gateway.domain.apply_blockers import (
    MOVED_UNDER_LOCKS,
    altered_plans,
    apply_blockers,
    merge_blockers,
    replanned_while_checked,
    unseen_drift,
)
from gateway.domain.errors import (
    BackendError,
    ConfigError,
    Conflict,
    GatewayError,
    LockLost,
    LockTimeout,
    NotFound,
    RefMoved,
    Refused,
)
from gateway.domain.locks import unmerged_holder
from gateway.domain.permissions import Action, refusals, require
from gateway.domain.plan import decode_plan_bytes
from gateway.domain.principals import Actor, Principal
from gateway.domain.proposal import Proposal, ProposalKind, ProposalStatus, Transition
from gateway.logs import get_logger
from gateway.ports import Forge
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.apply_order import apply_order
from gateway.services.change.code_host import forge_of, refresh_from_github
from gateway.services.change.locks import HeldLocks, lock_names, runner_name
from gateway.services.change.main_watch import record_own_commit, watch_main
from gateway.services.change.proposals import (
    get_proposal,
    replan_proposal,
    require_active_repository,
    sync_proposal,
)
from gateway.services.change.recovery import recover_holder
from gateway.services.workspace import MainRules, Records, Workspace

log = get_logger(__name__)

__all__ = ["ApplyReport", "StackOutcome", "apply_proposal", "merge_unmerged", "runner_name"]


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
    unmerged: str | None = None  # why an applied change could not be merged, and what to do

    @property
    def succeeded(self) -> bool:
        return bool(self.merge_sha) and all(o.succeeded for o in self.outcomes)


def apply_proposal(ws: Workspace, actor: Principal, proposal_id: int, runner: str | None = None,
                   progress: Callable[[str], None] | None = None) -> ApplyReport:
    """Apply an approved proposal stack by stack, then merge its branch into main, all under its locks."""
    runner = runner or runner_name()
    say = progress or (lambda _: None)
    with ws.store.session(readonly=True) as session:
        require_active_repository(session)
    proposal = get_proposal(ws, proposal_id)
    if actor.is_agent:  # refused before any lock is taken; a person's standing is checked under them, with the rest
        _refuse(ws, actor, proposal, refusals(actor, Action.APPLY))
    say(f"taking the locks of {', '.join(lock_names(ws, proposal))}")
    with _stack_locks(ws, proposal, runner) as locks:
        fault_points.reach("apply.after_lock")
        say("re-checking approvals, plan digests, state serials and the merge")
        checked, main_sha = _preflight(ws, actor, proposal_id)
        if set(lock_names(ws, checked)) - set(locks.names):  # a new commit brought stacks we do not hold
            _refuse(ws, actor, checked, [MOVED_UNDER_LOCKS])
        merged = ws.repo.merge_preview(main_sha, checked.head_sha)
        try:
            order = apply_order(ws, checked.stacks, merged)
        except ConfigError as exc:  # orders that go round in a circle: no stack can go first
            _refuse(ws, actor, checked, [str(exc)])
        locks.check("starting the apply")
        with ws.store.session() as session:
            proposal = session.proposals.get(proposal_id, lock=True)
            moved = replanned_while_checked(checked, proposal)
            if not moved:
                proposal.move(Transition.START_APPLY, actor, {
                    "runner": runner, "head_sha": proposal.head_sha, "main_sha": main_sha, "applied_sha": merged,
                    "digests": proposal.current_digests}, applied_sha=merged)
                session.proposals.save(proposal)
        if moved:
            _refuse(ws, actor, proposal, moved)
        fault_points.reach("apply.after_start_apply")
        report = ApplyReport(proposal_id)
        try:
            _apply_stacks(ws, actor, proposal, order, runner, merged, report, say, locks)
            if report.outcomes and not report.outcomes[-1].succeeded:
                return report
            locks.check("the merge")  # another runner may have taken a stack: never merge on top of that
            say("merging into main")
            fault_points.reach("apply.before_merge")
            _merge(ws, actor, proposal, main_sha, merged, report)
            if report.unmerged:
                locks.keep_as(unmerged_holder(proposal_id))
            else:
                fault_points.reach("apply.after_finish")
        except LockLost as exc:
            log.error("apply.lock_lost", proposal=proposal_id, error=str(exc))
            _stop_without_locks(ws, actor, proposal, locks, report, str(exc))
        except BaseException as exc:  # the one place an unexpected end becomes a recorded, retryable state
            log.exception("apply.crashed", proposal=proposal_id)
            error = f"the apply stopped: {type(exc).__name__}: {exc}"
            _record_crash(ws, actor, proposal_id, error)
            report.outcomes.append(StackOutcome("?", False, (), error))
            if not isinstance(exc, Exception):
                raise  # Ctrl-C, exit: recorded, then let it stop the process
    if report.succeeded:  # a revert or codify of open drift closes its record once a check confirms it
        ws.reactions.applied(ws, get_proposal(ws, proposal_id))
    return report


def _stop_without_locks(ws: Records, actor: Principal, proposal: Proposal, locks: HeldLocks, report: ApplyReport,
                        why: str) -> None:
    """The locks lapsed: stop, and record a state with a way out.

    Every stack applied: the change is what runs, so it keeps its stacks as an unmerged proposal (if
    the locks are still ours to give, nobody else's) for a person to merge. Otherwise the apply
    failed part-way, naming what was done; a retry re-plans.
    """
    applied_all = len(report.outcomes) == len(proposal.stacks) and all(o.succeeded for o in report.outcomes)
    if applied_all and not ws.store.locks.keep_unmerged(locks.names, locks.holder, proposal.id):
        locks.handed_over = True
        report.unmerged = (f"proposal {proposal.id} was applied, but {why}. Its stacks stay locked. Run "
                           f"`gateway merge {proposal.id}` to merge exactly what was applied, or merge by hand and run "
                           f"`gateway merge {proposal.id} --acknowledge -m \"how\"`")
        _transition(ws, proposal.id, Transition.BLOCK_MERGE, actor, {"reason": report.unmerged})
        return
    done = "; ".join(f"stack {o.stack}: {'applied' if o.succeeded else 'failed'} ({len(o.applied)} change(s))"
                     for o in report.outcomes) or "no stack was applied"
    error = f"{why} ({done})"
    _record_crash(ws, actor, proposal.id, error)
    report.outcomes.append(StackOutcome("?", False, (), error))


def _apply_stacks(ws: Workspace, actor: Principal, proposal: Proposal, order: list[str], runner: str, merged: str,
                  report: ApplyReport, say: Callable[[str], None], locks: HeldLocks) -> None:
    """Apply the stacks in `order` (e.g. the network before the apps that read its state); stop at a failure."""
    for index, stack in enumerate(order):
        locks.check(f"applying stack {stack}")
        say(f"applying stack {stack}")
        outcome = _apply_stack(ws, actor, proposal, stack, runner, merged, lambda line: say(f"  {line}"))
        say(f"stack {stack}: {'applied' if outcome.succeeded else 'FAILED'} ({len(outcome.applied)} change(s) done)")
        report.outcomes.append(outcome)
        fault_points.reach(f"apply.after_stack:{stack}")
        if not outcome.succeeded:
            not_started = order[index + 1:]
            if not_started:
                say(f"not started: {', '.join(not_started)} (stopped at the first failure)")
            _transition(ws, proposal.id, Transition.FAIL, actor, {"stack": stack, "error": outcome.error,
                                                                  "not_started": not_started})
            return


def merge_unmerged(ws: Workspace, actor: Principal, proposal_id: int, acknowledge: str | None = None) -> Proposal:
    """Leave `unmerged`: merge again now that main can take it, or record that a person made main right by hand."""
    proposal = get_proposal(ws, proposal_id)
    require(actor, Action.MERGE)
    if proposal.status != ProposalStatus.UNMERGED:
        raise Refused([f"proposal {proposal_id} is {proposal.status.value}, not unmerged"])
    holder = unmerged_holder(proposal_id)
    if acknowledge is not None:
        if not acknowledge.strip():
            raise Refused(["say how main was made to describe what runs (-m)"])
        _transition(ws, proposal_id, Transition.ACKNOWLEDGE_MERGE, actor, {"note": acknowledge.strip()})
    else:
        if not proposal.applied_sha:
            raise Refused([f"proposal {proposal_id} has no record of what was applied; acknowledge instead"])
        report = ApplyReport(proposal_id)
        # compared with what was applied, never with itself: main must take the merge without changing a stack
        _merge(ws, actor, proposal, "", proposal.applied_sha, report)
        if report.unmerged:
            raise Refused([report.unmerged])
    for stack in lock_names(ws, proposal):
        ws.store.locks.release(stack, holder)
    return get_proposal(ws, proposal_id)


def _refuse(ws: Records, actor: Principal, proposal: Proposal, reasons: list[str]) -> NoReturn:
    with ws.store.session() as session:
        session.audit.append(actor, "apply.refused", {"reasons": reasons, "head_sha": proposal.head_sha},
                             proposal.id, proposal.stacks)
    raise Refused(reasons)


def _preflight(ws: Workspace, actor: Principal, proposal_id: int) -> tuple[Proposal, str]:
    """Under the locks: merge, approvals, saved-plan digests and state serials, or refuse and re-plan.

    Every refusal is a row of the apply rule (`domain/apply_blockers.py`), from the facts every view gathers too.
    Returns the proposal as checked, and the main commit its plans were merged onto (the apply and the
    merge use it); the caller starts the apply only if the proposal is still exactly this one.
    """
    try:
        refresh_from_github(ws, get_proposal(ws, proposal_id))
        proposal, changes = sync_proposal(ws, proposal_id)
        failed: GatewayError | None = None
    except (Conflict, NotFound) as exc:  # main moved and the branch no longer merges, or it is gone: nothing applies
        proposal, changes, failed = get_proposal(ws, proposal_id), [], exc
    watch_main(ws)
    facts = gather_apply_facts(ws, proposal, actor, ask_github=True)
    reasons = apply_blockers(facts)
    if failed is not None and not merge_blockers(facts):  # a check that cannot be made fails closed
        reasons.append(str(failed))
    if reasons and changes:  # say what moved; an identical re-plan keeps its approvals and proceeds
        reasons = [f"{c}; re-planned" for c in changes] + reasons
    if unseen_drift(facts) or altered_plans(facts):
        # plan again from the approved commit: the new plan shows what the apply would revert, and only a plan
        # that hashes to an approved digest can ever run
        replan_proposal(ws, proposal)
    if reasons:
        _refuse(ws, actor, proposal, reasons)
    main_shas = {p.main_sha for p in proposal.plans.values()}
    main_sha = main_shas.pop() if len(main_shas) == 1 and None not in main_shas else ws.repo.resolve(ws.main_branch())
    return proposal, main_sha


def _apply_stack(ws: Workspace, actor: Principal, proposal: Proposal, stack: str, runner: str,
                 merged: str, progress: Callable[[str], None]) -> StackOutcome:
    plan = proposal.plans[stack]
    with ws.store.session() as session:
        document = decode_plan_bytes(session.proposals.plan_document(plan.plan_id).encode())
        artifact = session.proposals.plan_artifact(plan.plan_id)
        apply_id = session.proposals.start_apply(proposal.id, stack, plan.plan_id, runner, proposal.head_sha)
        session.audit.append(actor, "apply.started", {
            "apply_id": apply_id, "runner": runner, "head_sha": proposal.head_sha, "digest": plan.digest,
            "state_serial": plan.state_serial}, proposal.id, [stack])
    ws.store.locks.set_apply(stack, runner, apply_id)
    settings = ws.repo_settings()
    with tempfile.TemporaryDirectory(prefix=f"gw-apply-{stack.replace('/', '-')}-") as tmp:
        directory = ws.repo.export_stack(merged, settings.stacks[stack].path, Path(tmp) / "repo")
        result = ws.engine.apply(stack, directory, document, plan.state_serial, ws.stack_inputs(stack), artifact,
                                 progress)
    fault_points.reach(f"apply.after_engine:{stack}")
    status = ApplyStatus.SUCCEEDED if result.succeeded else ApplyStatus.FAILED
    read_at = ws.clock.now()
    with ws.store.session() as session:
        session.stacks.record_serials({stack: result.state_serial}, read_at)  # what reads compare other plans with
        session.proposals.finish_apply(apply_id, status, result.applied, result.error)
        session.audit.append(actor, f"apply.{status.value}", {
            "apply_id": apply_id, "applied": list(result.applied), "failed_address": result.failed_address,
            "error": result.error, "state_serial": result.state_serial, "digest": plan.digest,
            "head_sha": proposal.head_sha}, proposal.id, [stack])
    log.info("apply.finished", proposal=proposal.id, stack=stack, status=status.value, applied=len(result.applied))
    return StackOutcome(stack, result.succeeded, result.applied, result.error)


def _merge(ws: Workspace, actor: Principal, proposal: Proposal, main_sha: str, applied: str,
           report: ApplyReport) -> None:
    """Merge exactly what was applied; if main moved under a stack meanwhile, say so and keep the locks.

    With a forge the merge is GitHub's, of exactly the approved head (a push that slipped in is refused there).
    """
    message = (f"Merge proposal {proposal.id}: {proposal.reason.splitlines()[0][:72]}\n\n"
               f"Applied by the change gateway from {proposal.head_sha}.")
    forge = forge_of(ws)
    with ws.store.session(readonly=True) as session:
        pull = session.github.pull_request_of(proposal.id) if forge else None
    try:
        if forge is not None and pull is not None:
            report.merge_sha = _merge_on_github(ws, forge, pull.number, proposal, applied, message)
        else:
            report.merge_sha = _merge_locally(ws, proposal, main_sha, applied, message)
    except (Conflict, BackendError, NotFound) as exc:
        report.unmerged = _unmerged_reason(proposal, str(exc))
    if report.merge_sha:
        fault_points.reach("apply.after_merge")
    with ws.store.session() as session:
        current = session.proposals.get(proposal.id, lock=True)
        if report.merge_sha:
            current.move(Transition.MERGE if current.status == ProposalStatus.UNMERGED else Transition.FINISH, actor,
                         {"merge_sha": report.merge_sha}, merge_sha=report.merge_sha)
            session.proposals.save(current)
            session.audit.append(actor, "merged", {
                "branch": proposal.branch, "into": ws.main_branch(), "merge_sha": report.merge_sha,
                "on": f"{forge.settings.name.lower()} #{pull.number}" if pull and forge else "gateway",
                "applied_commit": {stack: proposal.head_sha for stack in proposal.stacks}}, proposal.id, proposal.stacks)
        elif current.status == ProposalStatus.APPLYING:
            current.move(Transition.BLOCK_MERGE, actor, {"reason": report.unmerged})
            session.proposals.save(current)


def _merge_locally(ws: MainRules, proposal: Proposal, main_sha: str, applied: str, message: str) -> str:
    main = ws.main_branch()
    for _ in range(3):  # a race with a push elsewhere in the repo is retried on the new main
        current = ws.repo.resolve(main)
        _refuse_changed_stacks(ws, proposal, current, main_sha, applied)
        if proposal.kind == ProposalKind.DRIFT_REVERT and ws.repo.is_ancestor(proposal.head_sha, current):
            return current  # a revert of drift applied main: there is nothing to merge
        try:
            return ws.repo.merge(current, proposal.head_sha, main, message,
                                 before_moving=lambda sha: record_own_commit(ws, sha))
        except RefMoved:
            continue
    raise Conflict(f"{main} kept moving while merging")


def _merge_on_github(ws: MainRules, forge: Forge, number: int, proposal: Proposal, applied: str,
                     message: str) -> str:
    main = ws.main_branch()
    forge.fetch_main(main)
    _refuse_changed_stacks(ws, proposal, ws.repo.resolve(main), "", applied)
    merge_sha = forge.merge(number, proposal.head_sha, message.splitlines()[0], message)
    record_own_commit(ws, merge_sha)  # before main is fetched: never taken for a push made outside the gateway
    try:
        forge.fetch_main(main)
    except GatewayError as exc:  # merged all the same: the next fetch brings main
        log.warning("github.fetch_after_merge_failed", proposal=proposal.id, error=str(exc))
    return merge_sha


def _refuse_changed_stacks(ws: MainRules, proposal: Proposal, current: str, main_sha: str, applied: str) -> None:
    """Main must take the merge without changing a stack from what was applied."""
    settings = ws.repo_settings()
    candidate = applied if current == main_sha else ws.repo.merge_preview(current, proposal.head_sha)
    drifted = [s for s in proposal.stacks if ws.repo.tree_of(candidate, settings.stacks[s].path)
               != ws.repo.tree_of(applied, settings.stacks[s].path)]
    if drifted:
        raise Conflict(f"main changed stack(s) {', '.join(drifted)} during the apply")


def _unmerged_reason(proposal: Proposal, why: str) -> str:
    return (f"proposal {proposal.id} was applied, but its branch cannot be merged into main: {why}. Its stacks stay "
            f"locked. Make main describe what runs: bring main to a state the branch merges into (for example, "
            f"revert the commit pushed outside the gateway) and run `gateway merge {proposal.id}`, or merge by "
            f"hand and run `gateway merge {proposal.id} --acknowledge -m \"how\"`")


def _transition(ws: Records, proposal_id: int, transition: Transition, actor: Actor,
                payload: dict) -> None:
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        proposal.move(transition, actor, payload)
        session.proposals.save(proposal)


def _record_crash(ws: Records, actor: Principal, proposal_id: int, error: str) -> None:
    """An unexpected end: running apply rows and the proposal are recorded failed, with what was done."""
    with ws.store.session() as session:
        for record in session.proposals.applies_of(proposal_id):
            if record.status == ApplyStatus.RUNNING:
                session.proposals.finish_apply(record.id, ApplyStatus.FAILED, record.applied, error)
        proposal = session.proposals.get(proposal_id, lock=True)
        if proposal.status == ProposalStatus.APPLYING:
            proposal.move(Transition.FAIL, actor, {"error": error})
            session.proposals.save(proposal)


@contextmanager
def _stack_locks(ws: Workspace, proposal: Proposal, runner: str) -> Iterator[HeldLocks]:
    """Hold every lock the apply needs (taken in name order, so two runners cannot deadlock)."""
    held = HeldLocks(ws.store.locks, runner, ws.settings.lock_ttl_seconds)
    held.start()
    try:
        for name in lock_names(ws, proposal):
            _acquire(ws, name, runner, proposal)
            held.names.append(name)
        yield held
    finally:
        held.stop()


def _acquire(ws: Workspace, stack: str, runner: str, proposal: Proposal) -> None:
    """Take one lock, waiting for a live holder; a holder that stopped heart-beating is settled first."""
    started = time.monotonic()
    deadline = started + ws.settings.lock_wait_seconds
    while True:
        attempt = ws.store.locks.acquire(stack, runner, ws.settings.lock_ttl_seconds, proposal.id)
        if attempt.taken:
            ws.metrics.lock_waited(time.monotonic() - started, taken=True)
            return
        holder = attempt.holder
        if holder is not None and holder.kept_for_unmerged:
            ws.metrics.lock_waited(time.monotonic() - started, taken=False)
            raise LockTimeout(holder.describe())
        if holder is not None and holder.expired(ws.clock.now()) and recover_holder(ws, holder.holder):
            continue  # its apply is settled: the lock is free now, or kept by an unmerged change
        if time.monotonic() >= deadline:
            ws.metrics.lock_waited(time.monotonic() - started, taken=False)
            raise LockTimeout(f"{holder.describe() if holder else f'stack {stack} is locked'}; try again later")
        time.sleep(0.2)
