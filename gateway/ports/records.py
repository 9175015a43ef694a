"""The store: units of work (one transaction, a repository per aggregate), and the stack locks, job queue
and worker registry that commit on their own."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from gateway.domain.agent_runs import AgentRun, AgentRunStatus, Conversation
from gateway.domain.applies import ApplyRecord, ApplyStatus
from gateway.domain.apply_blockers import MainPush
from gateway.domain.audit import AuditEvent, ChainLink, Checkpoint, EventQuery
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.breaker import BreakerState, CapacityChange
from gateway.domain.drift import DriftRecord
from gateway.domain.github import Delivery, PullRequestLink
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.locks import LockAttempt, StackLock
from gateway.domain.notifications import Channel, Notice, Notification, NotificationStatus
from gateway.domain.operations import EndedJobs, QueueDepth
from gateway.domain.plan_rounds import PlanRound, RoundState, StagedPlan
from gateway.domain.preview import DriftEntry
from gateway.domain.principals import Actor, Credentials, Principal, PrincipalKind, Role
from gateway.domain.proposal import (
    Decision,
    ListedProposal,
    PlanBasis,
    PlanSummary,
    Proposal,
    ProposalKind,
    ProposalStatus,
)
from gateway.domain.repositories import Repository
from gateway.domain.sign_in import PendingSignIn, RefusalTally, WebSession
from gateway.domain.workers import WorkerRecord


class Principals(Protocol):
    """People and agents, their credentials, and the GitHub accounts linked to them."""

    def add(self, name: str, kind: PrincipalKind, roles: frozenset[Role], groups: frozenset[str],
                      token_hash: str, acting_for: str | None = None) -> Principal: ...

    def count(self) -> int: ...

    def token_holder(self, token_hash: str) -> tuple[Principal, Credentials] | None:
        """The principal whose token has this hash, with its credential record (as `credentials`)."""
        ...

    def by_name(self, name: str) -> Principal | None: ...

    def get(self, pid: str) -> Principal: ...

    def credentials(self, pid: str) -> Credentials:
        """A principal's credential record: when disabled, when its token expires, when it was last used."""
        ...

    def set_token(self, pid: str, token_hash: str, expires_at: datetime | None) -> None:
        """A new token (only its hash is kept); the old one stops working at once."""
        ...

    def set_token_expiry(self, pid: str, expires_at: datetime | None) -> None: ...

    def set_disabled(self, pid: str, at: datetime | None) -> None:
        """Disabled from `at` (None: enabled again)."""
        ...

    def set_access(self, pid: str, roles: frozenset[Role], groups: frozenset[str]) -> None: ...

    def touch(self, pid: str, at: datetime) -> None:
        """The token was used at `at`."""
        ...

    def enabled_admins(self) -> list[str]: ...

    def list(self) -> list[Principal]: ...

    def link_github(self, principal: Principal, github_id: int, login: str) -> None:
        """Link a person to a GitHub account (by its numeric id: logins can be renamed and reused)."""
        ...

    def by_github_id(self, github_id: int) -> Principal | None: ...

    def github_login_of(self, principal_id: str) -> str | None: ...

    def link_gitlab(self, principal: Principal, gitlab_id: int, username: str) -> None:
        """Link a person to a GitLab account (by its numeric user id: usernames can be changed and reused)."""
        ...

    def by_gitlab_id(self, gitlab_id: int) -> Principal | None: ...

    def gitlab_account_of(self, principal_id: str) -> tuple[int, str] | None:
        """The linked GitLab account's numeric id and username, or None."""
        ...


class SignInRecords(Protocol):
    """Identities linked to principals (issuer and subject), and the page sessions, kept by the hash of their id."""

    def link_identity(self, principal: Principal, issuer: str, subject: str, display: str) -> None:
        """Link an identity to a principal (an identity maps to one principal; a relink moves it)."""
        ...

    def principal_of(self, issuer: str, subject: str) -> Principal | None: ...

    def identities_of(self, principal_id: str) -> list[tuple[str, str]]:
        """The (issuer, subject) pairs linked to a principal."""
        ...

    def open_session(self, id_hash: str, session: WebSession) -> None: ...

    def get_session(self, id_hash: str) -> WebSession | None: ...

    def end_session(self, id_hash: str, at: datetime) -> None: ...

    def end_sessions_of(self, principal_id: str, at: datetime) -> int:
        """End every open session of a principal; how many were open."""
        ...

    def add_flow(self, state_hash: str, flow: PendingSignIn) -> None:
        """Keep a sign-in in progress under the hash of its state."""
        ...

    def get_flow(self, state_hash: str) -> PendingSignIn | None:
        """The sign-in a state names, locked until the transaction ends (None: no such state)."""
        ...

    def use_flow(self, state_hash: str, at: datetime) -> bool:
        """Mark it used and forget its secrets; False when it was used already (by a concurrent callback)."""
        ...

    def forget_flows(self, expired_by: datetime) -> int:
        """Delete the sign-ins in progress that expired by then, used or not; how many."""
        ...

    def refusal_tally(self, kind: str) -> RefusalTally | None:
        """The refusals of one kind (provider:check) counted so far, locked until the transaction ends."""
        ...

    def save_refusal_tally(self, kind: str, tally: RefusalTally) -> None: ...


class Proposals(Protocol):
    """Proposals with their plans, decisions, policy overrides and apply records; a status changes in the domain
    (`Proposal.move`, which raises its event) and is persisted by `save`."""

    def add(self, branch: str, base_sha: str, head_sha: str, requester: Principal, proposer: Principal,
                     reason: str, stacks: Sequence[str], changed_paths: Sequence[str], agent_claim: str | None = None,
                     prompt_version: str | None = None, model: str | None = None,
                     kind: ProposalKind = ProposalKind.CHANGE) -> int: ...

    def open_for_branch(self, branch: str) -> int | None: ...

    def plan_bases(self, statuses: Collection[ProposalStatus]) -> list[PlanBasis]:
        """For each proposal in `statuses`: branch, head, stacks, and each stack's newest plan at that head (main commit and state serial), in two queries: what a worker's staleness scan needs."""
        ...

    def get(self, proposal_id: int, lock: bool = False) -> Proposal: ...

    def get_many(self, proposal_ids: Sequence[int]) -> list[Proposal]:
        """The proposals `proposal_ids` names, in that order, each as `get` reads it (unlocked; a missing one is
        NotFound, another repository's InAnotherRepository), in a few statements however many they are."""
        ...

    def list(self, status: str | None = None) -> list[ListedProposal]: ...

    def update_head(self, proposal_id: int, head_sha: str, stacks: Sequence[str], changed_paths: Sequence[str]) -> None: ...

    def set_agent_details(self, proposal_id: int, prompt_version: str, model: str, agent_claim: str | None = None) -> None:
        """The prompt version and model an agent's proposal was written with (and its latest claim)."""
        ...

    def save(self, proposal: Proposal) -> None:
        """Persist the transitions the proposal took (`Proposal.move`) since it was last saved, only if its row is
        still where the first of them started (else a Conflict), and hand their events to the unit of work, which
        writes them to the trail in this transaction."""
        ...

    def add_plan(self, proposal_id: int, stack: str, head_sha: str, main_sha: str, digest: str, document: str,
                 state_serial: int, state_lineage: str, summary: PlanSummary, preview: str,
                 artifact: bytes | None = None) -> int: ...

    def plan_preview(self, plan_id: int) -> str | None:
        """The stored masked preview of a plan (None for plans saved before previews were stored)."""
        ...

    def plan_artifact(self, plan_id: int) -> bytes | None:
        """The engine's own saved plan (Terraform's plan file), if the engine keeps one."""
        ...

    def plan_document(self, plan_id: int) -> str: ...

    def saved_plan_digests(self, plan_ids: Collection[int]) -> Mapping[int, str]:
        """Plan id -> the digest its saved plan (the JSON plan and the plan file, as stored now) hashes to."""
        ...

    def add_decision(self, proposal_id: int, principal: Principal, decision: Decision, head_sha: str,
                     digests: Mapping[str, str], comment: str, auth: str) -> int: ...

    def add_override(self, proposal_id: int, finding_key: str, principal: Principal, reason: str,
                     expires_at: datetime) -> int: ...

    def merged_as(self, sha: str) -> int | None:
        """The proposal whose merge made commit `sha` (None: the gateway did not make it)."""
        ...

    def repository_of(self, proposal_id: int) -> str | None:
        """The repository proposal `proposal_id` changes, whichever it is (None: no such proposal)."""
        ...

    def unfinished_by_repository(self) -> Mapping[tuple[str, str], int]:
        """How many proposals not yet applied or abandoned each repository has, by status: (repository, status) ->
        count (every repository's, the one read that spans them: what metrics show)."""
        ...

    def start_apply(self, proposal_id: int, stack: str, plan_id: int, runner: str, commit_sha: str) -> int: ...

    def finish_apply(self, apply_id: int, status: ApplyStatus, applied: Sequence[str], error: str | None) -> None: ...

    def get_apply(self, apply_id: int) -> ApplyRecord | None: ...

    def applies_of(self, proposal_id: int) -> list[ApplyRecord]: ...

    def last_applied_commit(self, stack: str) -> str | None: ...


class Conversations(Protocol):
    """Conversations with the agent and the runs (turns) of each."""

    def add(self, conversation_id: str, requester: Principal, branch: str) -> None: ...

    def get(self, conversation_id: str) -> Conversation | None: ...

    def link(self, conversation_id: str, proposal_id: int) -> None: ...

    def hold(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """Hold the conversation for `turn` until `until`; refused while another turn holds it (a lapsed hold is free)."""
        ...

    def renew(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """`turn`, still working, extends its hold; False when it holds the conversation no more (another turn took it over after its hold lapsed)."""
        ...

    def release(self, conversation_id: str, turn: str) -> bool:
        """`turn` lets go of the conversation; a turn that lost its hold leaves the new holder's alone (False)."""
        ...

    def busy(self, conversation_id: str) -> bool:
        """A turn holds this conversation now."""
        ...

    def of_proposal(self, proposal_id: int) -> Conversation | None: ...

    def add_run(self, run_id: str, requester: Principal, request: str, conversation_id: str,
                      job_id: int) -> None: ...

    def begin_run(self, run_id: str) -> bool:
        """A worker starts the queued run; False when it is no longer queued (the breaker stopped it meanwhile)."""
        ...

    def record_run_progress(self, run_id: str, steps: Sequence[str]) -> None: ...

    def finish_run(self, run_id: str, status: AgentRunStatus, message: str | None,
                         proposal_id: int | None = None) -> bool:
        """The turn's own end. A run the breaker marked stopped while it ran takes the turn's fuller account; one that recovery already recorded interrupted keeps that (its job says so too)."""
        ...

    def end_abandoned_run(self, run_id: str, status: AgentRunStatus, message: str) -> bool:
        """Recovery's end of a run whose job ended without it (its worker died): only while it is unfinished."""
        ...

    def abandoned_runs(self) -> list[tuple[AgentRun, Job]]:
        """Unfinished runs whose job has ended: what a dead worker left behind."""
        ...

    def has_unfinished_run(self, conversation_id: str) -> bool:
        """A message to this conversation is queued or running (a second one waits for it to end)."""
        ...

    def run(self, run_id: str) -> AgentRun | None: ...

    def stop_runs(self, reason: str) -> list[str]:
        """Mark every queued or running agent request stopped (each run also checks the breaker between its steps, and a queued one is not started)."""
        ...


class Jobs(Protocol):
    """Jobs queued and finished inside a use case's transaction."""

    def add(self, kind: JobKind, proposal_id: int | None, requested_by: Actor,
                args: Mapping[str, Any] | None = None) -> int: ...

    def queued(self, kind: JobKind, proposal_id: int, running_too: bool = True) -> int | None:
        """A job of this kind for this proposal that has not finished (or not started) yet, so a second is not queued."""
        ...

    def proposals_with_unfinished(self, kind: JobKind) -> set[int]: ...

    def of_proposal(self, proposal_id: int) -> list[Job]:
        """The proposal's jobs, oldest first, as this transaction sees them (a view's one snapshot)."""
        ...

    def latest_finished(self, kind: JobKind, proposal_ids: Collection[int]) -> Mapping[int, Job]:
        """Each proposal's latest finished job of this kind (proposals with none are left out)."""
        ...

    def finish(self, job_id: int, status: JobStatus, result: Mapping[str, Any] | None = None,
                   error: str | None = None, only_if_running: bool = True) -> bool: ...

    def retry(self, job_id: int, run_after: datetime, error: str) -> bool:
        """Put a running job back in the queue, not to be claimed before `run_after`; `error` says why it waits."""
        ...

    def recently_failed(self, kind: JobKind, seconds: float) -> set[int]:
        """Proposals with a job of this kind that failed in the last `seconds` (their retry waits)."""
        ...


class GitHubRecords(Protocol):
    """Webhook deliveries and the pull request of each proposal."""

    def add_delivery(self, delivery_id: str, event: str, action: str | None, payload: str) -> bool:
        """Record a webhook delivery once; False when this delivery id was recorded before (a redelivery)."""
        ...

    def set_delivery_job(self, delivery_id: str, job_id: int) -> None: ...

    def delivery(self, delivery_id: str) -> Delivery | None: ...

    def link_pull_request(self, proposal_id: int, repository: str, number: int) -> None:
        """Record the proposal's pull request (once: a second link of the same proposal changes nothing)."""
        ...

    def pull_request_of(self, proposal_id: int) -> PullRequestLink | None: ...

    def proposal_for_pull_request(self, repository: str, number: int) -> int | None:
        """The newest proposal of this pull request (a reopened one gets a new proposal)."""
        ...

    def mark_published(self, proposal_id: int, seq: int, comment_id: int | None, error: str | None = None,
                       digest: str | None = None) -> None: ...

    def unpublished_proposals(self, open_statuses: Collection[ProposalStatus], retry_after_seconds: float) -> list[int]:
        """Proposals whose pull request shows less than their trail: newer events, or no pull request yet (open ones)."""
        ...


class MainRecords(Protocol):
    """What the gateway last saw of main, and the pushes made to it outside the gateway."""

    def marker(self, name: str) -> str | None: ...

    def set_marker(self, name: str, value: str) -> None: ...

    def swap_marker(self, name: str, expected: str | None, value: str) -> bool:
        """Set the marker to `value` only if it still holds `expected` (None: absent); False when another worker changed it first. A compare-and-set: of workers racing for the same claim, one wins."""
        ...

    def add_push(self, sha: str, stacks: Sequence[str], paths: Sequence[str], author: str) -> bool: ...

    def unacknowledged_pushes(self) -> list[MainPush]: ...

    def acknowledge_push(self, sha: str, by: str, reason: str) -> MainPush | None: ...


class DayTwoRecords(Protocol):
    """Drift records per stack and break-glass windows."""

    def open_drift_record(self, stack: str) -> DriftRecord | None: ...

    def open_drift_records(self, stacks: Collection[str]) -> Mapping[str, DriftRecord]:
        """The open drift record of each of `stacks` that has one, in one read (a read of a proposal asks for all its
        stacks at once)."""
        ...

    def drift_records(self, stack: str | None = None, only_open: bool = False) -> list[DriftRecord]: ...

    def add_drift_record(self, stack: str, resources: Sequence[DriftEntry], expected: bool,
                         break_glass_id: int | None) -> int: ...

    def update_drift_record(self, record_id: int, resources: Sequence[DriftEntry], expected: bool,
                            break_glass_id: int | None) -> None: ...

    def close_drift_record(self, record_id: int, by: str, reason: str, proposal_id: int | None) -> None: ...

    def add_break_glass(self, stack: str, reason: str, opened_by: str, duration_seconds: int,
                        confirmed: bool) -> int: ...

    def break_glass(self, window_id: int) -> BreakGlassWindow: ...

    def break_glass_windows(self, stack: str | None = None) -> list[BreakGlassWindow]: ...

    def confirm_break_glass(self, window_id: int, by: str, opened_at: datetime, ends_at: datetime) -> None:
        """A second person confirmed the window: it opens now and ends at `ends_at`."""
        ...

    def close_break_glass(self, window_id: int, at: datetime) -> None: ...

    def acknowledge_break_glass(self, window_id: int, by: str, at: datetime, note: str) -> None: ...

    def mark_break_glass(self, window_id: int, column: str, moment: datetime) -> bool:
        """Set `column` (settled: codified_at, overdue: flagged_at) once: False when another worker already did, or the window was settled or acknowledged meanwhile."""
        ...


class BreakerRecords(Protocol):
    """The circuit breaker: each agent change's capacity figures, and each breaker's state."""

    def record_change(self, change: CapacityChange) -> None:
        """A proposal's latest capacity figures, at the time of its latest plans (a re-plan replaces the earlier)."""
        ...

    def changes(self, principal_id: str | None, since: datetime) -> list[CapacityChange]:
        """Agent changes since `since`, oldest first: one agent's, or every agent's (None)."""
        ...

    def state(self, scope: str) -> BreakerState | None: ...

    def states(self) -> list[BreakerState]: ...

    def set(self, scope: str, is_open: bool, reason: str, by: str) -> None: ...


class Notifications(Protocol):
    """Notifications, each delivered once: queued, then delivered or reported failed; or skipped, never sent."""

    def add(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None) -> int | None:
        """Queue a notification; None when one with this dedupe key exists (it is never sent twice)."""
        ...

    def skip(self, key: str, channel: Channel, notice: Notice, audit_seq: int | None, reason: str) -> int | None:
        """Record a notification the outbox could not make, never sent; None when this dedupe key exists."""
        ...

    def set_job(self, notification_id: int, job_id: int) -> None: ...

    def get(self, notification_id: int) -> Notification: ...

    def record_attempt(self, notification_id: int, attempts: int, error: str | None) -> None:
        """An attempt failed and another follows: it stays queued, saying why it waits."""
        ...

    def finish(self, notification_id: int, status: NotificationStatus, attempts: int, error: str | None = None,
               receipt: str | None = None) -> bool:
        """Delivered or failed, once: False when it had already ended."""
        ...

    def list(self, status: NotificationStatus | None = None, limit: int = 100) -> list[Notification]:
        """Newest first."""
        ...


class StackRecords(Protocol):
    """What workers read of each stack's state, kept so that reads never ask an engine or a cloud."""

    def record_serials(self, serials: Mapping[str, int], read_at: datetime) -> None:
        """Each stack's state serial as read at `read_at`; a reading older than the one kept is dropped."""
        ...

    def serials(self, stacks: Collection[str]) -> Mapping[str, int]:
        """The newest serial a worker read of each of `stacks` (those never read are absent)."""
        ...


class PlanRounds(Protocol):
    """Plan rounds: a proposal's stacks planned by jobs of their own, each stack's plan held until the last is done."""

    def add(self, proposal_id: int | None, head_sha: str, main_sha: str, merged_sha: str, stacks: Sequence[str],
            spec: Mapping[str, Any]) -> int:
        """A round in `planning`, each of its stacks queued."""
        ...

    def link_jobs(self, round_id: int, jobs: Mapping[str, int]) -> None:
        """Each stack's job (stack -> job id), written together."""
        ...

    def get(self, round_id: int, with_stacks: bool = True) -> PlanRound:
        """The round; without its stacks when only what it plans is wanted (a stack's job: one row, not a hundred)."""
        ...

    def latest(self, proposal_id: int) -> PlanRound | None:
        """The proposal's newest round, whatever its state."""
        ...

    def supersede(self, proposal_id: int) -> list[int]:
        """End the proposal's rounds still planning (a newer one replaces them); the ids of their queued jobs."""
        ...

    def start_stack(self, round_id: int, stack: str) -> bool:
        """Mark the stack being planned; False when there is nothing to plan (the round ended, the stack is done)."""
        ...

    def finish_stack(self, round_id: int, stack: str, staged: StagedPlan | None, error: str | None = None,
                     error_kind: str | None = None) -> int | None:
        """Record the stack's plan (or why it failed) once: the stacks of the round left unfinished after it, or None
        when the stack was finished already (a job run twice). The round's row is locked to the commit."""
        ...

    def staged(self, round_id: int) -> list[StagedPlan]:
        """The round's plans, in its stacks' order."""
        ...

    def close(self, round_id: int, state: RoundState, result: Mapping[str, Any] | None = None) -> bool:
        """Move a round from `planning` to `state` (compare-and-set: False if it had left `planning`), dropping the
        staged plans once they are written or will never be."""
        ...

    def set_result(self, round_id: int, result: Mapping[str, Any]) -> None: ...

    def discard_staged(self, round_id: int) -> None:
        """Drop the round's staged plans (its opener has written them)."""
        ...


class AuditLog(Protocol):
    """The hash-chained audit trail: appends, queries, the chain's head and its signed checkpoints."""

    def newest_seq(self, proposal_id: int) -> int: ...

    def append(self, actor: Actor, kind: str, payload: Mapping[str, Any],
                     proposal_id: int | None = None, stacks: Sequence[str] = ()) -> AuditEvent:
        """Add one event to the chain."""
        ...

    def append_many(self, entries: Sequence[tuple[Actor, str, Mapping[str, Any], int | None,
                                                    Sequence[str]]]) -> list[AuditEvent]:
        """Add events to the chain in order, written together. The head row lock (taken by the transaction's first event, held to its commit) keeps concurrent writers in line; the head row is written at the commit."""
        ...

    def write_chain_head(self) -> None: ...

    def events(self, proposal_id: int | None = None, actor: str | None = None, stack: str | None = None,
               since: str | None = None, kind: str | None = None) -> list[AuditEvent]: ...

    def query(self, q: EventQuery, after: int = 0, limit: int | None = None) -> list[AuditEvent]:
        """Events matching every filter, oldest first, from `after` (keyset pagination), in SQL on indexed columns."""
        ...

    def count(self, q: EventQuery) -> int: ...

    def iter(self, batch: int = 5000, upto: int | None = None, after: int = 0) -> Iterator[AuditEvent]:
        """Every event (after `after`) in order, read a batch at a time (constant memory however long the trail)."""
        ...

    def decode(self, canonical: bytes) -> Any:
        """An event's stored bytes as a read decodes them (`json.loads`), or ValueError: what verify checks."""
        ...

    def links(self, after: int = 0, upto: int | None = None) -> Iterator[ChainLink]:
        """Every event after `after` (up to `upto`), in order, streamed: its hashes, stored bytes and searched columns
        (what verify hashes and checks against the bytes)."""
        ...

    def of_proposals(self, proposal_ids: Sequence[int], exact: bool = True) -> list[AuditEvent]:
        """Every event of these proposals, oldest first (not `exact`: faster, an integer past 64 bits a float)."""
        ...

    def stored(self, seqs: Sequence[int]) -> list[tuple[int, str, str, str]]:
        """These events exactly as stored, oldest first: seq, canonical bytes (as text), prev_hash, hash."""
        ...

    def hashes(self, after: int, upto: int) -> list[str]:
        """The hashes of events after..upto, in order (the trail tree's leaves)."""
        ...

    def tree_blocks(self, upto: int) -> list[str]:
        """The stored roots of the trail tree's blocks 0..upto-1, in order, as far as they run without a gap."""
        ...

    def add_tree_blocks(self, first: int, roots: Sequence[str]) -> None: ...

    def add_checkpoint(self, checkpoint: Checkpoint) -> bool:
        """Keep a signed checkpoint, once per event: a second one of the same head (another worker signing it at the same moment) changes nothing. Whether this one was kept."""
        ...

    def checkpoints(self) -> list[Checkpoint]: ...

    def oldest_unsigned_at(self) -> str | None:
        """When the oldest event no signed checkpoint covers was appended (None: every event is signed)."""
        ...

    def chain_head(self) -> tuple[int, str] | None: ...


class StackLocks(Protocol):
    """Stack locks, committed on their own: other processes must see them while an apply runs."""

    def acquire(self, stack: str, holder: str, ttl_seconds: float, proposal_id: int | None = None) -> LockAttempt:
        """Take the stack's lock if nobody holds it; otherwise say who does (an expired holder is not broken here: its apply must be settled first, see services/change/recovery.py)."""
        ...

    def set_apply(self, stack: str, holder: str, apply_id: int) -> None: ...

    def renew(self, stacks: Sequence[str], holder: str, ttl_seconds: float) -> list[str]:
        """The heartbeat: push the expiry of `holder`'s locks forward. Returns the ones it no longer holds."""
        ...

    def hand_over(self, stack: str, holder: str, new_holder: str) -> bool:
        """Give a lock to a holder that never expires; only a person's action releases it. False if not held."""
        ...

    def release(self, stack: str, holder: str) -> None: ...

    def holder(self, stack: str) -> StackLock | None: ...

    def expired(self) -> list[StackLock]:
        """Locks whose holder stopped heart-beating (kept locks of unmerged proposals never expire)."""
        ...

    def take_over_expired(self, holder: str, new_holder: str, ttl_seconds: float) -> list[StackLock]:
        """Move every expired lock of `holder` to `new_holder` at once; the locks as the dead holder left them."""
        ...

    def keep_unmerged(self, stacks: Sequence[str], holder: str, proposal_id: int) -> list[str]:
        """Hand `holder`'s locks (expired or not) to the unmerged proposal, taking free ones too; the ones held by someone else, which the proposal could not keep."""
        ...


class JobQueue(Protocol):
    """Jobs claimed, heart-beaten and followed in transactions of their own."""

    def claim(self, runner: str, job_id: int | None = None) -> Job | None:
        """Take the oldest queued job (or `job_id`) whose proposal has no job running; None if there is none."""
        ...

    def moves(self) -> int:
        """A count that moves whenever a job may have become claimable; read it before `claim`, pass it to `wait`."""
        ...

    def wait(self, seen: int, timeout: float) -> bool:
        """Until a job is queued or finished after `moves()` was `seen` (any process), or `timeout`."""
        ...

    def wake(self) -> None:
        """Wake the waiters of this process."""
        ...

    def heartbeat(self, job_id: int, runner: str) -> bool: ...

    def add_progress(self, job_id: int, line: str) -> None: ...

    def stale(self, older_than_seconds: float) -> list[Job]:
        """Running jobs whose worker has not heart-beaten for `older_than_seconds`."""
        ...

    def of_proposal(self, proposal_id: int) -> list[Job]: ...

    def get(self, job_id: int) -> Job: ...

    def depth(self) -> list[QueueDepth]:
        """Queued and running jobs by kind, with the age of the oldest of each (one indexed query)."""
        ...

    def ended(self) -> list[EndedJobs]:
        """Jobs that ended, counted by kind and outcome (one query): whoever ran them, a worker, an API process or
        a command, and whoever settled them (recovery)."""
        ...


class WorkerRegistry(Protocol):
    """Which workers run: each registers at start, beats while it runs, and marks itself stopped on a clean stop."""

    def register(self, name: str, beat_seconds: float) -> None:
        """`name` starts now and will beat every `beat_seconds` (a name used before starts afresh)."""
        ...

    def beat(self, name: str, beat_seconds: float) -> bool:
        """`name` is alive now; False when it is not registered or was marked stopped."""
        ...

    def stop(self, name: str) -> None:
        """`name` stopped cleanly: no longer live, at once."""
        ...

    def live(self) -> list[WorkerRecord]:
        """The workers running now: not stopped, and beaten within `LIVE_BEATS` of their beat intervals."""
        ...


class Repositories(Protocol):
    """The declaration repositories the gateway serves; every unit of work sees them all."""

    def add(self, name: str, by: str) -> Repository:
        """Register `name` (a Conflict when it is there, removed or not: a removed one's trail keeps its name)."""
        ...

    def get(self, name: str) -> Repository | None: ...

    def list(self) -> list[Repository]:
        """Every repository, removed ones too, by name."""
        ...

    def remove(self, name: str, by: str) -> None:
        """Mark it removed: nothing new is proposed or applied there; its records stay."""
        ...


class UnitOfWork(Protocol):
    """One transaction: what a use case writes through these repositories commits together, or not at all. It works
    in one declaration repository (`repository`): its proposals, pushes, markers and breakers are that one's."""

    repository: str
    repositories: Repositories
    principals: Principals
    proposals: Proposals
    conversations: Conversations
    jobs: Jobs
    github: GitHubRecords
    main: MainRecords
    day_two: DayTwoRecords
    breaker: BreakerRecords
    sign_in: SignInRecords
    notifications: Notifications
    stacks: StackRecords
    plan_rounds: PlanRounds
    audit: AuditLog


class Store(Protocol):
    """Units of work over the records, and the locks, queue and worker registry that other processes must see at
    once."""

    locks: StackLocks
    queue: JobQueue
    workers: WorkerRegistry
    repository: str  # the declaration repository its units of work work in
    dialect: str  # sqlite, postgresql
    schema_version: int  # the schema this code reads and writes (its newest migration)

    def close(self) -> None:
        """Let go of every connection."""
        ...

    def for_repository(self, name: str) -> Store:
        """The same records, working in repository `name` (sharing this one's connections, locks and queue)."""
        ...

    def session(self, readonly: bool = False) -> AbstractContextManager[UnitOfWork]:
        """One unit of work; `readonly` for reads, which then never wait for a writer. A read opened inside
        another read joins it (one transaction, one snapshot); a write always has its own."""
        ...

    def pending_migrations(self) -> list[int]:
        """The schema's migrations this code knows and the database has not run (empty: at head)."""
        ...

    def migrate(self) -> list[int]:
        """Run the schema's migrations the database has not run (the versions run; none when it was current). A
        `BackendError` while the database does not answer."""
        ...
