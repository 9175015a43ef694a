"""Jobs: plans and applies as work a worker claims, heart-beats while it runs, and records the end of."""

from __future__ import annotations

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
