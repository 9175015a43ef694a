"""A proposal: a branch of the declaration repo, its current plans, and the decisions on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gateway.domain.errors import Refused
from gateway.domain.lifecycle import ProposalStatus, Transition, next_status, ways_out
from gateway.domain.policy import Finding, Override, unresolved_denies
from gateway.domain.principals import Actor, Principal
from gateway.domain.repositories import DEFAULT_REPOSITORY
from gateway.domain.risk import Risk, RiskLevel

__all__ = ["Decision", "DecisionRecord", "PlanSummary", "Proposal", "ProposalKind", "ProposalMoved", "ProposalStatus",
           "StackPlan", "Transition"]


class ProposalKind(StrEnum):
    CHANGE = "change"  # a branch that changes the declarations
    DRIFT_REVERT = "drift_revert"  # main as it is, applied again to undo what changed outside the gateway


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    WITHDRAW = "withdraw"  # the person takes back their earlier decisions (e.g. their review was dismissed)


@dataclass(frozen=True)
class PlanSummary:
    """What a saved plan holds, in brief: kept beside it, so a proposal is read without its plan document."""

    counts: Mapping[str, int]  # by action, plus moves and imports
    destructive: tuple[str, ...] = ()  # addresses deleted or replaced
    changed: tuple[str, ...] = ()  # addresses the plan changes (anything but no-op and read)
    drift: tuple[str, ...] = ()  # addresses found changed outside the gateway when it was planned
    risk: Risk = Risk(RiskLevel.LOW, ())
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"counts": dict(self.counts), "destructive": list(self.destructive), "changed": list(self.changed),
                "drift": list(self.drift), "risk": self.risk.to_json(), "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> PlanSummary:
        risk = data.get("risk") or {}
        assert isinstance(risk, Mapping)
        return cls(
            counts=dict(data.get("counts") or {}),  # type: ignore[call-overload]
            destructive=tuple(data.get("destructive") or ()),  # type: ignore[arg-type]
            changed=tuple(data.get("changed") or ()),  # type: ignore[arg-type]
            drift=tuple(data.get("drift") or ()),  # type: ignore[arg-type]
            risk=Risk(RiskLevel(risk.get("level", "low")), tuple(risk.get("reasons") or ())),
            findings=tuple(Finding.from_json(f) for f in data.get("findings") or ()),  # type: ignore[union-attr]
        )


@dataclass(frozen=True)
class StackPlan:
    """The current saved plan of one stack of a proposal."""

    plan_id: int
    stack: str
    head_sha: str
    digest: str
    state_serial: int
    counts: Mapping[str, int]
    destructive: tuple[str, ...]  # addresses deleted or replaced
    risk: RiskLevel = RiskLevel.LOW
    risk_reasons: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    main_sha: str | None = None  # the main commit the branch was merged onto for this plan
    changed: tuple[str, ...] = ()  # addresses the plan changes (anything but no-op and read)
    drift: tuple[str, ...] = ()  # addresses found changed outside the gateway when it was planned
    planned_at: datetime | None = None  # drift recorded after it is drift the plan never saw

    @property
    def has_changes(self) -> bool:
        return any(n for k, n in self.counts.items() if k not in ("no-op", "read"))


@dataclass(frozen=True)
class DecisionRecord:
    id: int
    principal: Principal
    decision: Decision
    head_sha: str
    digests: Mapping[str, str]  # stack -> plan digest the decider saw
    comment: str
    auth: str  # how the decider was authenticated, e.g. "api-token"
    at: datetime


@dataclass(frozen=True)
class ProposalMoved:
    """A transition a proposal took, raised by the proposal and not yet in the trail: the unit of work writes it
    (as `proposal.<transition>`) in the transaction that saves the new status."""

    proposal_id: int
    stacks: tuple[str, ...]
    transition: Transition
    before: ProposalStatus
    after: ProposalStatus
    actor: Actor
    detail: Mapping[str, object]  # what the transition's caller says about it (a reason, the runner, digests)
    merge_sha: str | None = None  # the commit it merged, if it did
    applied_sha: str | None = None  # the commit the apply it starts runs

    @property
    def kind(self) -> str:
        return f"proposal.{self.transition.value}"

    @property
    def payload(self) -> dict[str, object]:
        return {"from": self.before.value, "to": self.after.value, **self.detail}


@dataclass
class Proposal:
    id: int
    branch: str
    base_sha: str
    head_sha: str
    requester: Principal
    proposer: Principal
    reason: str
    stacks: tuple[str, ...]
    status: ProposalStatus
    plans: dict[str, StackPlan] = field(default_factory=dict)
    decisions: list[DecisionRecord] = field(default_factory=list)
    overrides: list[Override] = field(default_factory=list)
    changed_paths: tuple[str, ...] = ()
    merge_sha: str | None = None
    agent_claim: str | None = None
    applied_sha: str | None = None  # the commit (the branch merged onto main) the last apply ran
    kind: ProposalKind = ProposalKind.CHANGE
    repository: str = DEFAULT_REPOSITORY  # the declaration repository it changes
    # transitions taken since the proposal was last saved (cosmicpython's `Product.events`)
    events: list[ProposalMoved] = field(default_factory=list, compare=False, repr=False)

    def move(self, transition: Transition, actor: Actor, detail: Mapping[str, object],
             merge_sha: str | None = None, applied_sha: str | None = None) -> ProposalMoved:
        """Take `transition` as `actor` (refused when the table does not allow it here), noting the commits it
        merged or applied, and raise its event; `Proposals.save` persists the move and hands the event to the
        unit of work."""
        before = self.status
        after = self.take(transition)
        if merge_sha:
            self.merge_sha = merge_sha
        if applied_sha:
            self.applied_sha = applied_sha
        moved = ProposalMoved(self.id, self.stacks, transition, before, after, actor, dict(detail), merge_sha or None,
                              applied_sha or None)
        self.events.append(moved)
        return moved

    def take(self, transition: Transition) -> ProposalStatus:
        """Move along the lifecycle table; refuse with a reason when it does not allow this here."""
        target = next_status(self.status, transition)
        if target is None:
            allowed = ", ".join(t.value for t in ways_out(self.status)) or "nothing: it is final"
            raise Refused([f"proposal {self.id} is {self.status.value}; `{transition.value}` is not possible "
                           f"from there (allowed: {allowed})"])
        self.status = target
        return target

    @property
    def current_digests(self) -> dict[str, str]:
        return {stack: plan.digest for stack, plan in self.plans.items()}

    def is_current(self, decision: DecisionRecord) -> bool:
        """A decision counts only for the commit and the exact plans it named, until its maker withdraws it."""
        if decision.decision == Decision.WITHDRAW or self._withdrawn(decision):
            return False
        if decision.decision == Decision.REJECT:
            return decision.head_sha == self.head_sha  # a rejection stands until a new commit
        return decision.head_sha == self.head_sha and dict(decision.digests) == self.current_digests

    def _withdrawn(self, decision: DecisionRecord) -> bool:
        return any(w.decision == Decision.WITHDRAW and w.principal.id == decision.principal.id and w.id > decision.id
                   for w in self.decisions)

    @property
    def current_approvals(self) -> list[DecisionRecord]:
        """Approvals of the current commit and plans by people who are not disabled (checked again at apply)."""
        return [d for d in self.decisions if d.decision == Decision.APPROVE and self.is_current(d)
                and not d.principal.disabled]

    @property
    def current_rejection(self) -> DecisionRecord | None:
        return next((d for d in self.decisions if d.decision == Decision.REJECT and self.is_current(d)), None)

    @property
    def stale_decisions(self) -> list[DecisionRecord]:
        return [d for d in self.decisions if d.decision != Decision.WITHDRAW and not self.is_current(d)]

    @property
    def risk(self) -> RiskLevel:
        return max((p.risk for p in self.plans.values()), key=lambda r: r.rank, default=RiskLevel.LOW)

    @property
    def findings(self) -> list[Finding]:
        return [f for p in self.plans.values() for f in p.findings]

    def blocking_findings(self, now: datetime) -> list[Finding]:
        """Deny findings of the current plans that no active override covers."""
        return unresolved_denies(self.findings, self.overrides, now)

    @property
    def destructive(self) -> dict[str, tuple[str, ...]]:
        return {s: p.destructive for s, p in self.plans.items() if p.destructive}


@dataclass(frozen=True)
class PlanBasis:
    """What a proposal's current plans were made from: enough to tell whether they are out of date."""

    proposal_id: int
    branch: str
    head_sha: str
    stacks: tuple[str, ...]
    plans: Mapping[str, tuple[str | None, int]]  # stack -> (main commit merged onto, state serial)

    @classmethod
    def of(cls, proposal: Proposal) -> PlanBasis:
        return cls(proposal.id, proposal.branch, proposal.head_sha, proposal.stacks,
                   {s: (p.main_sha, p.state_serial) for s, p in proposal.plans.items()})


@dataclass(frozen=True)
class ListedProposal:
    """A proposal as a list shows it before it is read whole: when it was opened, and by which model if an agent's."""

    id: int
    status: ProposalStatus
    created_at: datetime
    model: str | None = None
    prompt_version: str | None = None
