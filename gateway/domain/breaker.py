"""The circuit breaker on runaway automation: cumulative, time-bound, and it stops the automation itself.

Each agent change adds capacity (the counted paths of the agent-capacity rule, and instance counts) and
destroys resources. Over a sliding window, per agent and for all agents together, the capacity added is
compared with what the touched stacks held before those changes; past the limit,
or past the destroy limit, the breaker trips: the change is refused and the agent stops until a person
resets it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.domain.plan import Plan
from gateway.domain.policy import CAPACITY_PATHS, number_at

ALL_AGENTS = "*"  # the scope of the breaker over every agent, and of the kill switch
INSTANCE_TYPES = ("aws_instance", "aws_eks_node_group", "aws_db_instance")


@dataclass(frozen=True)
class BreakerSettings:
    window: timedelta = timedelta(minutes=5)
    max_growth_percent: float = 100.0
    max_destroy_count: int = 10
    resetters: frozenset[str] = frozenset()  # groups whose people may reset it


@dataclass(frozen=True)
class CapacityChange:
    """What one agent change (a proposal's current plans) does to capacity."""

    proposal_id: int
    principal_id: str
    before: dict[str, float]  # stack -> capacity the change's resources held before it
    added: float  # capacity added (negative: removed)
    destroyed: int  # resources deleted or replaced
    at: datetime


@dataclass(frozen=True)
class BreakerState:
    """One breaker (an agent's, or every agent's: scope "*"), as last opened, tripped or reset."""

    scope: str
    open: bool
    reason: str
    changed_by: str
    changed_at: datetime


def capacity_of(plans: Iterable[tuple[str, Plan]]) -> tuple[dict[str, float], float, int]:
    """(capacity before, per stack; capacity added; resources destroyed) of a set of stack plans."""
    before: dict[str, float] = {}
    added, destroyed = 0.0, 0
    for stack, plan in plans:
        for rc in plan.resource_changes:
            destroyed += rc.change.is_destructive
            for rtype, path in CAPACITY_PATHS:
                if rc.type == rtype:
                    was, will = number_at(rc.change.before, path) or 0.0, number_at(rc.change.after, path) or 0.0
                    before[stack] = before.get(stack, 0.0) + was
                    added += will - was
            if rc.type in INSTANCE_TYPES:
                was = 1.0 if rc.change.before is not None else 0.0
                will = 1.0 if rc.change.after is not None or rc.change.after_unknown not in (False, None) else 0.0
                before[stack] = before.get(stack, 0.0) + was
                added += will - was
    return before, added, destroyed


def trip_reason(history: Sequence[CapacityChange], change: CapacityChange, settings: BreakerSettings,
                scope: str) -> str | None:
    """Why this change trips the breaker of `scope` (an agent's, or all agents'), with the figures; None if not.

    `history` holds the scope's earlier changes since the window's start (or its last reset), oldest first;
    a proposal counts once, with its latest plans.
    """
    window = [c for c in history if c.proposal_id != change.proposal_id] + [change]
    base: dict[str, float] = {}
    for c in window:  # what each stack held before the window's changes (the most any of them saw there)
        for stack, held in c.before.items():
            base[stack] = max(base.get(stack, 0.0), held)
    held = sum(base.values())
    added = sum(c.added for c in window)
    destroyed = sum(c.destroyed for c in window)
    who = "all agents together" if scope == ALL_AGENTS else "this agent"
    minutes = settings.window.total_seconds() / 60
    if added > 0 and added * 100 > max(held, 1.0) * settings.max_growth_percent:
        return (f"circuit breaker: {len(window)} change(s) by {who} in {minutes:g} minutes add {added:g} capacity "
                f"to {held:g} ({added * 100 / max(held, 1.0):.0f}%, limit {settings.max_growth_percent:g}%)")
    if destroyed > settings.max_destroy_count:
        return (f"circuit breaker: {len(window)} change(s) by {who} in {minutes:g} minutes delete or replace "
                f"{destroyed} resources (limit {settings.max_destroy_count})")
    return None
