"""Stack locks in SQL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.store.rows import (
    NEVER,
    as_stack_lock,
    now,
)
from gateway.adapters.store.schema import (
    Database,
    stack_locks,
)
from gateway.domain.locks import LockAttempt, StackLock, unmerged_holder


class SqlStackLocks:
    """Stack locks, committed on their own: other processes must see them while an apply runs."""

    def __init__(self, db: Database):
        self.db = db

    def acquire(self, stack: str, holder: str, ttl_seconds: float, proposal_id: int | None = None) -> LockAttempt:
        """Take the stack's lock if nobody holds it; otherwise say who does (an expired holder is not broken here:
        its apply must be settled first, see services/change/recovery.py)."""
        with self.db.transaction() as conn:
            row = conn.execute(select(stack_locks).where(stack_locks.c.stack == stack)).mappings().first()
            if row is not None:
                return LockAttempt(False, as_stack_lock(row))
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(stack_locks).values(
                            stack=stack,
                            holder=holder,
                            proposal_id=proposal_id,
                            acquired_at=now(),
                            expires_at=now() + timedelta(seconds=ttl_seconds),
                        )
                    )
            except IntegrityError:  # another runner inserted it first
                return LockAttempt(False, None)
        return LockAttempt(True)

    def set_apply(self, stack: str, holder: str, apply_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                update(stack_locks)
                .where(stack_locks.c.stack == stack, stack_locks.c.holder == holder)
                .values(apply_id=apply_id)
            )

    def renew(self, stacks: Sequence[str], holder: str, ttl_seconds: float) -> list[str]:
        """The heartbeat: push the expiry of `holder`'s locks forward. Returns the ones it no longer holds."""
        lost = []
        with self.db.transaction() as conn:
            for stack in stacks:
                renewed = conn.execute(
                    update(stack_locks)
                    .where(stack_locks.c.stack == stack, stack_locks.c.holder == holder)
                    .values(expires_at=now() + timedelta(seconds=ttl_seconds))
                )
                if renewed.rowcount != 1:
                    lost.append(stack)
        return lost

    def hand_over(self, stack: str, holder: str, new_holder: str) -> bool:
        """Give a lock to a holder that never expires; only a person's action releases it. False if not held."""
        with self.db.transaction() as conn:
            moved = conn.execute(
                update(stack_locks)
                .where(stack_locks.c.stack == stack, stack_locks.c.holder == holder)
                .values(holder=new_holder, apply_id=None, expires_at=NEVER)
            )
        return moved.rowcount == 1

    def release(self, stack: str, holder: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(stack_locks).where(stack_locks.c.stack == stack, stack_locks.c.holder == holder))

    def holder(self, stack: str) -> StackLock | None:
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(select(stack_locks).where(stack_locks.c.stack == stack)).mappings().first()
        return as_stack_lock(row) if row else None

    def expired(self) -> list[StackLock]:
        """Locks whose holder stopped heart-beating (kept locks of unmerged proposals never expire)."""
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(select(stack_locks).where(stack_locks.c.expires_at < now())).mappings()
            return [as_stack_lock(r) for r in rows]

    def take_over_expired(self, holder: str, new_holder: str, ttl_seconds: float) -> list[StackLock]:
        """Move every expired lock of `holder` to `new_holder` at once; the locks as the dead holder left them.

        Whoever gets them settles the dead holder's apply; a second recoverer racing for them gets none.
        """
        with self.db.transaction() as conn:
            rows = (
                conn.execute(
                    select(stack_locks)
                    .where(stack_locks.c.holder == holder, stack_locks.c.expires_at < now())
                    .order_by(stack_locks.c.stack)
                    .with_for_update()
                )
                .mappings()
                .all()
            )
            taken = [as_stack_lock(r) for r in rows]
            if taken:
                conn.execute(
                    update(stack_locks)
                    .where(stack_locks.c.holder == holder, stack_locks.c.stack.in_([lock.stack for lock in taken]))
                    .values(holder=new_holder, acquired_at=now(), expires_at=now() + timedelta(seconds=ttl_seconds))
                )
        return taken

    def keep_unmerged(self, stacks: Sequence[str], holder: str, proposal_id: int) -> list[str]:
        """Hand `holder`'s locks (expired or not) to the unmerged proposal, taking free ones too; the ones held
        by someone else, which the proposal could not keep."""
        kept_by = unmerged_holder(proposal_id)
        others = []
        with self.db.transaction() as conn:
            for stack in stacks:
                row = (
                    conn.execute(select(stack_locks).where(stack_locks.c.stack == stack).with_for_update())
                    .mappings()
                    .first()
                )
                if row is None:
                    conn.execute(
                        insert(stack_locks).values(
                            stack=stack, holder=kept_by, proposal_id=proposal_id, acquired_at=now(), expires_at=NEVER
                        )
                    )
                elif row["holder"] in (holder, kept_by):
                    conn.execute(
                        update(stack_locks)
                        .where(stack_locks.c.stack == stack)
                        .values(holder=kept_by, proposal_id=proposal_id, apply_id=None, expires_at=NEVER)
                    )
                else:
                    others.append(stack)
        return others
