"""Break-glass windows: a person in the break-glass group may change a stack outside the gateway for a while.

While a window is open, drift on its stack is expected and recorded as such. When it ends, its drift must be
codified (or reverted) within `break_glass.codify_within`; past that deadline the stack is flagged, and applies
on it need an acknowledgement from the break-glass group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gateway.domain.permissions import Action, refusals
from gateway.domain.principals import Principal
from gateway.domain.repo_settings import BreakGlassSettings, StackSettings


class WindowState(StrEnum):
    AWAITING_CONFIRMATION = "awaiting confirmation"  # a protected stack: a second person confirms
    OPEN = "open"
    CODIFY_DUE = "codify due"  # ended; its drift waits to be codified before the deadline
    OVERDUE = "overdue"  # past the deadline with drift not codified: flagged, applies need an acknowledgement
    ACKNOWLEDGED = "acknowledged"  # overdue, and the break-glass group acknowledged it
    SETTLED = "settled"  # ended and its drift codified or reverted (or none was made)
    CANCELLED = "cancelled"  # closed before anyone confirmed it


@dataclass(frozen=True)
class BreakGlassWindow:
    id: int
    stack: str
    reason: str
    opened_by: str
    requested_at: datetime
    duration: timedelta
    confirmed_by: str | None = None
    opened_at: datetime | None = None
    ends_at: datetime | None = None
    closed_at: datetime | None = None
    codified_at: datetime | None = None
    flagged_at: datetime | None = None
    acknowledged_by: str | None = None
    acknowledged_at: datetime | None = None
    acknowledgement: str | None = None

    @property
    def ended_at(self) -> datetime | None:
        if self.opened_at is None:
            return None
        if self.closed_at is not None and (self.ends_at is None or self.closed_at < self.ends_at):
            return self.closed_at
        return self.ends_at

    def is_open(self, moment: datetime) -> bool:
        ended = self.ended_at
        return self.opened_at is not None and ended is not None and self.opened_at <= moment < ended

    def codify_by(self, settings: BreakGlassSettings) -> datetime | None:
        ended = self.ended_at
        return ended + settings.codify_within if ended is not None else None

    def state(self, moment: datetime, settings: BreakGlassSettings) -> WindowState:
        if self.opened_at is None:
            return WindowState.CANCELLED if self.closed_at else WindowState.AWAITING_CONFIRMATION
        if self.is_open(moment):
            return WindowState.OPEN
        if self.codified_at is not None:
            return WindowState.SETTLED
        deadline = self.codify_by(settings)
        if deadline is not None and moment >= deadline:
            return WindowState.ACKNOWLEDGED if self.acknowledged_at else WindowState.OVERDUE
        return WindowState.CODIFY_DUE


def open_refusals(actor: Principal, stack: StackSettings, settings: BreakGlassSettings,
                  duration: timedelta, reason: str) -> list[str]:
    """Why `actor` may not open a break-glass window on `stack` (empty: they may)."""
    reasons = refusals(actor, Action.OPEN_BREAK_GLASS)
    if actor.is_agent:
        return reasons
    if not settings.groups:
        reasons.append("gateway.yaml names no break_glass.groups: nobody may break the glass")
    elif not actor.groups & settings.groups:
        reasons.append(f"{actor.name} is not in a break-glass group ({', '.join(sorted(settings.groups))})")
    if not reason.strip():
        reasons.append("say why (-m): the incident this is for")
    if duration > settings.max_window:
        reasons.append(f"a window lasts at most {settings.max_window} (break_glass.max_window)")
    return reasons


def confirm_refusals(actor: Principal, window: BreakGlassWindow, settings: BreakGlassSettings) -> list[str]:
    """Why `actor` may not confirm this window (empty: they may): another person of the break-glass group."""
    reasons = refusals(actor, Action.CONFIRM_BREAK_GLASS)
    if actor.is_agent:
        return reasons
    if window.opened_at is not None or window.closed_at is not None:
        reasons.append(f"break-glass window {window.id} is not waiting for a confirmation")
    if actor.name == window.opened_by:
        reasons.append(f"{actor.name} asked for this window; a second person confirms it")
    if not actor.groups & settings.groups:
        reasons.append(f"{actor.name} is not in a break-glass group ({', '.join(sorted(settings.groups)) or 'none'})")
    return reasons


def acknowledge_refusals(actor: Principal, settings: BreakGlassSettings,
                         window: BreakGlassWindow | None = None) -> list[str]:
    """Why `actor` may not acknowledge (or, without a window, act for the group on) a window (empty: they may)."""
    refused = refusals(actor, Action.ACKNOWLEDGE_BREAK_GLASS)
    if refused:
        return refused
    if not actor.groups & settings.groups:
        return [f"{actor.name} is not in a break-glass group ({', '.join(sorted(settings.groups)) or 'none'})"]
    if window is not None and actor.name == window.opened_by:  # segregation of duties, as for approvals
        return [f"{actor.name} broke the glass of window {window.id}; another person of the break-glass group "
                "acknowledges its uncodified drift"]
    return []
