"""Jobs: plans and applies as work a worker claims, heart-beats while it runs, and records the end of."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class JobKind(StrEnum):
    PLAN = "plan"  # re-plan a proposal whose branch, main or stack state moved
    APPLY = "apply"  # apply an approved proposal and merge it
    WEBHOOK = "webhook"  # handle one GitHub webhook delivery (args: delivery)
    PUBLISH = "publish"  # bring the proposal's pull request up to date: sticky comment, checks
    AGENT_TURN = "agent_turn"  # run one message of a person to the agent (args: run)
    NOTIFY = "notify"  # deliver one notification to its channel (args: notification)
    PLAN_STACK = "plan_stack"  # plan one stack of a plan round (args: round, stack, proposal)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the work ran and did not finish; the proposal's state says what is left
    REFUSED = "refused"  # a rule was not met; nothing was done
    INTERRUPTED = "interrupted"  # its worker stopped heart-beating; recorded by the next one


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.REFUSED, JobStatus.INTERRUPTED})


@dataclass(frozen=True)
class Job:
    id: int
    kind: JobKind
    proposal_id: int | None
    requested_by: str  # principal id
    status: JobStatus
    runner: str | None = None
    progress: tuple[str, ...] = ()
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    args: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0  # how many times a worker has started it (a retried webhook job more than once)
    run_after: datetime | None = None  # a retry waits until then

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass(frozen=True)
class RetryPolicy:
    """How long work that failed on a dependency's bad moment (GitHub down, rate-limited) keeps being retried:
    exponential backoff from `first_delay_seconds`, never waiting more than `max_delay_seconds` at a time, until
    `max_attempts` attempts or `max_age_seconds` since the job was queued, whichever comes first."""

    first_delay_seconds: float = 2.0
    max_delay_seconds: float = 300.0
    max_attempts: int = 20
    max_age_seconds: float = 3600.0

    def delay(self, attempt: int, asked: float | None = None) -> timedelta:
        """The wait after the `attempt`-th failed attempt (1 for the first); at least what the dependency `asked`
        for (a rate limit's reset), within the cap."""
        backoff = self.first_delay_seconds * 2 ** max(0, min(attempt - 1, 30))
        return timedelta(seconds=min(self.max_delay_seconds, max(backoff, asked or 0.0)))

    def gives_up(self, attempt: int, age: timedelta, wait: timedelta) -> bool:
        """Whether the `attempt`-th failure is the last: out of attempts, or the next one would come too late."""
        return attempt >= self.max_attempts or (age + wait).total_seconds() > self.max_age_seconds


PLANNED_FROM = "planned_from"  # in a failed plan job's result: the branch head and main head it planned from


@dataclass(frozen=True)
class PlanFailure:
    """A proposal's latest plan job failed on what it planned from: its branch head and main's head.

    The same inputs fail the same way (a branch that conflicts with main, a malformed declaration, an agent's change
    its open circuit breaker refuses), so the workers do not plan it again until one of the two moves, or a breaker
    is opened, tripped or reset; a person's `gateway sync` still does.
    """

    job_id: int
    error: str
    head_sha: str | None  # None: the branch was gone
    main_sha: str
    at: datetime | None = None  # when the job ended

    def holds(self, head_sha: str | None, main_sha: str, breakers_changed: datetime | None = None) -> bool:
        """Whether a plan now would start from the same inputs (and so fail the same way): the same heads, and no
        breaker changed since (`breakers_changed`: the newest change of any)."""
        moved = breakers_changed is not None and self.at is not None and breakers_changed > self.at
        return self.head_sha == head_sha and self.main_sha == main_sha and not moved

    def describe(self, proposal_id: int) -> str:
        """One sentence: why it cannot be planned, and what plans it again."""
        branch = f"its branch at {self.head_sha[:12]}" if self.head_sha else "its branch gone"
        return (f"cannot be planned: {self.error} (plan job {self.job_id}, {branch}, main at {self.main_sha[:12]}); "
                f"it is planned again when its branch or main moves, or now with `gateway sync {proposal_id}`")


def plan_failure(jobs: Sequence[Job]) -> PlanFailure | None:
    """How the latest finished plan job among `jobs` failed on its inputs (None: it did not, or there is none)."""
    finished = [j for j in jobs if j.kind == JobKind.PLAN and j.finished]
    if not finished:
        return None
    last = max(finished, key=lambda j: j.id)
    basis = last.result.get(PLANNED_FROM)
    ended = last.status in (JobStatus.FAILED, JobStatus.REFUSED)
    if not ended or not isinstance(basis, dict) or not basis.get("main_sha"):
        return None  # interrupted, or failed on something passing (a dependency down): planned again as before
    head = basis.get("head_sha")
    return PlanFailure(last.id, last.error or "failed", str(head) if head else None, str(basis["main_sha"]),
                       last.finished_at)
