"""Use cases of the change path before apply: propose, follow new commits, decide, override, show."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from gateway.domain.approvals import decision_refusals, override_refusals, required_approvals
from gateway.domain.claims import check_claim
from gateway.domain.errors import Conflict, GatewayError, InputError, NotFound, Refused
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.permissions import Action, request_refusals, require
from gateway.domain.plan import load_plan
from gateway.domain.plan_rounds import FANOUT_AT, RoundState, StagedPlan
from gateway.domain.preview import Preview, build_preview, preview_from_json, preview_to_json
from gateway.domain.principals import GATEWAY, Actor, Principal
from gateway.domain.proposal import Decision, PlanBasis, Proposal, ProposalKind, Transition
from gateway.domain.repositories import Repository
from gateway.domain.risk import Risk
from gateway.logs import get_logger
from gateway.ports import UnitOfWork
from gateway.services.change.annotations import annotate_previews
from gateway.services.change.breaker import guard_agent_change
from gateway.services.change.main_watch import watch_main
from gateway.services.change.plan_rounds import (
    Replanned,
    plan_in_round,
    record_plans,
    round_error,
    stage,
    unstage,
    write_replan,
)
from gateway.services.change.plan_rounds import record_commits as _record_commits
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.read_model import saved_preview
from gateway.services.workspace import Configured, MainRules, Records, Workspace

MAX_REASON = 4000

log = get_logger(__name__)


def open_proposal(ws: Workspace, actor: Principal, branch: str, reason: str,
                  requester: Principal | None = None, agent_claim: str | None = None) -> Proposal:
    """Open a proposal from an existing branch: find its stacks, plan each, record it all."""
    requester = requester or actor
    if requester.is_agent:
        raise InputError("the requester of a change must be a person")
    if actor.is_agent and requester.id == actor.id:
        raise InputError("an agent proposes on behalf of a person; name the requester")
    with ws.store.session(readonly=True) as session:
        _require_may_propose(session, actor, requester)  # refused before the (slow) plans
    reason = reason.strip()
    if not reason:
        raise InputError("say why: a proposal needs a reason (-m)")
    if len(reason) > MAX_REASON:
        raise InputError(f"the reason is too long ({len(reason)} characters, at most {MAX_REASON})")
    main = ws.main_branch()
    if branch == main:
        raise InputError(f"propose a branch, not {main} itself")
    if not ws.repo.branch_exists(branch):
        raise NotFound(f"no branch {branch!r} in the declaration repo; push it first")
    head = ws.repo.resolve(branch)
    base = ws.repo.merge_base(main, head)
    paths = ws.repo.changed_paths(base, head)
    if not paths:
        raise InputError(f"branch {branch} has no changes against {main}")
    stacks = ws.repo_settings().stacks_touched(paths, lambda path: ws.repo.module_directories(head, path))
    origin = ChangeOrigin(actor.is_agent, requester.name, tuple(paths))
    main_sha, plans = plan_merged(ws, stacks, head, origin)  # plan before writing anything
    capacity = guard_agent_change(ws, actor, None, [unstage(p) for p in plans]) if actor.is_agent else None
    with ws.store.session() as session:
        _require_may_propose(session, actor, requester)  # again, in the writing transaction: planning takes a while
        if session.proposals.open_for_branch(branch) is not None:
            raise Conflict(f"branch {branch} already has an open proposal")
        pid = session.proposals.add(branch, base, head, requester, actor, reason, stacks, paths, agent_claim=agent_claim)
        if capacity is not None:
            session.breaker.record_change(replace(capacity, proposal_id=pid))
        session.audit.append(requester, "change.requested", {"reason": reason, "branch": branch}, pid, stacks)
        session.audit.append(actor, "proposal.opened", {
            "branch": branch, "base_sha": base, "head_sha": head, "requester": requester.name,
            "proposer": actor.name, "changed_paths": paths}, pid, stacks)
        _record_commits(ws, session, pid, base, head, stacks)
        record_plans(session, pid, head, main_sha, plans)
        return session.proposals.get(pid)


def _require_may_propose(session: UnitOfWork, actor: Principal, requester: Principal) -> None:
    """The actor and the requester as the store holds them now, not as they were when a token was checked or
    an agent was bound: whoever was disabled or lost the role since proposes nothing, whatever the way in (the CLI,
    the API's agent, MCP, a push, a forge). The requester by `request_refusals`, the one rule of who may request in
    which repository."""
    actor, requester = session.principals.get(actor.id), session.principals.get(requester.id)
    require(actor, Action.PROPOSE)
    known = require_active_repository(session)  # in its own words: nothing new there, whoever asks
    if known is None:  # a folder in repos/ the gateway never registered (`gateway repos add` stopped half-way)
        raise NotFound(f"no repository {session.repository} is registered in this gateway (`gateway repos list`)")
    reasons = request_refusals(requester, known)
    if reasons:
        raise Refused(reasons)


def require_active_repository(session: UnitOfWork) -> Repository | None:
    """A repository removed from the gateway takes nothing new: no proposal, plan or apply (its records stay).
    The session's repository as registered (None: not registered)."""
    known = session.repositories.get(session.repository)
    if known is not None and not known.active:
        raise Refused([f"repository {known.name} was removed from the gateway by {known.removed_by}: nothing new "
                       "is proposed, planned or applied there"])
    return known


def plan_merged(ws: Workspace, stacks: Sequence[str], head: str,
                origin: ChangeOrigin) -> tuple[str, list[StagedPlan]]:
    """Plan each stack as main will be after merging `head` into the current main.

    An approval thus covers what main will describe once the change is applied; a branch that does
    not merge cleanly is refused here, before anything is planned or applied.
    """
    main_sha = ws.repo.resolve(ws.main_branch())
    merged = ws.repo.merge_preview(main_sha, head)
    if len(stacks) < FANOUT_AT:
        return main_sha, [stage(plan_stack(ws, stack, merged, origin)) for stack in stacks]
    ended = plan_in_round(ws, stacks, head, main_sha, merged, origin)  # any worker plans any of them
    if ended.state != RoundState.PLANNED:
        raise round_error(ended)
    with ws.store.session() as session:  # its plans are the caller's to write now: the round holds them no longer
        staged = session.plan_rounds.staged(ended.id)
        session.plan_rounds.discard_staged(ended.id)
    return main_sha, staged


def pending_changes(ws: MainRules, proposal: Proposal) -> list[str]:
    """What moved since the proposal's plans, in words (empty when nothing did), as the records have it: a read
    never asks an engine or a cloud; workers read the stacks' state serials and record them (`record_serials`)."""
    if proposal.status not in DECIDABLE:
        return []
    basis = PlanBasis.of(proposal)
    with ws.store.session(readonly=True) as session:
        recorded = session.stacks.serials(list(basis.plans))
    return changes_since_plans(ws, basis, ws.repo.resolve(ws.main_branch()),
                               lambda stack: recorded.get(stack, basis.plans[stack][1]))


def current_changes(ws: Workspace, proposal: Proposal) -> list[str]:
    """What moved since the proposal's plans, the stacks' state serials asked of their engines now (and recorded,
    for reads): the check a write makes before it decides, re-plans or applies."""
    if proposal.status not in DECIDABLE:
        return []
    basis = PlanBasis.of(proposal)
    serials = read_serials(ws, list(basis.plans))
    return changes_since_plans(ws, basis, ws.repo.resolve(ws.main_branch()), serials.__getitem__)


def read_serials(ws: Workspace, stacks: Sequence[str]) -> dict[str, int]:
    """The stacks' state serials from their engines, recorded as read now (a worker's or a write's, never a read's)."""
    read_at = ws.clock.now()
    with ws.store.session(readonly=True):  # one snapshot: an engine reading the store reads it in this transaction
        serials = {stack: ws.engine.state_serial(stack) for stack in stacks}
    if serials:
        with ws.store.session() as session:
            session.stacks.record_serials(serials, read_at)
    return serials


def changes_since_plans(ws: MainRules, basis: PlanBasis, main_sha: str, serial_of: Callable[[str], int]) -> list[str]:
    """The words for what moved since `basis`: the branch, main under its stacks or settings, a stack's state."""
    if not ws.repo.branch_exists(basis.branch):
        return [f"branch {basis.branch} no longer exists"]
    changes = []
    head = ws.repo.resolve(basis.branch)
    if head != basis.head_sha:
        changes.append(f"new commit {head[:12]} on {basis.branch}")
    if _main_moved_under(ws, basis, main_sha):
        changes.append(f"main moved to {main_sha[:12]} under the proposal's stacks or settings since the plan")
    changes += [f"state of stack {s} moved since its plan" for s, (_, serial) in basis.plans.items()
                if serial_of(s) != serial]
    if set(basis.plans) != set(basis.stacks):
        changes.append("a stack of the proposal has no plan yet")
    return changes


def _main_moved_under(ws: MainRules, basis: PlanBasis, main_sha: str) -> bool:
    """Whether main changed, since the plans, a file the plans depend on: the proposal's stacks or the settings.

    Main moving elsewhere (another stack's files, a README) leaves these plans as they are; the apply
    still checks that the branch merges into the main of that moment.
    """
    older = {m for m, _ in basis.plans.values() if m != main_sha}
    if not older:
        return False
    if None in older:
        return True
    settings = ws.repo_settings()
    stack_paths = [settings.stacks[s].path for s in basis.stacks if s in settings.stacks]
    watched = tuple(d.rstrip("/") + "/" for path in stack_paths
                    for d in (path, *ws.repo.module_directories(main_sha, path)))
    return any(settings.is_protected_path(path) or path.startswith(watched)
               for old in older for path in ws.repo.changed_paths(str(old), main_sha))


def sync_proposal(ws: Workspace, proposal_id: int) -> tuple[Proposal, list[str]]:
    """Catch up with the branch, main and the stacks' state: re-plan, making decisions on a different plan stale.

    A write path (plan jobs, decisions, applies): it asks the engines; reads call `pending_changes` instead.
    Returns the proposal and what changed, in words (empty when nothing moved).
    """
    watch_main(ws)  # a push to main outside the gateway is recorded at the next sync
    with ws.store.session(readonly=True) as session:
        proposal = session.proposals.get(proposal_id)
    changes = current_changes(ws, proposal)
    if not changes:
        return proposal, []
    if not ws.repo.branch_exists(proposal.branch):
        raise NotFound(f"branch {proposal.branch} of proposal {proposal_id} no longer exists")
    head = ws.repo.resolve(proposal.branch)
    stacks, paths = proposal.stacks, proposal.changed_paths
    if head != proposal.head_sha and proposal.kind == ProposalKind.DRIFT_REVERT:
        why = (f"commit {head[:12]} was pushed to {proposal.branch}: a revert of drift is main as it is and takes "
               "no commits (propose a change on a branch of its own)")
        with ws.store.session() as session:
            locked = session.proposals.get(proposal_id, lock=True)
            if locked.status in DECIDABLE:
                locked.move(Transition.ABANDON, GATEWAY, {"reason": why})
                session.proposals.save(locked)
            return session.proposals.get(proposal_id), [why]
    if head != proposal.head_sha:
        paths = tuple(ws.repo.changed_paths(proposal.base_sha, head))
        stacks = tuple(ws.repo_settings().stacks_touched(paths, lambda path: ws.repo.module_directories(head, path)))
    if len(stacks) >= FANOUT_AT:  # planned as jobs any worker may claim; the last one writes the plans
        main_sha = ws.repo.resolve(ws.main_branch())
        ended = plan_in_round(ws, stacks, head, main_sha, ws.repo.merge_preview(main_sha, head),
                              _origin(proposal, paths), proposal_id, changes)
        if ended.state == RoundState.FAILED:
            raise round_error(ended)
        said = (ended.result or {}).get("changes") if ended.state == RoundState.ASSEMBLED else None
        return get_proposal(ws, proposal_id), list(said if said is not None else ended.changes)
    main_sha, plans = plan_merged(ws, stacks, head, _origin(proposal, paths))
    new_agent_work = head != proposal.head_sha and proposal.proposer.is_agent
    capacity = guard_agent_change(ws, proposal.proposer, proposal_id, [unstage(p) for p in plans]) \
        if new_agent_work else None
    with ws.store.session() as session:
        locked = session.proposals.get(proposal_id, lock=True)
        if locked.status not in DECIDABLE:
            return locked, []
        said = write_replan(ws, session, locked, Replanned(head, main_sha, stacks, paths), plans, capacity, changes)
        return session.proposals.get(proposal_id), said


def decide(ws: Workspace, actor: Principal, proposal_id: int, decision: Decision, comment: str,
           seen_sha: str | None = None, auth: str = "api-token",
           seen_digests: Mapping[str, str] | None = None) -> Proposal:
    """Approve or reject the proposal's current commit and plans, if the rules allow this person.

    The rules are checked and the decision written in one transaction, under the proposal's row lock,
    so a decision always binds to the commit and plans it was checked against.
    """
    comment = comment.strip()
    if decision == Decision.REJECT and not comment:
        raise InputError("a rejection needs a reason (-m)")
    settings = ws.repo_settings()
    before = get_proposal(ws, proposal_id)
    if decision_refusals(actor, before, settings, ws.clock.now(), decision, pushed=pushed_by(ws, before)):
        changes: list[str] = []  # refused whatever the branch did: do not let this call re-plan anything
    else:
        _, changes = sync_proposal(ws, proposal_id)
    pushed = pushed_by(ws, get_proposal(ws, proposal_id))
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        reasons = decision_refusals(actor, proposal, settings, ws.clock.now(), decision, seen_sha, seen_digests,
                                    pushed)
        if changes and not reasons:  # the decider has not seen what the proposal is now
            reasons = [f"the proposal changed before your decision was recorded ({'; '.join(changes)}); "
                       f"review it again with `gateway show {proposal_id}`"]
        if reasons:
            session.audit.append(actor, f"{decision.value}.refused", {"reasons": reasons, "head_sha": proposal.head_sha},
                                 proposal_id, proposal.stacks)
        else:
            session.proposals.add_decision(proposal_id, actor, decision, proposal.head_sha, proposal.current_digests, comment, auth)
            session.audit.append(actor, "approval" if decision == Decision.APPROVE else "rejection", {
                "head_sha": proposal.head_sha, "digests": proposal.current_digests, "comment": comment,
                "authenticated_by": auth, "required_approvals": required_approvals(proposal, settings),
            }, proposal_id, proposal.stacks)
            proposal = session.proposals.get(proposal_id)
    if reasons:
        raise Refused(reasons)
    return proposal


def pushed_by(ws: MainRules, proposal: Proposal) -> dict[str, str]:
    """Who pushed commits of the proposal through the gateway's git endpoint (name -> the last commit they pushed):
    a push recorded under the proposal, or one to its branch before it was opened whose commit is part of it."""
    with ws.store.session(readonly=True) as session:
        pushes = session.audit.events(kind="git.pushed")
    ref, pushed = f"refs/heads/{proposal.branch}", {}
    for push in pushes:
        after = str(push.payload.get("after") or "")
        if push.payload.get("ref") != ref or not after.strip("0"):
            continue
        if push.proposal_id == proposal.id or (push.proposal_id is None and _part_of(ws, proposal, after)):
            pushed[push.actor] = after
    return pushed


def _part_of(ws: MainRules, proposal: Proposal, sha: str) -> bool:
    """Whether a pushed commit is part of the proposal; a check git cannot make counts it in (fails closed: the
    pusher is barred from deciding rather than let through)."""
    try:
        return ws.repo.is_ancestor(sha, proposal.head_sha) and not ws.repo.is_ancestor(sha, proposal.base_sha)
    except GatewayError as exc:
        log.warning("push.ancestry_unknown", proposal=proposal.id, sha=sha, error=str(exc))
        return True


def withdraw_decisions(ws: Records, actor: Actor, person: Principal, proposal_id: int,
                       reason: str, made_by: str | None = None) -> Proposal:
    """Take back `person`'s current decisions (those `made_by` one review, when given); the trail says who and why."""
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        current = [d for d in proposal.decisions if d.principal.id == person.id and proposal.is_current(d)
                   and made_by in (None, d.auth)]
        if not current:
            return proposal
        session.proposals.add_decision(proposal_id, person, Decision.WITHDRAW, proposal.head_sha, proposal.current_digests,
                             reason, "withdrawn")
        session.audit.append(actor, "decision.withdrawn", {
            "by": person.name, "withdrawn": [{"id": d.id, "decision": d.decision.value} for d in current],
            "reason": reason, "head_sha": proposal.head_sha}, proposal_id, proposal.stacks)
        return session.proposals.get(proposal_id)


def override_finding(ws: Workspace, actor: Principal, proposal_id: int, finding_key: str, reason: str,
                     expires_at: datetime) -> Proposal:
    """A policy owner lifts one deny finding, with a reason and an expiry; checked and written in one transaction."""
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    settings = ws.repo_settings()
    if not override_refusals(actor, get_proposal(ws, proposal_id), settings, finding_key, reason, expires_at, ws.clock.now()):
        sync_proposal(ws, proposal_id)  # only someone who may override starts a re-plan
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        reasons = override_refusals(actor, proposal, settings, finding_key, reason, expires_at, ws.clock.now())
        if reasons:
            session.audit.append(actor, "override.refused", {"finding": finding_key, "reasons": reasons},
                                 proposal_id, proposal.stacks)
        else:
            session.proposals.add_override(proposal_id, finding_key, actor, reason.strip(), expires_at)
            session.audit.append(actor, "policy.override", {
                "finding": finding_key, "reason": reason.strip(), "expires_at": expires_at.isoformat(),
                "head_sha": proposal.head_sha, "digests": proposal.current_digests}, proposal_id, proposal.stacks)
            proposal = session.proposals.get(proposal_id)
    if reasons:
        raise Refused(reasons)
    return proposal


def abandon_proposal(ws: Records, actor: Principal, proposal_id: int, reason: str) -> Proposal:
    """Withdraw a proposal that will not be applied; its branch may then be proposed again."""
    reason = reason.strip()
    if not reason:
        raise InputError("say why the proposal is abandoned (-m)")
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        require(actor, Action.ABANDON, proposal)
        proposal.move(Transition.ABANDON, actor, {"reason": reason})
        session.proposals.save(proposal)
        return proposal


def replan_proposal(ws: Workspace, proposal: Proposal) -> None:
    """Plan every stack of the proposal afresh at its commit (merged onto main) and save the plans."""
    main_sha, plans = plan_merged(ws, proposal.stacks, proposal.head_sha, _origin(proposal, proposal.changed_paths))
    with ws.store.session() as session:
        record_plans(session, proposal.id, proposal.head_sha, main_sha, plans)


def _origin(proposal: Proposal, paths: Sequence[str]) -> ChangeOrigin:
    return ChangeOrigin(proposal.proposer.is_agent, proposal.requester.name, tuple(paths))


def stored_previews(ws: Configured, proposal: Proposal) -> dict[str, str]:
    """Each stack's masked preview as stored with its current plan, in the public JSON shape.

    Plans saved before previews were stored are rendered from their documents.
    """
    previews = {}
    with ws.store.session(readonly=True) as session:
        for stack, plan in proposal.plans.items():
            previews[stack] = saved_preview(ws.settings.db_url, plan.plan_id, plan.digest, plan.planned_at,
                                            functools.partial(session.proposals.plan_preview, plan.plan_id)) or \
                preview_to_json(build_preview(
                load_plan(json.loads(session.proposals.plan_document(plan.plan_id))), findings=plan.findings,
                risk=Risk(plan.risk, plan.risk_reasons)))
    return annotate_previews(ws, proposal, previews)


def proposal_previews(ws: Configured, proposal: Proposal) -> dict[str, Preview]:
    """The preview of each stack's current saved plan, with its policy findings and risk."""
    return {stack: preview_from_json(text) for stack, text in stored_previews(ws, proposal).items()}


_CLAIM_ISSUES: dict[tuple[str, str, tuple[int, ...]], list[str]] = {}  # saved plans never change


def claim_issues(ws: Configured, proposal: Proposal) -> list[str]:
    """Where the agent's summary disagrees with the engine's plans (remembered per database, claim and plans)."""
    if not proposal.agent_claim:
        return []
    plan_ids = tuple(p.plan_id for p in proposal.plans.values())
    key = (ws.settings.db_url, proposal.agent_claim, plan_ids)
    if key not in _CLAIM_ISSUES:
        with ws.store.session(readonly=True) as session:
            plans = [load_plan(json.loads(session.proposals.plan_document(plan_id))) for plan_id in plan_ids]
        if len(_CLAIM_ISSUES) >= 256:
            _CLAIM_ISSUES.clear()
        _CLAIM_ISSUES[key] = check_claim(proposal.agent_claim, plans, proposal.findings)
    return list(_CLAIM_ISSUES[key])


def get_proposal(ws: Records, proposal_id: int) -> Proposal:
    with ws.store.session(readonly=True) as session:
        return session.proposals.get(proposal_id)
