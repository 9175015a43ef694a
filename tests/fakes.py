"""In-memory fakes of the ports (cosmicpython's FakeRepository): each subclasses the Protocol it implements,
so a use case or a rule can be tested with no database, no git and no engine.

A fake is a real, small implementation — it keeps state and answers as the SQL adapter would — plus a
way to make the dependency fail the way production's does (a database that stops answering).
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.config import Settings
from gateway.domain.applies import ApplyRecord, ApplyStatus
from gateway.domain.apply_blockers import MainPush
from gateway.domain.audit import GENESIS, AuditEvent, EventQuery, event_hash, event_outcome
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.drift import DriftRecord, DriftStatus
from gateway.domain.errors import BackendError, Conflict, NotFound
from gateway.domain.jobs import JobKind
from gateway.domain.lifecycle import ACTIVE, INITIAL
from gateway.domain.locks import LockAttempt, StackLock, unmerged_holder
from gateway.domain.notifications import Channel, Notice, Notification, NotificationStatus
from gateway.domain.policy import Override
from gateway.domain.preview import DriftEntry
from gateway.domain.principals import Actor, Principal, PrincipalKind, Role
from gateway.domain.proposal import (
    Decision,
    DecisionRecord,
    ListedProposal,
    PlanSummary,
    Proposal,
    ProposalKind,
    StackPlan,
)
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.repositories import DEFAULT_REPOSITORY, Repository
from gateway.domain.scrubbing import Scrubber
from gateway.ports import (
    AuditLog,
    Clock,
    DayTwoRecords,
    DeclarationRepo,
    Engine,
    Jobs,
    MainRecords,
    Notifications,
    Principals,
    Proposals,
    Repositories,
    StackLocks,
    StackRecords,
    Store,
    UnitOfWork,
)
from gateway.services.workspace import Workspace

T = TypeVar("T")

NEVER = datetime(9999, 1, 1, tzinfo=UTC)


class FakeClock(Clock):
    def __init__(self, start: datetime | None = None):
        self.moment = start or datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


class FakeStackLocks(StackLocks):
    """Stack locks in a dict. `down()` makes every call fail as a database outage does; `slow()` makes them hang."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or FakeClock()
        self.rows: dict[str, StackLock] = {}
        self.renewals = 0
        self._down: str | None = None
        self._answering = threading.Event()
        self._answering.set()

    # what goes wrong underneath
    def down(self, why: str = "connection refused") -> None:
        self._down = why

    def slow(self) -> None:
        self._answering.clear()

    def up(self) -> None:
        self._down = None
        self._answering.set()

    def _call(self) -> None:
        self._answering.wait(30)
        if self._down:
            raise BackendError(f"database unavailable or busy: {self._down}")

    # the port
    def acquire(self, stack: str, holder: str, ttl_seconds: float, proposal_id: int | None = None) -> LockAttempt:
        self._call()
        if stack in self.rows:
            return LockAttempt(False, self.rows[stack])
        now = self.clock.now()
        self.rows[stack] = StackLock(stack, holder, now, now + timedelta(seconds=ttl_seconds), proposal_id)
        return LockAttempt(True)

    def set_apply(self, stack: str, holder: str, apply_id: int) -> None:
        self._call()
        lock = self.rows.get(stack)
        if lock and lock.holder == holder:
            self.rows[stack] = StackLock(lock.stack, holder, lock.acquired_at, lock.expires_at, lock.proposal_id,
                                         apply_id)

    def renew(self, stacks: Sequence[str], holder: str, ttl_seconds: float) -> list[str]:
        self._call()
        self.renewals += 1
        lost = []
        for stack in stacks:
            lock = self.rows.get(stack)
            if lock is None or lock.holder != holder:
                lost.append(stack)
                continue
            self.rows[stack] = StackLock(stack, holder, lock.acquired_at,
                                         self.clock.now() + timedelta(seconds=ttl_seconds), lock.proposal_id,
                                         lock.apply_id)
        return lost

    def hand_over(self, stack: str, holder: str, new_holder: str) -> bool:
        self._call()
        lock = self.rows.get(stack)
        if lock is None or lock.holder != holder:
            return False
        self.rows[stack] = StackLock(stack, new_holder, lock.acquired_at, NEVER, lock.proposal_id)
        return True

    def release(self, stack: str, holder: str) -> None:
        self._call()
        if stack in self.rows and self.rows[stack].holder == holder:
            del self.rows[stack]

    def holder(self, stack: str) -> StackLock | None:
        self._call()
        return self.rows.get(stack)

    def expired(self) -> list[StackLock]:
        self._call()
        return [lock for lock in self.rows.values() if lock.expired(self.clock.now())]

    def take_over_expired(self, holder: str, new_holder: str, ttl_seconds: float) -> list[StackLock]:
        self._call()
        taken = [lock for lock in self.rows.values() if lock.holder == holder and lock.expired(self.clock.now())]
        for lock in taken:
            self.rows[lock.stack] = StackLock(lock.stack, new_holder, self.clock.now(),
                                              self.clock.now() + timedelta(seconds=ttl_seconds), lock.proposal_id,
                                              lock.apply_id)
        return taken

    def keep_unmerged(self, stacks: Sequence[str], holder: str, proposal_id: int) -> list[str]:
        self._call()
        kept_by, others = unmerged_holder(proposal_id), []
        for stack in stacks:
            lock = self.rows.get(stack)
            if lock is None or lock.holder in (holder, kept_by):
                self.rows[stack] = StackLock(stack, kept_by, self.clock.now(), NEVER, proposal_id)
            else:
                others.append(stack)
        return others


# ---------------------------------------------------------------------------------------------------------------
# The unit of work in memory (cosmicpython's FakeUnitOfWork): the records as dicts and lists, copied at the start of
# each write and put back if it fails, so a use case that raises leaves nothing behind, as a rolled-back transaction.
# Each repository answers as its SQL adapter does for what it implements (tests/test_fakes_contract.py runs the same
# assertions on both); what it does not implement raises NotImplementedError, never the Protocol's silent None.


class ReadOnlyWrite(Exception):
    """A read unit of work was asked to write (SQLite's query_only connection, PostgreSQL's READ ONLY refuse it)."""


def _unfaked(port: type, name: str) -> Callable[..., Any]:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.{name} is not faked: fake it, or test this on a workspace")
    return refuse


def only_what_is_faked(cls: type[T]) -> type[T]:
    """Every method of the port `cls` subclasses that `cls` does not define raises NotImplementedError (inherited
    from a Protocol, it would return None: an answer no adapter gives)."""
    ports = [b for b in cls.__mro__[1:] if getattr(b, "_is_protocol", False) and b.__module__ == "gateway.ports"]
    for port in ports:
        for name, member in vars(port).items():
            if callable(member) and not name.startswith("_") and not any(name in vars(c) for c in cls.__mro__
                                                                          if c not in ports and c is not object):
                setattr(cls, name, _unfaked(port, name))
    return cls


@dataclass
class Tables:
    """What the fake store holds: the rows of each table it fakes."""

    principals: dict[str, Principal] = field(default_factory=dict)
    proposals: dict[int, dict[str, Any]] = field(default_factory=dict)
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[int, dict[str, Any]] = field(default_factory=dict)
    overrides: dict[int, dict[str, Any]] = field(default_factory=dict)
    applies: dict[int, ApplyRecord] = field(default_factory=dict)
    drift_records: dict[int, DriftRecord] = field(default_factory=dict)
    windows: dict[int, dict[str, Any]] = field(default_factory=dict)
    markers: dict[str, str] = field(default_factory=dict)
    pushes: dict[str, dict[str, Any]] = field(default_factory=dict)
    serials: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    notifications: dict[int, Notification] = field(default_factory=dict)
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[AuditEvent] = field(default_factory=list)
    head: tuple[int, str] | None = None


class _Faked:
    """What each fake repository shares: the tables, the clock rows are stamped by, whether it may write."""

    def __init__(self, tables: Tables, clock: Clock, readonly: bool):
        self.t, self.clock, self.readonly = tables, clock, readonly

    def _writing(self) -> None:
        if self.readonly:
            raise ReadOnlyWrite("a read unit of work does not write")

    @staticmethod
    def _next(rows: Mapping[int, Any]) -> int:
        return max(rows, default=0) + 1


@only_what_is_faked
class FakePrincipals(_Faked, Principals):
    def add(self, name: str, kind: PrincipalKind, roles: frozenset[Role], groups: frozenset[str],
            token_hash: str = "", acting_for: str | None = None) -> Principal:
        self._writing()
        if self.by_name(name) is not None:
            raise Conflict(f"a principal named {name!r} already exists")
        principal = Principal(str(uuid.uuid4()), name, kind, frozenset(roles), frozenset(groups), acting_for)
        self.t.principals[principal.id] = principal
        return principal

    def count(self) -> int:
        return len(self.t.principals)

    def by_name(self, name: str) -> Principal | None:
        return next((p for p in self.t.principals.values() if p.name == name), None)

    def get(self, pid: str) -> Principal:
        if pid not in self.t.principals:
            raise NotFound(f"unknown principal {pid}")
        return self.t.principals[pid]

    def set_disabled(self, pid: str, at: datetime | None) -> None:
        self._writing()
        self.t.principals[pid] = replace(self.get(pid), disabled=at is not None)

    def list(self) -> list[Principal]:
        return sorted(self.t.principals.values(), key=lambda p: p.name)


@only_what_is_faked
class FakeProposals(_Faked, Proposals):
    """Proposals, plans, decisions, overrides and applies; `save` as the SQL one: compare-and-set, events handed on."""

    def __init__(self, tables: Tables, clock: Clock, readonly: bool, saved: Callable[[Proposal], None]):
        super().__init__(tables, clock, readonly)
        self.saved = saved

    def add(self, branch: str, base_sha: str, head_sha: str, requester: Principal, proposer: Principal,
            reason: str, stacks: Sequence[str], changed_paths: Sequence[str], agent_claim: str | None = None,
            prompt_version: str | None = None, model: str | None = None,
            kind: ProposalKind = ProposalKind.CHANGE) -> int:
        self._writing()
        pid = self._next(self.t.proposals)
        self.t.proposals[pid] = {
            "id": pid, "kind": kind, "branch": branch, "base_sha": base_sha, "head_sha": head_sha,
            "requester_id": requester.id, "proposer_id": proposer.id, "reason": reason, "status": INITIAL,
            "stacks": tuple(stacks), "changed_paths": tuple(changed_paths), "agent_claim": agent_claim,
            "prompt_version": prompt_version, "model": model, "merge_sha": None, "applied_sha": None,
            "created_at": self.clock.now()}
        return pid

    def repository_of(self, proposal_id: int) -> str | None:
        return DEFAULT_REPOSITORY if proposal_id in self.t.proposals else None

    def open_for_branch(self, branch: str) -> int | None:
        return next((r["id"] for r in self.t.proposals.values() if r["branch"] == branch and r["status"] in ACTIVE),
                    None)

    def get(self, proposal_id: int, lock: bool = False) -> Proposal:
        row = self.t.proposals.get(proposal_id)
        if row is None:
            raise NotFound(f"no proposal {proposal_id}")
        person = FakePrincipals(self.t, self.clock, True).get
        proposal = Proposal(row["id"], row["branch"], row["base_sha"], row["head_sha"], person(row["requester_id"]),
                            person(row["proposer_id"]), row["reason"], row["stacks"], row["status"],
                            changed_paths=row["changed_paths"], merge_sha=row["merge_sha"],
                            agent_claim=row["agent_claim"], applied_sha=row["applied_sha"], kind=row["kind"])
        proposal.plans = {p["stack"]: p["plan"] for p in self.t.plans.values()  # the newest of each stack wins
                          if p["proposal_id"] == proposal_id and p["plan"].head_sha == proposal.head_sha}
        proposal.decisions = [DecisionRecord(d["id"], person(d["principal_id"]), d["decision"], d["head_sha"],
                                             d["digests"], d["comment"], d["auth"], d["at"])
                              for d in self.t.decisions.values() if d["proposal_id"] == proposal_id]
        proposal.overrides = [Override(o["finding_key"], person(o["principal_id"]).name, o["reason"], o["expires_at"])
                              for o in self.t.overrides.values() if o["proposal_id"] == proposal_id]
        return proposal

    def list(self, status: str | None = None) -> list[ListedProposal]:
        rows = sorted(self.t.proposals.values(), key=lambda r: -r["id"])
        return [ListedProposal(r["id"], r["status"], r["created_at"], r["model"], r["prompt_version"])
                for r in rows if status in (None, r["status"].value)]

    def update_head(self, proposal_id: int, head_sha: str, stacks: Sequence[str], changed_paths: Sequence[str]) -> None:
        self._writing()
        self.t.proposals[proposal_id].update(head_sha=head_sha, stacks=tuple(stacks), changed_paths=tuple(changed_paths))

    def save(self, proposal: Proposal) -> None:
        if not proposal.events:
            return
        self._writing()
        row, first = self.t.proposals.get(proposal.id), proposal.events[0]
        if row is None or row["status"] != first.before:
            raise Conflict(f"proposal {proposal.id} changed while it was being moved from {first.before.value}; "
                           "try again")
        row["status"] = proposal.status
        for moved in proposal.events:
            row.update({k: v for k, v in (("merge_sha", moved.merge_sha), ("applied_sha", moved.applied_sha)) if v})
        self.saved(proposal)

    def add_plan(self, proposal_id: int, stack: str, head_sha: str, main_sha: str, digest: str, document: str,
                 state_serial: int, state_lineage: str, summary: PlanSummary, preview: str,
                 artifact: bytes | None = None) -> int:
        self._writing()
        plan_id = self._next(self.t.plans)
        plan = StackPlan(plan_id, stack, head_sha, digest, state_serial, summary.counts, summary.destructive,
                         summary.risk.level, summary.risk.reasons, summary.findings, main_sha, summary.changed,
                         summary.drift, self.clock.now())
        self.t.plans[plan_id] = {"proposal_id": proposal_id, "stack": stack, "plan": plan, "document": document,
                                 "preview": preview, "artifact": artifact, "lineage": state_lineage}
        return plan_id

    def plan_document(self, plan_id: int) -> str:
        if plan_id not in self.t.plans:
            raise NotFound(f"no saved plan {plan_id}")
        return str(self.t.plans[plan_id]["document"])

    def plan_preview(self, plan_id: int) -> str | None:
        return self.t.plans[plan_id]["preview"] if plan_id in self.t.plans else None

    def add_decision(self, proposal_id: int, principal: Principal, decision: Decision, head_sha: str,
                     digests: Mapping[str, str], comment: str, auth: str) -> int:
        self._writing()
        did = self._next(self.t.decisions)
        self.t.decisions[did] = {"id": did, "proposal_id": proposal_id, "principal_id": principal.id,
                                 "decision": decision, "head_sha": head_sha, "digests": dict(digests),
                                 "comment": comment, "auth": auth, "at": self.clock.now()}
        return did

    def add_override(self, proposal_id: int, finding_key: str, principal: Principal, reason: str,
                     expires_at: datetime) -> int:
        self._writing()
        oid = self._next(self.t.overrides)
        self.t.overrides[oid] = {"proposal_id": proposal_id, "finding_key": finding_key, "principal_id": principal.id,
                                 "reason": reason, "expires_at": expires_at}
        return oid

    def merged_as(self, sha: str) -> int | None:
        return next((r["id"] for r in self.t.proposals.values() if sha and r["merge_sha"] == sha), None)

    def start_apply(self, proposal_id: int, stack: str, plan_id: int, runner: str, commit_sha: str) -> int:
        self._writing()
        aid = self._next(self.t.applies)
        self.t.applies[aid] = ApplyRecord(aid, proposal_id, stack, plan_id, ApplyStatus.RUNNING, runner, (), None,
                                          commit_sha, self.clock.now(), None)
        return aid

    def finish_apply(self, apply_id: int, status: ApplyStatus, applied: Sequence[str], error: str | None) -> None:
        self._writing()
        self.t.applies[apply_id] = replace(self.t.applies[apply_id], status=status, applied=tuple(applied),
                                           error=error, finished_at=self.clock.now())

    def get_apply(self, apply_id: int) -> ApplyRecord | None:
        return self.t.applies.get(apply_id)

    def applies_of(self, proposal_id: int) -> list[ApplyRecord]:
        return [a for a in self.t.applies.values() if a.proposal_id == proposal_id]

    def last_applied_commit(self, stack: str) -> str | None:
        done = [a for a in self.t.applies.values() if a.stack == stack and a.status == ApplyStatus.SUCCEEDED]
        return done[-1].commit_sha if done else None


@only_what_is_faked
class FakeDayTwoRecords(_Faked, DayTwoRecords):
    """Drift records (one open per stack, as the SQL unique index keeps it) and break-glass windows."""

    def open_drift_record(self, stack: str) -> DriftRecord | None:
        return next(iter(self.drift_records(stack, only_open=True)), None)

    def open_drift_records(self, stacks: Collection[str]) -> dict[str, DriftRecord]:
        return {s: r for s in stacks if (r := self.open_drift_record(s)) is not None}

    def drift_records(self, stack: str | None = None, only_open: bool = False) -> list[DriftRecord]:
        return [r for r in sorted(self.t.drift_records.values(), key=lambda r: -r.id)
                if stack in (None, r.stack) and (not only_open or r.status == DriftStatus.OPEN)][:500]

    def add_drift_record(self, stack: str, resources: Sequence[DriftEntry], expected: bool,
                         break_glass_id: int | None) -> int:
        self._writing()
        if self.open_drift_record(stack) is not None:
            raise FakeIntegrityError(f"UNIQUE constraint failed: an open drift record of {stack} exists")
        rid, moment = self._next(self.t.drift_records), self.clock.now()
        self.t.drift_records[rid] = DriftRecord(rid, stack, DriftStatus.OPEN, tuple(resources), expected, moment,
                                                moment, None, None, None, None, break_glass_id)
        return rid

    def update_drift_record(self, record_id: int, resources: Sequence[DriftEntry], expected: bool,
                            break_glass_id: int | None) -> None:
        self._writing()
        self.t.drift_records[record_id] = replace(self.t.drift_records[record_id], resources=tuple(resources),
                                                  expected=expected, break_glass_id=break_glass_id,
                                                  updated_at=self.clock.now())

    def close_drift_record(self, record_id: int, by: str, reason: str, proposal_id: int | None) -> None:
        self._writing()
        self.t.drift_records[record_id] = replace(self.t.drift_records[record_id], status=DriftStatus.CLOSED,
                                                  closed_at=self.clock.now(), closed_by=by, closed_reason=reason,
                                                  closed_by_proposal=proposal_id)

    def add_break_glass(self, stack: str, reason: str, opened_by: str, duration_seconds: int, confirmed: bool) -> int:
        self._writing()
        wid, moment = self._next(self.t.windows), self.clock.now()
        self.t.windows[wid] = {
            "id": wid, "stack": stack, "reason": reason, "opened_by": opened_by, "confirmed_by": None,
            "requested_at": moment, "duration_seconds": duration_seconds,
            "opened_at": moment if confirmed else None,
            "ends_at": moment + timedelta(seconds=duration_seconds) if confirmed else None,
            **dict.fromkeys(("closed_at", "codify_by", "codified_at", "flagged_at", "acknowledged_by",
                             "acknowledged_at", "acknowledgement"))}
        return wid

    def break_glass(self, window_id: int) -> BreakGlassWindow:
        if window_id not in self.t.windows:
            raise NotFound(f"no break-glass window {window_id}")
        return _window(self.t.windows[window_id])

    def break_glass_windows(self, stack: str | None = None) -> list[BreakGlassWindow]:
        return [_window(w) for w in sorted(self.t.windows.values(), key=lambda w: -w["id"])
                if stack in (None, w["stack"])][:500]

    def confirm_break_glass(self, window_id: int, by: str, opened_at: datetime, ends_at: datetime) -> None:
        self._set(window_id, confirmed_by=by, opened_at=opened_at, ends_at=ends_at)

    def close_break_glass(self, window_id: int, at: datetime) -> None:
        self._set(window_id, closed_at=at)

    def acknowledge_break_glass(self, window_id: int, by: str, at: datetime, note: str) -> None:
        self._set(window_id, acknowledged_by=by, acknowledged_at=at, acknowledgement=note)

    def mark_break_glass(self, window_id: int, column: str, moment: datetime) -> bool:
        window = self.t.windows[window_id]
        if window[column] is not None or window["codified_at"] is not None or window["acknowledged_at"] is not None:
            return False
        self._set(window_id, **{column: moment})
        return True

    def _set(self, window_id: int, **values: Any) -> None:
        self._writing()
        if window_id in self.t.windows:
            self.t.windows[window_id].update(values)


def _window(row: dict[str, Any]) -> BreakGlassWindow:
    fields = {k: v for k, v in row.items() if k not in ("duration_seconds", "codify_by")}
    return BreakGlassWindow(**fields, duration=timedelta(seconds=row["duration_seconds"]))


class FakeIntegrityError(Exception):
    """A row the schema's constraints refuse (sqlalchemy.exc.IntegrityError, in SQL)."""


@only_what_is_faked
class FakeMainRecords(_Faked, MainRecords):
    def marker(self, name: str) -> str | None:
        return self.t.markers.get(name)

    def set_marker(self, name: str, value: str) -> None:
        self._writing()
        self.t.markers[name] = value

    def swap_marker(self, name: str, expected: str | None, value: str) -> bool:
        self._writing()
        if self.t.markers.get(name) != expected:
            return False
        self.t.markers[name] = value
        return True

    def add_push(self, sha: str, stacks: Sequence[str], paths: Sequence[str], author: str) -> bool:
        self._writing()
        if sha in self.t.pushes:
            return False
        self.t.pushes[sha] = {"sha": sha, "stacks": list(stacks), "paths": list(paths)[:500], "author": author[:200],
                              "detected_at": self.clock.now(), "acknowledged_at": None, "acknowledged_by": None,
                              "reason": None}
        return True

    def unacknowledged_pushes(self) -> list[MainPush]:
        return [MainPush(p["sha"], p["author"], frozenset(p["stacks"]))
                for p in sorted(self.t.pushes.values(), key=lambda p: p["detected_at"]) if p["acknowledged_at"] is None]

    def acknowledge_push(self, sha: str, by: str, reason: str) -> MainPush | None:
        self._writing()
        found = [p for p in self.t.pushes.values() if p["sha"].startswith(sha) and p["acknowledged_at"] is None]
        if len(found) != 1:  # none, or a prefix that names more than one: the SQL one answers None too
            return None
        found[0].update(acknowledged_at=self.clock.now(), acknowledged_by=by, reason=reason)
        return MainPush(found[0]["sha"], found[0]["author"], frozenset(found[0]["stacks"]))


@only_what_is_faked
class FakeAuditLog(_Faked, AuditLog):
    """The trail as a list, chained with the domain's hash (verify_chain reads it as it reads the SQL one's)."""

    def append(self, actor: Actor, kind: str, payload: Mapping[str, Any], proposal_id: int | None = None,
               stacks: Sequence[str] = ()) -> AuditEvent:
        return self.append_many([(actor, kind, payload, proposal_id, stacks)])[0]

    def append_many(self, entries: Sequence[tuple[Actor, str, Mapping[str, Any], int | None,
                                                  Sequence[str]]]) -> list[AuditEvent]:
        self._writing()
        out = []
        for actor, kind, payload, proposal_id, stacks in entries:
            seq, prev = self.t.head or (0, GENESIS)
            content = {"seq": seq + 1, "id": str(uuid.uuid4()), "at": self.clock.now().isoformat(timespec="microseconds"),
                       "actor": actor.name, "actor_kind": actor.kind.value, "kind": kind, "proposal_id": proposal_id,
                       "stacks": list(stacks), "payload": json.loads(json.dumps(payload, default=str))}
            event = AuditEvent(seq + 1, content["id"], content["at"], actor.name, actor.kind.value, kind, proposal_id,
                               tuple(stacks), content["payload"], prev, event_hash(prev, content))
            self.t.events.append(event)
            self.t.head = (event.seq, event.hash)
            out.append(event)
        return out

    def write_chain_head(self) -> None:
        pass  # the head moves with each event here

    def chain_head(self) -> tuple[int, str] | None:
        return self.t.head

    def newest_seq(self, proposal_id: int) -> int:
        return max((e.seq for e in self.t.events if e.proposal_id == proposal_id), default=0)

    def events(self, proposal_id: int | None = None, actor: str | None = None, stack: str | None = None,
               since: str | None = None, kind: str | None = None) -> list[AuditEvent]:
        return self.query(EventQuery(proposal_id=proposal_id, actor=actor, stack=stack, since=since, kind=kind))

    def query(self, q: EventQuery, after: int = 0, limit: int | None = None) -> list[AuditEvent]:
        if q.address:
            raise NotImplementedError("FakeAuditLog does not search by address: test that on a workspace")
        found = [e for e in self.t.events if e.seq > after and _matches(e, q)]
        return found[:limit] if limit is not None else found

    def count(self, q: EventQuery) -> int:
        return len(self.query(q))

    def iter(self, batch: int = 5000, upto: int | None = None, after: int = 0) -> Iterator[AuditEvent]:
        return iter([e for e in self.t.events if e.seq > after and (upto is None or e.seq <= upto)])

    def of_proposals(self, proposal_ids: Sequence[int], exact: bool = True) -> list[AuditEvent]:
        return [e for e in self.t.events if e.proposal_id in set(proposal_ids)]


def _matches(event: AuditEvent, q: EventQuery) -> bool:
    """Whether the event meets every filter of the query (the address filter aside), as the SQL conditions say."""
    return ((q.proposal_id is None or event.proposal_id == q.proposal_id) and q.actor in (None, "", event.actor)
            and (not q.stack or q.stack in event.stacks) and q.kind in (None, "", event.kind)
            and (not q.action or event.kind == q.action or event.kind.startswith(q.action + "."))
            and (not q.outcome or event_outcome(event.kind) == q.outcome)
            and (not q.since or event.at >= q.since) and (not q.until or event.at <= q.until))


@only_what_is_faked
class FakeStackRecords(_Faked, StackRecords):
    def record_serials(self, serials: Mapping[str, int], read_at: datetime) -> None:
        self._writing()
        for stack, serial in serials.items():
            kept = self.t.serials.get(stack)
            if kept is None or kept[1] <= read_at:
                self.t.serials[stack] = (serial, read_at)

    def serials(self, stacks: Collection[str]) -> dict[str, int]:
        return {s: self.t.serials[s][0] for s in stacks if s in self.t.serials}


@only_what_is_faked
class FakeNotifications(_Faked, Notifications):
    """The outbox's rows, one per dedupe key; the notice kept as the SQL one reads it back (its JSON), unscrubbed:
    what a notice hides of a secret is tested on a workspace (test_notifications.py)."""

    def add(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None) -> int | None:
        return self._insert(key, channel, notice, NotificationStatus.QUEUED, None)

    def skip(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None, reason: str) -> int | None:
        return self._insert(key, channel, notice, NotificationStatus.SKIPPED, reason)

    def _insert(self, key: str, channel: Channel, notice: Notice, status: NotificationStatus,
                error: str | None) -> int | None:
        self._writing()
        if any(n.dedupe_key == key for n in self.t.notifications.values()):
            return None
        nid = self._next(self.t.notifications)
        self.t.notifications[nid] = Notification(nid, key, notice.event, Channel.from_json(channel.to_json()),
                                                 Notice.from_json(notice.to_json()), status, 0, self.clock.now(),
                                                 error=error)
        return nid

    def set_job(self, notification_id: int, job_id: int) -> None:
        self._writing()
        if notification_id in self.t.notifications:
            self.t.notifications[notification_id] = replace(self.t.notifications[notification_id], job_id=job_id)

    def get(self, notification_id: int) -> Notification:
        if notification_id not in self.t.notifications:
            raise NotFound(f"no notification {notification_id}")
        return self.t.notifications[notification_id]

    def list(self, status: NotificationStatus | None = None, limit: int = 100) -> list[Notification]:
        return [n for n in sorted(self.t.notifications.values(), key=lambda n: -n.id)
                if status in (None, n.status)][:limit]


@only_what_is_faked
class FakeJobs(_Faked, Jobs):
    """Jobs queued by a use case; nothing claims or runs them here (the worker is tested on a workspace)."""

    def add(self, kind: JobKind, proposal_id: int | None, requested_by: Actor,
            args: Mapping[str, Any] | None = None) -> int:
        self._writing()
        jid = self._next(self.t.jobs)
        self.t.jobs[jid] = {"id": jid, "kind": kind, "proposal_id": proposal_id, "requested_by": requested_by.name,
                            "args": dict(args or {}), "created_at": self.clock.now()}
        return jid

    def queued(self, kind: JobKind, proposal_id: int, running_too: bool = True) -> int | None:
        return next((j["id"] for j in self.t.jobs.values() if j["kind"] == kind and j["proposal_id"] == proposal_id),
                    None)  # every job here is queued: none runs


class FakeEngine(Engine):
    """An engine that knows each stack's state serial and nothing else: a use case that plans or applies fails."""

    def __init__(self, serials: Mapping[str, int] | None = None):
        self.serials = dict(serials or {})

    def state_serial(self, stack: str) -> int:
        return self.serials.get(stack, 0)

    def plan(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("FakeEngine does not plan: test this on a workspace")

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("FakeEngine does not apply: test this on a workspace")


class _Unfaked:
    """A repository no fake stands for yet: any use of it says so."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, method: str) -> Any:
        raise NotImplementedError(f"the fake unit of work has no {self.name} repository ({self.name}.{method})")


@only_what_is_faked
class FakeRepositories(_Faked, Repositories):
    """The registry: the default repository, there from the start, and any added."""

    def _rows(self) -> dict[str, Repository]:
        found: dict[str, Repository] = self.t.__dict__.setdefault("repositories", {})
        found.setdefault(DEFAULT_REPOSITORY, Repository(DEFAULT_REPOSITORY, self.clock.now(), "gateway"))
        return found

    def add(self, name: str, by: str) -> Repository:
        self._writing()
        if name in self._rows():
            raise Conflict(f"repository {name} is already registered")
        self._rows()[name] = Repository(name, self.clock.now(), by)
        return self._rows()[name]

    def get(self, name: str) -> Repository | None:
        return self._rows().get(name)

    def list(self) -> list[Repository]:
        return [self._rows()[name] for name in sorted(self._rows())]

    def remove(self, name: str, by: str) -> None:
        self._writing()
        known = self._rows().get(name)
        if known is None or not known.active:
            raise NotFound(f"no repository {name} to remove")
        self._rows()[name] = replace(known, removed_at=self.clock.now(), removed_by=by)


class FakeUnitOfWork(UnitOfWork):
    """One transaction over the fake tables; a saved proposal's events go to the trail, as in SqlUnitOfWork. It works
    in the default repository only (two repositories' isolation is the SQL store's, tested on it)."""

    repository = DEFAULT_REPOSITORY

    def __init__(self, tables: Tables, clock: Clock, readonly: bool = False):
        self.principals = FakePrincipals(tables, clock, readonly)
        self.proposals = FakeProposals(tables, clock, readonly, saved=self.write_new_events)
        self.day_two = FakeDayTwoRecords(tables, clock, readonly)
        self.main = FakeMainRecords(tables, clock, readonly)
        self.audit = FakeAuditLog(tables, clock, readonly)
        self.stacks = FakeStackRecords(tables, clock, readonly)
        self.notifications = FakeNotifications(tables, clock, readonly)
        self.jobs = FakeJobs(tables, clock, readonly)
        self.repositories = FakeRepositories(tables, clock, readonly)
        for name in ("conversations", "github", "breaker", "sign_in"):
            setattr(self, name, _Unfaked(name))

    def write_new_events(self, proposal: Proposal) -> None:
        moved = list(proposal.events)
        proposal.events.clear()
        self.audit.append_many([(m.actor, m.kind, m.payload, m.proposal_id, m.stacks) for m in moved])


class FakeStore(Store):
    """Units of work over tables in memory: a write that raises leaves the tables as they were; a read joins an
    enclosing read, as SqlStore's does. `locks` is a FakeStackLocks; there is no job queue."""

    dialect = "fake"
    schema_version = 0
    repository = DEFAULT_REPOSITORY

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or FakeClock()
        self.tables = Tables()
        self.locks = FakeStackLocks(self.clock)
        self.queue = _Unfaked("queue")  # type: ignore[assignment]
        self.committed = 0  # write units of work that committed

    def close(self) -> None:
        pass

    def for_repository(self, name: str) -> FakeStore:
        if name != DEFAULT_REPOSITORY:
            raise NotImplementedError("the fake store holds the default repository only")
        return self

    @contextmanager
    def session(self, readonly: bool = False) -> Iterator[FakeUnitOfWork]:
        if readonly:
            yield FakeUnitOfWork(self.tables, self.clock, readonly=True)
            return
        before = copy.deepcopy(self.tables)
        try:
            yield FakeUnitOfWork(self.tables, self.clock)
        except BaseException:
            self.tables.__dict__.update(before.__dict__)  # rolled back
            raise
        self.committed += 1

    def pending_migrations(self) -> list[int]:
        return []

    def migrate(self) -> list[int]:
        return []


class FakeDeclarationRepo(DeclarationRepo):
    """A declaration repo of one commit on main holding `gateway_yaml`; `set_main` pushes another. Enough for use
    cases that read main's rules and resolve branches, and nothing that reads trees or merges."""

    repository = DEFAULT_REPOSITORY

    def __init__(self, gateway_yaml: str, branches: Mapping[str, str] | None = None):
        self.yaml = {"main-1": gateway_yaml}
        self.refs = {"main": "main-1", **(branches or {})}

    def set_main(self, gateway_yaml: str) -> str:
        sha = f"main-{len(self.yaml) + 1}"
        self.yaml[sha] = gateway_yaml
        self.refs["main"] = sha
        return sha

    def main_branch(self) -> str:
        return "main"

    def resolve(self, ref: str) -> str:
        if ref in self.refs:
            return self.refs[ref]
        if ref in self.yaml:
            return ref
        raise NotFound(f"no branch or commit {ref!r}")

    def branch_exists(self, branch: str) -> bool:
        return branch in self.refs

    def repo_settings(self, sha: str) -> RepoSettings:
        return parse_repo_settings(self.yaml[sha])

    def commits_touching(self, ref: str, path: str, limit: int = 20) -> list[str]:
        return sorted(self.yaml, key=lambda sha: -int(sha.split("-")[1]))[:limit] if path == "gateway.yaml" else []


SAMPLE_GATEWAY_YAML = (Path(__file__).parent.parent / "gateway" / "sample_repo" / "gateway.yaml").read_text()


def fake_workspace(gateway_yaml: str = SAMPLE_GATEWAY_YAML, home: Path | None = None,
                   clock: FakeClock | None = None) -> Workspace:
    """A workspace whose store, repo and clock are fakes (the sample repo's gateway.yaml on main by default); the
    engine knows state serials only, and every other port is absent: a use case that reaches one fails, naming it."""
    clock = clock or FakeClock()
    settings = Settings(home=home or Path("/nonexistent/fake-workspace"), token=None)
    absent = _Unfaked
    return Workspace(settings=settings, store=FakeStore(clock), repo=FakeDeclarationRepo(gateway_yaml),
                     engine=FakeEngine(), scrubber=Scrubber(), simulator=absent("simulator"), clock=clock,
                     open_forge=absent("forge"), declarations=absent("declarations"), scanner=absent("scanner"),
                     rego=absent("rego"), working_copies=absent("working_copies"),
                     open_checkpointer=absent("checkpointer"))  # type: ignore[arg-type]


def person(name: str, *roles: Role, groups: Sequence[str] = (), kind: PrincipalKind = PrincipalKind.PERSON,
           store: Store | None = None) -> Principal:
    """A principal, kept in `store` when one is given (a use case that reads people by id finds them)."""
    if store is None:
        return Principal(f"id-{name}", name, kind, frozenset(roles), frozenset(groups))
    with store.session() as session:
        return session.principals.add(name, kind, frozenset(roles), frozenset(groups), "")
