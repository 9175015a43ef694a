"""What a trail event tells whom: the notice (a masked summary and a link) and the groups it concerns.

Read from the records as they are when the outbox reads the event: an approval is wanted only if the plan still
waits for approvers then. Every text is a count, a name, an address, or a person's words with every known secret
cut out; never a value from a plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gateway.domain.approvals import approval_shortfall, approver_groups, policy_blocks
from gateway.domain.audit import AuditEvent
from gateway.domain.notifications import (
    TRAIL_KINDS,
    Notice,
    NotificationEvent,
    first_line,
    groups_of_stacks,
    plan_subject,
    summary_counts,
)
from gateway.domain.proposal import Proposal, ProposalStatus
from gateway.domain.repo_settings import RepoSettings
from gateway.ports import UnitOfWork

E = NotificationEvent


@dataclass(frozen=True)
class Told:
    """One thing to tell: `subject` is what happened once (a trail event, a set of plans), for the dedupe key."""

    subject: str
    notice: Notice
    groups: frozenset[str]


@dataclass(frozen=True)
class NoticeContext:
    session: UnitOfWork
    settings: RepoSettings  # main's gateway.yaml
    public_url: str
    scrub: Callable[[str], str]
    now: datetime

    def link(self, path: str) -> str:
        return f"{self.public_url.rstrip('/')}{path}"


def notices_for(context: NoticeContext, event: AuditEvent) -> list[Told]:
    """What `event` tells (nothing for most events)."""
    kind = TRAIL_KINDS.get(event.kind)
    if kind is None:
        return []
    if kind in (E.DRIFT_FOUND, E.BREAK_GLASS_OVERDUE, E.BREAKER_TRIPPED):
        told = _DAY_TWO[kind](context, event)
        return [told] if told else []
    if event.proposal_id is None:
        return []
    proposal = context.session.proposals.get(event.proposal_id)
    told = _approval_wanted(context, proposal) if kind == E.APPROVAL_WANTED else \
        _proposal_notice(context, event, proposal, kind)
    return [told] if told else []


def _approval_wanted(context: NoticeContext, proposal: Proposal) -> Told | None:
    if proposal.status != ProposalStatus.OPEN or proposal.current_rejection is not None or not proposal.plans:
        return None
    shortfall = approval_shortfall(proposal, context.settings)
    if not shortfall:
        return None  # approved already, or a revert of drift the gateway applies alone
    subject = plan_subject(proposal.id, proposal.head_sha, proposal.current_digests)
    title = f"Approval wanted: proposal {proposal.id}, {first_line(proposal.reason, 100)}"
    approvers = ", ".join(sorted(_proposal_groups(context, proposal))) or "none configured"
    facts = (*_proposal_facts(proposal), ("Needs", shortfall[0]), ("Approvers", f"groups {approvers}"),
             *(("Policy", first_line(block, 300)) for block in policy_blocks(proposal, context.now)[:3]))
    return _told(context, subject, E.APPROVAL_WANTED, title, facts, proposal)


def _proposal_notice(context: NoticeContext, event: AuditEvent, proposal: Proposal,
                     kind: NotificationEvent) -> Told | None:
    p = event.payload
    what = f"proposal {proposal.id}, {first_line(proposal.reason, 100)}"
    extra: tuple[tuple[str, str], ...]
    if kind == E.REJECTED:
        title, extra = f"Rejected by {event.actor}: {what}", (("Reason", first_line(str(p.get("comment", "")), 300)),)
    elif kind == E.APPLIED:
        how = "merged by hand, acknowledged" if event.kind == "proposal.acknowledge_merge" else "merged"
        title = f"Applied and {how}: {what}"
        extra = (("Merge", str(p["merge_sha"])[:12]),) if p.get("merge_sha") else (("Note", first_line(str(p.get("note", "")), 300)),)
    elif kind == E.APPLY_FAILED:
        why = p.get("error") or p.get("reason") or "interrupted"
        title = f"Apply failed: {what}"
        extra = ((("Stack", str(p["stack"])),) if p.get("stack") else ()) + (("Error", first_line(str(why), 300)),)
    else:  # unmerged
        title = f"Applied but not merged, its stacks stay locked: {what}"
        extra = (("Why", first_line(str(p.get("reason", "")), 300)),)
    return _told(context, f"trail-{event.seq}", kind, title, (*_proposal_facts(proposal), *extra), proposal)


def _proposal_facts(proposal: Proposal) -> tuple[tuple[str, str], ...]:
    who = proposal.requester.name if proposal.proposer.id == proposal.requester.id else \
        f"{proposal.proposer.name} for {proposal.requester.name}"
    return (("Proposal", f"#{proposal.id} {first_line(proposal.reason, 100)}"), ("Requested by", who),
            *((f"Stack {stack}", f"{summary_counts(plan.counts)}; risk {plan.risk.value}")
              for stack, plan in proposal.plans.items()))


def _proposal_groups(context: NoticeContext, proposal: Proposal) -> frozenset[str]:
    return approver_groups(proposal, context.settings).groups()


def _stack_groups(context: NoticeContext, stacks: tuple[str, ...] | list[str]) -> frozenset[str]:
    return groups_of_stacks({name: s.approver_groups for name, s in context.settings.stacks.items()}, stacks)


def _told(context: NoticeContext, subject: str, kind: NotificationEvent, title: str,
          facts: tuple[tuple[str, str], ...], proposal: Proposal) -> Told:
    notice = Notice(kind, context.scrub(title), tuple((label, context.scrub(value)) for label, value in facts),
                    context.link(f"/proposals/{proposal.id}"), proposal.id, proposal.stacks)
    return Told(subject, notice, _proposal_groups(context, proposal))


def _drift_found(context: NoticeContext, event: AuditEvent) -> Told | None:
    p = event.payload
    stack = str(p.get("stack", ""))
    drifted = sorted(p.get("drifted") or {})
    expected = f"expected: found during break-glass window {p['break_glass']}" if p.get("expected") else \
        "unexpected: changed outside the gateway"
    facts = (("Stack", stack), ("Resources", f"{len(drifted)}: {', '.join(drifted[:10])}"
                                + (" …" if len(drifted) > 10 else "")), ("Drift", expected),
             ("Record", str(p.get("record"))))
    title = f"Drift found on stack {stack}: {len(drifted)} resource(s) differ from main"
    return _day_two_told(context, event, E.DRIFT_FOUND, title, facts, "/drift", _stack_groups(context, [stack]))


def _break_glass_overdue(context: NoticeContext, event: AuditEvent) -> Told | None:
    p = event.payload
    stack = str(p.get("stack", ""))
    drifted = [str(a) for a in p.get("drifted") or ()]
    facts = (("Stack", stack), ("Window", str(p.get("break_glass"))), ("Codify by", str(p.get("codify_by"))),
             ("Not codified", ", ".join(drifted[:10]) + (" …" if len(drifted) > 10 else "")))
    title = (f"Break-glass window {p.get('break_glass')} on stack {stack} is overdue: its drift was not codified; "
             "applies there wait until someone acknowledges it")
    groups = _stack_groups(context, [stack]) | context.settings.break_glass.groups
    return _day_two_told(context, event, E.BREAK_GLASS_OVERDUE, title, facts, "/drift", groups)


def _breaker_tripped(context: NoticeContext, event: AuditEvent) -> Told | None:
    p = event.payload
    facts = (("Agent", str(p.get("agent"))), ("Why", first_line(str(p.get("reason", "")), 300)),
             *((("Proposal", f"#{p['proposal']}"),) if p.get("proposal") else ()))
    title = f"Circuit breaker tripped for {p.get('agent')}: agent changes are stopped until a resetter resets it"
    groups = context.settings.breaker.resetters
    if p.get("proposal"):
        groups |= _stack_groups(context, context.session.proposals.get(int(p["proposal"])).stacks)
    path = f"/proposals/{p['proposal']}" if p.get("proposal") else "/"
    return _day_two_told(context, event, E.BREAKER_TRIPPED, title, facts, path, groups)


def _day_two_told(context: NoticeContext, event: AuditEvent, kind: NotificationEvent, title: str,
                  facts: tuple[tuple[str, str], ...], path: str, groups: frozenset[str]) -> Told:
    notice = Notice(kind, context.scrub(title), tuple((label, context.scrub(value)) for label, value in facts),
                    context.link(path), event.proposal_id, tuple(event.stacks))
    return Told(f"trail-{event.seq}", notice, groups)


_DAY_TWO = {E.DRIFT_FOUND: _drift_found, E.BREAK_GLASS_OVERDUE: _break_glass_overdue,
            E.BREAKER_TRIPPED: _breaker_tripped}
