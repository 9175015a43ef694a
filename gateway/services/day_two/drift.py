"""Reverting drift: main applied again where the cloud changed outside the gateway.

A revert is a proposal of main as it is (kind `drift_revert`, proposed by the gateway itself). Where
main's gateway.yaml sets `drift.auto_revert` on the stack and every change is an in-place update of an
unprotected resource with no policy deny, the gateway applies it without a person, recording the commit
that set the switch as its authority; it counts against the circuit breaker like an agent change.
Anything else stays a proposal that needs approval like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gateway.domain.approvals import auto_revert_refusals
from gateway.domain.errors import ConfigError, Refused
from gateway.domain.jobs import Job, JobKind
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.permissions import Action, require
from gateway.domain.preview import preview_from_json, preview_to_json
from gateway.domain.principals import GATEWAY, SYSTEM_NAME, Principal, PrincipalKind, Role, hash_token, new_token
from gateway.domain.proposal import Proposal, ProposalKind
from gateway.services.change.breaker import guard_agent_change
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.plan_rounds import stage
from gateway.services.change.planning import ChangeOrigin, StackPlanResult, plan_stack
from gateway.services.change.proposals import get_proposal, record_plans, stored_previews
from gateway.services.workspace import Records, Workspace


@dataclass
class DriftOutcome:
    stack: str
    proposal: Proposal | None = None
    automatic: bool = False
    job: Job | None = None
    reasons: list[str] = field(default_factory=list)  # why it needs a person (or why nothing was opened)
    already: bool = False  # the revert was open before this check
    replanned: bool = False  # ... and planned again: the drift it was planned against is not the drift now


def system_principal(ws: Records) -> Principal:
    """The gateway's own principal (made on first use): it proposes and applies reverts a setting allows."""
    with ws.store.session() as session:
        gateway = session.principals.by_name(SYSTEM_NAME)
        if gateway is None:
            gateway = session.principals.add(SYSTEM_NAME, PrincipalKind.SYSTEM, frozenset({Role.REQUESTER}),
                                            frozenset(), hash_token(new_token()))
            session.audit.append(GATEWAY, "principal.added", {"name": SYSTEM_NAME, "kind": "system",
                                                                "roles": ["requester"]})
    if gateway.kind != PrincipalKind.SYSTEM:
        raise ConfigError(f"the principal named {SYSTEM_NAME!r} is not the gateway's own; rename it")
    return gateway


def revert_drift(ws: Workspace, actor: Principal, stack: str) -> DriftOutcome:
    """Plan main for `stack`; if the cloud drifted from it, open a revert, and apply it alone where allowed.

    An open revert covers the drift it was planned against: drift found since makes it stale, and it is planned
    again (approved again where the new plan needs it). `actor` asked for the check (a person, or the gateway's own
    schedule); the revert is the gateway's.
    """
    require(actor, Action.CHECK_DRIFT)
    settings = ws.repo_settings()
    settings.require_stack(stack)
    branch = f"drift/{stack}"
    gateway = system_principal(ws)
    main_sha = ws.repo.resolve(ws.main_branch())
    result = plan_stack(ws, stack, main_sha, ChangeOrigin(requester=SYSTEM_NAME))
    with ws.store.session(readonly=True) as session:
        existing = session.proposals.open_for_branch(branch)
    if existing is not None:
        return _revert_again(ws, actor, gateway, get_proposal(ws, existing), result, main_sha)
    drifted = [d.address for d in result.plan.resource_drift]
    if drifted and settings.stacks[stack].engine == "cloudformation":
        return DriftOutcome(stack, reasons=[f"CloudFormation shows drift but does not revert it: a change set of the "
                                            f"deployed template changes nothing; change {', '.join(drifted[:20])} "
                                            "back by hand, or codify the drift in the template"])
    if not drifted or not result.plan.changes:
        return DriftOutcome(stack, reasons=["no drift to revert"])
    try:  # an automatic revert counts like an agent change: with the breaker open, nothing is opened
        capacity = guard_agent_change(ws, gateway, None, [result])
    except Refused as exc:
        with ws.store.session() as session:
            session.audit.append(gateway, "drift.found", {"stack": stack, "drifted": drifted, "main_sha": main_sha,
                                                          "requested_by": actor.name, "not_reverted": exc.reasons},
                                 None, [stack])
        return DriftOutcome(stack, reasons=exc.reasons)
    ws.repo.set_branch(branch, main_sha)  # the revert's "branch" is main as it is
    reason = f"revert drift on stack {stack}: {', '.join(drifted[:20])} changed outside the gateway"
    with ws.store.session() as session:
        pid = session.proposals.add(branch, main_sha, main_sha, gateway, gateway, reason, [stack], [],
                                   kind=ProposalKind.DRIFT_REVERT)
        session.audit.append(gateway, "drift.found", {"stack": stack, "drifted": drifted, "main_sha": main_sha,
                                                      "requested_by": actor.name}, pid, [stack])
        session.audit.append(gateway, "proposal.opened", {"branch": branch, "base_sha": main_sha,
                                                          "head_sha": main_sha, "kind": "drift_revert"}, pid, [stack])
        record_plans(session, pid, main_sha, main_sha, [stage(result)])
        session.breaker.record_change(replace(capacity, proposal_id=pid))
    return _decide_revert(ws, gateway, get_proposal(ws, pid), result, main_sha)


def _decide_revert(ws: Workspace, gateway: Principal, proposal: Proposal, result: StackPlanResult, main_sha: str,
                   replanned: bool = False) -> DriftOutcome:
    """A revert just planned: record whether it needs approval, and queue its apply when it does not."""
    stack = result.stack
    reasons = auto_revert_refusals(proposal, ws.repo_settings())
    with ws.store.session() as session:
        if reasons:
            session.audit.append(gateway, "drift.revert_proposed", {"stack": stack, "needs_approval": reasons},
                                 proposal.id, [stack])
        else:
            session.audit.append(gateway, "drift.auto_revert", {
                "stack": stack, "changes": [rc.address for rc in result.plan.changes],
                "authority": ws.repo.last_commit_touching(main_sha, "gateway.yaml")},
                proposal.id, [stack])
    if reasons:
        return DriftOutcome(stack, proposal, reasons=reasons, replanned=replanned)
    return DriftOutcome(stack, proposal, automatic=True, replanned=replanned,
                        job=enqueue_job(ws, gateway, JobKind.APPLY, proposal.id))


def _revert_again(ws: Workspace, actor: Principal, gateway: Principal, revert: Proposal, result: StackPlanResult,
                  main_sha: str) -> DriftOutcome:
    """An open revert and what a plan of main finds now: the same drift is the revert's; other drift (new, changed
    or gone) makes it stale, and it is planned again, its earlier decisions stale with the plan they named."""
    stack = result.stack
    planned_against, now = stored_previews(ws, revert).get(stack), preview_to_json(result.preview())
    if _drift_seen(ws, planned_against) == _drift_seen(ws, now):
        reasons = auto_revert_refusals(revert, ws.repo_settings())
        with ws.store.session(readonly=True) as session:
            queued = session.jobs.queued(JobKind.APPLY, revert.id)
        return DriftOutcome(stack, revert, automatic=not reasons, job=ws.store.queue.get(queued) if queued else None,
                            reasons=reasons, already=True)
    if revert.status not in DECIDABLE:
        return DriftOutcome(stack, revert, already=True, reasons=[
            f"proposal {revert.id} is {revert.status.value}, reverting the drift it was planned against; "
            "check again after it: what it leaves is drift still"])
    drifted = [d.address for d in result.plan.resource_drift]
    try:
        capacity = guard_agent_change(ws, gateway, revert.id, [result])
    except Refused as exc:
        return DriftOutcome(stack, revert, already=True, reasons=exc.reasons)
    with ws.store.session() as session:
        locked = session.proposals.get(revert.id, lock=True)
        if locked.status not in DECIDABLE:
            return DriftOutcome(stack, locked, already=True, reasons=[f"proposal {revert.id} is {locked.status.value}"])
        session.audit.append(gateway, "drift.found", {"stack": stack, "drifted": drifted, "main_sha": main_sha,
                                                      "requested_by": actor.name, "replans": revert.id},
                             revert.id, [stack])
        record_plans(session, revert.id, locked.head_sha, main_sha, [stage(result)])
        session.breaker.record_change(replace(capacity, proposal_id=revert.id))
        updated = session.proposals.get(revert.id)
        stale = [d for d in updated.stale_decisions if locked.is_current(d)]
        if stale:
            session.audit.append(GATEWAY, "decisions.stale", {
                "decisions": [{"id": d.id, "by": d.principal.name, "decision": d.decision.value,
                               "head_sha": d.head_sha, "digests": dict(d.digests)} for d in stale],
                "because": [f"drift on stack {stack} changed since the revert was planned"],
                "head_sha": updated.head_sha, "digests": updated.current_digests}, revert.id, [stack])
    return _decide_revert(ws, gateway, updated, result, main_sha, replanned=True)


def _drift_seen(ws: Workspace, preview_json: str | None) -> list[tuple[str, tuple[tuple[str, str, str], ...]]]:
    """The drift a preview shows, resource by resource and attribute by attribute, masked as a stored one is."""
    if preview_json is None:
        return []
    drift = preview_from_json(preview_json).drift
    return sorted((d.address, tuple((a.path, ws.scrubber.scrub(a.before or ""), ws.scrubber.scrub(a.after or ""))
                                    for a in d.attributes)) for d in drift)
