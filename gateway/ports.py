"""The ports the use cases talk through. Adapters implement them; one composition root wires them.

    Store            units of work (`session()`), plus the stack locks, job queue and worker registry that commit on
                     their own
    UnitOfWork       one transaction, one repository per aggregate: principals, proposals, conversations,
                     jobs, github, main, day_two, breaker, sign_in, notifications, audit
    Clock            the time
    DeclarationRepo  the declaration repo: trees read at exact commits, merges, branches the gateway writes
    SimulatedCloud   the sandbox engine's cloud, acted on behind the gateway's back (drift, faults, imports)
    DeclarationReader  what a stack's HCL declares, read without planning (secrets, backend, local modules)
    PolicyScanner    an external plan scanner (checkov) beside the built-in rules
    PolicyEvaluator  main's Rego policies, loaded and evaluated
    WorkingCopies    clones of the declaration repo on disk, where agents edit files
    Engine           plans and applies one stack (every engine emits Terraform's JSON plan)
    Forge            the code host (GitHub, GitLab): pull/merge requests, reviews or approvals, checks, teams, merges
    Metrics          what operators count (job run times, lock waits, deliveries...); `NO_METRICS` counts nothing
    IdentityProvider an OpenID Connect provider or GitHub OAuth, for signing in to the pages
    NotificationSender  delivers one notice to one channel (Slack, e-mail, a signed webhook)

Services name these Protocols, never an adapter: a test can hand them a fake that implements one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from gateway.domain.agent_runs import AgentRun, AgentRunStatus, Conversation
from gateway.domain.applies import ApplyRecord, ApplyStatus
from gateway.domain.apply_blockers import MainPush
from gateway.domain.audit import AuditEvent, ChainLink, Checkpoint, EventQuery
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.breaker import BreakerState, CapacityChange
from gateway.domain.declarations import LiteralSecret, Unmasking
from gateway.domain.drift import DriftRecord
from gateway.domain.github import Check, Delivery, PullInfo, PullRequestLink
from gateway.domain.gitlab_rules import GitLabAccount
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.locks import LockAttempt, StackLock
from gateway.domain.notifications import Channel, Notice, Notification, NotificationStatus
from gateway.domain.operations import EndedJobs, QueueDepth
from gateway.domain.plan_rounds import PlanRound, RoundState, StagedPlan
from gateway.domain.policy import Finding, PolicyContext
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
from gateway.domain.rego import RegoPolicies
from gateway.domain.repo_settings import ForgeSettings, GitHubSettings, GitLabSettings, RepoSettings
from gateway.domain.sign_in import Identity, PendingSignIn, RefusalTally, WebSession
from gateway.domain.workers import WorkerRecord


@dataclass(frozen=True)
class EnginePlan:
    """A plan in Terraform's JSON format, with the state it was made against."""

    document: Mapping[str, Any]
    state_serial: int
    state_lineage: str
    artifact: bytes | None = None  # the engine's own saved plan (Terraform's plan file): what the apply runs


@dataclass(frozen=True)
class ApplyOutcome:
    succeeded: bool
    applied: tuple[str, ...]  # addresses whose change completed, in order
    failed_address: str | None
    error: str | None
    state_serial: int


@dataclass(frozen=True)
class StackInputs:
    """What the gateway supplies to a stack besides its files.

    Every supplied value and every variable main declares sensitive is secret by origin: an engine
    keeps it masked whatever the branch's files declare (DESIGN rule 6: a branch can never unmask).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    sensitive_on_main: frozenset[str] = frozenset()

    @property
    def secret(self) -> frozenset[str]:
        return frozenset(self.values) | self.sensitive_on_main


class Engine(Protocol):
    """Plans and applies one stack; every engine emits Terraform's JSON plan format."""

    name: str

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan: ...

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        """Apply exactly the saved plan; `progress` gets the engine's own lines as they come, secrets masked."""
        ...

    def state_serial(self, stack: str) -> int: ...

    def masks_by_origin(self, stack: str) -> bool:
        """Whether the engine keeps a secret masked through nonsensitive() (the sandbox does; Terraform cannot)."""
        ...

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        """Attributes of a resource type that the provider schema marks sensitive (non-empty when unknown)."""
        ...


class RemoteModules(Protocol):
    """The registry, git and HTTP modules a stack calls, laid out as `terraform init` lays them out."""

    def installed(self, directory: Path) -> AbstractContextManager[tuple[Path, Sequence[Any]]]:
        """A private copy of the stack in `directory` with its remote modules under `.terraform/modules` (and
        the pins of what was installed); removed when the context ends, so callers can only read it."""
        ...


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class Signer(Protocol):
    """Signs the audit trail's checkpoints with a key kept outside the database."""

    def public_key(self) -> str:
        """The signing key's public half (base64), which every checkpoint it signs names."""
        ...

    def sign(self, message: bytes) -> str: ...

    def valid(self, public_key: str, message: bytes, signature: str) -> bool:
        """Whether `signature` is `public_key`'s over `message` (any key's, not only this signer's)."""
        ...


# --- the records: one repository per aggregate, in one unit of work ---------------------------

class Metrics(Protocol):
    """What services count for the people who run the gateway. Every label is from a closed set (kinds, outcomes,
    channels): never an id, a name or an address. The figures that must agree across processes (job ends, queue depth
    and age, drift, breakers, checkpoints, workers) are not counted here: they are read from the records when
    scraped."""

    def job_ran(self, kind: str, seconds: float) -> None:
        """A job this process ran ended after `seconds` (how many ended, by outcome, is read from the records)."""
        ...

    def job_retried(self, kind: str) -> None:
        """A job went back in the queue to be tried again (a transient failure, a worker that died or stopped)."""
        ...

    def lock_waited(self, seconds: float, taken: bool) -> None:
        """An apply waited `seconds` for a stack lock, and got it (`taken`) or gave up."""
        ...

    def lock_broken(self, count: int) -> None:
        """Locks of a runner that stopped heart-beating were taken over by recovery."""
        ...

    def webhook_received(self, event: str, outcome: str) -> None:
        """A delivery reached the webhook: accepted, duplicate or refused."""
        ...

    def webhook_handled(self, event: str, lag_seconds: float) -> None:
        """A delivery's outcome was recorded (a decision, a re-plan, a refusal), `lag_seconds` after it arrived."""
        ...

    def publish_finished(self, failed: bool, retry: bool) -> None:
        """A pull request was brought up to date (or failed to be); `retry` when the last attempt had failed."""
        ...

    def notification_delivered(self, channel: str, outcome: str) -> None:
        """A notification was sent on `channel` (e.g. email, slack, webhook): delivered, failed, retried..."""
        ...

    def audit_appended(self, count: int) -> None:
        """`count` events were committed to the trail."""
        ...


class NoMetrics:
    """The default: counts nothing, costs nothing (tests, the CLI's one-shot commands)."""

    def job_ran(self, kind: str, seconds: float) -> None:
        pass

    def job_retried(self, kind: str) -> None:
        pass

    def lock_waited(self, seconds: float, taken: bool) -> None:
        pass

    def lock_broken(self, count: int) -> None:
        pass

    def webhook_received(self, event: str, outcome: str) -> None:
        pass

    def webhook_handled(self, event: str, lag_seconds: float) -> None:
        pass

    def publish_finished(self, failed: bool, retry: bool) -> None:
        pass

    def notification_delivered(self, channel: str, outcome: str) -> None:
        pass

    def audit_appended(self, count: int) -> None:
        pass


NO_METRICS: Metrics = NoMetrics()


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

    def link_job(self, round_id: int, stack: str, job_id: int) -> None: ...

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


class UnitOfWork(Protocol):
    """One transaction: what a use case writes through these repositories commits together, or not at all."""

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
    dialect: str  # sqlite, postgresql
    schema_version: int  # the schema this code reads and writes (its newest migration)

    def close(self) -> None:
        """Let go of every connection."""
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


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    author_name: str
    author_email: str
    message: str


class DeclarationRepo(Protocol):
    """The declaration repo. Reads name exact commits (what is at a commit never changes); refs are resolved fresh."""

    path: Path

    def reopen(self) -> DeclarationRepo:
        """A handle of its own on the same repo, for another thread."""
        ...

    def pinned(self) -> DeclarationRepo:
        """A handle for one read: each ref resolved once, then the same for the rest of the read."""
        ...

    def main_branch(self) -> str: ...

    def resolve(self, ref: str) -> str:
        """The commit SHA a branch, tag or SHA names (NotFound when none)."""
        ...

    def branch_exists(self, branch: str) -> bool: ...

    def repo_settings(self, sha: str) -> RepoSettings:
        """gateway.yaml as of commit `sha`."""
        ...

    def merge_base(self, a: str, b: str) -> str: ...

    def changed_paths(self, base: str, head: str) -> list[str]: ...

    def diff(self, base: str, head: str) -> str: ...

    def commits(self, base: str, head: str) -> list[CommitInfo]:
        """The commits in `base..head`, oldest first."""
        ...

    def read_file(self, sha: str, path: str) -> str: ...

    def read_files(self, sha: str, subdir: str, suffix: str) -> Mapping[str, str]: ...

    def read_tree(self, sha: str, subdir: str) -> Mapping[str, str]: ...

    def module_directories(self, sha: str, stack_path: str) -> tuple[str, ...]: ...

    def export_stack(self, sha: str, stack_path: str, dest: Path) -> Path:
        """Write a stack and the local modules it calls under `dest`; returns the stack's directory."""
        ...

    def merge_preview(self, main_sha: str, head_sha: str) -> str: ...

    def merge_conflict(self, main_sha: str, head_sha: str) -> str | None:
        """Why `head_sha` does not merge cleanly into `main_sha` (None: it merges); writes nothing."""
        ...

    def first_parent_commits(self, since: str, until: str) -> list[tuple[str, str | None, str]]: ...

    def is_ancestor(self, older: str, newer: str) -> bool: ...

    def merged_as(self, sha: str, ref: str) -> str | None: ...

    def last_commit_touching(self, ref: str, path: str) -> str | None: ...

    def commits_touching(self, ref: str, path: str, limit: int = 20) -> list[str]: ...

    def tree_of(self, sha: str, subdir: str) -> str | None: ...

    def merge(self, main_sha: str, head_sha: str, into: str, message: str,
              before_moving: Callable[[str], None] | None = None) -> str: ...

    def set_branch(self, branch: str, sha: str) -> None:
        """Point `branch` at `sha` (created if missing)."""
        ...

    def commit_to_new_branch(self, base_sha: str, branch: str, files: Mapping[str, str], message: str,
                             author: str) -> str: ...

    def revert_merge_to_new_branch(self, merge_sha: str, onto_sha: str, branch: str, message: str,
                                   author: str) -> str: ...

    def delete_branch(self, branch: str) -> None: ...


class SimulatedCloud(Protocol):
    """The sandbox engine's cloud, changed behind the gateway's back as people outside it would (a console edit, a
    failing provider), and read for imports. It stands for real infrastructure only in the simulator."""

    def edit_object(self, stack: str, address: str, changes: Mapping[str, Any]) -> None: ...

    def delete_object(self, stack: str, address: str) -> None: ...

    def inject_fault(self, stack: str, address: str, message: str) -> None: ...

    def inject_delay(self, stack: str, address: str, seconds: float) -> None: ...

    def get_object(self, rtype: str, rid: str) -> Mapping[str, Any] | None:
        """A live object's attributes, or None when no such object exists."""
        ...

    def managed_by(self, rtype: str, rid: str, stacks: Collection[str]) -> tuple[str, str] | None:
        """The (stack, address) among `stacks` whose state holds the object, if any does."""
        ...

    def declarable_attributes(self, rtype: str, live: Mapping[str, Any]) -> Mapping[str, Any]:
        """The attributes of a live object a declaration sets (neither computed nor sensitive)."""
        ...


class DeclarationReader(Protocol):
    """What HCL files declare, read without planning them. `files` maps a shown path to its text."""

    def sensitive_variables(self, files: Mapping[str, str]) -> frozenset[str]:
        """The variables declared with `sensitive = true`."""
        ...

    def unmaskings(self, files: Mapping[str, str], secret_variables: frozenset[str], main_sensitive: frozenset[str],
                   sensitive_attributes: Callable[[str], frozenset[str]]) -> list[Unmasking]:
        """Every place the files try to show a secret in clear, by address."""
        ...

    def outside_reads(self, files: Mapping[str, str]) -> list[Unmasking]:
        """File functions reading outside their directory."""
        ...

    def literal_secrets(self, files: Mapping[str, str]) -> list[LiteralSecret]:
        """Secret-like attributes set from a string literal (a file that cannot be read is a ConfigError)."""
        ...

    def backend(self, files: Mapping[str, str]) -> Mapping[str, Any] | None:
        """The backend the files declare, as `{TYPE: {setting: value}}` (None: none)."""
        ...

    def local_modules(self, stack_path: str, root: Path) -> tuple[str, ...]:
        """The local module directories (repo-relative) the stack at `stack_path` calls, in a checkout at `root`."""
        ...


class PolicyScanner(Protocol):
    def scan(self, document: Mapping[str, Any], context: PolicyContext) -> list[Finding]:
        """Findings of the plan's checks; a scanner that cannot run fails closed when the settings say deny."""
        ...


class PolicyEvaluation(Protocol):
    results: Mapping[str, Any]  # query -> its value
    errors: Mapping[str, str]  # query -> why it could not be evaluated
    module_errors: Mapping[str, str]  # file -> why it does not load


class PolicyEvaluator(Protocol):
    def load(self, repo: DeclarationRepo, sha: str) -> RegoPolicies | None:
        """The Rego policies under `policies/` at `sha` (None: there are none)."""
        ...

    def evaluate(self, policies: RegoPolicies, input_document: Any, queries: Sequence[str]) -> PolicyEvaluation: ...


class WorkingCopy(Protocol):
    """A clone of the declaration repo on disk. Only what is committed and pushed leaves it."""

    root: Path

    def is_dirty(self) -> bool:
        """Edited, added or removed files (untracked ones too)."""
        ...

    def new_branch(self, branch: str) -> None:
        """Start `branch` at the commit checked out."""
        ...

    def commit_and_push(self, message: str, author: str, ref: str, force: bool = False) -> None:
        """Commit every change as `author` and push the commit to `ref` of the declaration repo."""
        ...

    def fetch(self, ref: str) -> tuple[str, str | None] | None:
        """(commit, its parent) of `ref` in the declaration repo, fetched here; None when it does not exist."""
        ...

    def head(self) -> str: ...

    def uncommit_onto(self, ref: str) -> list[str]:
        """Move the current branch to `ref` and undo its last commit, keeping its edits: the files they change."""
        ...

    def delete_remote(self, ref: str) -> None: ...


class WorkingCopies(Protocol):
    def clone(self, dest: Path, branch: str | None = None, at: str | None = None) -> WorkingCopy:
        """A clone at `dest` on `branch` (made from main when it does not exist yet), or detached `at` a ref."""
        ...


class Forge(Protocol):
    """The code host of the declaration repo (GitHub or GitLab): pull (merge) requests, notes, checks, team (group)
    membership, merges. What only one host has is in `ReviewForge` (GitHub) and `ApprovalForge` (GitLab)."""

    settings: ForgeSettings

    def close(self) -> None: ...

    def fetch_main(self, main: str) -> None:
        """Make the gateway's main exactly the forge's (with a forge, its main is the truth)."""
        ...

    def sync_branch(self, branch: str) -> str:
        """Bring a pull request's branch and the gateway's copy together; returns the head both now have."""
        ...

    def push(self, branch: str, sha: str) -> None:
        """Publish a branch the gateway made (never forced: a branch someone else moved is not overwritten)."""
        ...

    def open_pull(self, branch: str, base: str, title: str, body: str) -> PullInfo:
        """The open pull request of `branch`, opened now if there is none."""
        ...

    def pull(self, number: int) -> PullInfo: ...

    def upsert_comment(self, number: int, comment_id: int | None, body: str) -> int:
        """Edit the sticky comment in place (not when it already reads so); post it when there is none yet."""
        ...

    def comment(self, number: int, comment_id: int) -> tuple[str, int]:
        """A comment as the forge has it now: body and author id (an edited or deleted one is not a command)."""
        ...

    def reply(self, number: int, body: str) -> None:
        """A one-off comment, for a pull request that has no proposal (a fork, an unlinked author)."""
        ...

    def request_teams(self, number: int, teams: list[str]) -> None: ...

    def set_checks(self, sha: str, checks: list[Check], details_url: str) -> None:
        """The four checks on the commit (check runs or commit statuses)."""
        ...

    def merge(self, number: int, sha: str, title: str, message: str) -> str:
        """Merge exactly `sha`: the forge refuses if the head moved since (a push that slipped in is never merged)."""
        ...

    def user_id(self, login: str) -> tuple[int, str]:
        """The numeric id and exact login (username) of a user."""
        ...

    def is_team_member(self, team: str, login: str, account_id: int | None) -> bool:
        """An active member of the team (group) now (a pending invitation does not count); GitHub asks by login,
        GitLab by the numeric id."""
        ...


class ReviewForge(Forge, Protocol):
    """GitHub: decisions are reviews, each of one commit."""

    settings: GitHubSettings  # type: ignore[misc]

    def review(self, number: int, review_id: int) -> tuple[str, str | None, int]:
        """A review as GitHub has it now: state (upper-case), commit, author id. Deliveries can be late or replayed."""
        ...


class ApprovalForge(Forge, Protocol):
    """GitLab: decisions are approvals of the merge request as it is, and bots are what the users API says."""

    settings: GitLabSettings  # type: ignore[misc]

    def approver_ids(self, number: int) -> frozenset[int]:
        """The numeric ids of the users whose approval the merge request has now (GitLab's approvals API)."""
        ...

    def account(self, user_id: int) -> GitLabAccount:
        """A GitLab user as its users API has them now (username, bot)."""
        ...


@dataclass(frozen=True)
class SignInStart:
    """Where to send the person, and what the callback must match (kept server-side, under the state, until then)."""

    url: str
    pending: dict[str, str]  # state, nonce, code_verifier, redirect_uri


class IdentityProvider(Protocol):
    """An identity provider the pages offer (OpenID Connect, GitHub OAuth): authorization code flow with PKCE."""

    name: str  # in URLs: /login/NAME
    label: str  # on the sign-in page

    def start(self, redirect_uri: str) -> SignInStart:
        """The authorization URL with a fresh state (and nonce), and the PKCE verifier kept for the callback."""
        ...

    def finish(self, pending: Mapping[str, str], callback: Mapping[str, str]) -> Identity:
        """Redeem the callback's code with what `start` kept for its state (the caller found the pending sign-in by
        the callback's state, in the browser that started it, and used it) and verify the answer; `SignInRefused`
        (naming the check that failed) otherwise."""
        ...


class NotificationSender(Protocol):
    """Delivers one notice to one channel, with the channel's secret from the gateway's settings."""

    def send(self, channel: Channel, notice: Notice, delivery_id: str) -> str:
        """Deliver it; what the channel answered. `Unavailable` when a later attempt may succeed (no connection, a
        5xx, a rate limit, an SMTP 4xx), `BackendError` when it never will (refused), `ConfigError` when the gateway
        has no secret for the channel."""
        ...
