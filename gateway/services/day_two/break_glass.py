"""Break-glass: during an incident a person of the break-glass group changes a stack outside the gateway, in the
open. The window is asked for with a reason and a length (a second person confirms it on a protected stack);
drift made in it (or found after it, before it is settled) is recorded as expected; once it ends its drift must
be codified (or reverted) within `break_glass.codify_within`. Past that deadline the stack is flagged on every page
and in the trail, and applies on it wait for an acknowledgement from the break-glass group.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.domain.audit import AuditEvent
from gateway.domain.break_glass import (
    BreakGlassWindow,
    WindowState,
    acknowledge_refusals,
    confirm_refusals,
    open_refusals,
)
from gateway.domain.errors import ConfigError, GatewayError, InputError, Refused
from gateway.domain.principals import GATEWAY, Principal
from gateway.domain.repo_settings import BreakGlassSettings
from gateway.logs import get_logger
from gateway.services.admin import audit as audit_service
from gateway.services.change.apply_facts import windows_of
from gateway.services.day_two.drift_records import CHECKED, check_drift
from gateway.services.workspace import MainRules, Records, Workspace

log = get_logger(__name__)

ACTIVE_STATES = (WindowState.AWAITING_CONFIRMATION, WindowState.OPEN)


def open_break_glass(ws: MainRules, actor: Principal, stack: str, reason: str,
                     duration: timedelta) -> BreakGlassWindow:
    """Ask for a window on `stack`; it opens at once, or on a protected stack when a second person confirms."""
    settings = ws.repo_settings()
    settings.require_stack(stack)
    reasons = open_refusals(actor, settings.stacks[stack], settings.break_glass, duration, reason)
    moment = ws.clock.now()
    if any(w.state(moment, settings.break_glass) in ACTIVE_STATES for w in windows_of(ws, stack)):
        reasons.append(f"stack {stack} already has a break-glass window open or waiting for confirmation")
    if reasons:
        with ws.store.session() as session:
            session.audit.append(actor, "break_glass.refused", {"stack": stack, "reasons": reasons}, None, [stack])
        raise Refused(reasons)
    protected = bool(settings.stacks[stack].protected)
    with ws.store.session() as session:
        wid = session.day_two.add_break_glass(stack, reason.strip(), actor.name, int(duration.total_seconds()),
                                      confirmed=not protected)
        window = session.day_two.break_glass(wid)
        session.audit.append(actor, "break_glass.requested" if protected else "break_glass.opened", {
            "break_glass": wid, "stack": stack, "reason": window.reason, "for_seconds": int(duration.total_seconds()),
            "ends_at": window.ends_at.isoformat() if window.ends_at else None,
            "needs_confirmation": protected}, None, [stack])
    return window


def confirm_break_glass(ws: MainRules, actor: Principal, window_id: int) -> BreakGlassWindow:
    """A second person of the break-glass group opens a window asked for on a protected stack."""
    settings = ws.repo_settings()
    window = get_window(ws, window_id)
    reasons = confirm_refusals(actor, window, settings.break_glass)
    if reasons:
        raise Refused(reasons)
    moment = ws.clock.now()
    with ws.store.session() as session:
        session.day_two.confirm_break_glass(window_id, actor.name, moment, moment + window.duration)
        session.audit.append(actor, "break_glass.opened", {
            "break_glass": window_id, "stack": window.stack, "reason": window.reason, "asked_by": window.opened_by,
            "confirmed_by": actor.name, "ends_at": (moment + window.duration).isoformat()}, None, [window.stack])
    return get_window(ws, window_id)


def close_break_glass(ws: Workspace, actor: Principal, window_id: int, note: str) -> BreakGlassWindow:
    """End a window early (the incident is over): its drift is recorded as expected, and the codify clock starts."""
    window = get_window(ws, window_id)
    its_people = {window.opened_by, window.confirmed_by}
    # its people are people (agents may never open or confirm one); anyone else acts for the group, if the rules let them
    if actor.name not in its_people and acknowledge_refusals(actor, ws.repo_settings().break_glass):
        raise Refused([f"{actor.name} may not close break-glass window {window_id}: its people or the "
                       "break-glass group may"])
    moment = ws.clock.now()
    if window.closed_at is not None or (window.ended_at is not None and window.ended_at <= moment):
        raise Refused([f"break-glass window {window_id} has already ended"])
    if window.opened_at is not None:
        try:  # while it is open: what was changed is expected (a later check attributes it to the window too)
            check_drift(ws, GATEWAY, window.stack)
        except GatewayError as exc:
            log.warning("break_glass.check_failed", window=window_id, error=str(exc))
    with ws.store.session() as session:
        session.day_two.close_break_glass(window_id, ws.clock.now())
        session.audit.append(actor, "break_glass.closed", {"break_glass": window_id, "stack": window.stack,
                                                           "note": note.strip()}, None, [window.stack])
    return get_window(ws, window_id)


def acknowledge_break_glass(ws: MainRules, actor: Principal, window_id: int, note: str) -> BreakGlassWindow:
    """The break-glass group has looked at an overdue window: applies on its stack go on."""
    settings = ws.repo_settings()
    if not note.strip():
        raise InputError("say what is being done about the uncodified drift (-m)")
    window = get_window(ws, window_id)
    reasons = acknowledge_refusals(actor, settings.break_glass, window)
    if window.state(ws.clock.now(), settings.break_glass) != WindowState.OVERDUE:
        reasons.append(f"break-glass window {window_id} is {window.state(ws.clock.now(), settings.break_glass).value}, "
                       "not overdue")
    if reasons:
        raise Refused(reasons)
    with ws.store.session() as session:
        session.day_two.acknowledge_break_glass(window_id, actor.name, ws.clock.now(), note.strip())
        session.audit.append(actor, "break_glass.acknowledged", {"break_glass": window_id, "stack": window.stack,
                                                                 "note": note.strip()}, None, [window.stack])
    return get_window(ws, window_id)


def _sweep_settings(ws: MainRules) -> BreakGlassSettings:
    """Main's break-glass settings. When main's gateway.yaml does not parse (pushed outside the gateway, which holds
    applies until acknowledged), time keeps running on open windows by the last gateway.yaml on main that did."""
    try:
        return ws.repo_settings().break_glass
    except ConfigError as exc:
        for sha in ws.repo.commits_touching(ws.main_branch(), "gateway.yaml")[1:]:
            try:
                settings = ws.repo_settings(sha).break_glass
            except ConfigError:
                continue
            log.warning("break_glass.sweep_with_older_settings", commit=sha, error=str(exc))
            return settings
        raise


def sweep_break_glass(ws: Workspace, moment: datetime | None = None) -> list[str]:
    """Record what time did to the windows (workers call this): settled once their drift is gone, flagged overdue
    past the codify deadline (once, in the trail)."""
    moment = moment or ws.clock.now()
    settings = _sweep_settings(ws)
    done = []
    for window in windows_of(ws):
        if window.ended_at is None or window.ended_at > moment or window.codified_at or window.acknowledged_at:
            continue
        if not _checked_since(ws, window.stack, window.ended_at) and not _check_after_window(ws, window):
            continue  # settled only once a check has looked at the stack after the window: its drift is the window's
        with ws.store.session() as session:
            record = session.day_two.open_drift_record(window.stack)
            # settled: no open drift, or a record that is not the window's and did not change while it was open
            if record is None or (record.break_glass_id != window.id and window.opened_at is not None
                                  and _aware(record.updated_at) < _aware(window.opened_at)):
                if not session.day_two.mark_break_glass(window.id, "codified_at", moment):
                    continue  # another worker settled it: once in the trail
                session.audit.append(GATEWAY, "break_glass.settled", {
                    "break_glass": window.id, "stack": window.stack,
                    "codify_by": window.codify_by(settings).isoformat()}, None, [window.stack])
                done.append(f"window {window.id} settled")
            elif window.state(moment, settings) == WindowState.OVERDUE and window.flagged_at is None:
                if not session.day_two.mark_break_glass(window.id, "flagged_at", moment):
                    continue  # another worker flagged it: once in the trail
                session.audit.append(GATEWAY, "break_glass.overdue", {
                    "break_glass": window.id, "stack": window.stack, "drift_record": record.id,
                    "codify_by": window.codify_by(settings).isoformat(), "drifted": record.addresses}, None,
                    [window.stack])
                done.append(f"window {window.id} overdue")
    return done


def _checked_since(ws: Records, stack: str, moment: datetime) -> bool:
    """Whether a drift check of `stack` completed at or after `moment`."""
    with ws.store.session(readonly=True) as session:
        marker = session.main.marker(CHECKED + stack)
    if marker is None:
        return False
    checked = datetime.fromisoformat(marker)
    return _aware(checked) >= _aware(moment)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _check_after_window(ws: Workspace, window: BreakGlassWindow) -> bool:
    """Check the stack now that the window ended (nobody closed it); False when the check could not be made."""
    try:
        check_drift(ws, GATEWAY, window.stack)
    except GatewayError as exc:
        log.warning("break_glass.check_failed", window=window.id, stack=window.stack, error=str(exc))
        return False
    return True


def overdue_windows(ws: MainRules, moment: datetime | None = None) -> list[BreakGlassWindow]:
    """Windows past their codify deadline with drift not codified and not acknowledged: flagged on every page."""
    moment = moment or ws.clock.now()
    settings = ws.repo_settings().break_glass
    return [w for w in windows_of(ws) if w.state(moment, settings) == WindowState.OVERDUE]


def get_window(ws: Records, window_id: int) -> BreakGlassWindow:
    with ws.store.session(readonly=True) as session:
        return session.day_two.break_glass(window_id)


def break_glass_story(ws: Records, actor: Principal, window_id: int) -> list[AuditEvent]:
    """The whole episode: the window, the drift it made, and the proposals that codified or reverted it."""
    window = get_window(ws, window_id)
    with ws.store.session(readonly=True) as session:
        records = [r for r in session.day_two.drift_records(window.stack) if r.break_glass_id == window_id]
    settled_by = {r.closed_by_proposal for r in records if r.closed_by_proposal}
    record_ids = {r.id for r in records}
    events = audit_service.list_events(ws, actor, stack=window.stack,
                                       since=(window.requested_at - timedelta(seconds=1)).isoformat())
    return [e for e in events if e.payload.get("break_glass") == window_id or e.payload.get("record") in record_ids
            or e.proposal_id in settled_by]
