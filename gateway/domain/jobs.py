"""Jobs: plans and applies as work a worker claims, heart-beats while it runs, and records the end of."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobKind(StrEnum):
    PLAN = "plan"  # re-plan a proposal whose branch, main or stack state moved
    APPLY = "apply"  # apply an approved proposal and merge it
    WEBHOOK = "webhook"  # handle one GitHub webhook delivery (args: delivery)
    PUBLISH = "publish"  # bring the proposal's pull request up to date: sticky comment, checks
    AGENT_TURN = "agent_turn"  # run one message of a person to the agent (args: run)


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

    @property
    def finished(self) -> bool:
        return self.status in FINISHED
