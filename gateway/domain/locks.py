"""Stack locks: one writer per stack (DESIGN rule 4), as values the services reason about.

A lock is held by a runner (`host:pid[/loop]`) while it applies, renewed by its heartbeat; by a
recoverer (`recovery:host:pid`) while it reads what a dead runner left; or, for an applied change
main could not take yet, by the proposal itself (`unmerged:N`), which never expires and only a
person's `gateway merge` releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

UNMERGED = "unmerged:"
RECOVERY = "recovery:"


def unmerged_holder(proposal_id: int) -> str:
    return f"{UNMERGED}{proposal_id}"


def recovery_holder(runner: str) -> str:
    return f"{RECOVERY}{runner}"


@dataclass(frozen=True)
class StackLock:
    stack: str
    holder: str
    acquired_at: datetime
    expires_at: datetime
    proposal_id: int | None = None  # the proposal whose apply (or unmerged change) holds it
    apply_id: int | None = None  # the stack's running apply record, once it started

    @property
    def kept_for_unmerged(self) -> bool:
        return self.holder.startswith(UNMERGED)

    def expired(self, moment: datetime) -> bool:
        return self.expires_at <= moment

    def describe(self) -> str:
        if self.kept_for_unmerged:
            return (f"stack {self.stack} is held by proposal {self.proposal_id}, which was applied but could not be "
                    f"merged into main; see `gateway show {self.proposal_id}` for what to do")
        return (f"stack {self.stack} is locked by runner {self.holder} (apply {self.apply_id or 'starting'}, "
                f"since {self.acquired_at})")


@dataclass(frozen=True)
class LockAttempt:
    """The answer to taking a lock: taken, or who holds it (perhaps a holder that stopped heart-beating)."""

    taken: bool
    holder: StackLock | None = None
