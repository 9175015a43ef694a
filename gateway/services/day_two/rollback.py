"""Rollback: a proposal that restores the declaration to what it was before an applied change (a revert of its
merge on a new branch), planned and approved like any other. Its preview names the proposal it undoes, and says
first what it would destroy."""

from __future__ import annotations

from gateway.domain.errors import InputError, Refused
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal, ProposalKind
from gateway.services.change.annotations import ROLLBACK_OF
from gateway.services.change.branches import free_branch_name
from gateway.services.change.proposals import get_proposal, open_proposal
from gateway.services.workspace import Workspace


def rollback_proposal(ws: Workspace, actor: Principal, proposal_id: int, reason: str) -> Proposal:
    """Open a proposal on `rollback/N` that reverts the merge of applied proposal N."""
    reason = reason.strip()
    if not reason:
        raise InputError("say why it is rolled back (-m)")
    target = get_proposal(ws, proposal_id)
    if target.status != ProposalStatus.APPLIED or not target.merge_sha:
        raise Refused([f"proposal {proposal_id} is {target.status.value}; only an applied, merged change is rolled "
                       "back (a proposal not applied is withdrawn with `gateway abandon`)"])
    if target.kind == ProposalKind.DRIFT_REVERT:
        raise Refused([f"proposal {proposal_id} reverted drift by applying main as it was: it changed no "
                       "declaration, so there is nothing to roll back"])
    imported = sorted(stack for stack, plan in target.plans.items() if plan.counts.get("import"))
    if imported:  # reverting an import block destroys an object that existed before the gateway managed it
        raise Refused([f"proposal {proposal_id} imported objects that existed before it (stack "
                       f"{', '.join(imported)}): a rollback would destroy them, not return to the state before it; "
                       "to let go of them, push a branch that replaces the resource with a `removed { from = ... "
                       "lifecycle { destroy = false } }` block and `gateway propose` it"])
    branch = free_branch_name(ws, f"rollback/{proposal_id}")
    title = target.reason.splitlines()[0][:80]
    message = f"Roll back proposal {proposal_id}: {title}\n\n{reason}\n\nReverts {target.merge_sha}."
    ws.repo.revert_merge_to_new_branch(target.merge_sha, ws.repo.resolve(ws.main_branch()), branch, message,
                                       actor.name)
    try:
        proposal = open_proposal(ws, actor, branch, f"roll back proposal {proposal_id} ({title}): {reason}")
    except BaseException:
        ws.repo.delete_branch(branch)
        raise
    with ws.store.session() as session:
        session.main.set_marker(f"{ROLLBACK_OF}{proposal.id}", str(proposal_id))
        session.audit.append(actor, "rollback.opened", {"rolls_back": proposal_id, "merge_sha": target.merge_sha,
                                                        "reason": reason, "branch": branch,
                                                        "destroys": {s: list(d) for s, d in proposal.destructive.items()}},
                             proposal.id, proposal.stacks)
    return get_proposal(ws, proposal.id)

