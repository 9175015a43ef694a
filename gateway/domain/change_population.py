"""What an auditor tests change management with, read from the trail alone: the change population of a period (one
row per change applied or attempted in it), the exceptions to sample first, the two checks that must find nothing,
and a reproducible sample.

One function, `build_population`, takes the trail's events and returns typed rows; the CLI, the API and the pages
all print what it returns, so their numbers agree. It reads nothing but the events given: the service hands it every
event of the period's changes and the trail's events about main, break-glass windows, drift records and identities.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.domain.audit import AuditEvent
from gateway.domain.audit_period import Period
from gateway.domain.trail_context import Identities, Push, Window, pushes_of, windows_of

RISK_ORDER = ("low", "medium", "high", "critical")
FLAGS = ("override", "break-glass", "pushed-outside", "drift-revert", "rollback", "failed", "partial", "unmerged")
# what an auditor samples first, in this order
EXCEPTION_KINDS = ("override", "break-glass", "pushed-outside", "unapproved-apply", "self-approval", "drift-revert",
                   "rollback", "failed-apply", "partial-apply", "unmerged")
GLOBAL_ACTIONS = ("main", "break_glass", "drift", "principal", "identity.linked")  # read beside the changes
# the kinds of events that tell of windows, pushes and identities (what `build_population` reads beside stories)
_AROUND = ("main.", "break_glass.", "drift.", "principal.", "identity.", "sign_in", "github.team_check")


@dataclass(frozen=True)
class Scope:
    """Which changes of the period: by repository, stack, environment tag, person (any of them may be unset)."""

    repository: str | None = None
    stack: str | None = None
    environment: str | None = None
    person: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("repository", self.repository), ("stack", self.stack),
                                  ("environment", self.environment), ("person", self.person)) if v}


@dataclass(frozen=True)
class Approval:
    by: str
    at: str
    authenticated_by: str
    head_sha: str
    digests: Mapping[str, str]
    required: int | None
    seq: int
    withdrawn_at: int | None = None  # the seq of the event that withdrew it

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "at": self.at, "authenticated_by": self.authenticated_by, "head_sha": self.head_sha,
                "digests": dict(self.digests), "required_approvals": self.required, "event": self.seq,
                "withdrawn_by_event": self.withdrawn_at}


@dataclass(frozen=True)
class Override:
    finding: str
    by: str
    reason: str
    expires_at: str
    at: str
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"finding": self.finding, "by": self.by, "reason": self.reason, "expires_at": self.expires_at,
                "at": self.at, "event": self.seq}


@dataclass(frozen=True)
class StackApply:
    """One stack's apply: what started it, against which commit and plan, which approvals counted, how it ended."""

    stack: str
    by: str
    started_at: str
    head_sha: str
    digest: str
    seq: int
    counted: tuple[str, ...]  # who approved exactly this commit and plan digest before it started
    required: int | None  # the approvals those approvals said were needed (None: no approval to say)
    authority: str | None = None  # a drift revert the rules let the gateway apply alone: the gateway.yaml commit
    status: str = "running"  # succeeded | failed | interrupted | running
    finished_at: str | None = None
    applied: tuple[str, ...] = ()
    failed_address: str | None = None
    error: str | None = None

    @property
    def bound(self) -> bool:
        """Its required approvals were of exactly what it applied (or the rules let the gateway apply it alone)."""
        if self.authority is not None:
            return True
        return bool(self.counted) and len(self.counted) >= (self.required or 1)

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "by": self.by, "started_at": self.started_at, "head_sha": self.head_sha,
                "digest": self.digest, "event": self.seq, "counted_approvals": list(self.counted),
                "required_approvals": self.required, "authority": self.authority, "status": self.status,
                "finished_at": self.finished_at, "applied": len(self.applied), "failed_address": self.failed_address,
                "error": self.error}


@dataclass(frozen=True)
class ChangeRow:
    """One change applied (or attempted) in the period, as the trail tells it."""

    proposal_id: int
    repository: str
    stacks: tuple[str, ...]
    environments: tuple[str, ...]
    reason: str
    requester: str
    proposer: str
    proposer_kind: str
    approvals: tuple[Approval, ...]
    applies: tuple[StackApply, ...]
    overrides: tuple[Override, ...]
    findings: tuple[str, ...]
    risk: str
    required_approvals: int | None
    approved_commit: str | None
    approved_digests: Mapping[str, str]
    applied_commit: str | None
    applied_digests: Mapping[str, str]
    applied_at: str | None
    merge_sha: str | None
    outcome: str  # applied | failed | partial | unmerged | applying
    flags: tuple[str, ...]
    rolls_back: int | None = None
    seqs: tuple[int, ...] = ()  # the change's own events

    def to_json(self) -> dict[str, Any]:
        return {"proposal": self.proposal_id, "repository": self.repository, "stacks": list(self.stacks),
                "environments": list(self.environments), "reason": self.reason, "requester": self.requester,
                "proposer": self.proposer, "proposer_kind": self.proposer_kind,
                "approvals": [a.to_json() for a in self.approvals], "applies": [a.to_json() for a in self.applies],
                "overrides": [o.to_json() for o in self.overrides], "findings": list(self.findings),
                "risk": self.risk, "required_approvals": self.required_approvals,
                "approved_commit": self.approved_commit, "approved_digests": dict(self.approved_digests),
                "applied_commit": self.applied_commit, "applied_digests": dict(self.applied_digests),
                "applied_at": self.applied_at, "merge_sha": self.merge_sha, "outcome": self.outcome,
                "flags": list(self.flags), "rolls_back": self.rolls_back}

    def csv_row(self) -> dict[str, str]:
        approvers = "; ".join(f"{a.by} ({a.authenticated_by}, {a.at[:19]})" for a in self.approvals
                              if a.withdrawn_at is None)
        return {"proposal": str(self.proposal_id), "repository": self.repository, "stacks": " ".join(self.stacks),
                "environments": " ".join(self.environments), "requester": self.requester, "proposer": self.proposer,
                "proposer_kind": self.proposer_kind, "approvers": approvers,
                "approved_commit": self.approved_commit or "", "approved_digests": _pairs(self.approved_digests),
                "applied_commit": self.applied_commit or "", "applied_digests": _pairs(self.applied_digests),
                "applied_at": self.applied_at or "", "merge_sha": self.merge_sha or "", "outcome": self.outcome,
                "risk": self.risk, "required_approvals": "" if self.required_approvals is None
                else str(self.required_approvals), "findings": "; ".join(self.findings),
                "overrides": "; ".join(f"{o.finding} by {o.by} until {o.expires_at}: {o.reason}"
                                       for o in self.overrides),
                "flags": " ".join(self.flags), "rolls_back": "" if self.rolls_back is None else str(self.rolls_back),
                "reason": self.reason}


CSV_FIELDS = ("proposal", "repository", "stacks", "environments", "requester", "proposer", "proposer_kind",
              "approvers", "approved_commit", "approved_digests", "applied_commit", "applied_digests", "applied_at",
              "merge_sha", "outcome", "risk", "required_approvals", "findings", "overrides", "flags", "rolls_back",
              "reason")
EXCEPTION_CSV_FIELDS = ("kind", "proposal", "at", "summary", "events")


def _pairs(mapping: Mapping[str, str]) -> str:
    return "; ".join(f"{k}={v}" for k, v in sorted(mapping.items()))


@dataclass(frozen=True)
class ExceptionItem:
    """One thing an auditor samples first: what it is, the change (if one), when, in words, and the events."""

    kind: str
    summary: str
    at: str
    proposal_id: int | None = None
    seqs: tuple[int, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "proposal": self.proposal_id, "at": self.at, "summary": self.summary,
                "events": list(self.seqs), "details": dict(self.details)}

    def csv_row(self) -> dict[str, str]:
        return {"kind": self.kind, "proposal": "" if self.proposal_id is None else str(self.proposal_id),
                "at": self.at, "summary": self.summary, "events": " ".join(str(s) for s in self.seqs)}


@dataclass(frozen=True)
class Check:
    """A control that must find nothing, shown with what it looked at."""

    name: str
    rule: str
    checked: int
    what: str  # what `checked` counts
    violations: tuple[ExceptionItem, ...]

    @property
    def passed(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rule": self.rule, "checked": self.checked, "what": self.what,
                "passed": self.passed, "violations": [v.to_json() for v in self.violations]}


@dataclass(frozen=True)
class Population:
    period: Period
    scope: Scope
    rows: tuple[ChangeRow, ...]
    exceptions: tuple[ExceptionItem, ...]
    checks: tuple[Check, ...]

    def counts(self) -> dict[str, int]:
        by = {"changes": len(self.rows), "exceptions": len(self.exceptions)}
        for outcome in ("applied", "failed", "partial", "unmerged", "applying"):
            by[outcome] = sum(1 for r in self.rows if r.outcome == outcome)
        for flag in FLAGS:
            by[f"flag:{flag}"] = sum(1 for r in self.rows if flag in r.flags)
        return by

    def digest(self) -> str:
        """What the population is, for a sample's record: the sha256 of its proposal numbers, in order."""
        return "sha256:" + hashlib.sha256(",".join(str(r.proposal_id) for r in self.rows).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"period": self.period.to_json(), "scope": self.scope.to_json(), "counts": self.counts(),
                "population_digest": self.digest(), "checks": [c.to_json() for c in self.checks],
                "exceptions": [e.to_json() for e in self.exceptions], "changes": [r.to_json() for r in self.rows]}


# --- one change ---------------------------------------------------------------------------------------------------


def _approvals(events: Sequence[AuditEvent]) -> list[Approval]:
    found: list[Approval] = []
    for e in events:
        p = e.payload
        if e.kind == "approval":
            required = p.get("required_approvals")
            found.append(Approval(e.actor, e.at, str(p.get("authenticated_by", "")), str(p.get("head_sha", "")),
                                  dict(p.get("digests") or {}), required if isinstance(required, int) else None,
                                  e.seq))
        elif e.kind == "decision.withdrawn":
            found = [replace(a, withdrawn_at=e.seq) if a.by == p.get("by") and a.head_sha == p.get("head_sha")
                     and a.withdrawn_at is None else a for a in found]
    return found


def _applies(events: Sequence[AuditEvent], approvals: Sequence[Approval], requester: str,
             proposer: str) -> list[StackApply]:
    """Each stack's apply, with the approvals that counted for it: before it, of its commit and plan digest, not
    withdrawn by then, one per person, never the requester's or the proposer's own."""
    authority = next((str(e.payload.get("authority") or "gateway.yaml") for e in events
                      if e.kind == "drift.auto_revert"), None)
    applies: dict[int, dict[str, Any]] = {}  # StackApply's fields, each apply's filled in as its events come
    by_id: dict[Any, int] = {}
    for e in events:
        p = e.payload
        if e.kind == "apply.started" and e.stacks:
            stack, head, digest = e.stacks[0], str(p.get("head_sha", "")), str(p.get("digest", ""))
            counted = tuple(dict.fromkeys(
                a.by for a in approvals if a.seq < e.seq and a.head_sha == head and a.digests.get(stack) == digest
                and (a.withdrawn_at is None or a.withdrawn_at > e.seq) and a.by not in (requester, proposer)))
            required = max((a.required for a in approvals if a.by in counted and a.seq < e.seq and a.head_sha == head
                            and a.required is not None), default=None)
            applies[e.seq] = {"stack": stack, "by": e.actor, "started_at": e.at, "head_sha": head, "digest": digest,
                              "seq": e.seq, "counted": counted, "required": required,
                              "authority": authority if not counted else None}
            by_id[p.get("apply_id")] = e.seq
        elif e.kind in ("apply.succeeded", "apply.failed") and p.get("apply_id") in by_id:
            applies[by_id[p["apply_id"]]].update(
                status=e.kind.split(".")[1], finished_at=e.at, applied=tuple(p.get("applied") or ()),
                failed_address=p.get("failed_address"), error=p.get("error"))
        elif e.kind == "apply.interrupted":
            for apply_id in p.get("apply_ids") or ():
                started = applies.get(by_id.get(apply_id, -1))
                if started is not None and started.get("status", "running") == "running":
                    read = (p.get("read") or {}).get(started["stack"]) or {}
                    started.update(status="interrupted", finished_at=e.at,
                                   error=f"runner {p.get('runner')} stopped; read after: {read.get('result', 'unknown')}",
                                   applied=("(partly)",) if read.get("result") == "partly applied" else ())
    return [StackApply(**fields) for fields in applies.values()]


def _attempts(events: Sequence[AuditEvent], applies: Sequence[StackApply]) -> tuple[str, bool, bool]:
    """How the change ended (applied | failed | partial | unmerged | applying), and whether any attempt failed, and
    whether any failed part-way (something applied, the rest not)."""
    outcome, failed, partial = "applying", False, False
    attempt: list[StackApply] = []
    starts = {a.seq: a for a in applies}
    for e in events:
        if e.kind == "proposal.start_apply":
            attempt = []
        elif e.seq in starts:
            attempt.append(starts[e.seq])
        elif e.kind in ("proposal.fail", "proposal.interrupt"):
            failed = True
            done = any(a.status == "succeeded" or a.applied for a in attempt)
            partial = partial or done
            outcome = "partial" if done else "failed"
        elif e.kind in ("proposal.finish", "proposal.merge", "proposal.acknowledge_merge"):
            outcome = "applied"
        elif e.kind == "proposal.block_merge":
            outcome = "unmerged"
    return outcome, failed, partial


def _row(pid: int, events: Sequence[AuditEvent], repository: str,
         environments: Mapping[str, str | None]) -> ChangeRow:
    opened = next((e for e in events if e.kind == "proposal.opened"), None)
    requested = next((e for e in events if e.kind == "change.requested"), None)
    proposer = opened.actor if opened else "?"
    requester = requested.actor if requested else proposer
    drift_revert = bool(opened and opened.payload.get("kind") == "drift_revert")
    approvals = _approvals(events)
    applies = _applies(events, approvals, requester, proposer)
    outcome, failed, partial = _attempts(events, applies)
    succeeded = {a.stack: a for a in applies if a.status == "succeeded"}  # the last one of each stack
    plans = {(e.stacks[0], e.payload.get("digest")): e.payload for e in events if e.kind == "plan" and e.stacks}
    applied_plans = [plans.get((a.stack, a.digest)) or {} for a in succeeded.values()] or [
        plans.get((a.stack, a.digest)) or {} for a in applies]
    risk = max((str((p.get("risk") or {}).get("level", "low")) for p in applied_plans),
               key=lambda level: RISK_ORDER.index(level) if level in RISK_ORDER else 0, default="low")
    findings = tuple(dict.fromkeys(f"{f.get('stack')}:{f.get('rule')}:{f.get('address')} ({f.get('severity')})"
                                   for p in applied_plans for f in p.get("findings") or ()))
    overrides = tuple(Override(str(e.payload.get("finding")), e.actor, str(e.payload.get("reason", "")),
                               str(e.payload.get("expires_at", "")), e.at, e.seq)
                      for e in events if e.kind == "policy.override")
    final = list(succeeded.values()) or applies
    merged = next((e for e in reversed(events) if e.kind == "merged"), None)
    rollback = next((e for e in events if e.kind == "rollback.opened"), None)
    stacks = tuple(sorted({a.stack for a in applies}))
    flags = [flag for flag, present in (
        ("override", bool(overrides)), ("drift-revert", drift_revert), ("rollback", rollback is not None),
        ("failed", failed and not partial), ("partial", partial),
        ("unmerged", any(e.kind == "proposal.block_merge" for e in events))) if present]
    return ChangeRow(
        proposal_id=pid, repository=repository, stacks=stacks,
        environments=tuple(sorted({env for s in stacks if (env := environments.get(s))})),
        reason=str(requested.payload.get("reason", "")) if requested else (
            f"revert drift on {', '.join(stacks)}" if drift_revert else ""),
        requester=requester, proposer=proposer, proposer_kind=opened.actor_kind if opened else "?",
        approvals=tuple(approvals), applies=tuple(applies), overrides=overrides, findings=findings, risk=risk,
        required_approvals=max((a.required for a in final if a.required is not None), default=None),
        approved_commit=_one({a.head_sha for a in final if a.counted}),
        approved_digests={a.stack: a.digest for a in final if a.counted},
        applied_commit=_one({a.head_sha for a in succeeded.values()}),
        applied_digests={a.stack: a.digest for a in succeeded.values()},
        applied_at=max((a.finished_at or a.started_at for a in succeeded.values()), default=None),
        merge_sha=str(merged.payload.get("merge_sha")) if merged else None, outcome=outcome, flags=tuple(flags),
        rolls_back=int(rollback.payload["rolls_back"]) if rollback and isinstance(
            rollback.payload.get("rolls_back"), int) else None,
        seqs=tuple(e.seq for e in events))


def _one(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else (", ".join(sorted(values)) if values else None)


# --- the population ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadChange:
    """One change as the population reads it: its row (flags from the trail around it set), what an auditor samples
    first in it, and what each check finds in it."""

    row: ChangeRow
    exceptions: tuple[ExceptionItem, ...]
    unapproved: tuple[ExceptionItem, ...]
    self_approved: tuple[ExceptionItem, ...]


@dataclass(frozen=True)
class TrailIndex:
    """The events a population reads, as it reads them: each change's story in order, the changes with an apply
    started in the period, and the events about windows, pushes and identities. Extended, never edited: a copy
    takes the newer events (the trail only grows), so a reader of this one is never disturbed."""

    period: Period
    stories: Mapping[int, tuple[AuditEvent, ...]]
    applied_in: frozenset[int]
    around: tuple[AuditEvent, ...]
    newest: int = 0  # the seq of the newest event taken in

    @classmethod
    def of(cls, events: Iterable[AuditEvent], period: Period) -> TrailIndex:
        by_seq = {e.seq: e for e in events}
        return cls(period, {}, frozenset(), ()).extended([by_seq[seq] for seq in sorted(by_seq)])

    def extended(self, newer: Sequence[AuditEvent]) -> TrailIndex:
        """With these events, oldest first, all newer than the ones it holds."""
        stories: dict[int, list[AuditEvent]] = defaultdict(list)
        applied_in, around = set(self.applied_in), list(self.around)
        for e in newer:
            if e.seq <= self.newest:
                raise ValueError(f"event {e.seq} is not newer than the index's newest, {self.newest}")
            if e.proposal_id is not None:
                stories[e.proposal_id].append(e)
                if e.kind == "apply.started" and self.period.holds(e.at):
                    applied_in.add(e.proposal_id)
            if e.kind.startswith(_AROUND):
                around.append(e)
        if not newer:
            return self
        merged = dict(self.stories)
        for pid, added in stories.items():
            merged[pid] = merged.get(pid, ()) + tuple(added)
        return TrailIndex(self.period, merged, frozenset(applied_in), tuple(around), newer[-1].seq)


def build_population(events: Iterable[AuditEvent], period: Period, scope: Scope = Scope(), repository: str = "",
                     environments: Mapping[str, str | None] | None = None) -> Population:
    """Every change with an apply started in the period (its whole story read, whenever it began), the windows and
    pushes of the period, what an auditor samples first, and the two checks, for the scope asked."""
    return population_of(TrailIndex.of(events, period), scope, repository, environments)


def population_of(index: TrailIndex, scope: Scope = Scope(), repository: str = "",
                  environments: Mapping[str, str | None] | None = None,
                  known: dict[tuple[Any, ...], ReadChange] | None = None) -> Population:
    """`build_population` of the events an index holds. `known` keeps the changes already read (a change whose story
    and the trail around it are the same reads the same): a caller that asks again after the trail moved reads only
    the changes that moved; it is left holding the changes this population read."""
    environments = environments or {}
    windows, pushes = windows_of(index.around), pushes_of(index.around)
    earlier = {} if known is None else dict(known)
    context = (repository, tuple(sorted(environments.items(), key=str)), len(index.around),
               index.around[-1].seq if index.around else 0)
    identities: Identities | None = None
    read: dict[tuple[Any, ...], ReadChange] = {}
    for pid in sorted(index.applied_in):
        story = index.stories[pid]
        key = (pid, story[-1].seq, len(story), context)
        change = earlier.get(key)
        if change is None:
            identities = identities or Identities.of(index.around)
            row = _with_context(_row(pid, story, repository, environments), windows.values(), pushes)
            change = ReadChange(row, tuple(_row_exceptions(row)), _unapproved(row), _self_approved(row, identities))
        read[key] = change
    if known is not None:
        known.clear()
        known.update(read)
    chosen = [c for c in read.values() if _in_scope(c.row, scope)]
    checks = (_approvals_check(chosen), _segregation_check(chosen))
    windows_in, pushes_in = _around_in(windows.values(), pushes, index.period, scope, environments)
    found = [_window_exception(w) for w in windows_in] + [_push_exception(p) for p in pushes_in] + [
        item for c in chosen for item in c.exceptions] + [v for c in checks for v in c.violations]
    rank = {kind: i for i, kind in enumerate(EXCEPTION_KINDS)}
    found.sort(key=lambda item: (rank[item.kind], item.at, item.proposal_id or 0))
    return Population(index.period, scope, tuple(c.row for c in chosen), tuple(found), checks)


def _window_exception(w: Window) -> ExceptionItem:
    """A break-glass window as an auditor samples it: who, when, and how its drift was settled."""
    confirmed = f", confirmed by {w.confirmed_by}" if w.confirmed_by else ""
    span = f"open {w.opened_at[:19]} to {(w.ended_at or 'now')[:19]}" if w.opened_at else "never opened"
    return ExceptionItem("break-glass", f"break-glass window {w.id} on {w.stack} ({w.reason}): asked by "
                                        f"{w.asked_by}{confirmed}, {span}; {w.resolution()}",
                         w.requested_at, None, tuple(w.seqs), {
                             "window": w.id, "stack": w.stack, "asked_by": w.asked_by,
                             "confirmed_by": w.confirmed_by, "opened_at": w.opened_at,
                             "ended_at": w.ended_at, "drifted": sorted(w.drifted),
                             "codified_or_reverted_by": [pid for pid, _, _ in w.settled_by if pid],
                             "settled_at": w.settled_at, "overdue_at": w.overdue_at,
                             "acknowledged_by": w.acknowledged[0] if w.acknowledged else None})


def _push_exception(p: Push) -> ExceptionItem:
    """A commit on main the gateway did not merge, and who acknowledged it (or that nobody did)."""
    said = (f"acknowledged by {p.acknowledged[0]} at {p.acknowledged[1][:19]}: {p.acknowledged[2]}"
            if p.acknowledged else "NOT acknowledged: applies on its stacks wait")
    seqs = (p.seq,) + ((p.acknowledged[3],) if p.acknowledged else ())
    return ExceptionItem("pushed-outside", f"commit {p.sha[:12]} by {p.author} reached main outside the "
                                           f"gateway (stacks {', '.join(p.stacks) or 'none'}); {said}",
                         p.at, None, seqs, {
                             "sha": p.sha, "author": p.author, "stacks": list(p.stacks),
                             "acknowledged_by": p.acknowledged[0] if p.acknowledged else None,
                             "acknowledged_at": p.acknowledged[1] if p.acknowledged else None,
                             "reason": p.acknowledged[2] if p.acknowledged else None})


def _around_in(windows: Iterable[Window], pushes: Iterable[Push], period: Period, scope: Scope,
               environments: Mapping[str, str | None]) -> tuple[list[Window], list[Push]]:
    """The break-glass windows asked for and the pushes made in the period, within the scope."""
    def fits(stacks: Sequence[str], people: Sequence[Any]) -> bool:
        return ((scope.stack is None or scope.stack in stacks)
                and (scope.environment is None or scope.environment in {environments.get(s) for s in stacks})
                and (scope.person is None or scope.person in people))

    return ([w for w in windows if period.holds(w.requested_at) and fits(
                [w.stack], [w.asked_by, w.confirmed_by, w.acknowledged and w.acknowledged[0]])],
            [p for p in pushes if period.holds(p.at) and fits(p.stacks, [p.author, p.acknowledged and p.acknowledged[0]])])


def change_of(events: Iterable[AuditEvent], proposal_id: int, repository: str = "",
              environments: Mapping[str, str | None] | None = None) -> tuple[ChangeRow, list[int]] | None:
    """One change's row, whether or not it was applied, and the seqs of the events around it that set its flags
    (the break-glass windows it settled or ran in, the pushes to main under its stacks); None when the trail has
    no event of it."""
    ordered = sorted({e.seq: e for e in events}.values(), key=lambda e: e.seq)
    story = [e for e in ordered if e.proposal_id == proposal_id]
    if not story:
        return None
    windows, pushes = windows_of(ordered), pushes_of(ordered)
    row = _with_context(_row(proposal_id, story, repository, environments or {}), windows.values(), pushes)
    around: list[int] = []
    for w in windows.values():
        if any(pid == proposal_id for pid, _, _ in w.settled_by) or any(
                a.stack == w.stack and w.covers(a.started_at) for a in row.applies):
            around += w.seqs
    last = max((a.seq for a in row.applies), default=0)
    for p in pushes:
        if row.seqs[0] < p.seq < last and set(p.stacks) & set(row.stacks):
            around += [p.seq] + ([p.acknowledged[3]] if p.acknowledged else [])
    return row, sorted(set(around))


def _in_scope(row: ChangeRow, scope: Scope) -> bool:
    people = {row.requester, row.proposer, *(a.by for a in row.approvals), *(a.by for a in row.applies),
              *(o.by for o in row.overrides)}
    return ((scope.repository is None or scope.repository == row.repository)
            and (scope.stack is None or scope.stack in row.stacks)
            and (scope.environment is None or scope.environment in row.environments)
            and (scope.person is None or scope.person in people))


def _with_context(row: ChangeRow, windows: Iterable[Window], pushes: Sequence[Push]) -> ChangeRow:
    """The flags only the trail around a change can set: it settled break-glass drift or ran in a window, or main
    moved outside the gateway under its stacks while it waited."""
    flags = set(row.flags)
    for w in windows:
        if w.stack in row.stacks and any(a.stack == w.stack and w.covers(a.started_at) for a in row.applies) or any(
                pid == row.proposal_id for pid, _, _ in w.settled_by):
            flags.add("break-glass")
    first, last = (row.seqs[0], max(a.seq for a in row.applies)) if row.applies else (0, 0)
    if any(first < p.seq < last and not set(p.stacks).isdisjoint(row.stacks) for p in pushes):
        flags.add("pushed-outside")
    if flags == set(row.flags):
        return row
    return replace(row, flags=tuple(f for f in FLAGS if f in flags))


def _row_exceptions(row: ChangeRow) -> list[ExceptionItem]:
    pid, found = row.proposal_id, []
    for o in row.overrides:
        found.append(ExceptionItem("override", f"proposal {pid} applied with {o.finding} overridden by {o.by} until "
                                               f"{o.expires_at[:19]}: {o.reason}", o.at, pid, (o.seq,), o.to_json()))
    if "drift-revert" in row.flags:
        authority = next((a.authority for a in row.applies if a.authority), None)
        how = (f"applied by the gateway alone, as gateway.yaml at {authority[:12]} allows" if authority
               else f"approved by {', '.join(sorted({b for a in row.applies for b in a.counted})) or 'nobody'}")
        found.append(ExceptionItem("drift-revert", f"proposal {pid} reverted drift on {', '.join(row.stacks)}: {how}",
                                   row.applies[0].started_at, pid, (row.seqs[0],), {"authority": authority}))
    if row.rolls_back is not None:
        found.append(ExceptionItem("rollback", f"proposal {pid}: {row.reason}",
                                   row.applies[0].started_at, pid, (row.seqs[0],), {"rolls_back": row.rolls_back}))
    for a in row.applies:
        if a.status in ("failed", "interrupted"):
            kind = "partial-apply" if "partial" in row.flags else "failed-apply"
            where = f" at {a.failed_address}" if a.failed_address else ""
            found.append(ExceptionItem(kind, f"proposal {pid}: the apply of {a.stack} {a.status}{where} at "
                                             f"{(a.finished_at or a.started_at)[:19]}"
                                             f"{': ' + a.error if a.error else ''}; the change ended {row.outcome}",
                                       a.finished_at or a.started_at, pid, (a.seq,), a.to_json()))
    if "unmerged" in row.flags:
        found.append(ExceptionItem("unmerged", f"proposal {pid} was applied but main could not take its merge; "
                                               f"it ended {row.outcome}" + (f", merged as {row.merge_sha[:12]}"
                                                                            if row.merge_sha else ""),
                                   row.applied_at or row.applies[-1].started_at, pid, (row.seqs[-1],), {}))
    return found


def _unapproved(row: ChangeRow) -> tuple[ExceptionItem, ...]:
    """The change's applies that ran without their required approvals of exactly what they applied."""
    return tuple(
        ExceptionItem("unapproved-apply", f"proposal {row.proposal_id}: the apply of {a.stack} at {a.started_at[:19]} "
                                          f"counted {len(a.counted)} of {a.required or 1} approval(s) of commit "
                                          f"{a.head_sha[:12]} and plan {a.digest[:19]}…", a.started_at,
                      row.proposal_id, (a.seq,), a.to_json())
        for a in row.applies if not a.bound)


def _self_approved(row: ChangeRow, identities: Identities) -> tuple[ExceptionItem, ...]:
    """The change's approvals made by its requester or proposer, through any identity."""
    found = []
    for a in row.approvals:
        for role, name in (("requester", row.requester), ("proposer", row.proposer)):
            how = identities.same(a.by, name)
            if how is not None:
                found.append(ExceptionItem(
                    "self-approval", f"proposal {row.proposal_id}: approved by {a.by}, the same person as its "
                                     f"{role} {name} ({how})", a.at, row.proposal_id, (a.seq,),
                    {"approver": a.by, role: name, "through": how}))
                break
    return tuple(found)


def _approvals_check(changes: Sequence[ReadChange]) -> Check:
    return Check("approvals-of-what-ran", "every apply counted its required approvals, each of exactly the commit "
                                          "and plan digest it applied, made before it started and not withdrawn",
                 sum(len(c.row.applies) for c in changes), "applies",
                 tuple(v for c in changes for v in c.unapproved))


def _segregation_check(changes: Sequence[ReadChange]) -> Check:
    return Check("requester-is-not-approver", "no change was approved by its requester or proposer through any "
                                              "identity (principal, OIDC issuer and subject, GitHub account, the "
                                              "person an agent acts for)",
                 sum(len(c.row.approvals) for c in changes), "approvals",
                 tuple(v for c in changes for v in c.self_approved))


# --- the sample ----------------------------------------------------------------------------------------------------

SAMPLE_METHOD = ("each change of the population is ranked by the SHA-256 (hex) of '<seed>:<proposal number>'; "
                 "the lowest `size` are taken")


@dataclass(frozen=True)
class Sample:
    seed: str
    size: int
    population: int
    population_digest: str
    selected: tuple[int, ...]
    period: Period
    scope: Scope

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "size": self.size, "population": self.population,
                "population_digest": self.population_digest, "selected": list(self.selected),
                "period": self.period.to_json(), "scope": self.scope.to_json(), "method": SAMPLE_METHOD}


def draw_sample(population: Population, size: int, seed: str) -> Sample:
    """A reproducible selection: the same population, size and seed always give the same changes, by a rule any
    tool can redo (SAMPLE_METHOD)."""
    if size < 1:
        raise ValueError("a sample has at least one change (--size)")
    if not seed:
        raise ValueError("a sample needs a seed (--seed): it is what makes it reproducible")
    ranked = sorted(population.rows, key=lambda r: (hashlib.sha256(f"{seed}:{r.proposal_id}".encode()).hexdigest(),
                                                    r.proposal_id))
    chosen = tuple(sorted(r.proposal_id for r in ranked[:size]))
    return Sample(seed, size, len(population.rows), population.digest(), chosen, population.period, population.scope)


def to_json_text(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)


def to_csv(rows: Sequence[Mapping[str, str]], fields: Sequence[str]) -> str:
    """Rows as CSV with a header (what the CLI prints and the API and the page serve)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
