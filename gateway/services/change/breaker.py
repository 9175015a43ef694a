"""The circuit breaker: judging each agent change against the window, tripping, the kill switch, resets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from gateway.domain.breaker import ALL_AGENTS, BreakerSettings, CapacityChange, capacity_of, trip_reason
from gateway.domain.errors import InputError, NotFound, Refused
from gateway.domain.permissions import Action, require
from gateway.domain.principals import BUILTIN_AGENT_NAME, GATEWAY, Principal, PrincipalKind
from gateway.ports import UnitOfWork
from gateway.services.change.planning import StackPlanResult
from gateway.services.workspace import MainRules, Records


def guard_agent_change(ws: MainRules, agent: Principal, proposal_id: int | None,
                       results: Sequence[StackPlanResult]) -> CapacityChange:
    """Refuse the change if the agent's breaker (or every agent's) is open, or if this change trips it.

    A trip is recorded, and every running agent request stopped, before the refusal; the caller records the
    returned figures with the proposal when it writes it.
    """
    settings = ws.repo_settings().breaker
    before, added, destroyed = capacity_of((r.stack, r.plan) for r in results)
    change = CapacityChange(proposal_id or 0, agent.id, before, added, destroyed, ws.clock.now())
    with ws.store.session() as session:
        refusal = open_breaker_reason(session, agent)
        if refusal is None:
            for scope in (agent.id, ALL_AGENTS):
                reason = trip_reason(_window(session, scope, settings, change.at), change, settings, scope)
                if reason:
                    _trip(session, scope, reason, proposal_id, agent)
                    refusal = reason
                    break
        else:
            session.audit.append(agent, "breaker.refused", {"reason": refusal, "proposal": proposal_id})
    if refusal:
        raise Refused([refusal])
    return change


def _window(session: UnitOfWork, scope: str, settings: BreakerSettings, moment: datetime) -> list[CapacityChange]:
    """The scope's changes in the window; a reset starts the window again (an agent's reset, for its changes
    in the all-agents window too)."""
    since: datetime = moment - settings.window
    resets = {s.scope: s.changed_at for s in session.breaker.states() if not s.open}
    if scope in resets:
        since = max(since, resets[scope])
    changes = session.breaker.changes(None if scope == ALL_AGENTS else scope, since)
    return [c for c in changes if c.at >= resets.get(c.principal_id, since)]


def _trip(session: UnitOfWork, scope: str, reason: str, proposal_id: int | None, agent: Principal) -> None:
    session.breaker.set(scope, True, reason, "gateway")
    stopped = _stop_requests(session, scope, reason)
    session.audit.append(GATEWAY, "breaker.tripped", {
        "scope": scope, "agent": agent.name, "reason": reason, "proposal": proposal_id, "stopped_requests": stopped})


def _stop_requests(session: UnitOfWork, scope: str, reason: str) -> list[str]:
    """The built-in agent's running requests stop when its breaker or every agent's opens; another agent's breaker
    leaves them running (that agent's own work is refused at its next call)."""
    if scope != ALL_AGENTS and session.principals.get(scope).name != BUILTIN_AGENT_NAME:
        return []
    return session.conversations.stop_runs(reason)


def open_breaker_reason(session: UnitOfWork, agent: Principal) -> str | None:
    """Why this agent may not act now (its breaker or every agent's is open), or None."""
    for scope in (agent.id, ALL_AGENTS):
        state = session.breaker.state(scope)
        if state is not None and state.open:
            return (f"the circuit breaker {'for every agent' if scope == ALL_AGENTS else 'for ' + agent.name} is "
                    f"open since {state.changed_at:%Y-%m-%d %H:%M} UTC: {state.reason}; a person in a "
                    f"resetter group resets it (`gateway breaker reset`)")
    return None


def agent_stop_reason(ws: Records, agent: Principal) -> str | None:
    """For a running agent request, between its steps: stop when its breaker is open."""
    with ws.store.session(readonly=True) as session:
        return open_breaker_reason(session, agent)


def open_breaker(ws: Records, actor: Principal, agent_name: str | None, reason: str) -> str:
    """The kill switch: an admin opens one agent's breaker, or every agent's; running requests stop."""
    require(actor, Action.OPEN_BREAKER)
    reason = _reason(reason)
    with ws.store.session() as session:
        scope = _scope(session, agent_name)
        session.breaker.set(scope, True, f"opened by {actor.name}: {reason}", actor.name)
        stopped = _stop_requests(session, scope, f"the circuit breaker was opened by {actor.name}: {reason}")
        session.audit.append(actor, "breaker.opened", {"scope": scope, "agent": agent_name or "every agent",
                                                       "reason": reason, "stopped_requests": stopped})
    return scope


def reset_breaker(ws: MainRules, actor: Principal, agent_name: str | None, reason: str) -> str:
    """A person in a resetter group closes a tripped breaker, with a reason; the window starts again."""
    settings = ws.repo_settings().breaker
    require(actor, Action.RESET_BREAKER)
    if not actor.groups & settings.resetters:
        raise Refused([f"{actor.name} is not in a resetter group "
                       f"({', '.join(sorted(settings.resetters)) or 'none configured: set breaker.resetters'})"])
    reason = _reason(reason)
    with ws.store.session() as session:
        scope = _scope(session, agent_name)
        state = session.breaker.state(scope)
        if state is None or not state.open:
            raise InputError(f"the breaker {'for every agent' if scope == ALL_AGENTS else 'for ' + str(agent_name)} "
                             "is not open")
        session.breaker.set(scope, False, reason, actor.name)
        session.audit.append(actor, "breaker.reset", {"scope": scope, "agent": agent_name or "every agent",
                                                      "reason": reason, "was": state.reason})
    return scope


def breaker_status(ws: Records) -> list[dict[str, Any]]:
    """Every breaker that was ever tripped, opened or reset, with names for the scopes."""
    with ws.store.session(readonly=True) as session:
        names = {p.id: p.name for p in session.principals.list()}
        return [{**asdict(s), "agent": "every agent" if s.scope == ALL_AGENTS else names.get(s.scope, s.scope)}
                for s in session.breaker.states()]


def _scope(session: UnitOfWork, agent_name: str | None) -> str:
    if agent_name is None:
        return ALL_AGENTS
    agent = session.principals.by_name(agent_name)
    if agent is None or not (agent.is_agent or agent.kind == PrincipalKind.SYSTEM):
        raise NotFound(f"no agent {agent_name}")
    return agent.id


def _reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise InputError("say why (-m)")
    return reason[:1000]
