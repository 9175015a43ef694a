"""What runs underneath every use case: the time, the trail's signing key, what operators count."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class Signer(Protocol):
    """Signs the audit trail's checkpoints with a key kept outside the database."""

    def public_key(self) -> str:
        """The signing key's public half (base64), which every checkpoint it signs names."""
        ...

    def sign(self, message: bytes) -> str: ...

    def valid(self, public_key: str, message: bytes, signature: str) -> bool:
        """Whether `signature` is `public_key`'s over `message` (any key's, not only this signer's)."""
        ...


class Metrics(Protocol):
    """What services count for the people who run the gateway. Every label is from a closed set (kinds, outcomes,
    channels): never an id, a name or an address. The figures that must agree across processes (job ends, queue depth
    and age, drift, breakers, checkpoints, workers) are not counted here: they are read from the records when
    scraped."""

    def job_ran(self, kind: str, seconds: float) -> None:
        """A job this process ran ended after `seconds` (how many ended, by outcome, is read from the records)."""
        ...

    def job_retried(self, kind: str) -> None:
        """A job went back in the queue to be tried again (a transient failure, a worker that died or stopped)."""
        ...

    def lock_waited(self, seconds: float, taken: bool) -> None:
        """An apply waited `seconds` for a stack lock, and got it (`taken`) or gave up."""
        ...

    def lock_broken(self, count: int) -> None:
        """Locks of a runner that stopped heart-beating were taken over by recovery."""
        ...

    def webhook_received(self, event: str, outcome: str) -> None:
        """A delivery reached the webhook: accepted, duplicate or refused."""
        ...

    def webhook_handled(self, event: str, lag_seconds: float) -> None:
        """A delivery's outcome was recorded (a decision, a re-plan, a refusal), `lag_seconds` after it arrived."""
        ...

    def publish_finished(self, failed: bool, retry: bool) -> None:
        """A pull request was brought up to date (or failed to be); `retry` when the last attempt had failed."""
        ...

    def notification_delivered(self, channel: str, outcome: str) -> None:
        """A notification was sent on `channel` (e.g. email, slack, webhook): delivered, failed, retried..."""
        ...

    def audit_appended(self, count: int) -> None:
        """`count` events were committed to the trail."""
        ...


class NoMetrics:
    """The default: counts nothing, costs nothing (tests, the CLI's one-shot commands)."""

    def job_ran(self, kind: str, seconds: float) -> None:
        pass

    def job_retried(self, kind: str) -> None:
        pass

    def lock_waited(self, seconds: float, taken: bool) -> None:
        pass

    def lock_broken(self, count: int) -> None:
        pass

    def webhook_received(self, event: str, outcome: str) -> None:
        pass

    def webhook_handled(self, event: str, lag_seconds: float) -> None:
        pass

    def publish_finished(self, failed: bool, retry: bool) -> None:
        pass

    def notification_delivered(self, channel: str, outcome: str) -> None:
        pass

    def audit_appended(self, count: int) -> None:
        pass


NO_METRICS: Metrics = NoMetrics()
