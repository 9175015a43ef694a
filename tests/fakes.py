"""In-memory fakes of the ports (cosmicpython's FakeRepository): each subclasses the Protocol it implements,
so a use case or a rule can be tested with no database, no git and no engine.

A fake is a real, small implementation — it keeps state and answers as the SQL adapter would — plus a
way to make the dependency fail the way production's does (a database that stops answering).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from gateway.domain.errors import BackendError
from gateway.domain.locks import LockAttempt, StackLock, unmerged_holder
from gateway.ports import Clock, StackLocks

NEVER = datetime(9999, 1, 1, tzinfo=UTC)


class FakeClock(Clock):
    def __init__(self, start: datetime | None = None):
        self.moment = start or datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


class FakeStackLocks(StackLocks):
    """Stack locks in a dict. `down()` makes every call fail as a database outage does; `slow()` makes them hang."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or FakeClock()
        self.rows: dict[str, StackLock] = {}
        self.renewals = 0
        self._down: str | None = None
        self._answering = threading.Event()
        self._answering.set()

    # what goes wrong underneath
    def down(self, why: str = "connection refused") -> None:
        self._down = why

    def slow(self) -> None:
        self._answering.clear()

    def up(self) -> None:
        self._down = None
        self._answering.set()

    def _call(self) -> None:
        self._answering.wait(30)
        if self._down:
            raise BackendError(f"database unavailable or busy: {self._down}")

    # the port
    def acquire(self, stack: str, holder: str, ttl_seconds: float, proposal_id: int | None = None) -> LockAttempt:
        self._call()
        if stack in self.rows:
            return LockAttempt(False, self.rows[stack])
        now = self.clock.now()
        self.rows[stack] = StackLock(stack, holder, now, now + timedelta(seconds=ttl_seconds), proposal_id)
        return LockAttempt(True)

    def set_apply(self, stack: str, holder: str, apply_id: int) -> None:
        self._call()
        lock = self.rows.get(stack)
        if lock and lock.holder == holder:
            self.rows[stack] = StackLock(lock.stack, holder, lock.acquired_at, lock.expires_at, lock.proposal_id,
                                         apply_id)

    def renew(self, stacks: Sequence[str], holder: str, ttl_seconds: float) -> list[str]:
        self._call()
        self.renewals += 1
        lost = []
        for stack in stacks:
            lock = self.rows.get(stack)
            if lock is None or lock.holder != holder:
                lost.append(stack)
                continue
            self.rows[stack] = StackLock(stack, holder, lock.acquired_at,
                                         self.clock.now() + timedelta(seconds=ttl_seconds), lock.proposal_id,
                                         lock.apply_id)
        return lost

    def hand_over(self, stack: str, holder: str, new_holder: str) -> bool:
        self._call()
        lock = self.rows.get(stack)
        if lock is None or lock.holder != holder:
            return False
        self.rows[stack] = StackLock(stack, new_holder, lock.acquired_at, NEVER, lock.proposal_id)
        return True

    def release(self, stack: str, holder: str) -> None:
        self._call()
        if stack in self.rows and self.rows[stack].holder == holder:
            del self.rows[stack]

    def holder(self, stack: str) -> StackLock | None:
        self._call()
        return self.rows.get(stack)

    def expired(self) -> list[StackLock]:
        self._call()
        return [lock for lock in self.rows.values() if lock.expired(self.clock.now())]

    def take_over_expired(self, holder: str, new_holder: str, ttl_seconds: float) -> list[StackLock]:
        self._call()
        taken = [lock for lock in self.rows.values() if lock.holder == holder and lock.expired(self.clock.now())]
        for lock in taken:
            self.rows[lock.stack] = StackLock(lock.stack, new_holder, self.clock.now(),
                                              self.clock.now() + timedelta(seconds=ttl_seconds), lock.proposal_id,
                                              lock.apply_id)
        return taken

    def keep_unmerged(self, stacks: Sequence[str], holder: str, proposal_id: int) -> list[str]:
        self._call()
        kept_by, others = unmerged_holder(proposal_id), []
        for stack in stacks:
            lock = self.rows.get(stack)
            if lock is None or lock.holder in (holder, kept_by):
                self.rows[stack] = StackLock(stack, kept_by, self.clock.now(), NEVER, proposal_id)
            else:
                others.append(stack)
        return others
