"""Request and response bodies of the HTTP API, named by use."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.domain.agent_runs import AgentRun, AgentRunStatus
from gateway.domain.jobs import Job


class ErrorPublic(BaseModel):
    error: str
    detail: str
    reasons: list[str] | None = None


class Health(BaseModel):
    status: Literal["ok"]
    database: str
    engine: str


class Readiness(BaseModel):
    """Whether this process can do its work; `failed` names each check that did not pass, and why."""

    status: Literal["ready", "not ready"]
    checks: dict[str, str]  # database, migrations, workspace, keys -> "ok" or what is wrong
    failed: list[str]
    reason: str | None = None


class RequestCreate(BaseModel):
    text: str = Field(min_length=1, max_length=8000, description="what you want changed, in plain words")
    conversation_id: str | None = Field(default=None, max_length=36, description="continue this conversation")


class RequestPublic(BaseModel):
    id: str
    status: AgentRunStatus
    finished: bool = Field(description="the turn has ended (any status but queued and running): stop polling")
    progress: list[str]
    proposal_id: int | None
    conversation_id: str | None
    message: str | None
    question: str | None = Field(default=None, description="status waiting: the agent's question; answer it with a "
                                                           "new request in the same conversation_id")

    @classmethod
    def of(cls, run: AgentRun) -> RequestPublic:
        return cls(id=run.id, status=run.status, finished=run.finished, progress=list(run.progress),
                   proposal_id=run.proposal_id, conversation_id=run.conversation_id, message=run.message,
                   question=run.question)


class DecisionPublic(BaseModel):
    by: str
    decision: Literal["approve", "reject"]
    head_sha: str
    digests: dict[str, str]
    comment: str
    authenticated_by: str
    at: datetime
    current: bool


class FindingPublic(BaseModel):
    key: str
    rule: str
    severity: Literal["deny", "warn"]
    address: str
    message: str
    overridden: bool


class StackPlanPublic(BaseModel):
    stack: str
    digest: str
    state_serial: int
    risk: str
    counts: dict[str, int]
    destructive: list[str]
    preview: dict[str, Any]


class RepositoryPublic(BaseModel):
    name: str
    active: bool
    added_at: datetime
    added_by: str
    removed_at: datetime | None = None


class ProposalSummary(BaseModel):
    id: int
    branch: str
    status: str
    stacks: list[str]
    reason: str
    requester: str
    proposer: str
    risk: str | None = None
    blocked_by: list[str] = Field(default=[], description="what still stands before an apply")
    created_at: datetime | None = None
    waiting_for_you: bool = Field(default=False, description="you may approve it now")


class InboxEntry(BaseModel):
    """A proposal you can decide now, and why it needs you."""

    id: int
    branch: str
    reason: str
    requester: str
    stacks: list[str]
    risk: str = Field(description="its risk tier")
    groups: list[str] = Field(description="your groups that may decide it (approver groups of its stacks; config "
                                          "approvers, when it changes a protected path)")
    required_approvals: int = Field(description="the quorum: approvals it needs")
    current_approvals: int = Field(description="current approvals it has")
    why: list[str] = Field(description="the same, in sentences")
    repository: str = Field(description="the declaration repository the proposal is in")


class ProposalPublic(ProposalSummary):
    head_sha: str
    base_sha: str
    risk: str
    required_approvals: int
    blocked_by: list[str]
    can_apply: bool = Field(description="you may apply it now: the runner would not refuse you")
    apply_blockers: list[str] = Field(description="why an apply by you would be refused now (empty: it would not)")
    pending: list[str] = Field(default_factory=list, description="what moved since the plans; a plan job catches up")
    cannot_plan: str | None = Field(default=None, description="why its last plan job failed, while a plan would start "
                                    "from the same branch and main heads (the workers wait for one to move)")
    jobs: list[dict[str, Any]] = Field(default_factory=list, description="the proposal's plan and apply jobs")
    planning: dict[str, Any] | None = Field(default=None, description=(
        "its stacks being planned as jobs of their own (`summary`: planned 37 of 100 stacks; each stack's status), "
        "or how its newest planning failed (`reasons`: which stack, why); null once the plans are written"))
    agent_claim: str | None
    claim_issues: list[str]
    plans: list[StackPlanPublic]
    findings: list[FindingPublic]
    decisions: list[DecisionPublic]
    merge_sha: str | None


class DecisionCreate(BaseModel):
    comment: str = Field(default="", max_length=4000)
    sha: str | None = Field(default=None, min_length=40, max_length=40, pattern="^[0-9a-f]{40}$",
                            description="the commit you reviewed; refused if the branch moved")
    digests: dict[str, str] | None = Field(default=None, max_length=100,
                                           description="stack -> plan digest you reviewed; refused if re-planned")


class RejectionCreate(BaseModel):
    comment: str = Field(min_length=1, max_length=4000)


class OverrideCreate(BaseModel):
    finding: str = Field(min_length=3, max_length=500, description="STACK:RULE:ADDRESS")
    reason: str = Field(min_length=1, max_length=4000)
    expires_at: datetime


class DeliveryPublic(BaseModel):
    """A GitHub webhook delivery, recorded and queued (a redelivery of the same id changes nothing)."""

    delivery: str
    duplicate: bool
    job: int | None = Field(description="the job handling it; none for events the gateway does not act on")


class JobPublic(BaseModel):
    """A plan or apply job: queued at once, run by a worker; poll it until `finished`."""

    id: int
    kind: str
    proposal_id: int | None
    status: str
    finished: bool
    runner: str | None
    progress: list[str]
    result: dict[str, Any]
    error: str | None

    @classmethod
    def of(cls, job: Job) -> JobPublic:
        return cls(id=job.id, kind=job.kind.value, proposal_id=job.proposal_id, status=job.status.value,
                   finished=job.finished, runner=job.runner, progress=list(job.progress), result=job.result,
                   error=job.error)


class EventPublic(BaseModel):
    seq: int
    id: str
    at: str
    actor: str
    actor_kind: str
    kind: str
    proposal_id: int | None
    stacks: list[str]
    payload: dict[str, Any]
    prev_hash: str
    hash: str


class VerifyPublic(BaseModel):
    intact: bool
    events: int
    broken_at: int | None = None
    reason: str | None = None
