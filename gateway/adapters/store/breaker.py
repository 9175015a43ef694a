"""The circuit breaker's records."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import RowMapping, delete, insert, select

from gateway.adapters.store.rows import (
    Records,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    breaker_changes,
    breaker_states,
)
from gateway.domain.breaker import BreakerState, CapacityChange


class SqlBreakerRecords(Records):
    """The circuit breaker: each agent change's capacity figures, and each breaker's state."""

    def record_change(self, change: CapacityChange) -> None:
        """A proposal's latest capacity figures, at the time of its latest plans (a re-plan replaces the earlier)."""
        self.conn.execute(delete(breaker_changes).where(breaker_changes.c.proposal_id == change.proposal_id))
        self.conn.execute(
            insert(breaker_changes).values(
                proposal_id=change.proposal_id,
                principal_id=change.principal_id,
                before=dict(change.before),
                added=change.added,
                destroyed=change.destroyed,
                at=change.at,
            )
        )

    def changes(self, principal_id: str | None, since: datetime) -> list[CapacityChange]:
        """Agent changes since `since`, oldest first: one agent's, or every agent's (None)."""
        query = select(breaker_changes).where(breaker_changes.c.at >= since).order_by(breaker_changes.c.at)
        if principal_id is not None:
            query = query.where(breaker_changes.c.principal_id == principal_id)
        return [
            CapacityChange(
                r["proposal_id"],
                r["principal_id"],
                dict(r["before"]),
                float(r["added"]),
                int(r["destroyed"]),
                aware(r["at"]),
            )
            for r in self.conn.execute(query).mappings()
        ]

    def state(self, scope: str) -> BreakerState | None:
        row = self.conn.execute(select(breaker_states).where(breaker_states.c.scope == scope)).mappings().first()
        return _state(row) if row else None

    def states(self) -> list[BreakerState]:
        return [_state(r) for r in self.conn.execute(select(breaker_states).order_by(breaker_states.c.scope)).mappings()]

    def set(self, scope: str, is_open: bool, reason: str, by: str) -> None:
        self.conn.execute(delete(breaker_states).where(breaker_states.c.scope == scope))
        self.conn.execute(
            insert(breaker_states).values(scope=scope, open=is_open, reason=reason, changed_by=by, changed_at=now())
        )


def _state(row: RowMapping) -> BreakerState:
    return BreakerState(row["scope"], row["open"], row["reason"], row["changed_by"], aware(row["changed_at"]))
