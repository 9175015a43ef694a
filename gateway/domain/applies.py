"""Applies: each stack's apply record, and how an apply whose runner stopped is settled.

A runner can stop anywhere: after taking its locks, after the proposal started applying, inside
an engine's apply, between stacks, before or after the merge. Whoever finds its locks expired
reads what really happened on each stack (the apply record, the engine's state serial, and a
plan of the applied commit against the state as it is now) and settles the proposal here, in
one of the states that has a way out:

    what the stacks hold                         merged?   settles as   way out
    nothing applied anywhere                     -         failed       retry: the plans and approvals still hold
    some stacks applied, some not (or part-way)  -         failed       retry re-plans; the trail names what was done
    every stack applied                          no        unmerged     `gateway merge N` (or merge by hand, acknowledge)
    every stack applied                          yes       applied      nothing left to do
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gateway.domain.lifecycle import Transition


class ApplyStatus(StrEnum):
    """One stack's apply record."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # its runner stopped; what it did is in the record's error


@dataclass(frozen=True)
class ApplyRecord:
    """One stack's apply of one plan, by one runner."""

    id: int
    proposal_id: int
    stack: str
    plan_id: int
    status: ApplyStatus
    runner: str
    applied: tuple[str, ...]  # the addresses the engine changed, in order
    error: str | None
    commit_sha: str
    started_at: datetime
    finished_at: datetime | None


class StackResult(StrEnum):
    """What a stack holds of the approved plan, as read after its runner stopped."""

    NOT_STARTED = "not started"  # the state is where the plan found it
    APPLIED = "applied"  # the state holds the whole plan: a new plan of the applied commit changes nothing
    PARTLY = "partly applied"  # the state moved, and a new plan still has changes (or could not be made)


@dataclass(frozen=True)
class StackReading:
    stack: str
    result: StackResult
    detail: str = ""  # what was read: serials, the changes a new plan still has, or why it could not be read

    def describe(self) -> str:
        return f"stack {self.stack}: {self.result.value}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Settlement:
    """How an interrupted apply ends: the transition to take and the words that say what happened."""

    transition: Transition
    reason: str
    keep_locks: bool  # an applied, unmerged change keeps its stacks locked until a person merges it
    merge_sha: str | None = None  # when the dead runner had merged already


def settle_interrupted_apply(proposal_id: int, runner: str, readings: Sequence[StackReading],
                             merge_sha: str | None) -> Settlement:
    """Decide how an apply whose runner stopped ends, from what each of its stacks really holds."""
    stopped = f"runner {runner} stopped before recording the end of its apply"
    done = "; ".join(r.describe() for r in readings) or "it had not started on any stack"
    if readings and all(r.result is StackResult.APPLIED for r in readings):
        if merge_sha:
            return Settlement(Transition.FINISH, f"{stopped}, after applying every stack and merging as "
                              f"{merge_sha[:12]}: recorded as applied", keep_locks=False, merge_sha=merge_sha)
        return Settlement(Transition.BLOCK_MERGE, (
            f"{stopped}: every stack was applied ({done}), but the branch was not merged into main. Its stacks "
            f"stay locked. Run `gateway merge {proposal_id}` to merge exactly what was applied, or merge by hand "
            f"and run `gateway merge {proposal_id} --acknowledge -m \"how\"`"), keep_locks=True)
    if any(r.result is not StackResult.NOT_STARTED for r in readings):
        return Settlement(Transition.INTERRUPT, (
            f"{stopped}, part-way: {done}. Nothing was merged. `gateway apply {proposal_id}` re-plans what is "
            f"left (the new plan needs approval), or abandon it"), keep_locks=False)
    return Settlement(Transition.INTERRUPT, (
        f"{stopped}; nothing was applied ({done}). `gateway apply {proposal_id}` retries with the same plans and "
        "approvals"), keep_locks=False)
