"""What a person sees of a proposal, and what they may do with it: shared by the API and the pages."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.domain.apply_blockers import apply_blockers, standing_blockers
from gateway.domain.approvals import approver_groups, decision_refusals, required_approvals
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.permissions import Action, refusals
from gateway.domain.plan_rounds import PlanRound, RoundState
from gateway.domain.preview import Preview, preview_from_json
from gateway.domain.principals import Principal
from gateway.domain.proposal import Decision, Proposal
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.scrubbing import Scrubber
from gateway.ports import UnitOfWork
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.plan_failures import standing_plan_failure
from gateway.services.change.proposals import (
    claim_issues,
    get_proposal,
    pending_changes,
    pushed_by,
    stored_previews,
)
from gateway.services.change.read_model import scrubbed_bytes
from gateway.services.workspace import Workspace


@dataclass
class ProposalView:
    proposal: Proposal
    preview_json: dict[str, str]  # stack -> the stored, masked preview in its public JSON shape
    required_approvals: int
    blocked_by: list[str]  # what stands before an apply whoever asks (open and failed proposals)
    claim_issues: list[str]
    can_approve: bool
    can_reject: bool
    apply_blockers: list[str]  # why the viewer's apply would be refused now: what the runner says
    diff: str
    pending: list[str]  # what moved since the plans (a plan job catches up; reads never do)
    cannot_plan: str | None  # why the workers do not plan it again until its branch or main moves (None: they do)
    jobs: list[Job]  # the proposal's plan and apply jobs, oldest first
    planning: PlanRound | None  # its stacks being planned as jobs of their own, or how that failed
    at: datetime  # when the view was taken: what "active" means for overrides

    @property
    def can_apply(self) -> bool:
        return not self.apply_blockers

    @functools.cached_property
    def previews(self) -> dict[str, Preview]:
        return {stack: preview_from_json(text) for stack, text in self.preview_json.items()}

    def public_json(self) -> str:
        """The proposal document the API serves; each stored preview is spliced in as is, never re-encoded."""
        return "".join(self.public_parts())

    def public_body(self, scrubber: Scrubber) -> bytes:
        """The document scrubbed and encoded, as `scrubber.scrub(public_json())` would give it: the pieces read now
        are scrubbed now, each stored preview's scrubbed bytes are kept by its content (a big one is a megabyte)."""
        parts = self.public_parts()
        previews = parts[1::2]
        if not (scrubber.splices_safely and all(p.startswith("{") and p.endswith("}") for p in previews)):
            return scrubber.scrub("".join(parts)).encode("utf-8")
        return b"".join(scrubbed_bytes(scrubber, part) if i % 2 else scrubber.scrub(part).encode("utf-8")
                        for i, part in enumerate(parts))

    def public_parts(self) -> list[str]:
        """The document's text in pieces: every second one (from the second) is a stored preview, as stored."""
        p = self.proposal
        active = {o.finding_key for o in p.overrides if o.active(self.at)}
        document = {
            "id": p.id, "branch": p.branch, "status": p.status.value, "stacks": list(p.stacks), "reason": p.reason,
            "requester": p.requester.name, "proposer": p.proposer.name, "head_sha": p.head_sha, "base_sha": p.base_sha,
            "pending": self.pending, "cannot_plan": self.cannot_plan,
            "jobs": [{"id": j.id, "kind": j.kind.value, "status": j.status.value} for j in self.jobs],
            "planning": self.planning.to_public() if self.planning else None,
            "risk": p.risk.value, "required_approvals": self.required_approvals, "blocked_by": self.blocked_by,
            "can_apply": self.can_apply, "apply_blockers": self.apply_blockers,
            "agent_claim": p.agent_claim, "claim_issues": self.claim_issues, "merge_sha": p.merge_sha,
            "findings": [{"key": f.key, "rule": f.rule, "severity": f.severity.value, "address": f.address,
                          "message": f.message, "overridden": f.key in active} for f in p.findings],
            "decisions": [{"by": d.principal.name, "decision": d.decision.value, "head_sha": d.head_sha,
                           "digests": dict(d.digests), "comment": d.comment, "authenticated_by": d.auth,
                           "at": d.at.isoformat(), "current": p.is_current(d)} for d in p.decisions],
        }
        parts, seam = [], _open_member(document, "plans") + "["
        for i, (s, sp) in enumerate(p.plans.items()):
            plan = {"stack": s, "digest": sp.digest, "state_serial": sp.state_serial, "risk": sp.risk.value,
                    "counts": dict(sp.counts), "destructive": list(sp.destructive)}
            parts += [seam + ("," if i else "") + _open_member(plan, "preview"), self.preview_json[s]]
            seam = "}"
        parts.append(seam + "]}")
        return parts

    def to_public(self) -> dict[str, Any]:
        return dict(json.loads(self.public_json()))


def _open_member(obj: dict[str, Any], key: str) -> str:
    """`obj` (not empty) as JSON, left open for one more member `key` whose value follows."""
    return f"{json.dumps(obj, ensure_ascii=False)[:-1]}, {json.dumps(key)}: "


def view_proposal(ws: Workspace, viewer: Principal, proposal_id: int) -> ProposalView:
    """Everything a person sees of a proposal; reads only, however stale the plans (`pending` says so).

    One read unit of work and one reading of the git refs: every record it shows is of the same moment.
    """
    with ws.store.session(readonly=True) as session:
        return _view(ws.for_read(), session, viewer, proposal_id)


def _view(ws: Workspace, session: UnitOfWork, viewer: Principal, proposal_id: int) -> ProposalView:
    proposal = get_proposal(ws, proposal_id)
    jobs = session.jobs.of_proposal(proposal_id)
    facts = gather_apply_facts(ws, proposal, viewer, hash_saved_plans=False)
    # only who may request may push through the git endpoint: nobody else's view asks who pushed (a decision does)
    pushed = pushed_by(ws, proposal) if not refusals(viewer, Action.REQUEST) else None
    settings, moment = facts.settings, facts.now
    failure = standing_plan_failure(ws, proposal, jobs)
    return ProposalView(
        proposal=proposal,
        preview_json=stored_previews(ws, proposal),
        required_approvals=required_approvals(proposal, settings),
        blocked_by=standing_blockers(facts) if proposal.status in DECIDABLE else [],
        claim_issues=claim_issues(ws, proposal),
        can_approve=not decision_refusals(viewer, proposal, settings, moment, Decision.APPROVE, pushed=pushed),
        can_reject=not decision_refusals(viewer, proposal, settings, moment, Decision.REJECT, pushed=pushed),
        apply_blockers=apply_blockers(facts),
        diff=ws.repo.diff(proposal.base_sha, proposal.head_sha),
        pending=pending_changes(ws, proposal),
        cannot_plan=failure.describe(proposal_id) if failure else None,
        jobs=jobs,
        planning=planning_of(session, proposal_id) if _planning_shown(jobs) else None,
        at=moment,
    )


def _planning_shown(jobs: list[Job]) -> bool:
    """Whether a view asks for the proposal's plan round: while a plan job runs it, or when the last one failed (a
    read's round trips are counted: an idle proposal's read asks nothing more)."""
    plans = [j for j in jobs if j.kind == JobKind.PLAN]
    return bool(plans) and plans[-1].status not in (JobStatus.SUCCEEDED, JobStatus.REFUSED)


def planning_of(session: UnitOfWork, proposal_id: int) -> PlanRound | None:
    """The proposal's plan round while its stacks are planned, or when its newest one failed (saying which stack and
    why); none once its plans are written."""
    current = session.plan_rounds.latest(proposal_id)
    return current if current and current.state in (RoundState.PLANNING, RoundState.FAILED) else None


@dataclass(frozen=True)
class ProposalRow:
    """One line of a proposal list, the same for the command, the API and the pages."""

    id: int
    branch: str
    status: str
    stacks: list[str]
    reason: str
    requester: str
    proposer: str
    risk: str
    blocked_by: list[str]  # what still stands before an apply (open proposals)
    created_at: datetime
    waiting_for_you: bool  # the viewer may approve it now


@dataclass(frozen=True)
class InboxItem:
    """A proposal the viewer can decide now, and why it needs them: their groups, its risk tier, its quorum."""

    id: int
    branch: str
    reason: str
    requester: str
    stacks: list[str]
    risk: str
    groups: list[str]  # the viewer's groups that may decide it (approver groups of its stacks, config approvers)
    required_approvals: int
    current_approvals: int
    why: list[str]  # the same, in sentences

    def to_public(self) -> dict[str, Any]:
        return {"id": self.id, "branch": self.branch, "reason": self.reason, "requester": self.requester,
                "stacks": self.stacks, "risk": self.risk, "groups": self.groups,
                "required_approvals": self.required_approvals, "current_approvals": self.current_approvals,
                "why": self.why}


def waiting_for(viewer: Principal, proposal: Proposal, settings: RepoSettings, moment: datetime) -> InboxItem | None:
    """The proposal as an inbox item when the viewer may decide it now (None: not theirs to decide).

    The one test of "waiting for you": the inbox (API, `gateway inbox`) and the proposals list use it.
    """
    if proposal.status not in DECIDABLE or decision_refusals(viewer, proposal, settings, moment):
        return None
    approvers = approver_groups(proposal, settings)
    groups = sorted(approvers.groups() & viewer.groups)
    needed, given = required_approvals(proposal, settings), len(proposal.current_approvals)
    why = [f"you are in approver group {g} of {', '.join(approvers.approved_by(g))}" for g in groups]
    why.append(f"risk {proposal.risk.value}: {needed} approval(s) needed, {given} given so far")
    return InboxItem(proposal.id, proposal.branch, proposal.reason, proposal.requester.name, list(proposal.stacks),
                     proposal.risk.value, groups, needed, given, why)


def inbox(ws: Workspace, viewer: Principal) -> list[InboxItem]:
    """What the viewer can decide now, oldest first (the queue a person works through)."""
    settings, moment = ws.repo_settings(), ws.clock.now()
    decidable = sorted(status.value for status in DECIDABLE)  # never the whole history
    items = [waiting_for(viewer, proposal, settings, moment) for proposal, _ in _listed(ws, decidable)]
    return sorted((i for i in items if i is not None), key=lambda i: i.id)


def _listed(ws: Workspace, statuses: Sequence[str | None]) -> list[tuple[Proposal, datetime]]:
    """The proposals in each of `statuses` (None: in any), newest first in each, each read whole, with when it was
    opened; in one read unit of work, read together (a hundred read one by one were two hundred round trips on
    PostgreSQL)."""
    with ws.store.session(readonly=True) as session:
        listed = [item for status in statuses for item in session.proposals.list(status)]
        read = session.proposals.get_many([item.id for item in listed])
    return [(proposal, item.created_at) for proposal, item in zip(read, listed, strict=True)]


def list_proposal_rows(ws: Workspace, viewer: Principal, status: str | None = None) -> list[ProposalRow]:
    """Proposals, those waiting for the viewer's approval first, then newest first."""
    with ws.store.session(readonly=True):  # one read unit of work for the whole list
        return _rows(ws, viewer, status)


def _rows(ws: Workspace, viewer: Principal, status: str | None) -> list[ProposalRow]:
    settings = ws.repo_settings()
    moment = ws.clock.now()
    rows = []
    for proposal, created_at in _listed(ws, [status]):
        decidable = proposal.status in DECIDABLE
        rows.append(ProposalRow(
            id=proposal.id, branch=proposal.branch, status=proposal.status.value, stacks=list(proposal.stacks),
            reason=proposal.reason, requester=proposal.requester.name, proposer=proposal.proposer.name,
            risk=proposal.risk.value,
            # the saved plans and the merge are checked on the proposal's own view: a list hashes no plans
            blocked_by=standing_blockers(gather_apply_facts(ws, proposal, check_plans=False)) if decidable else [],
            created_at=created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC),
            waiting_for_you=waiting_for(viewer, proposal, settings, moment) is not None))
    return sorted(rows, key=lambda r: (not r.waiting_for_you, -r.id))
