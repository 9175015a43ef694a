"""What an operator watches: the figures read from the records at scrape time, and the readiness verdict.

Pure values. Every label a metric carries comes from a closed set (job kinds and outcomes, the GitHub events the
gateway handles, the stacks of gateway.yaml), never from ids, names of people or addresses: a label that can grow
without bound would make the metrics themselves an outage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.domain.repositories import DEFAULT_REPOSITORY

# GitHub sends its event name in a header anyone can write: only these are labels, anything else is "other"
WEBHOOK_EVENTS = frozenset({"pull_request", "pull_request_review", "issue_comment", "push", "ping"})


def webhook_event_label(event: str) -> str:
    """The bounded label of a delivery's X-GitHub-Event."""
    return event if event in WEBHOOK_EVENTS else "other"


# The outcomes each counter is labelled with: their series exist at 0 from a process's start, so the first event is
# an increase (`increase()` and `rate()` see nothing in a series that appears with its first event already counted).
WEBHOOK_OUTCOMES = ("accepted", "duplicate", "refused")
LOCK_WAIT_OUTCOMES = ("taken", "gave_up")
NOTIFICATION_OUTCOMES = ("delivered", "failed", "retried")


@dataclass(frozen=True)
class QueueDepth:
    """Jobs of one kind in one unfinished status, and how long the oldest of them has waited (queued) or run."""

    kind: str
    status: str  # queued | running
    count: int
    oldest_seconds: float
    repository: str = DEFAULT_REPOSITORY  # the declaration repository the jobs work in


@dataclass(frozen=True)
class EndedJobs:
    """How many jobs of one kind ended with one outcome, ever: a job's end is never undone, so it only grows."""

    kind: str
    outcome: str  # succeeded | failed | refused | interrupted
    count: int


@dataclass(frozen=True)
class ServiceGauges:
    """The figures that must be right across every process, so they are read from the database when scraped."""

    queue: tuple[QueueDepth, ...] = ()
    ended: tuple[EndedJobs, ...] = ()  # counted where they are recorded: whichever process ran or settled them
    open_drift_by_stack: dict[str, int] = field(default_factory=dict)
    breakers_open: dict[str, int] = field(default_factory=dict)  # scope kind (all_agents | agent) -> how many open
    checkpoint_age_seconds: float | None = None  # the newest signed checkpoint of the trail (None: never signed)
    unsigned_seconds: float = 0.0  # how long the oldest event no signed checkpoint covers has waited (0: all signed)
    checkpoint_interval_seconds: float = 3600.0  # how often workers are configured to sign one
    terraform_timeout_seconds: float = 1800.0  # the longest one Terraform run may take (an apply's alert is near it)
    audit_events: int = 0  # the chain's length: every process's appends
    locks_expired: int = 0  # held by a runner that stopped heart-beating: recovery has not settled them yet
    workers_alive: int = 0  # workers registered, not stopped, whose last beat still counts
    repositories: tuple[str, ...] = (DEFAULT_REPOSITORY,)  # the registered ones still served: the label's values
    # proposals not yet applied or abandoned, by (repository, status): registered repositories only
    proposals: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadinessCheck:
    """One thing a ready process needs, and what is wrong with it (None: fine)."""

    name: str  # database | migrations | workspace | keys
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def failed_checks(checks: list[ReadinessCheck]) -> list[ReadinessCheck]:
    return [c for c in checks if not c.ok]
