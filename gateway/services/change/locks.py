"""The stack locks one runner holds, renewed by a heartbeat, and lost the moment they lapse.

A lock is only as good as its last renewal: when the heartbeat has not renewed it within its TTL
(the database did not answer, or answered that someone else holds it now), another runner may
have broken it and written to the stack. The holder then stops before its next engine step or its
merge (`check`) and records why; it never goes on as if it still held them (DESIGN rule 4).
"""

from __future__ import annotations

import os
import socket
import time

from gateway.domain.errors import LockLost
from gateway.domain.proposal import Proposal
from gateway.logs import get_logger
from gateway.ports import StackLocks
from gateway.services.change.heartbeat import Heartbeat
from gateway.services.workspace import MainRules

log = get_logger(__name__)

REPO_LOCK = "(repo)"  # held by proposals that change files outside their stacks: their merges may conflict


def runner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lock_names(ws: MainRules, proposal: Proposal) -> list[str]:
    """The locks an apply holds: its stacks, and the repo lock when it changes files outside them."""
    settings = ws.repo_settings()
    outside = [p for p in proposal.changed_paths
               if not any(p.startswith(settings.stacks[s].path.rstrip("/") + "/") for s in settings.stacks)]
    return sorted(proposal.stacks) + ([REPO_LOCK] if outside else [])


class HeldLocks:
    """The locks one holder holds, renewed by a heartbeat until released or handed over."""

    def __init__(self, locks: StackLocks, holder: str, ttl: float, names: list[str] | None = None):
        self.locks, self.holder, self.ttl = locks, holder, ttl
        self.names: list[str] = list(names or [])
        self.kept_as: str | None = None
        self.handed_over = False  # the locks were given away already (to an unmerged proposal): leave them
        self._taken_by_others: list[str] = []
        self._renewed_at = time.monotonic()  # the locks are valid for a TTL from the start of their last renewal
        self._lapsed = False  # a renewal landed after the TTL ran out: someone may have broken them meanwhile
        self._heartbeat = Heartbeat(f"locks-{holder}", max(0.05, self.ttl / 3), self._renew)

    def start(self) -> None:
        self._renewed_at = time.monotonic()
        self._heartbeat.start()

    def _renew(self) -> None:
        started = time.monotonic()
        taken = self.locks.renew(self.names, self.holder, self.ttl)
        if time.monotonic() - self._renewed_at >= self.ttl:
            self._lapsed = True  # renewed again, but only after they had expired: that gap cannot be undone
        self._renewed_at = started
        if taken:
            log.error("lock.lost", holder=self.holder, stacks=taken)
            self._taken_by_others = sorted(set(self._taken_by_others) | set(taken))

    def lost(self) -> list[str]:
        """The locks this holder can no longer count on: taken by someone else, or not renewed within the TTL."""
        if self._lapsed or time.monotonic() - self._renewed_at >= self.ttl:
            self._lapsed = True
            return list(self.names)
        return list(self._taken_by_others)

    def check(self, before: str) -> None:
        """Stop here, before `before`, unless every lock is still surely held."""
        lost = self.lost()
        if not lost:
            return
        if self._taken_by_others and not self._lapsed:
            why = "another holder has them now"
        else:
            why = (f"they were not renewed within their TTL of {self.ttl:g} s"
                   + (f" (the last renewal failed: {self._heartbeat.last_error})" if self._heartbeat.last_error
                      else " (the renewals did not get through)"))
        raise LockLost(f"the locks of {', '.join(lost)} were lost: {why}; stopped before {before}")

    def keep_as(self, holder: str) -> None:
        """Hand the locks to a holder that never expires (an applied, unmerged proposal) when they are released."""
        self.kept_as = holder

    def stop(self) -> None:
        self._heartbeat.stop()
        if self.handed_over:
            return
        for name in self.names:
            if self.kept_as:
                self.locks.hand_over(name, self.holder, self.kept_as)
            else:
                self.locks.release(name, self.holder)
