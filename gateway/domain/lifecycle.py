"""A proposal's lifecycle: its states and the only transitions between them, written down once.

    state       transition          to          who takes it
    open        start_apply         applying    an apply job, once approvals, digests and serials hold
    open        abandon             abandoned   the requester, an approver or an admin, with a reason
    applying    finish              applied     the runner: every stack applied and the branch merged
    applying    fail                failed      the runner: an engine error or refusal part-way
    applying    interrupt           failed      the next runner: the last one stopped heart-beating
    applying    block_merge         unmerged    the runner: applied, but main cannot take the merge
    failed      start_apply         applying    a retry, when approvals, digests and serials still hold
    failed      replan              open        a new plan (a retry needs fresh approvals if it differs)
    failed      abandon             abandoned   as from open
    unmerged    merge               applied     a person, once main can take the merge again
    unmerged    acknowledge_merge   applied     a person who made main describe what runs by hand

Approved and rejected are not states: they are derived from the decisions bound to the current
commit and plans, so they go stale on their own. `applied` and `abandoned` are final (a rollback or
a retry is a new proposal); every other state has a way out that a person can take.
"""

from __future__ import annotations

from enum import StrEnum


class ProposalStatus(StrEnum):
    OPEN = "open"  # planned; waiting for decisions
    APPLYING = "applying"  # an apply job holds its stacks' locks
    APPLIED = "applied"  # applied and merged: main describes what runs
    FAILED = "failed"  # an apply failed or was interrupted; see its apply records
    UNMERGED = "unmerged"  # applied, but the merge into main failed: its stacks stay locked
    ABANDONED = "abandoned"  # withdrawn by a person; the branch may be proposed again


class Transition(StrEnum):
    START_APPLY = "start_apply"
    FINISH = "finish"
    FAIL = "fail"
    INTERRUPT = "interrupt"
    BLOCK_MERGE = "block_merge"
    REPLAN = "replan"
    MERGE = "merge"
    ACKNOWLEDGE_MERGE = "acknowledge_merge"
    ABANDON = "abandon"


S, T = ProposalStatus, Transition
TRANSITIONS: dict[tuple[ProposalStatus, Transition], ProposalStatus] = {
    (S.OPEN, T.START_APPLY): S.APPLYING,
    (S.OPEN, T.ABANDON): S.ABANDONED,
    (S.APPLYING, T.FINISH): S.APPLIED,
    (S.APPLYING, T.FAIL): S.FAILED,
    (S.APPLYING, T.INTERRUPT): S.FAILED,
    (S.APPLYING, T.BLOCK_MERGE): S.UNMERGED,
    (S.FAILED, T.START_APPLY): S.APPLYING,
    (S.FAILED, T.REPLAN): S.OPEN,
    (S.FAILED, T.ABANDON): S.ABANDONED,
    (S.UNMERGED, T.MERGE): S.APPLIED,
    (S.UNMERGED, T.ACKNOWLEDGE_MERGE): S.APPLIED,
}
del S, T

INITIAL = ProposalStatus.OPEN  # a proposal is born planned
FINAL = frozenset({ProposalStatus.APPLIED, ProposalStatus.ABANDONED})
ACTIVE = frozenset(ProposalStatus) - FINAL  # a branch has at most one active proposal
DECIDABLE = frozenset({ProposalStatus.OPEN, ProposalStatus.FAILED})  # decisions and overrides are taken


def next_status(status: ProposalStatus, transition: Transition) -> ProposalStatus | None:
    """Where `transition` leads from `status`, or None when it is not allowed there."""
    return TRANSITIONS.get((status, transition))


def ways_out(status: ProposalStatus) -> list[Transition]:
    """The transitions allowed from `status`, in table order."""
    return [t for (s, t) in TRANSITIONS if s == status]
