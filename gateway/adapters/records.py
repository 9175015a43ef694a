"""Proposals, principals, plans, decisions, applies, stack locks and the audit chain in SQL.

`SqlStore.session()` is the unit of work: everything a use case writes, audit events included,
commits together or not at all. Stack locks commit on their own, since other processes must see
them while an apply runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, insert, or_, select, union, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.sealing import UNSEALED, Sealer
from gateway.adapters.sql_store import (
    Database,
    agent_runs,
    applies,
    audit_checkpoints,
    audit_event_addresses,
    audit_event_stacks,
    audit_events,
    audit_head,
    break_glass_windows,
    breaker_changes,
    breaker_states,
    conversations,
    decisions,
    drift_records,
    dumps,
    github_accounts,
    jobs,
    main_pushes,
    markers,
    overrides,
    plans,
    principals,
    proposals,
    pull_requests,
    stack_locks,
    webhook_deliveries,
)
from gateway.domain.agent_runs import UNFINISHED, AgentRun, AgentRunStatus
from gateway.domain.audit import AuditEvent, Checkpoint, event_addresses, event_hash, event_outcome
from gateway.domain.breaker import CapacityChange
from gateway.domain.drift import DriftRecord, DriftStatus, entries_from_json, entries_to_json
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import ACTIVE, INITIAL, Transition
from gateway.domain.locks import UNMERGED, LockAttempt, StackLock, unmerged_holder
from gateway.domain.policy import Finding, Override
from gateway.domain.preview import DriftEntry
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, DecisionRecord, Proposal, ProposalKind, ProposalStatus, StackPlan
from gateway.domain.risk import RiskLevel
from gateway.domain.scrubbing import Scrubber

MAX_ID = 2**31 - 1  # ids are 32-bit in both databases; anything larger cannot exist


def now() -> datetime:
    return datetime.now(UTC)


class SqlStore:
    def __init__(self, db: Database, scrubber: Scrubber | None = None, sealer: Sealer = UNSEALED):
        self.db = db
        self.scrubber = scrubber or Scrubber()
        self.sealer = sealer  # saved plans hold secrets in clear: sealed at rest

    @contextmanager
    def session(self, readonly: bool = False) -> Iterator[StoreSession]:
        """One transaction over the records; `readonly` for reads, which then never wait for a writer."""
        with self.db.transaction(readonly) as conn:
            session = StoreSession(conn, self.scrubber, self.sealer)
            yield session
            session.write_chain_head()  # once, before the commit, after however many events

    # --- stack locks: committed on their own -------------------------------------------------

    def acquire_lock(self, stack: str, holder: str, ttl_seconds: float, proposal_id: int | None = None) -> LockAttempt:
        """Take the stack's lock if nobody holds it; otherwise say who does (an expired holder is not broken here:
        its apply must be settled first, see services/recovery.py)."""
        with self.db.transaction() as conn:
            row = conn.execute(select(stack_locks).where(stack_locks.c.stack == stack)).mappings().first()
            if row is not None:
                return LockAttempt(False, _stack_lock(row))
            try:
                with conn.begin_nested():
                    conn.execute(insert(stack_locks).values(
                        stack=stack, holder=holder, proposal_id=proposal_id, acquired_at=now(),
                        expires_at=now() + timedelta(seconds=ttl_seconds)))
            except IntegrityError:  # another runner inserted it first
                return LockAttempt(False, None)
        return LockAttempt(True)

    def set_lock_apply(self, stack: str, holder: str, apply_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(stack_locks).where(stack_locks.c.stack == stack, stack_locks.c.holder == holder)
                         .values(apply_id=apply_id))

    def renew_locks(self, stacks: Sequence[str], holder: str, ttl_seconds: float) -> list[str]:
        """The heartbeat: push the expiry of `holder`'s locks forward. Returns the ones it no longer holds."""
        lost = []
        with self.db.transaction() as conn:
            for stack in stacks:
                renewed = conn.execute(update(stack_locks).where(
                    stack_locks.c.stack == stack, stack_locks.c.holder == holder).values(
                    expires_at=now() + timedelta(seconds=ttl_seconds)))
                if renewed.rowcount != 1:
                    lost.append(stack)
        return lost

    def hand_over_lock(self, stack: str, holder: str, new_holder: str) -> bool:
        """Give a lock to a holder that never expires; only a person's action releases it. False if not held."""
        with self.db.transaction() as conn:
            moved = conn.execute(update(stack_locks).where(stack_locks.c.stack == stack,
                                                           stack_locks.c.holder == holder)
                                 .values(holder=new_holder, apply_id=None, expires_at=NEVER))
        return moved.rowcount == 1

    def release_lock(self, stack: str, holder: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(stack_locks).where(stack_locks.c.stack == stack, stack_locks.c.holder == holder))

    def lock_holder(self, stack: str) -> StackLock | None:
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(select(stack_locks).where(stack_locks.c.stack == stack)).mappings().first()
        return _stack_lock(row) if row else None

    def expired_locks(self) -> list[StackLock]:
        """Locks whose holder stopped heart-beating (kept locks of unmerged proposals never expire)."""
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(select(stack_locks).where(stack_locks.c.expires_at < now())).mappings()
            return [_stack_lock(r) for r in rows]

    def take_over_expired_locks(self, holder: str, new_holder: str, ttl_seconds: float) -> list[StackLock]:
        """Move every expired lock of `holder` to `new_holder` at once; the locks as the dead holder left them.

        Whoever gets them settles the dead holder's apply; a second recoverer racing for them gets none.
        """
        with self.db.transaction() as conn:
            rows = conn.execute(select(stack_locks).where(
                stack_locks.c.holder == holder, stack_locks.c.expires_at < now())
                .order_by(stack_locks.c.stack).with_for_update()).mappings().all()
            taken = [_stack_lock(r) for r in rows]
            if taken:
                conn.execute(update(stack_locks).where(
                    stack_locks.c.holder == holder, stack_locks.c.stack.in_([lock.stack for lock in taken]))
                    .values(holder=new_holder, acquired_at=now(), expires_at=now() + timedelta(seconds=ttl_seconds)))
        return taken

    def keep_locks_unmerged(self, stacks: Sequence[str], holder: str, proposal_id: int) -> list[str]:
        """Hand `holder`'s locks (expired or not) to the unmerged proposal, taking free ones too; the ones held
        by someone else, which the proposal could not keep."""
        kept_by = unmerged_holder(proposal_id)
        others = []
        with self.db.transaction() as conn:
            for stack in stacks:
                row = conn.execute(select(stack_locks).where(stack_locks.c.stack == stack)
                                   .with_for_update()).mappings().first()
                if row is None:
                    conn.execute(insert(stack_locks).values(stack=stack, holder=kept_by, proposal_id=proposal_id,
                                                            acquired_at=now(), expires_at=NEVER))
                elif row["holder"] in (holder, kept_by):
                    conn.execute(update(stack_locks).where(stack_locks.c.stack == stack).values(
                        holder=kept_by, proposal_id=proposal_id, apply_id=None, expires_at=NEVER))
                else:
                    others.append(stack)
        return others

    # --- jobs: claimed, heart-beaten and finished in transactions of their own ---------------

    def claim_job(self, runner: str, job_id: int | None = None) -> Job | None:
        """Take the oldest queued job (or `job_id`) whose proposal has no job running; None if there is none.

        A job waiting for a retry is not taken before its `run_after`, and a proposal's later deliveries wait
        behind it (a proposal's deliveries run in the order GitHub sent them). PostgreSQL skips rows other
        workers are claiming (FOR UPDATE SKIP LOCKED); SQLite's BEGIN IMMEDIATE lets one claimer in at a time.
        """
        moment = now()
        running = select(jobs.c.proposal_id).where(jobs.c.status == JobStatus.RUNNING.value,
                                                   jobs.c.proposal_id.is_not(None))
        earlier = jobs.alias("earlier")
        delivery_waiting = select(earlier.c.id).where(
            earlier.c.kind == JobKind.WEBHOOK.value, earlier.c.status == JobStatus.QUEUED.value,
            earlier.c.proposal_id == jobs.c.proposal_id, earlier.c.id < jobs.c.id).exists()
        query = select(jobs).where(jobs.c.status == JobStatus.QUEUED.value,
                                   jobs.c.proposal_id.not_in(running) | jobs.c.proposal_id.is_(None),
                                   jobs.c.run_after.is_(None) | (jobs.c.run_after <= moment),
                                   (jobs.c.kind != JobKind.WEBHOOK.value) | jobs.c.proposal_id.is_(None)
                                   | ~delivery_waiting)
        if job_id is not None:
            query = query.where(jobs.c.id == job_id)
        query = query.order_by(jobs.c.id).limit(1)
        with self.db.transaction() as conn:
            if not self.db.is_sqlite:
                query = query.with_for_update(skip_locked=True)
            row = conn.execute(query).mappings().first()
            if row is None:
                return None
            try:
                with conn.begin_nested():  # the unique index refuses a second running job for one proposal
                    conn.execute(update(jobs).where(jobs.c.id == row["id"]).values(
                        status=JobStatus.RUNNING.value, runner=runner, started_at=now(), heartbeat_at=now(),
                        attempts=jobs.c.attempts + 1))
            except IntegrityError:
                return None
            row = conn.execute(select(jobs).where(jobs.c.id == row["id"])).mappings().one()
        return _job(row)

    def heartbeat_job(self, job_id: int, runner: str) -> bool:
        with self.db.transaction() as conn:
            beat = conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.runner == runner,
                                                   jobs.c.status == JobStatus.RUNNING.value).values(heartbeat_at=now()))
        return beat.rowcount == 1

    def add_job_progress(self, job_id: int, line: str) -> None:
        with self.db.transaction() as conn:
            current = conn.scalar(select(jobs.c.progress).where(jobs.c.id == job_id)) or []
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(progress=[*current, line][-200:]))

    def stale_jobs(self, older_than_seconds: float) -> list[Job]:
        """Running jobs whose worker has not heart-beaten for `older_than_seconds`."""
        cutoff = now() - timedelta(seconds=older_than_seconds)
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(select(jobs).where(jobs.c.status == JobStatus.RUNNING.value,
                                                   jobs.c.heartbeat_at < cutoff)).mappings()
            return [_job(r) for r in rows]

    def jobs_of(self, proposal_id: int) -> list[Job]:
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(select(jobs).where(jobs.c.proposal_id == proposal_id).order_by(jobs.c.id)).mappings()
            return [_job(r) for r in rows]

    def get_job(self, job_id: int) -> Job:
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        if row is None or not 0 < job_id <= MAX_ID:
            raise NotFound(f"no job {job_id}")
        return _job(row)


NEVER = datetime(9999, 1, 1, tzinfo=UTC)


def _stack_lock(row: Mapping[str, Any]) -> StackLock:
    proposal_id = row.get("proposal_id")
    if proposal_id is None and str(row["holder"]).startswith(UNMERGED):  # kept before locks named their proposal
        proposal_id = int(str(row["holder"]).removeprefix(UNMERGED))
    return StackLock(stack=row["stack"], holder=row["holder"], acquired_at=_aware(row["acquired_at"]),
                     expires_at=_aware(row["expires_at"]), proposal_id=proposal_id, apply_id=row["apply_id"])


def _job(row: Mapping[str, Any]) -> Job:
    return Job(id=row["id"], kind=JobKind(row["kind"]), proposal_id=row["proposal_id"],
               requested_by=row["requested_by"], status=JobStatus(row["status"]), runner=row["runner"],
               progress=tuple(row["progress"] or ()), result=dict(row["result"] or {}), error=row["error"],
               created_at=row["created_at"], started_at=row["started_at"], finished_at=row["finished_at"],
               args=dict(row.get("args") or {}), attempts=int(row.get("attempts") or 0),
               run_after=_aware(row["run_after"]) if row.get("run_after") else None)


def _agent_run(row: Mapping[str, Any]) -> AgentRun:
    return AgentRun(row["id"], row["requester_id"], row["request"], row["conversation_id"],
                    AgentRunStatus(row["status"]), tuple(row["progress"] or ()), row["proposal_id"], row["message"],
                    row["job_id"], _aware(row["created_at"]), _aware(row["updated_at"]))


def _drift_record(row: Mapping[str, Any]) -> DriftRecord:
    return DriftRecord(row["id"], row["stack"], DriftStatus(row["status"]), entries_from_json(row["resources"]),
                       bool(row["expected"]), _aware(row["opened_at"]), _aware(row["updated_at"]),
                       _aware(row["closed_at"]) if row["closed_at"] else None, row["closed_by"], row["closed_reason"],
                       row["closed_by_proposal"], row["break_glass_id"])


def _aware_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_aware(v) if isinstance(v, datetime) else v) for k, v in row.items()}


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class StoreSession:
    """One transaction's view of the records."""

    def __init__(self, conn: Connection, scrubber: Scrubber | None = None, sealer: Sealer = UNSEALED):
        self.conn = conn
        self.scrubber = scrubber or Scrubber()
        self.sealer = sealer
        self._head: tuple[int, str] | None = None  # the chain's head, row-locked by this transaction's first event
        self._head_moved = False

    # --- principals ------------------------------------------------------------------------

    def add_principal(self, name: str, kind: PrincipalKind, roles: frozenset[Role], groups: frozenset[str],
                      token_hash: str, acting_for: str | None = None) -> Principal:
        if self.principal_by_name(name) is not None:
            raise Conflict(f"a principal named {name!r} already exists")
        pid = str(uuid.uuid4())
        self.conn.execute(insert(principals).values(
            id=pid, name=name, kind=kind.value, roles=sorted(roles), groups=sorted(groups),
            token_hash=token_hash, acting_for=acting_for, created_at=now()))
        return Principal(pid, name, kind, roles, groups, acting_for)

    def count_principals(self) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(principals)) or 0)

    def principal_by_token_hash(self, token_hash: str) -> Principal | None:
        row = self.conn.execute(select(principals).where(principals.c.token_hash == token_hash)).mappings().first()
        return _principal(row) if row else None

    def principal_by_name(self, name: str) -> Principal | None:
        row = self.conn.execute(select(principals).where(principals.c.name == name)).mappings().first()
        return _principal(row) if row else None

    def principal(self, pid: str) -> Principal:
        row = self.conn.execute(select(principals).where(principals.c.id == pid)).mappings().first()
        if row is None:
            raise NotFound(f"unknown principal {pid}")
        return _principal(row)

    def credentials(self, pid: str) -> dict[str, Any]:
        """A principal's credential record: when disabled, when its token expires, when it was last used."""
        row = self.conn.execute(select(principals.c.disabled_at, principals.c.token_expires_at,
                                       principals.c.last_used_at).where(principals.c.id == pid)).mappings().first()
        if row is None:
            raise NotFound(f"unknown principal {pid}")
        return {k: (_aware(v) if v else None) for k, v in row.items()}

    def update_principal(self, pid: str, **values: Any) -> None:
        self.conn.execute(update(principals).where(principals.c.id == pid).values(**values))

    def enabled_admins(self) -> list[str]:
        rows = self.conn.execute(select(principals.c.id, principals.c.roles).where(principals.c.disabled_at.is_(None)))
        return [r.id for r in rows if Role.ADMIN.value in r.roles]

    def list_principals(self) -> list[Principal]:
        rows = self.conn.execute(select(principals).order_by(principals.c.name)).mappings()
        return [_principal(r) for r in rows]

    # --- proposals -------------------------------------------------------------------------

    def add_proposal(self, branch: str, base_sha: str, head_sha: str, requester: Principal, proposer: Principal,
                     reason: str, stacks: Sequence[str], changed_paths: Sequence[str], agent_claim: str | None = None,
                     prompt_version: str | None = None, model: str | None = None,
                     kind: ProposalKind = ProposalKind.CHANGE) -> int:
        result = self.conn.execute(insert(proposals).values(kind=kind.value,
            branch=branch, base_sha=base_sha, head_sha=head_sha, requester_id=requester.id,
            proposer_id=proposer.id, reason=reason, status=INITIAL.value, stacks=list(stacks),
            changed_paths=list(changed_paths),
            agent_claim=agent_claim, prompt_version=prompt_version, model=model,
            created_at=now(), updated_at=now()))
        return int(result.inserted_primary_key[0])

    def open_proposal_for_branch(self, branch: str) -> int | None:
        return self.conn.scalar(select(proposals.c.id).where(
            proposals.c.branch == branch, proposals.c.status.in_([s.value for s in ACTIVE])))

    def plan_bases(self, statuses: Collection[ProposalStatus]) -> list[dict[str, Any]]:
        """For each proposal in `statuses`: branch, head, stacks, and each stack's newest plan at that head
        (main commit and state serial), in two queries: what a worker's staleness scan needs."""
        rows = self.conn.execute(select(proposals.c.id, proposals.c.branch, proposals.c.head_sha, proposals.c.stacks)
                                 .where(proposals.c.status.in_([s.value for s in statuses]))).mappings().all()
        bases = {r["id"]: {**dict(r), "plans": {}} for r in rows}
        if bases:
            marks = self.conn.execute(
                select(plans.c.proposal_id, plans.c.stack, plans.c.head_sha, plans.c.main_sha, plans.c.state_serial)
                .where(plans.c.proposal_id.in_(list(bases))).order_by(plans.c.id)).mappings()
            for m in marks:  # the newest plan of each stack at the proposal's head wins
                if m["head_sha"] == bases[m["proposal_id"]]["head_sha"]:
                    bases[m["proposal_id"]]["plans"][m["stack"]] = (m["main_sha"], m["state_serial"])
        return list(bases.values())

    def get_proposal(self, proposal_id: int, lock: bool = False) -> Proposal:
        if not 0 < proposal_id <= MAX_ID:
            raise NotFound(f"no proposal {proposal_id}")
        query = select(proposals).where(proposals.c.id == proposal_id)
        row = self.conn.execute(query.with_for_update() if lock else query).mappings().first()
        if row is None:
            raise NotFound(f"no proposal {proposal_id}")
        proposal = Proposal(
            id=row["id"], branch=row["branch"], base_sha=row["base_sha"], head_sha=row["head_sha"],
            requester=self.principal(row["requester_id"]), proposer=self.principal(row["proposer_id"]),
            reason=row["reason"], stacks=tuple(row["stacks"]), status=ProposalStatus(row["status"]),
            merge_sha=row["merge_sha"], agent_claim=row["agent_claim"], changed_paths=tuple(row["changed_paths"]),
            applied_sha=row["applied_sha"], kind=ProposalKind(row["kind"] or ProposalKind.CHANGE.value),
        )
        proposal.plans = self._current_plans(proposal_id, proposal.head_sha)
        proposal.decisions = self._decisions(proposal_id)
        proposal.overrides = self._overrides(proposal_id)
        return proposal

    def list_proposals(self, status: str | None = None) -> list[dict[str, Any]]:
        query = select(proposals).order_by(proposals.c.id.desc())
        if status:
            query = query.where(proposals.c.status == status)
        return [dict(r) for r in self.conn.execute(query).mappings()]

    def update_head(self, proposal_id: int, head_sha: str, stacks: Sequence[str], changed_paths: Sequence[str]) -> None:
        self.conn.execute(update(proposals).where(proposals.c.id == proposal_id).values(
            head_sha=head_sha, stacks=list(stacks), changed_paths=list(changed_paths), updated_at=now()))

    def set_agent_details(self, proposal_id: int, prompt_version: str, model: str, agent_claim: str | None = None) -> None:
        """The prompt version and model an agent's proposal was written with (and its latest claim)."""
        values: dict[str, Any] = {"prompt_version": prompt_version, "model": model, "updated_at": now()}
        if agent_claim is not None:
            values["agent_claim"] = agent_claim
        self.conn.execute(update(proposals).where(proposals.c.id == proposal_id).values(**values))

    def record_transition(self, proposal: Proposal, transition: Transition, actor: Principal | str,
                          payload: Mapping[str, Any], merge_sha: str | None = None,
                          applied_sha: str | None = None) -> ProposalStatus:
        """Take one lifecycle transition and persist it with its audit event, in this transaction.

        The row changes only if it is still in the state the transition started from: a concurrent
        writer that moved it first makes this one a Conflict, never a silent overwrite.
        """
        before = proposal.status
        after = proposal.take(transition)
        values: dict[str, Any] = {"status": after.value, "updated_at": now()}
        if merge_sha:
            values["merge_sha"] = merge_sha
            proposal.merge_sha = merge_sha
        if applied_sha:
            values["applied_sha"] = applied_sha
            proposal.applied_sha = applied_sha
        moved = self.conn.execute(update(proposals).where(
            proposals.c.id == proposal.id, proposals.c.status == before.value).values(**values))
        if moved.rowcount != 1:
            raise Conflict(f"proposal {proposal.id} changed while it was being moved from {before.value}; try again")
        self.append_event(actor, f"proposal.{transition.value}",
                          {"from": before.value, "to": after.value, **payload}, proposal.id, proposal.stacks)
        return after

    # --- plans -----------------------------------------------------------------------------

    def add_plan(self, proposal_id: int, stack: str, head_sha: str, main_sha: str, digest: str, document: str,
                 state_serial: int, state_lineage: str, summary: Mapping[str, Any], preview: str,
                 artifact: bytes | None = None) -> int:
        result = self.conn.execute(insert(plans).values(
            proposal_id=proposal_id, stack=stack, head_sha=head_sha, main_sha=main_sha, digest=digest,
            document=self.sealer.seal_text(document), state_serial=state_serial, state_lineage=state_lineage,
            summary=dict(summary), preview=preview,
            artifact=self.sealer.seal_bytes(artifact) if artifact is not None else None, created_at=now()))
        return int(result.inserted_primary_key[0])

    def plan_preview(self, plan_id: int) -> str | None:
        """The stored masked preview of a plan (None for plans saved before previews were stored)."""
        return self.conn.scalar(select(plans.c.preview).where(plans.c.id == plan_id))

    def plan_artifact(self, plan_id: int) -> bytes | None:
        """The engine's own saved plan (Terraform's plan file), if the engine keeps one."""
        value = self.conn.scalar(select(plans.c.artifact).where(plans.c.id == plan_id))
        return self.sealer.open_bytes(bytes(value)) if value is not None else None

    def plan_document(self, plan_id: int) -> str:
        document = self.conn.scalar(select(plans.c.document).where(plans.c.id == plan_id))
        if document is None:
            raise NotFound(f"no saved plan {plan_id}")
        return self.sealer.open_text(str(document))

    def _current_plans(self, proposal_id: int, head_sha: str) -> dict[str, StackPlan]:
        columns = [c for c in plans.c if c.name not in ("document", "preview", "artifact")]  # the big ones are read on demand
        rows = self.conn.execute(
            select(*columns).where(plans.c.proposal_id == proposal_id, plans.c.head_sha == head_sha)
            .order_by(plans.c.id)).mappings()
        current: dict[str, StackPlan] = {}
        for r in rows:  # the newest plan of each stack wins
            current[r["stack"]] = StackPlan(
                plan_id=r["id"], stack=r["stack"], head_sha=r["head_sha"], digest=r["digest"],
                state_serial=r["state_serial"], counts=r["summary"].get("counts", {}),
                destructive=tuple(r["summary"].get("destructive", [])),
                risk=RiskLevel(r["summary"].get("risk", {}).get("level", "low")),
                risk_reasons=tuple(r["summary"].get("risk", {}).get("reasons", [])),
                findings=tuple(Finding.from_json(f) for f in r["summary"].get("findings", [])),
                main_sha=r["main_sha"], changed=tuple(r["summary"].get("changed", [])),
                drift=tuple(r["summary"].get("drift", [])), planned_at=_aware(r["created_at"]))
        return current

    # --- decisions -------------------------------------------------------------------------

    def add_decision(self, proposal_id: int, principal: Principal, decision: Decision, head_sha: str,
                     digests: Mapping[str, str], comment: str, auth: str) -> int:
        result = self.conn.execute(insert(decisions).values(
            proposal_id=proposal_id, principal_id=principal.id, decision=decision.value, head_sha=head_sha,
            digests=dict(digests), comment=comment, auth=auth, created_at=now()))
        return int(result.inserted_primary_key[0])

    def _decisions(self, proposal_id: int) -> list[DecisionRecord]:
        rows = self.conn.execute(
            select(decisions).where(decisions.c.proposal_id == proposal_id).order_by(decisions.c.id)).mappings()
        return [DecisionRecord(
            id=r["id"], principal=self.principal(r["principal_id"]), decision=Decision(r["decision"]),
            head_sha=r["head_sha"], digests=r["digests"], comment=r["comment"], auth=r["auth"],
            at=_aware(r["created_at"])) for r in rows]

    # --- policy overrides ------------------------------------------------------------------

    def add_override(self, proposal_id: int, finding_key: str, principal: Principal, reason: str,
                     expires_at: datetime) -> int:
        result = self.conn.execute(insert(overrides).values(
            proposal_id=proposal_id, finding_key=finding_key, principal_id=principal.id, reason=reason,
            expires_at=expires_at, created_at=now()))
        return int(result.inserted_primary_key[0])

    def _overrides(self, proposal_id: int) -> list[Override]:
        rows = self.conn.execute(select(overrides).where(overrides.c.proposal_id == proposal_id)
                                 .order_by(overrides.c.id)).mappings()
        return [Override(r["finding_key"], self.principal(r["principal_id"]).name, r["reason"],
                         _aware(r["expires_at"])) for r in rows]

    # --- conversations with the agent -------------------------------------------------------

    def add_conversation(self, conversation_id: str, requester: Principal, branch: str) -> None:
        self.conn.execute(insert(conversations).values(
            id=conversation_id, requester_id=requester.id, branch=branch, created_at=now()))

    def conversation(self, conversation_id: str) -> dict[str, Any] | None:
        row = self.conn.execute(select(conversations).where(conversations.c.id == conversation_id)).mappings().first()
        return dict(row) if row else None

    def link_conversation(self, conversation_id: str, proposal_id: int) -> None:
        self.conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                          .values(proposal_id=proposal_id))

    def hold_conversation(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """Hold the conversation for `turn` until `until`; refused while another turn holds it (a lapsed hold is free)."""
        free = or_(conversations.c.running_until.is_(None), conversations.c.running_until < now())
        query = update(conversations).where(conversations.c.id == conversation_id, free)
        return self.conn.execute(query.values(running_turn=turn, running_until=until)).rowcount == 1

    def renew_conversation(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """`turn`, still working, extends its hold; False when it holds the conversation no more (another turn took
        it over after its hold lapsed)."""
        query = update(conversations).where(conversations.c.id == conversation_id,
                                            conversations.c.running_turn == turn)
        return self.conn.execute(query.values(running_until=until)).rowcount == 1

    def release_conversation(self, conversation_id: str, turn: str) -> bool:
        """`turn` lets go of the conversation; a turn that lost its hold leaves the new holder's alone (False)."""
        query = update(conversations).where(conversations.c.id == conversation_id,
                                            conversations.c.running_turn == turn)
        return self.conn.execute(query.values(running_turn=None, running_until=None)).rowcount == 1

    def conversation_busy(self, conversation_id: str) -> bool:
        """A turn holds this conversation now."""
        return self.conn.scalar(select(func.count()).select_from(conversations).where(
            conversations.c.id == conversation_id, conversations.c.running_until >= now())) == 1

    def conversation_of_proposal(self, proposal_id: int) -> dict[str, Any] | None:
        row = self.conn.execute(select(conversations).where(conversations.c.proposal_id == proposal_id)).mappings().first()
        return dict(row) if row else None

    # --- agent runs (one message to the agent, run as an agent_turn job) ----------------------

    def add_agent_run(self, run_id: str, requester: Principal, request: str, conversation_id: str,
                      job_id: int) -> None:
        self.conn.execute(insert(agent_runs).values(
            id=run_id, requester_id=requester.id, request=request, conversation_id=conversation_id, job_id=job_id,
            status=AgentRunStatus.QUEUED.value, progress=[], created_at=now(), updated_at=now()))

    def begin_agent_run(self, run_id: str) -> bool:
        """A worker starts the queued run; False when it is no longer queued (the breaker stopped it meanwhile)."""
        return self._move_agent_run(run_id, {AgentRunStatus.QUEUED}, status=AgentRunStatus.RUNNING.value) == 1

    def record_agent_run_progress(self, run_id: str, steps: Sequence[str]) -> None:
        self.conn.execute(update(agent_runs).where(agent_runs.c.id == run_id).values(
            progress=list(steps), updated_at=now()))

    def finish_agent_run(self, run_id: str, status: AgentRunStatus, message: str | None,
                         proposal_id: int | None = None) -> bool:
        """The turn's own end. A run the breaker marked stopped while it ran takes the turn's fuller account; one
        that recovery already recorded interrupted keeps that (its job says so too)."""
        return self._move_agent_run(run_id, {AgentRunStatus.RUNNING, AgentRunStatus.STOPPED}, status=status.value,
                                    message=message, proposal_id=proposal_id) == 1

    def end_abandoned_agent_run(self, run_id: str, status: AgentRunStatus, message: str) -> bool:
        """Recovery's end of a run whose job ended without it (its worker died): only while it is unfinished."""
        return self._move_agent_run(run_id, UNFINISHED, status=status.value, message=message) == 1

    def abandoned_agent_runs(self) -> list[tuple[AgentRun, Job]]:
        """Unfinished runs whose job has ended: what a dead worker left behind."""
        unfinished = [s.value for s in UNFINISHED]
        rows = self.conn.execute(
            select(agent_runs, jobs.c.status.label("job_status"), jobs.c.runner.label("job_runner"))
            .join(jobs, jobs.c.id == agent_runs.c.job_id)
            .where(agent_runs.c.status.in_(unfinished), jobs.c.status.not_in(unfinished))).mappings()
        return [(_agent_run(r), self._job_of_run(r)) for r in rows]

    def _job_of_run(self, row: Mapping[str, Any]) -> Job:
        return Job(id=row["job_id"], kind=JobKind.AGENT_TURN, proposal_id=None, requested_by=row["requester_id"],
                   status=JobStatus(row["job_status"]), runner=row["job_runner"])

    def conversation_has_unfinished_run(self, conversation_id: str) -> bool:
        """A message to this conversation is queued or running (a second one waits for it to end)."""
        return self.conn.scalar(select(func.count()).select_from(agent_runs).where(
            agent_runs.c.conversation_id == conversation_id,
            agent_runs.c.status.in_([s.value for s in UNFINISHED]))) > 0

    def agent_run(self, run_id: str) -> AgentRun | None:
        row = self.conn.execute(select(agent_runs).where(agent_runs.c.id == run_id)).mappings().first()
        return _agent_run(row) if row else None

    def _move_agent_run(self, run_id: str, from_statuses: Collection[AgentRunStatus], **values: Any) -> int:
        query = update(agent_runs).where(agent_runs.c.id == run_id,
                                         agent_runs.c.status.in_([s.value for s in from_statuses]))
        return int(self.conn.execute(query.values(updated_at=now(), **values)).rowcount)

    # --- jobs ------------------------------------------------------------------------------

    def add_job(self, kind: JobKind, proposal_id: int | None, requested_by: Principal | str,
                args: Mapping[str, Any] | None = None) -> int:
        who = requested_by.id if isinstance(requested_by, Principal) else requested_by
        result = self.conn.execute(insert(jobs).values(
            kind=kind.value, proposal_id=proposal_id, requested_by=who, status=JobStatus.QUEUED.value,
            progress=[], created_at=now(), args=dict(args or {})))
        return int(result.inserted_primary_key[0])

    def queued_job(self, kind: JobKind, proposal_id: int, running_too: bool = True) -> int | None:
        """A job of this kind for this proposal that has not finished (or not started) yet, so a second is not queued."""
        waiting = [JobStatus.QUEUED.value, JobStatus.RUNNING.value] if running_too else [JobStatus.QUEUED.value]
        return self.conn.scalar(select(jobs.c.id).where(
            jobs.c.kind == kind.value, jobs.c.proposal_id == proposal_id, jobs.c.status.in_(waiting)).limit(1))

    def proposals_with_unfinished_jobs(self, kind: JobKind) -> set[int]:
        return set(self.conn.scalars(select(jobs.c.proposal_id).where(
            jobs.c.kind == kind.value, jobs.c.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]))))

    def finish_job(self, job_id: int, status: JobStatus, result: Mapping[str, Any] | None = None,
                   error: str | None = None, only_if_running: bool = True) -> bool:
        query = update(jobs).where(jobs.c.id == job_id)
        if only_if_running:
            query = query.where(jobs.c.status == JobStatus.RUNNING.value)
        done = self.conn.execute(query.values(status=status.value, result=dict(result or {}),
                                              error=self.scrubber.scrub(error) if error else None, finished_at=now()))
        return done.rowcount == 1

    def retry_job(self, job_id: int, run_after: datetime, error: str) -> bool:
        """Put a running job back in the queue, not to be claimed before `run_after`; `error` says why it waits."""
        done = self.conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == JobStatus.RUNNING.value)
                                 .values(status=JobStatus.QUEUED.value, runner=None, heartbeat_at=None,
                                         run_after=run_after, error=self.scrubber.scrub(error)))
        return done.rowcount == 1

    # --- GitHub: linked accounts, pull requests, webhook deliveries ---------------------------

    def link_github(self, principal: Principal, github_id: int, login: str) -> None:
        """Link a person to a GitHub account (by its numeric id: logins can be renamed and reused)."""
        self.conn.execute(delete(github_accounts).where((github_accounts.c.principal_id == principal.id)
                                                        | (github_accounts.c.github_id == github_id)))
        self.conn.execute(insert(github_accounts).values(github_id=github_id, login=login, principal_id=principal.id,
                                                         linked_at=now()))

    def principal_by_github_id(self, github_id: int) -> Principal | None:
        pid = self.conn.scalar(select(github_accounts.c.principal_id).where(github_accounts.c.github_id == github_id))
        return self.principal(pid) if pid else None

    def github_login_of(self, principal_id: str) -> str | None:
        return self.conn.scalar(select(github_accounts.c.login).where(github_accounts.c.principal_id == principal_id))

    def add_delivery(self, delivery_id: str, event: str, action: str | None, payload: str) -> bool:
        """Record a webhook delivery once; False when this delivery id was recorded before (a redelivery)."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(insert(webhook_deliveries).values(
                    delivery_id=delivery_id, event=event, action=action, payload=payload, received_at=now()))
        except IntegrityError:
            return False
        return True

    def set_delivery_job(self, delivery_id: str, job_id: int) -> None:
        self.conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.delivery_id == delivery_id)
                          .values(job_id=job_id))

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        row = self.conn.execute(select(webhook_deliveries).where(
            webhook_deliveries.c.delivery_id == delivery_id)).mappings().first()
        return dict(row) if row else None

    def link_pull_request(self, proposal_id: int, repository: str, number: int) -> None:
        """Record the proposal's pull request (once: a second link of the same proposal changes nothing)."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(insert(pull_requests).values(
                    proposal_id=proposal_id, repository=repository, number=number, published_seq=0, created_at=now()))
        except IntegrityError:
            pass

    def pull_request_of(self, proposal_id: int) -> dict[str, Any] | None:
        row = self.conn.execute(select(pull_requests).where(pull_requests.c.proposal_id == proposal_id)).mappings().first()
        return dict(row) if row else None

    def proposal_for_pull_request(self, repository: str, number: int) -> int | None:
        """The newest proposal of this pull request (a reopened one gets a new proposal)."""
        return self.conn.scalar(select(pull_requests.c.proposal_id).where(
            pull_requests.c.repository == repository, pull_requests.c.number == number)
            .order_by(pull_requests.c.proposal_id.desc()).limit(1))

    def proposal_merged_as(self, sha: str) -> int | None:
        """The proposal whose merge made commit `sha` (None: the gateway did not make it)."""
        return self.conn.scalar(select(proposals.c.id).where(proposals.c.merge_sha == sha).limit(1)) if sha else None

    def recently_failed_jobs(self, kind: JobKind, seconds: float) -> set[int]:
        """Proposals with a job of this kind that failed in the last `seconds` (their retry waits)."""
        since = now() - timedelta(seconds=seconds)
        return set(self.conn.scalars(select(jobs.c.proposal_id).where(
            jobs.c.kind == kind.value, jobs.c.status == JobStatus.FAILED.value, jobs.c.finished_at > since)))

    def mark_published(self, proposal_id: int, seq: int, comment_id: int | None, error: str | None = None,
                       digest: str | None = None) -> None:
        values: dict[str, Any] = {"publish_error": self.scrubber.scrub(error) if error else None,
                                  "attempted_at": now()}
        if error is None:
            values["published_seq"] = seq
            values["published_digest"] = digest
        if comment_id is not None:
            values["comment_id"] = comment_id
        self.conn.execute(update(pull_requests).where(pull_requests.c.proposal_id == proposal_id).values(**values))

    def unpublished_proposals(self, open_statuses: Collection[ProposalStatus], retry_after_seconds: float) -> list[int]:
        """Proposals whose pull request shows less than their trail: newer events, or no pull request yet (open ones).

        One whose last publish failed waits `retry_after_seconds` before it is tried again.
        """
        newest = (select(audit_events.c.proposal_id, func.max(audit_events.c.seq).label("seq"))
                  .where(audit_events.c.proposal_id.is_not(None)).group_by(audit_events.c.proposal_id).subquery())
        behind = select(pull_requests.c.proposal_id).join(newest, newest.c.proposal_id == pull_requests.c.proposal_id) \
            .where(newest.c.seq > pull_requests.c.published_seq,
                   pull_requests.c.publish_error.is_(None)
                   | (pull_requests.c.attempted_at < now() - timedelta(seconds=retry_after_seconds)))
        unlinked = select(proposals.c.id).where(  # a revert of drift has nothing to review in a pull request
            proposals.c.status.in_([s.value for s in open_statuses]),
            proposals.c.kind.is_(None) | (proposals.c.kind != ProposalKind.DRIFT_REVERT.value),
            proposals.c.id.not_in(select(pull_requests.c.proposal_id)))
        return sorted(set(self.conn.scalars(behind)) | set(self.conn.scalars(unlinked)))

    def newest_event_seq(self, proposal_id: int) -> int:
        return int(self.conn.scalar(select(func.max(audit_events.c.seq)).where(
            audit_events.c.proposal_id == proposal_id)) or 0)

    # --- main moved outside the gateway --------------------------------------------------------

    def marker(self, name: str) -> str | None:
        return self.conn.scalar(select(markers.c.value).where(markers.c.name == name))

    def set_marker(self, name: str, value: str) -> None:
        self.conn.execute(delete(markers).where(markers.c.name == name))
        self.conn.execute(insert(markers).values(name=name, value=value))

    def swap_marker(self, name: str, expected: str | None, value: str) -> bool:
        """Set the marker to `value` only if it still holds `expected` (None: absent); False when another
        worker changed it first. A compare-and-set: of workers racing for the same claim, one wins."""
        if expected is not None:
            done = self.conn.execute(update(markers).where(markers.c.name == name, markers.c.value == expected)
                                     .values(value=value))
            return done.rowcount == 1
        dialect = self.conn.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            # psycopg reports no rowcount for ON CONFLICT DO NOTHING: the returned row says whether it was inserted
            return self.conn.execute(pg_insert(markers).values(name=name, value=value)
                                     .on_conflict_do_nothing(index_elements=["name"])
                                     .returning(markers.c.name)).first() is not None
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        created = self.conn.execute(sqlite_insert(markers).values(name=name, value=value)
                                    .on_conflict_do_nothing(index_elements=["name"]))
        return created.rowcount == 1

    def add_main_push(self, sha: str, stacks: Sequence[str], paths: Sequence[str], author: str) -> bool:
        if self.conn.scalar(select(main_pushes.c.sha).where(main_pushes.c.sha == sha)) is not None:
            return False
        self.conn.execute(insert(main_pushes).values(sha=sha, stacks=list(stacks), paths=list(paths)[:500],
                                                     author=author[:200], detected_at=now()))
        return True

    def unacknowledged_pushes(self) -> list[dict[str, Any]]:
        rows = self.conn.execute(select(main_pushes).where(main_pushes.c.acknowledged_at.is_(None))
                                 .order_by(main_pushes.c.detected_at)).mappings()
        return [dict(r) for r in rows]

    def acknowledge_push(self, sha: str, by: str, reason: str) -> dict[str, Any] | None:
        row = self.conn.execute(select(main_pushes).where(main_pushes.c.sha.startswith(sha, autoescape=True),
                                                          main_pushes.c.acknowledged_at.is_(None))).mappings().all()
        if len(row) != 1:
            return None
        self.conn.execute(update(main_pushes).where(main_pushes.c.sha == row[0]["sha"]).values(
            acknowledged_by=by, acknowledged_at=now(), reason=reason))
        return dict(row[0])

    # --- day two: drift records and break-glass windows ----------------------------------------

    def open_drift_record(self, stack: str) -> DriftRecord | None:
        row = self.conn.execute(select(drift_records).where(drift_records.c.stack == stack,
                                                            drift_records.c.status == DriftStatus.OPEN.value)
                                .order_by(drift_records.c.id.desc())).mappings().first()
        return _drift_record(row) if row else None

    def drift_records(self, stack: str | None = None, only_open: bool = False) -> list[DriftRecord]:
        query = select(drift_records).order_by(drift_records.c.id.desc())
        if stack is not None:
            query = query.where(drift_records.c.stack == stack)
        if only_open:
            query = query.where(drift_records.c.status == DriftStatus.OPEN.value)
        return [_drift_record(r) for r in self.conn.execute(query.limit(500)).mappings()]

    def add_drift_record(self, stack: str, resources: Sequence[DriftEntry], expected: bool,
                         break_glass_id: int | None) -> int:
        moment = now()
        return int(self.conn.execute(insert(drift_records).values(
            stack=stack, status=DriftStatus.OPEN.value, resources=entries_to_json(resources), expected=expected,
            break_glass_id=break_glass_id, opened_at=moment, updated_at=moment)).inserted_primary_key[0])

    def update_drift_record(self, record_id: int, resources: Sequence[DriftEntry], expected: bool,
                            break_glass_id: int | None) -> None:
        self.conn.execute(update(drift_records).where(drift_records.c.id == record_id).values(
            resources=entries_to_json(resources), expected=expected, break_glass_id=break_glass_id,
            updated_at=now()))

    def close_drift_record(self, record_id: int, by: str, reason: str, proposal_id: int | None) -> None:
        self.conn.execute(update(drift_records).where(drift_records.c.id == record_id).values(
            status=DriftStatus.CLOSED.value, closed_at=now(), closed_by=by, closed_reason=reason,
            closed_by_proposal=proposal_id))

    def add_break_glass(self, stack: str, reason: str, opened_by: str, duration_seconds: int,
                        confirmed: bool) -> int:
        moment = now()
        values: dict[str, Any] = {"stack": stack, "reason": reason, "opened_by": opened_by,
                                  "requested_at": moment, "duration_seconds": duration_seconds}
        if confirmed:
            values.update(opened_at=moment, ends_at=moment + timedelta(seconds=duration_seconds))
        return int(self.conn.execute(insert(break_glass_windows).values(**values)).inserted_primary_key[0])

    def break_glass(self, window_id: int) -> dict[str, Any]:
        row = self.conn.execute(select(break_glass_windows).where(break_glass_windows.c.id == window_id)).mappings().first()
        if row is None:
            raise NotFound(f"no break-glass window {window_id}")
        return _aware_row(row)

    def break_glass_windows(self, stack: str | None = None) -> list[dict[str, Any]]:
        query = select(break_glass_windows).order_by(break_glass_windows.c.id.desc())
        if stack is not None:
            query = query.where(break_glass_windows.c.stack == stack)
        return [_aware_row(r) for r in self.conn.execute(query.limit(500)).mappings()]

    def update_break_glass(self, window_id: int, **values: Any) -> None:
        self.conn.execute(update(break_glass_windows).where(break_glass_windows.c.id == window_id).values(**values))

    def mark_break_glass(self, window_id: int, column: str, moment: datetime) -> bool:
        """Set `column` (settled: codified_at, overdue: flagged_at) once: False when another worker already did,
        or the window was settled or acknowledged meanwhile."""
        c = break_glass_windows.c
        done = self.conn.execute(update(break_glass_windows).where(
            c.id == window_id, c[column].is_(None), c.codified_at.is_(None), c.acknowledged_at.is_(None))
            .values({column: moment}))
        return done.rowcount == 1


    # --- the circuit breaker ------------------------------------------------------------------

    def record_capacity_change(self, change: CapacityChange) -> None:
        """A proposal's latest capacity figures, at the time of its latest plans (a re-plan replaces the earlier)."""
        self.conn.execute(delete(breaker_changes).where(breaker_changes.c.proposal_id == change.proposal_id))
        self.conn.execute(insert(breaker_changes).values(
            proposal_id=change.proposal_id, principal_id=change.principal_id, before=dict(change.before),
            added=change.added, destroyed=change.destroyed, at=change.at))

    def capacity_changes(self, principal_id: str | None, since: datetime) -> list[CapacityChange]:
        """Agent changes since `since`, oldest first: one agent's, or every agent's (None)."""
        query = select(breaker_changes).where(breaker_changes.c.at >= since).order_by(breaker_changes.c.at)
        if principal_id is not None:
            query = query.where(breaker_changes.c.principal_id == principal_id)
        return [CapacityChange(r["proposal_id"], r["principal_id"], dict(r["before"]), float(r["added"]),
                               int(r["destroyed"]), _aware(r["at"])) for r in self.conn.execute(query).mappings()]

    def breaker_state(self, scope: str) -> dict[str, Any] | None:
        row = self.conn.execute(select(breaker_states).where(breaker_states.c.scope == scope)).mappings().first()
        return {**row, "changed_at": _aware(row["changed_at"])} if row else None

    def breaker_states(self) -> list[dict[str, Any]]:
        rows = self.conn.execute(select(breaker_states).order_by(breaker_states.c.scope)).mappings()
        return [{**r, "changed_at": _aware(r["changed_at"])} for r in rows]

    def set_breaker(self, scope: str, is_open: bool, reason: str, by: str) -> None:
        self.conn.execute(delete(breaker_states).where(breaker_states.c.scope == scope))
        self.conn.execute(insert(breaker_states).values(scope=scope, open=is_open, reason=reason, changed_by=by,
                                                        changed_at=now()))

    def stop_agent_runs(self, reason: str) -> list[str]:
        """Mark every queued or running agent request stopped (each run also checks the breaker between its steps,
        and a queued one is not started)."""
        unfinished = [s.value for s in UNFINISHED]
        running = list(self.conn.scalars(select(agent_runs.c.id).where(agent_runs.c.status.in_(unfinished))))
        if running:
            self.conn.execute(update(agent_runs).where(agent_runs.c.id.in_(running)).values(
                status=AgentRunStatus.STOPPED.value, message=reason, updated_at=now()))
        return running

    # --- applies ---------------------------------------------------------------------------

    def start_apply(self, proposal_id: int, stack: str, plan_id: int, runner: str, commit_sha: str) -> int:
        result = self.conn.execute(insert(applies).values(
            proposal_id=proposal_id, stack=stack, plan_id=plan_id, status="running", runner=runner,
            applied=[], commit_sha=commit_sha, started_at=now()))
        return int(result.inserted_primary_key[0])

    def finish_apply(self, apply_id: int, status: str, applied: Sequence[str], error: str | None) -> None:
        self.conn.execute(update(applies).where(applies.c.id == apply_id).values(
            status=status, applied=list(applied), error=error, finished_at=now()))

    def get_apply(self, apply_id: int) -> dict[str, Any] | None:
        row = self.conn.execute(select(applies).where(applies.c.id == apply_id)).mappings().first()
        return dict(row) if row else None

    def applies_of(self, proposal_id: int) -> list[dict[str, Any]]:
        rows = self.conn.execute(select(applies).where(applies.c.proposal_id == proposal_id).order_by(applies.c.id))
        return [dict(r) for r in rows.mappings()]

    def last_applied_commit(self, stack: str) -> str | None:
        return self.conn.scalar(select(applies.c.commit_sha).where(
            applies.c.stack == stack, applies.c.status == "succeeded").order_by(applies.c.id.desc()).limit(1))

    # --- audit -----------------------------------------------------------------------------

    def append_event(self, actor: Principal | str, kind: str, payload: Mapping[str, Any],
                     proposal_id: int | None = None, stacks: Sequence[str] = ()) -> AuditEvent:
        """Add one event to the chain."""
        return self.append_events([(actor, kind, payload, proposal_id, stacks)])[0]

    def append_events(self, entries: Sequence[tuple[Principal | str, str, Mapping[str, Any], int | None,
                                                    Sequence[str]]]) -> list[AuditEvent]:
        """Add events to the chain in order, written together. The head row lock (taken by the transaction's first
        event, held to its commit) keeps concurrent writers in line; the head row is written at the commit."""
        if self._head is None:
            head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1).with_for_update()).mappings().one()
            self._head = (head["seq"], head["hash"])
        events, rows, stack_rows, address_rows = [], [], [], []
        for actor, kind, payload, proposal_id, stacks in entries:
            prev_seq, prev_hash = self._head
            name, actor_kind = (actor.name, actor.kind.value) if isinstance(actor, Principal) else (actor, "system")
            event = AuditEvent(
                seq=prev_seq + 1, id=str(uuid.uuid4()), at=now().isoformat(timespec="microseconds"),
                actor=name, actor_kind=actor_kind, kind=kind, proposal_id=proposal_id,
                stacks=tuple(stacks), payload=self.scrubber.scrub_data(json.loads(dumps(payload))),
                prev_hash=prev_hash, hash="")
            event = AuditEvent(**{**event.__dict__, "hash": event_hash(prev_hash, event.content())})
            rows.append({"seq": event.seq, "id": event.id, "at": event.at, "actor": event.actor,
                         "actor_kind": event.actor_kind, "kind": event.kind, "proposal_id": event.proposal_id,
                         "stacks": list(event.stacks), "payload": dumps(event.payload), "prev_hash": event.prev_hash,
                         "hash": event.hash, "outcome": event_outcome(kind)})
            stack_rows += [{"seq": event.seq, "stack": s} for s in set(event.stacks)]
            address_rows += [{"seq": event.seq, "address": a} for a in event_addresses(event.payload)]
            self._head, self._head_moved = (event.seq, event.hash), True
            events.append(event)
        self.conn.execute(insert(audit_events), rows)
        if stack_rows:
            self.conn.execute(insert(audit_event_stacks), stack_rows)
        if address_rows:
            self.conn.execute(insert(audit_event_addresses), address_rows)
        return events

    def write_chain_head(self) -> None:
        if self._head_moved and self._head is not None:
            self.conn.execute(update(audit_head).where(audit_head.c.id == 1).values(seq=self._head[0],
                                                                                      hash=self._head[1]))
            self._head_moved = False

    def events(self, proposal_id: int | None = None, actor: str | None = None, stack: str | None = None,
               since: str | None = None, kind: str | None = None) -> list[AuditEvent]:
        return self.query_events(EventQuery(proposal_id=proposal_id, actor=actor, stack=stack, since=since,
                                            kind=kind))

    def query_events(self, q: EventQuery, after: int = 0, limit: int | None = None) -> list[AuditEvent]:
        """Events matching every filter, oldest first, from `after` (keyset pagination), in SQL on indexed columns."""
        if q.proposal_id is not None and not 0 < q.proposal_id <= MAX_ID:
            return []
        query = select(audit_events).where(audit_events.c.seq > after, *_event_filters(q, after)).order_by(
            audit_events.c.seq)
        if limit is not None:
            query = query.limit(limit)
        return [_event(r) for r in self.conn.execute(query).mappings()]

    def count_events(self, q: EventQuery) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(audit_events).where(*_event_filters(q))) or 0)

    def iter_events(self, batch: int = 5000, upto: int | None = None, after: int = 0) -> Iterator[AuditEvent]:
        """Every event (after `after`) in order, read a batch at a time (constant memory however long the trail)."""
        while True:
            query = select(audit_events).where(audit_events.c.seq > after)
            if upto is not None:
                query = query.where(audit_events.c.seq <= upto)
            rows = self.conn.execute(query.order_by(audit_events.c.seq).limit(batch)).mappings().all()
            if not rows:
                return
            for row in rows:
                yield _event(row)
            after = rows[-1]["seq"]

    def add_checkpoint(self, checkpoint: Checkpoint) -> bool:
        """Keep a signed checkpoint, once per event: a second one of the same head (another worker signing it at the
        same moment) changes nothing. Whether this one was kept."""
        if self.conn.scalar(select(audit_checkpoints.c.seq).where(audit_checkpoints.c.seq == checkpoint.seq)) is not None:
            return False
        try:
            with self.conn.begin_nested():  # a racing signer's insert of the same seq wins; this one is not needed
                self.conn.execute(insert(audit_checkpoints).values(**checkpoint.to_json()))
        except IntegrityError:
            return False
        return True

    def checkpoints(self) -> list[Checkpoint]:
        rows = self.conn.execute(select(audit_checkpoints).order_by(audit_checkpoints.c.seq)).mappings()
        return [Checkpoint.from_json(r) for r in rows]

    def chain_head(self) -> tuple[int, str] | None:
        if self._head is not None:
            return self._head
        head = self.conn.execute(select(audit_head).where(audit_head.c.id == 1)).mappings().first()
        return (head["seq"], head["hash"]) if head else None


@dataclass(frozen=True)
class EventQuery:
    """What an auditor filters the trail by; every filter is a condition on an indexed column."""

    proposal_id: int | None = None
    actor: str | None = None
    stack: str | None = None
    since: str | None = None
    until: str | None = None
    kind: str | None = None
    action: str | None = None  # a kind or a kind prefix: `apply` matches apply.started, apply.failed, ...
    outcome: str | None = None
    address: str | None = None  # exact, or a prefix when it ends with `*`


def _event_filters(q: EventQuery, after: int = 0) -> list[Any]:
    """Conditions on audit_events; the stack and address tables are searched from `after` on, and an address's
    proposals' events come as one set of seqs (a UNION), so each side uses its own index."""
    out: list[Any] = []
    if q.proposal_id is not None:
        out.append(audit_events.c.proposal_id == q.proposal_id)
    if q.actor:
        out.append(audit_events.c.actor == q.actor)
    if q.since:
        out.append(audit_events.c.at >= q.since)
    if q.until:
        out.append(audit_events.c.at <= q.until)
    if q.kind:
        out.append(audit_events.c.kind == q.kind)
    if q.action:
        out.append((audit_events.c.kind == q.action) | audit_events.c.kind.startswith(q.action + ".", autoescape=True))
    if q.outcome:
        out.append(audit_events.c.outcome == q.outcome)
    if q.stack:
        out.append(audit_events.c.seq.in_(select(audit_event_stacks.c.seq).where(
            audit_event_stacks.c.stack == q.stack, audit_event_stacks.c.seq > after)))
    if q.address:
        column = audit_event_addresses.c.address
        prefix = q.address[:-1].replace("/", "//").replace("%", "/%").replace("_", "/_")
        match = column.like(prefix + "%", escape="/") if q.address.endswith("*") else column == q.address
        naming = select(audit_event_addresses.c.seq).where(match)
        proposals = select(audit_events.c.proposal_id).where(audit_events.c.seq.in_(naming),
                                                             audit_events.c.proposal_id.is_not(None))
        their_events = select(audit_events.c.seq).where(audit_events.c.seq > after,
                                                         audit_events.c.proposal_id.in_(proposals))
        out.append(audit_events.c.seq.in_(union(naming.where(audit_event_addresses.c.seq > after), their_events)))
    return out


def _principal(row: Mapping[str, Any]) -> Principal:
    return Principal(row["id"], row["name"], PrincipalKind(row["kind"]),
                     frozenset(Role(r) for r in row["roles"]), frozenset(row["groups"]), row["acting_for"],
                     row.get("disabled_at") is not None)


def _event(row: Mapping[str, Any]) -> AuditEvent:
    return AuditEvent(
        seq=row["seq"], id=row["id"], at=row["at"], actor=row["actor"], actor_kind=row["actor_kind"],
        kind=row["kind"], proposal_id=row["proposal_id"], stacks=tuple(row["stacks"]),
        payload=json.loads(row["payload"]), prev_hash=row["prev_hash"], hash=row["hash"])
