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
    proposals,
)
from gateway.domain.breaker import BreakerState, CapacityChange
from gateway.domain.repositories import DEFAULT_REPOSITORY


class SqlBreakerRecords(Records):
    """The circuit breaker: each agent change's capacity figures, and each breaker's state, of the unit of work's
    repository (an added repository's breakers are kept under `repo:` before their scope)."""

    def _scoped(self, scope: str) -> str:
        return scope if self.repository == DEFAULT_REPOSITORY else f"{self.repository}:{scope}"

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
        others = select(proposals.c.id).where(proposals.c.repository != self.repository)  # their breakers' own
        query = select(breaker_changes).where(breaker_changes.c.at >= since,
                                              breaker_changes.c.proposal_id.not_in(others)).order_by(breaker_changes.c.at)
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
        row = self.conn.execute(select(breaker_states).where(breaker_states.c.scope == self._scoped(scope))) \
            .mappings().first()
        return self._state(row) if row else None

    def states(self) -> list[BreakerState]:
        rows = self.conn.execute(select(breaker_states).order_by(breaker_states.c.scope)).mappings()
        return [self._state(r) for r in rows if self._mine(r["scope"])]

    def set(self, scope: str, is_open: bool, reason: str, by: str) -> None:
        scoped = self._scoped(scope)
        self.conn.execute(delete(breaker_states).where(breaker_states.c.scope == scoped))
        self.conn.execute(
            insert(breaker_states).values(scope=scoped, open=is_open, reason=reason, changed_by=by, changed_at=now())
        )

    def _mine(self, scope: str) -> bool:
        """Whether a stored scope is this repository's (the default's have no `repo:` before them)."""
        if self.repository == DEFAULT_REPOSITORY:
            return ":" not in scope
        return scope.startswith(f"{self.repository}:")

    def _state(self, row: RowMapping) -> BreakerState:
        scope = str(row["scope"]).split(":", 1)[-1] if self.repository != DEFAULT_REPOSITORY else row["scope"]
        return BreakerState(scope, row["open"], row["reason"], row["changed_by"], aware(row["changed_at"]))
