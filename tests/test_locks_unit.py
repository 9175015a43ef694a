"""The rules of holding a stack lock and settling a dead runner's apply, on in-memory fakes: no database, no git.

End-to-end counterparts on both databases: tests/test_lock_lapse.py and tests/test_fault_points.py.
"""

from __future__ import annotations

import time

import pytest

from gateway.domain.applies import StackReading, StackResult, settle_interrupted_apply
from gateway.domain.errors import LockLost
from gateway.domain.lifecycle import Transition
from gateway.services.change.locks import HeldLocks

from .fakes import FakeStackLocks

TTL = 0.3


def _held(locks: FakeStackLocks, *stacks: str) -> HeldLocks:
    held = HeldLocks(locks, "runner-a", TTL)
    held.start()
    for stack in stacks:
        assert locks.acquire(stack, "runner-a", TTL).taken
        held.names.append(stack)
    return held


def test_locks_renewed_by_their_heartbeat_stay_held() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-prod", "app-staging")
    try:
        time.sleep(TTL * 3)
        held.check("the merge")
        assert held.lost() == [] and locks.renewals >= 3
    finally:
        held.stop()
    assert locks.rows == {}  # released at the end


def test_a_database_outage_longer_than_the_ttl_loses_the_locks_and_says_why() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-staging")
    try:
        locks.down("connection refused")
        time.sleep(TTL * 1.5)
        with pytest.raises(LockLost) as lost:
            held.check("the merge")
        locks.up()
        time.sleep(TTL)  # renewals get through again: the gap cannot be undone
        with pytest.raises(LockLost):
            held.check("the merge")
    finally:
        held.stop()
    assert "the locks of app-staging were lost" in str(lost.value)
    assert "not renewed within their TTL" in str(lost.value)
    assert "BackendError: database unavailable or busy: connection refused" in str(lost.value)
    assert "stopped before the merge" in str(lost.value)


def test_a_short_outage_within_the_ttl_keeps_the_locks() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-staging")
    try:
        locks.down()
        time.sleep(TTL * 0.2)
        locks.up()
        time.sleep(TTL * 0.5)
        held.check("the merge")
    finally:
        held.stop()


def test_a_renewal_that_hangs_past_the_ttl_loses_the_locks_even_once_it_answers() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-staging")
    try:
        locks.slow()
        time.sleep(TTL * 1.6)
        locks.up()
        time.sleep(TTL * 0.5)
        with pytest.raises(LockLost, match="not renewed within their TTL"):
            held.check("applying stack app-staging")
    finally:
        held.stop()


def test_a_lock_another_holder_took_is_lost() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-staging")
    try:
        locks.release("app-staging", "runner-a")
        assert locks.acquire("app-staging", "runner-b", 60).taken
        time.sleep(TTL * 0.7)
        with pytest.raises(LockLost, match="another holder has them now"):
            held.check("the merge")
    finally:
        held.stop()
    assert locks.rows["app-staging"].holder == "runner-b"  # never released by the one that lost it


def test_an_unmerged_change_keeps_its_locks_when_the_runner_stops() -> None:
    locks = FakeStackLocks()
    held = _held(locks, "app-staging")
    held.keep_as("unmerged:7")
    held.stop()
    assert locks.rows["app-staging"].kept_for_unmerged


A, N, P = StackResult.APPLIED, StackResult.NOT_STARTED, StackResult.PARTLY


@pytest.mark.parametrize(("results", "merged", "transition", "words"), [
    ([N], None, Transition.INTERRUPT, "nothing was applied"),
    ([N, N], None, Transition.INTERRUPT, "retries with the same plans and approvals"),
    ([A, N], None, Transition.INTERRUPT, "part-way"),
    ([P], None, Transition.INTERRUPT, "part-way"),
    ([A, P], None, Transition.INTERRUPT, "re-plans what is left"),
    ([A], None, Transition.BLOCK_MERGE, "every stack was applied"),
    ([A, A], None, Transition.BLOCK_MERGE, "gateway merge 7"),
    ([A], "c0ffee" * 6 + "ab12", Transition.FINISH, "recorded as applied"),
])
def test_an_interrupted_apply_settles_by_what_its_stacks_hold(results: list[StackResult], merged: str | None,
                                                              transition: Transition, words: str) -> None:
    readings = [StackReading(f"stack-{i}", result, "read") for i, result in enumerate(results)]
    settlement = settle_interrupted_apply(7, "host:42", readings, merged)
    assert settlement.transition is transition
    assert words in settlement.reason
    assert "runner host:42 stopped" in settlement.reason
    assert settlement.keep_locks is (transition is Transition.BLOCK_MERGE)
    assert settlement.merge_sha == merged
