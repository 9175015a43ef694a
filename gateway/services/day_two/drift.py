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
from gateway.domain.permissions import Action, require
from gateway.domain.principals import GATEWAY, SYSTEM_NAME, Principal, PrincipalKind, Role, hash_token, new_token
from gateway.domain.proposal import Proposal, ProposalKind
from gateway.services.change.breaker import guard_agent_change
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.proposals import get_proposal, record_plans
from gateway.services.workspace import Workspace


@dataclass
class DriftOutcome:
    stack: str
    proposal: Proposal | None = None
    automatic: bool = False
    job: Job | None = None
    reasons: list[str] = field(default_factory=list)  # why it needs a person (or why nothing was opened)


def system_principal(ws: Workspace) -> Principal:
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

    `actor` asked for the check (a person, or the gateway's own schedule); the revert is the gateway's.
    """
    require(actor, Action.CHECK_DRIFT)
    settings = ws.repo_settings()
    settings.require_stack(stack)
    branch = f"drift/{stack}"
    with ws.store.session(readonly=True) as session:
        existing = session.proposals.open_for_branch(branch)
    if existing is not None:
        return DriftOutcome(stack, get_proposal(ws, existing), reasons=[f"proposal {existing} already reverts it"])
    gateway = system_principal(ws)
    main_sha = ws.repo.resolve(ws.main_branch())
    result = plan_stack(ws, stack, main_sha, ChangeOrigin(requester=SYSTEM_NAME))
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
        record_plans(session, pid, main_sha, main_sha, [result])
        session.breaker.record_change(replace(capacity, proposal_id=pid))
    proposal = get_proposal(ws, pid)
    reasons = auto_revert_refusals(proposal, settings)
    with ws.store.session() as session:
        if reasons:
            session.audit.append(gateway, "drift.revert_proposed", {"stack": stack, "needs_approval": reasons}, pid,
                                 [stack])
        else:
            session.audit.append(gateway, "drift.auto_revert", {
                "stack": stack, "changes": [rc.address for rc in result.plan.changes],
                "authority": ws.repo.last_commit_touching(main_sha, "gateway.yaml")}, pid, [stack])
    if reasons:
        return DriftOutcome(stack, proposal, reasons=reasons)
    return DriftOutcome(stack, proposal, automatic=True, job=enqueue_job(ws, gateway, JobKind.APPLY, pid))
