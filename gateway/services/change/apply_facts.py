"""The facts the apply rule (`domain/apply_blockers.py`) looks at, gathered once for the runner and every view."""

from __future__ import annotations

from gateway.domain.apply_blockers import ApplyFacts
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.services.change.code_host import github_team_checks
from gateway.services.change.main_watch import unacknowledged_pushes
from gateway.services.workspace import Workspace


def gather_apply_facts(ws: Workspace, proposal: Proposal, actor: Principal | None = None,
                       ask_github: bool = False) -> ApplyFacts:
    """What stands around the proposal now, as recorded; reads only, unless `ask_github` (the apply alone).

    Pushes to main count as far as the gateway has seen them (the runner watches main first; a view does
    not, since a read never writes). `ask_github` asks GitHub for the team membership of every GitHub
    approver and records the answers; without it the last recorded answers are used.
    """
    return ApplyFacts(proposal=proposal, settings=ws.repo_settings(), now=ws.clock.now(), actor=actor,
                      pushes=unacknowledged_pushes(ws), windows=windows_on(ws, proposal),
                      team_checks=github_team_checks(ws, proposal, ask_github))


def windows_on(ws: Workspace, proposal: Proposal) -> tuple[BreakGlassWindow, ...]:
    """The break-glass windows on the proposal's stacks (the apply rule decides which are overdue)."""
    return tuple(w for w in windows_of(ws) if w.stack in proposal.stacks)


def windows_of(ws: Workspace, stack: str | None = None) -> list[BreakGlassWindow]:
    """The break-glass windows, of one stack or all (opened and recorded by services/day_two/break_glass.py)."""
    with ws.store.session(readonly=True) as session:
        return session.day_two.break_glass_windows(stack)
