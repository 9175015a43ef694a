"""The facts the apply rule (`domain/apply_blockers.py`) looks at, gathered once for the runner and every view."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.domain.apply_blockers import ApplyFacts, MergeCheck
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.drift import DriftRecord
from gateway.domain.lifecycle import Transition, next_status
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.services.change.apply_order import proposal_state_reads
from gateway.services.change.code_host import github_team_checks
from gateway.services.change.main_watch import unacknowledged_pushes
from gateway.services.workspace import MainRules, Records, Workspace


def gather_apply_facts(ws: Workspace, proposal: Proposal, actor: Principal | None = None,
                       ask_github: bool = False, check_plans: bool = True,
                       hash_saved_plans: bool = True) -> ApplyFacts:
    """What stands around the proposal now, as recorded; reads only, unless `ask_github` (the apply alone).

    Pushes to main count as far as the gateway has seen them (the runner watches main first; a view does
    not, since a read never writes). `ask_github` asks GitHub for the team membership of every GitHub
    approver and records the answers; without it the last recorded answers are used. `check_plans` hashes the
    saved plans again, merges the branch into main (in a scratch object directory) and reads which of the stacks read
    another's state on the branch, as the runner does before it applies: a list of proposals leaves that to each
    proposal's own view. Without `hash_saved_plans` the saved
    plans are not unsealed and hashed (a read: a saved plan edited where it is kept is the runner's to find, before it
    applies anything; a read stays clear of the sealing key and of reading every plan's bytes).
    """
    appliable = next_status(proposal.status, Transition.START_APPLY) is not None
    look = check_plans and appliable
    settings = ws.repo_settings()
    return ApplyFacts(proposal=proposal, settings=settings, now=ws.clock.now(), actor=actor,
                      pushes=unacknowledged_pushes(ws), windows=windows_on(ws, proposal),
                      team_checks=github_team_checks(ws, proposal, ask_github),
                      drift=_open_drift(ws, proposal) if appliable else (),
                      saved_digests=saved_digests(ws, proposal) if look and hash_saved_plans else None,
                      merge=merge_check(ws, proposal) if look else None,
                      state_reads=proposal_state_reads(ws, settings, proposal) if look else None)


def _open_drift(ws: Records, proposal: Proposal) -> tuple[DriftRecord, ...]:
    with ws.store.session(readonly=True) as session:
        return tuple(r for r in session.day_two.drift_records(only_open=True) if r.stack in proposal.plans)


def saved_digests(ws: Records, proposal: Proposal) -> Mapping[str, str]:
    """Stack -> the digest its saved plan (the JSON plan and the engine's plan file, as stored) hashes to now; a plan
    no longer stored hashes to nothing (fails closed)."""
    with ws.store.session(readonly=True) as session:
        found = session.proposals.saved_plan_digests([plan.plan_id for plan in proposal.plans.values()])
    return {stack: found.get(plan.plan_id, "none stored") for stack, plan in proposal.plans.items()}


def merge_check(ws: MainRules, proposal: Proposal) -> MergeCheck:
    """Whether the proposal's branch, as it is now, merges into main as it is now (writing nothing)."""
    if not ws.repo.branch_exists(proposal.branch):
        return MergeCheck(branch_exists=False)
    main = ws.repo.resolve(ws.main_branch())
    return MergeCheck(branch_exists=True, conflict=ws.repo.merge_conflict(main, ws.repo.resolve(proposal.branch)))


def windows_on(ws: Records, proposal: Proposal) -> tuple[BreakGlassWindow, ...]:
    """The break-glass windows on the proposal's stacks (the apply rule decides which are overdue)."""
    return tuple(w for w in windows_of(ws) if w.stack in proposal.stacks)


def windows_of(ws: Records, stack: str | None = None) -> list[BreakGlassWindow]:
    """The break-glass windows, of one stack or all (opened and recorded by services/day_two/break_glass.py)."""
    with ws.store.session(readonly=True) as session:
        return session.day_two.break_glass_windows(stack)
