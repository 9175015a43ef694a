"""In-memory fakes of the ports (cosmicpython's FakeRepository): each subclasses the Protocol it implements,
so a use case or a rule can be tested with no database, no git and no engine.

A fake is a real, small implementation — it keeps state and answers as the SQL adapter would — plus a
way to make the dependency fail the way production's does (a database that stops answering).
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr

from gateway.adapters.engines.sandbox.state import SandboxStore, StackState
from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.config import Settings
from gateway.domain.agent_runs import UNFINISHED, AgentRun, AgentRunStatus, Conversation
from gateway.domain.applies import ApplyRecord, ApplyStatus
from gateway.domain.apply_blockers import MainPush
from gateway.domain.audit import GENESIS, AuditEvent, EventQuery, event_hash, event_outcome, event_repository
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.breaker import BreakerState, CapacityChange
from gateway.domain.drift import DriftRecord, DriftStatus
from gateway.domain.errors import BackendError, Conflict, NotFound, SignInRefused
from gateway.domain.github import Check, Delivery, PullRequestLink
from gateway.domain.gitlab_rules import GitLabAccount
from gateway.domain.jobs import JobKind
from gateway.domain.lifecycle import ACTIVE, INITIAL
from gateway.domain.locks import LockAttempt, StackLock, unmerged_holder
from gateway.domain.notifications import Channel, Notice, Notification, NotificationStatus
from gateway.domain.policy import Override
from gateway.domain.preview import DriftEntry
from gateway.domain.principals import Actor, Credentials, Principal, PrincipalKind, Role
from gateway.domain.proposal import (
    Decision,
    DecisionRecord,
    ListedProposal,
    PlanSummary,
    Proposal,
    ProposalKind,
    StackPlan,
)
from gateway.domain.repo_settings import ForgeSettings, GitHubSettings, GitLabSettings, RepoSettings
from gateway.domain.repositories import DEFAULT_REPOSITORY, Repository
from gateway.domain.scrubbing import Scrubber
from gateway.domain.sign_in import Identity, PendingSignIn, RefusalTally, WebSession
from gateway.ports import (
    ApprovalForge,
    AuditLog,
    BreakerRecords,
    Clock,
    CommitInfo,
    Conversations,
    DayTwoRecords,
    DeclarationRepo,
    Engine,
    Forge,
    GitHubRecords,
    IdentityProvider,
    Jobs,
    MainRecords,
    Notifications,
    NotificationSender,
    Principals,
    Proposals,
    Repositories,
    ReviewForge,
    SignInRecords,
    SignInStart,
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
    ports = [b for b in cls.__mro__[1:]  # the ports live in gateway.ports' modules (records, forge, ...)
             if getattr(b, "_is_protocol", False) and b.__module__.startswith("gateway.ports")]
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
    event_repositories: dict[int, str] = field(default_factory=dict)  # each event's repository (an index, as in SQL)
    head: tuple[int, str] | None = None
    forge: ForgeTables = field(default_factory=lambda: ForgeTables())  # see "forges" below
    more: MoreTables = field(default_factory=lambda: MoreTables())  # day two, breaker, sign-in (at the end)


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

    def get_many(self, proposal_ids: Sequence[int]) -> list[Proposal]:
        return [self.get(proposal_id) for proposal_id in proposal_ids]

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
            self.t.event_repositories[event.seq] = event_repository(kind, content["payload"], stacks,
                                                                                   DEFAULT_REPOSITORY)
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
        found = [e for e in self.t.events if e.seq > after and _matches(e, q)
                 and q.repository in (None, "", self.t.event_repositories[e.seq])]
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
        wire_breaker_and_sign_in_fakes(self, tables, clock, readonly)
        wire_forge_fakes(self, tables, clock, readonly)

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


def later(ws: Workspace, seconds: float) -> None:
    """Moves a fake workspace's clock on: a window runs out when the test says so, not after a sleep."""
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(seconds)


def event_kinds(ws: Workspace, prefix: str) -> list[str]:
    """The kinds of the trail's events that start with `prefix`, oldest first."""
    with ws.store.session(readonly=True) as session:
        return [e.kind for e in session.audit.query(EventQuery()) if e.kind.startswith(prefix)]


# ---------------------------------------------------------------------------------------------------------------
# forges
# The code host's records (webhook deliveries, each proposal's pull request, people's linked GitHub and GitLab
# accounts) and the code host itself (FakeGitHubForge, FakeGitLabForge: comments, checks, team members, reviews,
# approvals, branch heads), so a webhook's rules run with no HTTP server and no git. What only the real path shows
# (signatures over HTTP, PyGithub and python-gitlab, git fetches, the sticky comment's rendering) stays in
# tests/test_github.py and tests/test_gitlab.py.


@dataclass
class ForgeTables:
    """The forge's rows: deliveries by id, each proposal's pull request, linked accounts by the forge's user id."""

    deliveries: dict[str, Delivery] = field(default_factory=dict)
    pull_requests: dict[int, PullRequestLink] = field(default_factory=dict)
    github_accounts: dict[int, tuple[str, str]] = field(default_factory=dict)  # github id -> (principal id, login)
    gitlab_accounts: dict[int, tuple[str, str]] = field(default_factory=dict)  # gitlab id -> (principal id, username)


@only_what_is_faked
class FakeGitHubRecords(_Faked, GitHubRecords):
    """Deliveries recorded once by their id, and one pull request per proposal (what is published there is not
    faked: test_github.py keeps the sticky comment)."""

    def add_delivery(self, delivery_id: str, event: str, action: str | None, payload: str) -> bool:
        self._writing()
        if delivery_id in self.t.forge.deliveries:
            return False
        self.t.forge.deliveries[delivery_id] = Delivery(delivery_id, event, action, payload, None, self.clock.now())
        return True

    def set_delivery_job(self, delivery_id: str, job_id: int) -> None:
        self._writing()
        if delivery_id in self.t.forge.deliveries:
            self.t.forge.deliveries[delivery_id] = replace(self.t.forge.deliveries[delivery_id], job_id=job_id)

    def delivery(self, delivery_id: str) -> Delivery | None:
        return self.t.forge.deliveries.get(delivery_id)

    def link_pull_request(self, proposal_id: int, repository: str, number: int) -> None:
        self._writing()
        self.t.forge.pull_requests.setdefault(proposal_id, PullRequestLink(proposal_id, repository, number, None, 0,
                                                                           None, None, None))

    def pull_request_of(self, proposal_id: int) -> PullRequestLink | None:
        return self.t.forge.pull_requests.get(proposal_id)

    def proposal_for_pull_request(self, repository: str, number: int) -> int | None:
        return max((link.proposal_id for link in self.t.forge.pull_requests.values()
                    if (link.repository, link.number) == (repository, number)), default=None)


class LinkedAccounts(_Faked):
    """The GitHub and GitLab account each person is linked to, for a principal repository (one each way: linking
    again replaces the person's account and the account's person, as the SQL one deletes both rows first)."""

    get: Callable[[str], Principal]

    def link_github(self, principal: Principal, github_id: int, login: str) -> None:
        self._link(self.t.forge.github_accounts, principal, github_id, login)

    def by_github_id(self, github_id: int) -> Principal | None:
        linked = self.t.forge.github_accounts.get(github_id)
        return self.get(linked[0]) if linked else None

    def github_login_of(self, principal_id: str) -> str | None:
        return next((login for pid, login in self.t.forge.github_accounts.values() if pid == principal_id), None)

    def link_gitlab(self, principal: Principal, gitlab_id: int, username: str) -> None:
        self._link(self.t.forge.gitlab_accounts, principal, gitlab_id, username)

    def by_gitlab_id(self, gitlab_id: int) -> Principal | None:
        linked = self.t.forge.gitlab_accounts.get(gitlab_id)
        return self.get(linked[0]) if linked else None

    def gitlab_account_of(self, principal_id: str) -> tuple[int, str] | None:
        return next(((uid, name) for uid, (pid, name) in self.t.forge.gitlab_accounts.items() if pid == principal_id),
                    None)

    def _link(self, accounts: dict[int, tuple[str, str]], principal: Principal, account_id: int, name: str) -> None:
        self._writing()
        for old in [uid for uid, (pid, _) in accounts.items() if pid == principal.id or uid == account_id]:
            del accounts[old]
        accounts[account_id] = (principal.id, name)


@cache
def with_linked_accounts(principals: type[FakePrincipals]) -> type[FakePrincipals]:
    """`principals` (FakePrincipals, or another section's subclass of it) that also keeps linked forge accounts."""
    return only_what_is_faked(type(f"Linked{principals.__name__}", (LinkedAccounts, principals), {}))


def wire_forge_fakes(uow: FakeUnitOfWork, tables: Tables, clock: Clock, readonly: bool) -> None:
    """This section's repositories in a fake unit of work, in place of the ones that said they were not faked; run it
    after any other section's wiring replaces the principal repository, whose class it adds linked accounts to."""
    uow.github = FakeGitHubRecords(tables, clock, readonly)
    uow.principals = with_linked_accounts(type(uow.principals))(tables, clock, readonly)


class FakeHostedRepo(FakeDeclarationRepo):
    """The declaration repo of a gateway with a forge: commits pushed to the host (`FakeCodeHost.push_commit`) reach
    it by the forge's fetch_main and sync_branch, each knowing its parent and the paths it changed (gateway.yaml is
    its parent's)."""

    def __init__(self, gateway_yaml: str, branches: Mapping[str, str] | None = None):
        super().__init__(gateway_yaml, branches)
        self.parents: dict[str, tuple[str, tuple[str, ...]]] = {}  # sha -> (parent, paths changed)

    def resolve(self, ref: str) -> str:
        return ref if ref in self.parents and ref not in self.refs else super().resolve(ref)

    def repo_settings(self, sha: str) -> RepoSettings:
        while sha in self.parents:
            sha = self.parents[sha][0]
        return super().repo_settings(sha)

    def changed_paths(self, base: str, head: str) -> list[str]:
        paths: list[str] = []
        while head != base and head in self.parents:
            head, changed = self.parents[head]
            paths = [p for p in changed if p not in paths] + paths
        return paths

    def module_directories(self, sha: str, path: str) -> tuple[str, ...]:
        return ()  # no stack of these tests calls a local module


class FakeCodeHost:
    """What GitHub and GitLab share here: branch heads on the host, comments as the host has them now, one-off
    replies, the sticky comment, checks, team members (and each membership asked, by whom: `team_checks`); `fetches`
    names each branch fetched. Opening and merging pull requests is not faked (test_github.py, test_gitlab.py)."""

    def __init__(self, repo: FakeHostedRepo):
        self.repo = repo
        self.heads: dict[str, str] = dict(repo.refs)
        self.members: dict[str, set[Any]] = {}  # team -> logins (GitHub) or user ids (GitLab)
        self.comments: dict[int, tuple[str, int]] = {}  # comment id -> (body, author id), as the host has it now
        self.replies: list[tuple[int, str]] = []
        self.sticky: dict[int, str] = {}
        self.checks: dict[str, list[Check]] = {}
        self.fetches: list[str] = []
        self.team_checks: list[tuple[str, Any]] = []  # (team, login or user id) as asked
        self._ids = iter(range(1000, 10**9))

    def push_commit(self, branch: str, paths: Sequence[str]) -> str:
        """Someone pushes a commit to `branch` on the host; the gateway sees it once it fetches."""
        sha = f"{branch.replace('/', '-')}-{next(self._ids)}"
        self.repo.parents[sha] = (self.heads[branch], tuple(paths))
        self.heads[branch] = sha
        return sha

    def add_comment(self, body: str, author_id: int) -> int:
        comment_id = next(self._ids)
        self.comments[comment_id] = (body, author_id)
        return comment_id

    # the port
    def close(self) -> None:
        pass

    def fetch_main(self, main: str) -> None:
        self.fetches.append(main)
        self.repo.refs[main] = self.heads[main]

    def sync_branch(self, branch: str) -> str:
        self.fetches.append(branch)
        if branch in self.heads:
            self.repo.refs[branch] = self.heads[branch]
        return self.repo.refs[branch]

    def push(self, branch: str, sha: str) -> None:
        self.heads[branch] = sha

    def upsert_comment(self, number: int, comment_id: int | None, body: str) -> int:
        self.sticky[number] = body
        return comment_id or next(self._ids)

    def comment(self, number: int, comment_id: int) -> tuple[str, int]:
        if comment_id not in self.comments:
            raise NotFound(f"no comment {comment_id}")
        return self.comments[comment_id]

    def reply(self, number: int, body: str) -> None:
        self.replies.append((number, body))

    def set_checks(self, sha: str, checks: list[Check], details_url: str) -> None:
        self.checks[sha] = list(checks)

    def is_team_member(self, team: str, login: str, account_id: int | None) -> bool:
        who = account_id if account_id is not None else login  # GitLab asks by the numeric id, GitHub by login
        self.team_checks.append((team, who))
        return who in self.members.get(team, set())


@only_what_is_faked
class FakeGitHubForge(FakeCodeHost, ReviewForge):
    """GitHub: reviews as GitHub has them now (a dismissed one says so), team members by login."""

    def __init__(self, settings: GitHubSettings, repo: FakeHostedRepo):
        super().__init__(repo)
        self.settings = settings
        self.reviews: dict[int, tuple[str, str | None, int]] = {}  # id -> (STATE, commit, author id)

    def add_review(self, author_id: int, state: str, commit_id: str | None) -> int:
        review_id = next(self._ids)
        self.reviews[review_id] = (state.upper(), commit_id, author_id)
        return review_id

    def dismiss_review(self, review_id: int) -> None:
        _, commit_id, author_id = self.reviews[review_id]
        self.reviews[review_id] = ("DISMISSED", commit_id, author_id)

    def review(self, number: int, review_id: int) -> tuple[str, str | None, int]:
        if review_id not in self.reviews:
            raise NotFound(f"no review {review_id}")
        return self.reviews[review_id]


@only_what_is_faked
class FakeGitLabForge(FakeCodeHost, ApprovalForge):
    """GitLab: who approves each merge request now (its approvals API), users as its users API has them (bots
    included), group members by numeric user id."""

    def __init__(self, settings: GitLabSettings, repo: FakeHostedRepo):
        super().__init__(repo)
        self.settings = settings
        self.users: dict[int, GitLabAccount] = {}
        self.approvals: dict[int, set[int]] = {}  # merge request iid -> approvers' ids

    def add_user(self, user_id: int, username: str, bot: bool = False) -> GitLabAccount:
        self.users[user_id] = GitLabAccount(user_id, username, bot)
        return self.users[user_id]

    def approver_ids(self, number: int) -> frozenset[int]:
        return frozenset(self.approvals.get(number, ()))

    def account(self, user_id: int) -> GitLabAccount:
        if user_id not in self.users:
            raise NotFound(f"no GitLab user {user_id}")
        return self.users[user_id]


def forge_workspace(forge_yaml: str, secrets: Mapping[str, str], clock: FakeClock | None = None) -> Workspace:
    """fake_workspace whose main's gateway.yaml adds `forge_yaml` (forge: github or gitlab), with the webhook
    secrets given (github_webhook_secret, gitlab_webhook_secret) and the fake code host as its forge
    (`ws.open_forge(settings)` answers the one FakeGitHubForge or FakeGitLabForge, made at the first call)."""
    base = fake_workspace(clock=clock)
    repo = FakeHostedRepo(SAMPLE_GATEWAY_YAML + forge_yaml)
    hosts: dict[str, Forge] = {}

    def open_forge(settings: ForgeSettings) -> Forge:
        if "host" not in hosts:
            hosts["host"] = FakeGitLabForge(settings, repo) if isinstance(settings, GitLabSettings) \
                else FakeGitHubForge(settings, repo)
        return hosts["host"]

    settings = base.settings.model_copy(update={k: SecretStr(v) for k, v in secrets.items()})
    return replace(base, settings=settings, repo=repo, open_forge=open_forge)
# day two, breaker, sign-in: the circuit breaker's records; sign-in's records (linked identities, page sessions,
# sign-ins in progress, refusal tallies); conversations and agent requests as far as a request opens them and the
# breaker stops them; principals with their credentials and GitHub accounts; the outbox's deliveries. Wired into
# FakeUnitOfWork by `wire_breaker_and_sign_in_fakes` (in place of the `_Unfaked` it made first). Beside them, an
# identity provider that vouches for whom a test says and a notification sender whose receivers answer as told.


@dataclass
class MoreTables:
    """The rows of this section's tables (`Tables.more`: a rolled-back write restores them with the rest)."""

    breaker_changes: dict[int, CapacityChange] = field(default_factory=dict)  # by proposal
    breaker_states: dict[str, BreakerState] = field(default_factory=dict)  # by scope
    identities: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (issuer, subject) -> (pid, display)
    sessions: dict[str, WebSession] = field(default_factory=dict)  # by the hash of the session id
    flows: dict[str, PendingSignIn] = field(default_factory=dict)  # by the hash of the state
    tallies: dict[str, RefusalTally] = field(default_factory=dict)  # by provider:check
    runs: dict[str, AgentRun] = field(default_factory=dict)
    conversations: dict[str, Conversation] = field(default_factory=dict)
    github_accounts: dict[int, tuple[str, str]] = field(default_factory=dict)  # GitHub's id -> (principal, login)
    credentials: dict[str, dict[str, Any]] = field(default_factory=dict)  # by principal: token hash, expiry, uses


def _more(tables: Tables) -> MoreTables:
    return tables.more


@only_what_is_faked
class FakeBreakerRecords(_Faked, BreakerRecords):
    """Each agent change's capacity figures (a re-plan replaces the proposal's earlier ones) and each breaker's state."""

    def record_change(self, change: CapacityChange) -> None:
        self._writing()
        _more(self.t).breaker_changes.pop(change.proposal_id, None)  # the newest goes last, as a new row would
        _more(self.t).breaker_changes[change.proposal_id] = replace(change, before=dict(change.before))

    def changes(self, principal_id: str | None, since: datetime) -> list[CapacityChange]:
        return sorted((c for c in _more(self.t).breaker_changes.values()
                       if c.at >= since and principal_id in (None, c.principal_id)), key=lambda c: c.at)

    def state(self, scope: str) -> BreakerState | None:
        return _more(self.t).breaker_states.get(scope)

    def states(self) -> list[BreakerState]:
        return sorted(_more(self.t).breaker_states.values(), key=lambda s: s.scope)

    def set(self, scope: str, is_open: bool, reason: str, by: str) -> None:
        self._writing()
        _more(self.t).breaker_states[scope] = BreakerState(scope, is_open, reason, by, self.clock.now())


@only_what_is_faked
class FakeSignInRecords(_Faked, SignInRecords):
    """Linked identities, page sessions, sign-ins in progress (used once) and refusal tallies, as the SQL tables."""

    def link_identity(self, principal: Principal, issuer: str, subject: str, display: str) -> None:
        self._writing()
        _more(self.t).identities[(issuer, subject)] = (principal.id, display[:200])

    def principal_of(self, issuer: str, subject: str) -> Principal | None:
        link = _more(self.t).identities.get((issuer, subject))
        return None if link is None else FakePrincipals(self.t, self.clock, True).get(link[0])

    def identities_of(self, principal_id: str) -> list[tuple[str, str]]:
        return sorted(key for key, (pid, _) in _more(self.t).identities.items() if pid == principal_id)

    def open_session(self, id_hash: str, session: WebSession) -> None:
        self._writing()
        if id_hash in _more(self.t).sessions:
            raise FakeIntegrityError("UNIQUE constraint failed: web_sessions.id_hash")
        _more(self.t).sessions[id_hash] = session

    def get_session(self, id_hash: str) -> WebSession | None:
        return _more(self.t).sessions.get(id_hash)

    def end_session(self, id_hash: str, at: datetime) -> None:
        self._writing()
        found = _more(self.t).sessions.get(id_hash)
        if found is not None and found.ended_at is None:
            _more(self.t).sessions[id_hash] = replace(found, ended_at=at)

    def end_sessions_of(self, principal_id: str, at: datetime) -> int:
        self._writing()
        sessions = _more(self.t).sessions
        ending = [h for h, s in sessions.items() if s.principal_id == principal_id and s.ended_at is None]
        for id_hash in ending:
            sessions[id_hash] = replace(sessions[id_hash], ended_at=at)
        return len(ending)

    def add_flow(self, state_hash: str, flow: PendingSignIn) -> None:
        self._writing()
        if state_hash in _more(self.t).flows:
            raise FakeIntegrityError("UNIQUE constraint failed: sign_in_flows.state_hash")
        _more(self.t).flows[state_hash] = replace(flow, secrets=dict(flow.secrets))

    def get_flow(self, state_hash: str) -> PendingSignIn | None:
        return _more(self.t).flows.get(state_hash)

    def use_flow(self, state_hash: str, at: datetime) -> bool:
        self._writing()
        flow = _more(self.t).flows.get(state_hash)
        if flow is None or flow.used_at is not None:
            return False
        _more(self.t).flows[state_hash] = replace(flow, used_at=at, secrets={})  # the secrets go with the use
        return True

    def forget_flows(self, expired_by: datetime) -> int:
        self._writing()
        flows = _more(self.t).flows
        expired = [h for h, f in flows.items() if f.expires_at <= expired_by]
        for state_hash in expired:
            del flows[state_hash]
        return len(expired)

    def refusal_tally(self, kind: str) -> RefusalTally | None:
        self._writing()  # the SQL one makes the row when it is missing
        tally = _more(self.t).tallies.setdefault(kind, RefusalTally(self.clock.now()))
        return None if tally.recorded == 0 and tally.unrecorded == 0 else tally

    def save_refusal_tally(self, kind: str, tally: RefusalTally) -> None:
        self._writing()
        if kind in _more(self.t).tallies:  # an UPDATE: a tally never read is not made here
            _more(self.t).tallies[kind] = tally


@only_what_is_faked
class FakeConversations(_Faked, Conversations):
    """Conversations as a request opens them, and agent requests: queued, begun and stopped by the breaker (the
    agent's turns and their holds on a conversation are tested on a workspace)."""

    def add(self, conversation_id: str, requester: Principal, branch: str) -> None:
        self._writing()
        if conversation_id in _more(self.t).conversations:
            raise FakeIntegrityError("UNIQUE constraint failed: conversations.id")
        _more(self.t).conversations[conversation_id] = Conversation(conversation_id, requester.id, branch, None,
                                                                    self.clock.now())

    def get(self, conversation_id: str) -> Conversation | None:
        return _more(self.t).conversations.get(conversation_id)

    def add_run(self, run_id: str, requester: Principal, request: str, conversation_id: str, job_id: int) -> None:
        self._writing()
        if run_id in _more(self.t).runs:
            raise FakeIntegrityError("UNIQUE constraint failed: agent_runs.id")
        moment = self.clock.now()
        _more(self.t).runs[run_id] = AgentRun(run_id, requester.id, request, conversation_id, AgentRunStatus.QUEUED,
                                              (), None, None, job_id, moment, moment)

    def begin_run(self, run_id: str) -> bool:
        return self._move(run_id, {AgentRunStatus.QUEUED}, status=AgentRunStatus.RUNNING)

    def run(self, run_id: str) -> AgentRun | None:
        return _more(self.t).runs.get(run_id)

    def stop_runs(self, reason: str) -> list[str]:
        self._writing()
        running = [r.id for r in _more(self.t).runs.values() if r.status in UNFINISHED]
        for run_id in running:
            self._move(run_id, UNFINISHED, status=AgentRunStatus.STOPPED, message=reason)
        return running

    def _move(self, run_id: str, from_statuses: Collection[AgentRunStatus], **values: Any) -> bool:
        self._writing()
        found = _more(self.t).runs.get(run_id)
        if found is None or found.status not in from_statuses:
            return False
        _more(self.t).runs[run_id] = replace(found, updated_at=self.clock.now(), **values)
        return True


@only_what_is_faked
class FakePeople(FakePrincipals):
    """FakePrincipals with their credentials: the hash of each token, when it expires and was last used, when the
    principal was disabled; which of them are enabled admins; the GitHub account each is linked to (by its id)."""

    def add(self, name: str, kind: PrincipalKind, roles: frozenset[Role], groups: frozenset[str],
            token_hash: str = "", acting_for: str | None = None) -> Principal:
        principal = super().add(name, kind, roles, groups, token_hash, acting_for)
        _more(self.t).credentials[principal.id] = {"token_hash": token_hash, **dict.fromkeys(
            ("disabled_at", "token_expires_at", "last_used_at"))}
        return principal

    def token_holder(self, token_hash: str) -> tuple[Principal, Credentials] | None:
        pid = next((pid for pid, c in _more(self.t).credentials.items() if c["token_hash"] == token_hash), None)
        return None if pid is None else (self.get(pid), self.credentials(pid))

    def credentials(self, pid: str) -> Credentials:
        self.get(pid)  # NotFound, as the SQL one
        row = _more(self.t).credentials.get(pid, {})
        return Credentials(row.get("disabled_at"), row.get("token_expires_at"), row.get("last_used_at"))

    def set_token(self, pid: str, token_hash: str, expires_at: datetime | None) -> None:
        self._credential(pid, token_hash=token_hash, token_expires_at=expires_at)

    def set_token_expiry(self, pid: str, expires_at: datetime | None) -> None:
        self._credential(pid, token_expires_at=expires_at)

    def set_disabled(self, pid: str, at: datetime | None) -> None:
        super().set_disabled(pid, at)
        self._credential(pid, disabled_at=at)

    def set_access(self, pid: str, roles: frozenset[Role], groups: frozenset[str]) -> None:
        self._writing()
        if pid in self.t.principals:
            self.t.principals[pid] = replace(self.t.principals[pid], roles=frozenset(roles), groups=frozenset(groups))

    def touch(self, pid: str, at: datetime) -> None:
        self._credential(pid, last_used_at=at)

    def enabled_admins(self) -> list[str]:
        return [p.id for p in self.t.principals.values() if Role.ADMIN in p.roles and not p.disabled]

    def link_github(self, principal: Principal, github_id: int, login: str) -> None:
        self._writing()
        links = _more(self.t).github_accounts  # one account per person, one person per account
        for gid in [g for g, (pid, _) in links.items() if g == github_id or pid == principal.id]:
            del links[gid]
        links[github_id] = (principal.id, login)

    def by_github_id(self, github_id: int) -> Principal | None:
        link = _more(self.t).github_accounts.get(github_id)
        return self.get(link[0]) if link else None

    def github_login_of(self, principal_id: str) -> str | None:
        return next((login for pid, login in _more(self.t).github_accounts.values() if pid == principal_id), None)

    def _credential(self, pid: str, **values: Any) -> None:
        self._writing()
        if pid in self.t.principals:  # an UPDATE of no row changes nothing
            _more(self.t).credentials.setdefault(pid, {"token_hash": ""}).update(values)


@only_what_is_faked
class FakeOutbox(FakeNotifications):
    """FakeNotifications with their deliveries: an attempt that failed (it stays queued), and the end, once."""

    def record_attempt(self, notification_id: int, attempts: int, error: str | None) -> None:
        self._writing()
        found = self.t.notifications.get(notification_id)
        if found is not None and found.status == NotificationStatus.QUEUED:
            self.t.notifications[notification_id] = replace(found, attempts=attempts, error=error)

    def finish(self, notification_id: int, status: NotificationStatus, attempts: int, error: str | None = None,
               receipt: str | None = None) -> bool:
        self._writing()
        found = self.t.notifications.get(notification_id)
        if found is None or found.status != NotificationStatus.QUEUED:
            return False
        delivered = self.clock.now() if status == NotificationStatus.DELIVERED else None
        self.t.notifications[notification_id] = replace(found, status=status, attempts=attempts, error=error,
                                                        delivered_at=delivered)
        return True


def wire_breaker_and_sign_in_fakes(uow: FakeUnitOfWork, tables: Tables, clock: Clock, readonly: bool) -> None:
    """This section's repositories in a fake unit of work, in place of the ones that said they were not faked."""
    uow.principals = FakePeople(tables, clock, readonly)
    uow.breaker = FakeBreakerRecords(tables, clock, readonly)
    uow.sign_in = FakeSignInRecords(tables, clock, readonly)
    uow.conversations = FakeConversations(tables, clock, readonly)
    uow.notifications = FakeOutbox(tables, clock, readonly)


class FakeIdentityProvider(IdentityProvider):
    """A provider that vouches for whom `sign_in_as` names, or refuses the answer as `refuse` says (the checks of a
    real provider's answer are tested against a provider on loopback in test_sign_in.py). Each `start` hands out a
    new state; `callback()` is what the provider sends the browser back with."""

    def __init__(self, name: str = "oidc", issuer: str = "https://idp.example.com"):
        self.name, self.label, self.issuer = name, f"Test {name}", issuer
        self.identity: Identity | None = None
        self.refusal: SignInRefused | None = None  # what `finish` raises
        self.unreachable = False  # `start` cannot reach the provider
        self.started: list[str] = []  # the states handed out, newest last

    def sign_in_as(self, subject: str, email: str | None = None, verified: bool = True,
                   groups: Collection[str] | None = None, display: str | None = None) -> None:
        self.identity = Identity(self.name, self.issuer, subject, display or email or subject, email, verified,
                                 None if groups is None else frozenset(groups))
        self.refusal = None

    def refuse(self, check: str, message: str) -> None:
        self.refusal = SignInRefused(check, message)

    def start(self, redirect_uri: str) -> SignInStart:
        if self.unreachable:
            raise SignInRefused("provider_unreachable", f"the identity provider at {self.issuer} could not be reached")
        state = f"state-{len(self.started) + 1}"
        self.started.append(state)
        return SignInStart(f"{self.issuer}/authorize?state={state}",
                           {"state": state, "nonce": f"nonce-{state}", "redirect_uri": redirect_uri})

    def callback(self, state: str | None = None) -> dict[str, str]:
        return {"state": state or self.started[-1], "code": "a-code"}

    def finish(self, pending: Mapping[str, str], callback: Mapping[str, str]) -> Identity:
        if self.refusal is not None:
            raise self.refusal
        if self.identity is None or pending.get("nonce") != f"nonce-{callback.get('state')}":
            raise SignInRefused("nonce", "the ID token's nonce is not valid")
        return self.identity


class FakeNotificationSender(NotificationSender):
    """The receivers as the sender meets them: each channel named in `answers` gives its answers in turn and then
    its last one for good (an exception is raised, a string is the receipt); any other channel takes every
    notice. Every attempt is kept."""

    def __init__(self, answers: Mapping[str, Sequence[str | Exception]] | None = None):
        self.answers = {name: list(said) for name, said in (answers or {}).items()}
        self.attempts: list[tuple[str, str, str]] = []  # (channel, title, delivery id)

    def send(self, channel: Channel, notice: Notice, delivery_id: str) -> str:
        self.attempts.append((channel.name, notice.title, delivery_id))
        said = self.answers.get(channel.name)
        answer = (said.pop(0) if len(said) > 1 else said[0]) if said else f"ok {channel.name}"
        if isinstance(answer, Exception):
            raise answer
        return answer
# sandbox
# The sandbox engine's store in memory: a SandboxEngine over a FakeSandboxStore plans and applies a folder of files
# with no database; tests/test_fakes_contract.py holds it to what SqlSandboxStore answers.


class FakeSandboxStore(SandboxStore):
    """Each stack's state and the simulated cloud's objects as dicts, JSON-copied in and out as the SQL store's rows
    are (a caller's later edit of what it wrote or read changes nothing here); the serial is compare-and-swapped."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}  # stack -> the state as JSON
        self.objects: dict[tuple[str, str], str] = {}  # (type, id) -> attributes as JSON
        self.faults: dict[tuple[str, str], str] = {}  # (stack, address) -> message

    def read_serial(self, stack: str) -> int:
        state = self.read_state(stack)
        return state.serial if state else 0

    def read_state(self, stack: str) -> StackState | None:
        return StackState.from_json(json.loads(self.states[stack])) if stack in self.states else None

    def write_state(self, stack: str, state: StackState, expected_serial: int,
                    changed: Collection[str] | None = None) -> None:
        self._write_state(stack, state, expected_serial, changed)

    def write_apply(self, stack: str, state: StackState, expected_serial: int, changed: Collection[str],
                    objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> None:
        before = dict(self.objects)
        for key, attributes in objects.items():
            self.objects.pop(key, None)
            if attributes is not None:
                self.objects[key] = _sandbox_json(attributes)
        try:
            self._write_state(stack, state, expected_serial, changed)
        except BackendError:
            self.objects = before  # one transaction: the objects go back with the refused state
            raise

    def _write_state(self, stack: str, state: StackState, expected_serial: int,
                     changed: Collection[str] | None) -> None:
        stored = json.loads(self.states[stack]) if stack in self.states else None
        if (stored["serial"] if stored else 0) != expected_serial:
            raise BackendError(f"state of stack {stack} changed underneath this write "
                               f"(expected serial {expected_serial})")
        resources = {} if stored is None or changed is None else stored["resources"]
        for address in (state.resources if changed is None else changed):
            resources.pop(address, None)
            if address in state.resources:
                resources[address] = vars(state.resources[address])
        self.states[stack] = _sandbox_json({"lineage": state.lineage, "serial": state.serial,
                                            "outputs": state.outputs, "resources": resources})

    def fault_addresses(self, stack: str) -> frozenset[str]:
        return frozenset(address for s, address in self.faults if s == stack)

    def get_objects(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {key: json.loads(self.objects[key]) for key in set(keys) if key in self.objects}

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None:
        body = self.objects.get((rtype, rid))
        return json.loads(body) if body is not None else None

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        self.objects[(rtype, rid)] = _sandbox_json(attributes)

    def delete_object(self, rtype: str, rid: str) -> None:
        self.objects.pop((rtype, rid), None)

    def inject_fault(self, stack: str, address: str, message: str) -> None:
        self.faults[(stack, address)] = message

    def inject_delay(self, stack: str, address: str, seconds: float) -> None:
        from gateway.adapters.engines.sandbox.applier import DELAY_PREFIX

        self.inject_fault(stack, address, f"{DELAY_PREFIX}{seconds}")

    def take_fault(self, stack: str, address: str) -> str | None:
        return self.faults.pop((stack, address), None)


def _sandbox_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))  # as the SQL store encodes its rows


class FakeFilesRepo(FakeDeclarationRepo):
    """A declaration repo whose commits hold whole trees of files (path -> bytes), in memory: the engine is handed
    a commit's files on disk as from git, with no git. Commits are made by `commit` (FakeClone pushes through it);
    history is a graph of parents, merged file by file (a file changed on both sides is a conflict, even where git
    would merge its lines)."""

    def __init__(self, files: Mapping[str, bytes]):
        super().__init__(files["gateway.yaml"].decode())
        self.trees: dict[str, dict[str, bytes]] = {"main-1": dict(files)}
        self.parents: dict[str, tuple[str, ...]] = {"main-1": ()}
        self.infos: dict[str, CommitInfo] = {"main-1": CommitInfo("main-1", "change-gateway", "gateway@localhost",
                                                                  "the sample repo")}

    def commit(self, branch: str, files: Mapping[str, bytes], message: str = "change", author: str = "alice",
               parents: tuple[str, ...] | None = None) -> str:
        """A commit of `files` on top of `branch`'s head (a new branch starts from main); the branch moves to it."""
        sha = f"commit-{len(self.trees) + 1}"
        self.parents[sha] = parents or (self.refs.get(branch, self.refs["main"]),)
        self.trees[sha] = dict(files)
        self.yaml[sha] = files["gateway.yaml"].decode() if "gateway.yaml" in files else ""
        self.infos[sha] = CommitInfo(sha, author, f"{author}@example.com", message)
        if branch:
            self.refs[branch] = sha
        return sha

    def commit_to_new_branch(self, base_sha: str, branch: str, files: Mapping[str, str], message: str,
                             author: str) -> str:
        if self.branch_exists(branch):
            raise Conflict(f"branch {branch} already exists in the declaration repo")
        base = self.resolve(base_sha)
        tree = {**self.trees[base], **{path: text.encode() for path, text in files.items()}}
        sha = self.commit(branch, tree, message, author, (base,))
        self.infos[sha] = replace(self.infos[sha], author_email=f"{author}@gateway")
        return sha

    def set_branch(self, branch: str, sha: str) -> None:
        self.refs[branch] = self.resolve(sha)

    def set_main(self, gateway_yaml: str) -> str:
        return self.commit("main", {**self.trees[self.refs["main"]], "gateway.yaml": gateway_yaml.encode()})

    def _ancestry(self, sha: str) -> list[str]:
        """`sha` and every commit before it, nearest first."""
        seen, order, frontier = set(), [], [self.resolve(sha)]
        while frontier:
            nxt: list[str] = []
            for c in frontier:
                if c not in seen:
                    seen.add(c)
                    order.append(c)
                    nxt += self.parents[c]
            frontier = nxt
        return order

    def merge_base(self, a: str, b: str) -> str:
        of_a = set(self._ancestry(a))
        found = next((c for c in self._ancestry(b) if c in of_a), None)
        if found is None:
            raise Conflict(f"{a} and {b} have no common history")
        return found

    def changed_paths(self, base: str, head: str) -> list[str]:
        old, new = self.trees[self.resolve(base)], self.trees[self.resolve(head)]
        return sorted(path for path in old.keys() | new.keys() if old.get(path) != new.get(path))

    def commits(self, base: str, head: str) -> list[CommitInfo]:
        hidden = set(self._ancestry(base))
        return [self.infos[c] for c in reversed(self._ancestry(head)) if c not in hidden]

    def merge_preview(self, main_sha: str, head_sha: str) -> str:
        base = self.trees[self.merge_base(main_sha, head_sha)]
        ours, theirs = self.trees[self.resolve(main_sha)], self.trees[self.resolve(head_sha)]
        merged, conflicts = dict(ours), []
        for path in sorted(base.keys() | ours.keys() | theirs.keys()):
            if theirs.get(path) == base.get(path) or theirs.get(path) == ours.get(path):
                continue
            if ours.get(path) != base.get(path):
                conflicts.append(path)
            elif path in theirs:
                merged[path] = theirs[path]
            else:
                merged.pop(path, None)
        if conflicts:
            raise Conflict(f"the branch does not merge cleanly into main (conflicts in {', '.join(conflicts)}); "
                           "rebase it on main and push again")
        return self.commit("", merged, "merge preview", "change-gateway", (main_sha, head_sha))

    def commits_touching(self, ref: str, path: str, limit: int = 20) -> list[str]:
        found = []
        for sha in self._ancestry(ref):
            parents = self.parents[sha]
            if not parents or any(self._under(sha, path) != self._under(p, path) for p in parents):
                found.append(sha)
        return found[:limit]

    def _under(self, sha: str, subdir: str) -> dict[str, bytes]:
        top = subdir.strip("/")
        tree = self.trees[self.resolve(sha)]
        return {path: data for path, data in tree.items() if not top or path == top or path.startswith(top + "/")}

    def read_file(self, sha: str, path: str) -> str:
        tree = self.trees[self.resolve(sha)]
        if path not in tree:
            raise NotFound(f"{path} does not exist at {sha[:12]}")
        return tree[path].decode()

    def read_files(self, sha: str, subdir: str, suffix: str) -> dict[str, str]:
        top = subdir.strip("/")
        return {path: data.decode() for path, data in self._under(sha, subdir).items()
                if path.rpartition("/")[0] == top and path.endswith(suffix)}

    def read_tree(self, sha: str, subdir: str) -> dict[str, str]:
        found = {}
        for path, data in self._under(sha, subdir).items():
            try:
                found[path] = data.decode()
            except UnicodeDecodeError:
                continue
        return found

    def tree_of(self, sha: str, subdir: str) -> str | None:
        files = self._under(sha, subdir)
        return hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest() if files else None  # noqa: S324

    def export(self, sha: str, subdir: str, dest: Path) -> Path:
        files = self._under(sha, subdir)
        if not files:
            raise NotFound(f"{subdir} does not exist at {sha[:12]}")
        top = subdir.strip("/")
        dest.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            target = dest / (path[len(top) + 1:] if top else path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return dest

    def module_directories(self, sha: str, stack_path: str) -> tuple[str, ...]:
        from gateway.adapters.modules.sources import local_module_directories

        return local_module_directories(stack_path, lambda directory: self.read_files(sha, directory, ".tf"))

    def export_stack(self, sha: str, stack_path: str, dest: Path) -> Path:
        directory = self.export(sha, stack_path, dest / stack_path)
        for module in self.module_directories(sha, stack_path):
            try:
                self.export(sha, module, dest / module)
            except NotFound:
                continue  # the engine names the call whose source does not exist
        (dest / "gateway.yaml").write_bytes(self.trees[self.resolve(sha)].get("gateway.yaml", b""))
        return directory


class FakeClone:
    """A developer's clone of a FakeFilesRepo, as tests/conftest.py's Clone of a git repo: branch, edit, push."""

    def __init__(self, repo: FakeFilesRepo):
        self.repo = repo
        self.branch_name = "main"
        self.files = dict(repo.trees[repo.resolve("main")])

    def branch(self, name: str) -> FakeClone:
        self.branch_name, self.files = name, dict(self.repo.trees[self.repo.resolve("main")])
        return self

    def write(self, relative: str, content: str) -> FakeClone:
        self.files[relative] = content.encode()
        return self

    def edit(self, relative: str, old: str, new: str) -> FakeClone:
        text_before = self.read(relative)
        assert old in text_before, f"{old!r} not in {relative}"
        return self.write(relative, text_before.replace(old, new))

    def remove(self, relative: str) -> FakeClone:
        del self.files[relative]
        return self

    def read(self, relative: str) -> str:
        return self.files[relative].decode()

    def push(self, message: str = "change", author: str = "alice") -> str:
        return self.repo.commit(self.branch_name, self.files, message, author)


SAMPLE_REPO = Path(__file__).parent.parent / "gateway" / "sample_repo"
_sample_cloud: dict[str, Any] = {}  # the sample's stacks applied once per process: each workspace starts from a copy


def sandbox_workspace(home: Path) -> Workspace:
    """A workspace of the sample repo whose engine is the real SandboxEngine over a FakeSandboxStore, main's stacks
    applied to it, its repo a FakeFilesRepo and its store a FakeStore: plan_stack runs as it does on a workspace (the
    HCL reader, the policy checks, main's Rego), with no git, no database and no job."""
    from gateway.adapters.declarations import HclDeclarations  # the engine's imports only where it is used
    from gateway.adapters.engines.sandbox.cloud import SandboxCloud
    from gateway.adapters.engines.sandbox.engine import SandboxEngine
    from gateway.adapters.policy.engines import CheckovScanner, RegoInterpreter

    files = {str(p.relative_to(SAMPLE_REPO)): p.read_bytes() for p in sorted(SAMPLE_REPO.rglob("*")) if p.is_file()}
    settings = Settings(home=home, token=None)
    settings.secrets_path.mkdir(parents=True, exist_ok=True)
    if not _sample_cloud:
        _sample_cloud["secrets"] = {"data": {"db_password": uuid.uuid4().hex[:24]}}
    for stack, values in _sample_cloud["secrets"].items():
        (settings.secrets_path / f"{stack}.tfvars.json").write_text(json.dumps(values))
    store = FakeSandboxStore()
    engine = SandboxEngine(store)
    clock = FakeClock()
    absent = _Unfaked
    ws = Workspace(settings=settings, store=FakeStore(clock), repo=FakeFilesRepo(files), engine=engine,
                   scrubber=Scrubber(), simulator=SandboxCloud(engine, store), clock=clock,  # type: ignore[arg-type]
                   open_forge=absent("forge"), declarations=HclDeclarations(), scanner=CheckovScanner(),
                   rego=RegoInterpreter(), working_copies=absent("working_copies"),  # type: ignore[arg-type]
                   open_checkpointer=absent("checkpointer"))  # type: ignore[arg-type]
    if "states" not in _sample_cloud:
        _apply_main(ws)
        _sample_cloud.update(states=dict(store.states), objects=dict(store.objects))
    store.states, store.objects = dict(_sample_cloud["states"]), dict(_sample_cloud["objects"])
    return ws


def _apply_main(ws: Workspace) -> None:
    """Every stack of main applied, as `gateway init` starts the simulated cloud."""
    sha = ws.repo.resolve("main")
    for stack, stack_settings in sorted(ws.repo_settings().stacks.items()):
        with tempfile.TemporaryDirectory(prefix=f"gw-fake-{stack}-") as tmp:
            directory = ws.repo.export_stack(sha, stack_settings.path, Path(tmp))
            planned = ws.engine.plan(stack, directory, ws.stack_inputs(stack))
            outcome = ws.engine.apply(stack, directory, planned.document, planned.state_serial, ws.stack_inputs(stack))
        assert outcome.succeeded, f"the sample's stack {stack} did not apply: {outcome.error}"


# ---------------------------------------------------------------------------------------------------------------
# more
# What an apply and day two reach past opening and deciding, so the whole path (open, decide, apply, merge, watch
# main, codify, roll back) runs on sandbox_workspace: the saved plan's digest and artifact as stored (a row edited
# in place hashes differently, as SqlProposals' does), a proposal's queued jobs, and on FakeFilesRepo a merge into
# main that moves the branch only if nobody moved it meanwhile (git's update-ref compare-and-swap), main's
# first-parent line, ancestry, a text diff, a merge's revert onto a new branch, a conflict named without a commit,
# a pinned read and a deleted branch. Added to the fakes above, which leave them unfaked (or to the Protocol's
# silent None); tests/test_fakes_contract.py holds them to the SQL store and to git. Beside them, the sample's
# people: one record, People, filled in a fake store here and on a real workspace by conftest's add_people.


def _saved_plan_digests(self: FakeProposals, plan_ids: Collection[int]) -> dict[int, str]:
    from gateway.domain.plan import decode_plan_bytes, plan_digest

    rows = {i: self.t.plans[i] for i in plan_ids if i in self.t.plans}
    return {i: plan_digest(decode_plan_bytes(str(row["document"]).encode()), row["artifact"])
            for i, row in rows.items()}


def _plan_artifact(self: FakeProposals, plan_id: int) -> bytes | None:
    row = self.t.plans.get(plan_id)
    return row["artifact"] if row is not None else None


FakeProposals.saved_plan_digests = _saved_plan_digests  # type: ignore[method-assign]
FakeProposals.plan_artifact = _plan_artifact  # type: ignore[method-assign]


def _merge(self: FakeFilesRepo, main_sha: str, head_sha: str, into: str, message: str,
           before_moving: Callable[[str], None] | None = None) -> str:
    from gateway.domain.errors import RefMoved

    sha = self.merge_preview(main_sha, head_sha)  # a conflict is refused before any commit is named
    self.infos[sha] = replace(self.infos[sha], message=message)
    if before_moving is not None:
        before_moving(sha)
    if self.refs.get(into) != self.resolve(main_sha):
        raise RefMoved(f"{into} moved while merging; it is no longer at {main_sha[:12]}")
    self.refs[into] = sha
    return sha


def _is_ancestor(self: FakeFilesRepo, older: str, newer: str) -> bool:
    return self.resolve(older) in self._ancestry(newer)


def _first_parent_commits(self: FakeFilesRepo, since: str, until: str) -> list[tuple[str, str | None, str]]:
    hidden, line, sha = set(self._ancestry(since)), [], self.resolve(until)
    while sha not in hidden:
        parents = self.parents[sha]
        info = self.infos[sha]
        line.append((sha, parents[0] if parents else None, f"{info.author_name} <{info.author_email}>"))
        if not parents:
            break
        sha = parents[0]
    return line[::-1]


def _diff(self: FakeFilesRepo, base: str, head: str) -> str:
    import difflib

    old, new = self.trees[self.resolve(base)], self.trees[self.resolve(head)]
    lines: list[str] = []
    for path in self.changed_paths(base, head):
        before = old[path].decode().splitlines(keepends=True) if path in old else []
        after = new[path].decode().splitlines(keepends=True) if path in new else []
        lines += [f"diff --git a/{path} b/{path}\n"]
        lines += difflib.unified_diff(before, after, f"a/{path}" if path in old else "/dev/null",
                                      f"b/{path}" if path in new else "/dev/null")
    return "".join(lines)


def _revert_merge_to_new_branch(self: FakeFilesRepo, merge_sha: str, onto_sha: str, branch: str, message: str,
                                author: str) -> str:
    """The merge's changes (against its first parent, the mainline) undone on `onto_sha`, file by file: a file
    changed since the merge is a conflict, as where git's revert would not apply."""
    if self.branch_exists(branch):
        raise Conflict(f"branch {branch} already exists in the declaration repo")
    merged, mainline = self.trees[self.resolve(merge_sha)], self.trees[self.parents[self.resolve(merge_sha)][0]]
    onto = self.resolve(onto_sha)
    tree = dict(self.trees[onto])
    for path in self.changed_paths(self.parents[self.resolve(merge_sha)][0], merge_sha):
        if tree.get(path) != merged.get(path):
            raise Conflict(f"the merge {merge_sha[:12]} no longer reverts cleanly on main (later changes touch the "
                           "same lines); write the rollback by hand")
        if path in mainline:
            tree[path] = mainline[path]
        else:
            tree.pop(path, None)
    sha = self.commit(branch, tree, message, author, (onto,))
    self.infos[sha] = replace(self.infos[sha], author_email=f"{author}@gateway")
    return sha


def _merge_conflict(self: FakeFilesRepo, main_sha: str, head_sha: str) -> str | None:
    """merge_preview's refusal, in its words, with no commit made (None: it merges)."""
    base = self.trees[self.merge_base(main_sha, head_sha)]
    ours, theirs = self.trees[self.resolve(main_sha)], self.trees[self.resolve(head_sha)]
    conflicts = [path for path in sorted(base.keys() | ours.keys() | theirs.keys())
                 if theirs.get(path) not in (base.get(path), ours.get(path)) and ours.get(path) != base.get(path)]
    if not conflicts:
        return None
    return (f"the branch does not merge cleanly into main (conflicts in {', '.join(conflicts)}); rebase it on main "
            "and push again")


def _pinned(self: FakeFilesRepo) -> FakeFilesRepo:
    """The same commits with the refs as they are now: a push after this does not move what the read sees."""
    pinned = copy.copy(self)
    pinned.refs = dict(self.refs)
    return pinned


def _delete_branch(self: FakeFilesRepo, branch: str) -> None:
    self.refs.pop(branch, None)


FakeFilesRepo.diff = _diff  # type: ignore[method-assign]
FakeFilesRepo.revert_merge_to_new_branch = _revert_merge_to_new_branch  # type: ignore[method-assign]
FakeFilesRepo.delete_branch = _delete_branch  # type: ignore[method-assign]
FakeFilesRepo.merge_conflict = _merge_conflict  # type: ignore[method-assign]
FakeFilesRepo.pinned = _pinned  # type: ignore[method-assign]
FakeFilesRepo.merge = _merge  # type: ignore[method-assign]
FakeFilesRepo.is_ancestor = _is_ancestor  # type: ignore[method-assign]
FakeFilesRepo.first_parent_commits = _first_parent_commits  # type: ignore[method-assign]


def _jobs_of_proposal(self: FakeJobs, proposal_id: int) -> list[Any]:
    from gateway.domain.jobs import Job, JobStatus

    return [Job(j["id"], j["kind"], j["proposal_id"], j["requested_by"], JobStatus.QUEUED, args=dict(j["args"]),
                created_at=j["created_at"]) for j in sorted(self.t.jobs.values(), key=lambda j: j["id"])
            if j["proposal_id"] == proposal_id]  # every job here is queued: none runs


FakeJobs.of_proposal = _jobs_of_proposal  # type: ignore[method-assign]


@dataclass
class People:
    """The sample's team: the same names, roles and groups in a fake store (sample_people) and on a real workspace
    (conftest's add_people, which also keeps each one's token to sign in with)."""

    admin: Principal
    alice: Principal  # requester, app group
    bob: Principal  # approver, platform
    carol: Principal  # approver, platform
    erin: Principal  # approver, data group only
    dana: Principal  # auditor
    frank: Principal  # policy owner (security group)
    agent: Principal  # an agent acting for alice
    tokens: dict[str, str] = field(default_factory=dict)  # by name; none in a fake store, where nobody signs in




def sample_people(store: Store) -> People:
    """The sample's team kept in a fake store, with no tokens."""
    def add(name: str, role: Role, *groups: str, kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
        return person(name, role, groups=groups, kind=kind, store=store)

    return People(admin=add("admin", Role.ADMIN), alice=add("alice", Role.REQUESTER, "app"),
                  bob=add("bob", Role.APPROVER, "platform"), carol=add("carol", Role.APPROVER, "platform"),
                  erin=add("erin", Role.APPROVER, "data"), dana=add("dana", Role.AUDITOR),
                  frank=add("frank", Role.APPROVER, "security"),
                  agent=add("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT))
