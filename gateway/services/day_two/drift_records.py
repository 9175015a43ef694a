"""Drift checks and drift records: what changed outside the gateway, per stack, until a person settles it.

A check plans main's declaration of a stack against reality (the engine refreshes first) and keeps the drift
it finds, masked, attribute by attribute, in the stack's open record; a later check that finds none closes it.
Workers run the check on the schedule main's gateway.yaml sets per stack (`drift.interval`). Two ways out, each a
proposal with approval: a revert (`gateway drift revert`) or a codify (`gateway drift codify`, or any branch that
changes the declaration to match); after such an apply the gateway checks again, and the record closes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.drift import DriftRecord, check_due
from gateway.domain.errors import GatewayError
from gateway.domain.permissions import Action, require
from gateway.domain.preview import SENSITIVE, DriftEntry
from gateway.domain.principals import GATEWAY, SYSTEM_NAME, Actor, Principal
from gateway.domain.proposal import Proposal, ProposalKind
from gateway.domain.scrubbing import Scrubber
from gateway.logs import get_logger
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.workspace import Records, Workspace

log = get_logger(__name__)

CHECKED = "drift_checked:"  # marker name prefix: when a stack was last checked (ISO time)
CLAIMED = "drift_claimed:"  # marker name prefix: when a worker last claimed a stack's scheduled check


@dataclass(frozen=True)
class DriftCheck:
    """What one check of one stack found, and what it did with the stack's record."""

    stack: str
    found: tuple[DriftEntry, ...]
    record: DriftRecord | None  # the record as it stands after the check (closed if the check closed it)
    outcome: str  # opened | updated | unchanged | closed | clean


def check_drift(ws: Workspace, actor: Actor, stack: str, settled_by: Proposal | None = None) -> DriftCheck:
    """Refresh main's declaration of `stack` against reality; open, update or close the stack's drift record.

    `actor` is a person with a role, or the gateway's own name (its schedule, or its check after an apply).
    """
    if isinstance(actor, Principal):
        require(actor, Action.CHECK_DRIFT)
    settings = ws.repo_settings()
    settings.require_stack(stack)
    result = plan_stack(ws, stack, ws.main_branch(), ChangeOrigin(requester=SYSTEM_NAME))
    found = [_mask_known_secrets(ws.scrubber, entry) for entry in result.preview().drift]
    moment = ws.clock.now()
    who = actor if isinstance(actor, str) else actor.name
    with ws.store.session() as session:
        session.main.set_marker(CHECKED + stack, moment.isoformat())
        record = session.day_two.open_drift_record(stack)
        windows = session.day_two.break_glass_windows(stack)
        window = next((w for w in windows if _covers(w, moment)), None)
        base = {"stack": stack, "main_sha": result.sha, "requested_by": who,
                "drifted": {d.address: [a.path for a in d.attributes] or [d.summary] for d in found}}
        if not found and record is None:
            outcome = "clean"
        elif not found and record is not None:
            reason = (f"proposal {settled_by.id} ({_way_out(settled_by, stack)}) was applied; a check after it finds no drift"
                      if settled_by else "a check finds no drift any more")
            session.day_two.close_drift_record(record.id, who, reason, settled_by.id if settled_by else None)
            session.audit.append(actor, "drift.closed", {**base, "record": record.id, "reason": reason,
                                                          "break_glass": record.break_glass_id},
                                 settled_by.id if settled_by else None, [stack])
            outcome = "closed"
        elif record is None:
            expected_by = window.id if window else None
            rid = session.day_two.add_drift_record(stack, found, window is not None, expected_by)
            session.audit.append(actor, "drift.opened", {**base, "record": rid, "expected": window is not None,
                                                         "break_glass": expected_by}, None, [stack])
            outcome = "opened"
        else:
            # a record keeps how it was opened: drift found before a window is never relabelled as the window's
            # (the sweep holds a window whose stack's record changed during it: see sweep_break_glass)
            expected_by = record.break_glass_id
            if tuple(found) != record.resources:
                session.day_two.update_drift_record(record.id, found, record.expected, expected_by)
                session.audit.append(actor, "drift.updated", {**base, "record": record.id,
                                                              "expected": record.expected,
                                                              "break_glass": expected_by}, None, [stack])
                outcome = "updated"
            else:
                outcome = "unchanged"
        if isinstance(actor, Principal) and outcome in ("clean", "unchanged"):  # a person asked: the trail says so
            session.audit.append(actor, "drift.checked", {**base, "outcome": outcome}, None, [stack])
        latest = session.day_two.drift_records(stack)[:1]
    return DriftCheck(stack, tuple(found), latest[0] if latest and outcome != "clean" else None, outcome)


def _mask_known_secrets(scrubber: Scrubber, entry: DriftEntry) -> DriftEntry:
    """A workspace secret typed into a plain attribute is secret by origin: the record keeps it masked, never in
    clear (the engine marks only what the schema or the declaration calls sensitive)."""
    def masked(value: str | None) -> str | None:
        return SENSITIVE if value is not None and scrubber.scrub(value) != value else value
    attributes = tuple(replace(a, before=masked(a.before), after=masked(a.after)) for a in entry.attributes)
    return replace(entry, summary=scrubber.scrub(entry.summary), attributes=attributes)


def _covers(window: BreakGlassWindow, moment: datetime) -> bool:
    """Drift found while a window is open, or after it ended and before it was settled, is the window's."""
    ended = window.ended_at
    return window.is_open(moment) or (window.opened_at is not None and ended is not None and ended <= moment
                                      and window.codified_at is None)


def _way_out(proposal: Proposal, stack: str) -> str:
    """How an applied proposal settled a stack's drift: a revert, or a codify (its plan there changed nothing)."""
    if proposal.kind == ProposalKind.DRIFT_REVERT:
        return "a revert of the drift"
    plan = proposal.plans.get(stack)
    return "a codify" if plan is not None and not plan.has_changes else "a change"


def check_scheduled_drift(ws: Workspace, moment: datetime | None = None) -> list[DriftCheck]:
    """Check each stack whose `drift.interval` has passed since its last check (workers call this)."""
    moment = moment or ws.clock.now()
    checks = []
    for name, stack in sorted(ws.repo_settings().stacks.items()):
        if stack.drift_interval is None:
            continue
        with ws.store.session(readonly=True) as session:
            last = session.main.marker(CHECKED + name)
            claimed = session.main.marker(CLAIMED + name)
        if not check_due(datetime.fromisoformat(last) if last else None, stack.drift_interval, moment):
            continue
        if claimed and (last is None or claimed > last) and not check_due(datetime.fromisoformat(claimed),
                                                                           stack.drift_interval, moment):
            continue  # another worker claimed this check and is running it (a claim older than the interval lapses)
        with ws.store.session() as session:  # one worker runs a due check; the others see the claim and move on
            if not session.main.swap_marker(CLAIMED + name, claimed, moment.isoformat()):
                continue
        try:
            checks.append(check_drift(ws, GATEWAY, name))
        except GatewayError as exc:  # one broken stack never stops the others; the trail says why
            log.warning("drift.check_failed", stack=name, error=str(exc))
            with ws.store.session() as session:
                session.main.set_marker(CHECKED + name, moment.isoformat())
                session.audit.append(GATEWAY, "drift.check_failed", {"stack": name, "error": str(exc)}, None,
                                     [name])
    return checks


def settle_drift_after_apply(ws: Workspace, proposal: Proposal) -> list[DriftCheck]:
    """After an applied proposal, check each of its stacks that had open drift: a revert or codify closes it."""
    with ws.store.session(readonly=True) as session:
        stacks = [s for s in proposal.stacks if session.day_two.open_drift_record(s) is not None]
    checks = []
    for stack in stacks:
        try:
            checks.append(check_drift(ws, GATEWAY, stack, settled_by=proposal))
        except Exception as exc:  # the apply stands whatever happens here; the next check catches up
            log.warning("drift.recheck_failed", stack=stack, proposal=proposal.id, error=str(exc))
    return checks


def list_drift_records(ws: Records, actor: Principal, stack: str | None = None,
                       only_open: bool = False) -> list[DriftRecord]:
    """Drift records, newest first (any signed-in person may read them)."""
    del actor  # authenticated by the caller; reading needs no role
    with ws.store.session(readonly=True) as session:
        return session.day_two.drift_records(stack, only_open)
