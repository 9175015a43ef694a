"""Drift records and break-glass windows."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update

from gateway.adapters.store.rows import (
    Records,
    as_drift_record,
    aware_row,
    now,
)
from gateway.adapters.store.schema import (
    break_glass_windows,
    drift_records,
)
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.drift import DriftRecord, DriftStatus, entries_to_json
from gateway.domain.errors import NotFound
from gateway.domain.preview import DriftEntry

# asked by every read of a proposal: built once (a statement built afresh costs more to execute than the query)
_OPEN_DRIFT = (
    select(drift_records)
    .where(drift_records.c.stack == bindparam("stack"), drift_records.c.status == DriftStatus.OPEN.value)
    .order_by(drift_records.c.id.desc())
)
_OPEN_DRIFT_ON = (
    select(drift_records)
    .where(drift_records.c.stack.in_(bindparam("stacks", expanding=True)),
           drift_records.c.status == DriftStatus.OPEN.value)
    .order_by(drift_records.c.id.desc())
)
WINDOWS = select(break_glass_windows).order_by(break_glass_windows.c.id.desc()).limit(500)
DRIFT_LISTED = 500  # the newest open drift records a list holds
OPEN_DRIFT_LISTED = (
    select(drift_records).where(drift_records.c.status == DriftStatus.OPEN.value)
    .order_by(drift_records.c.id.desc()).limit(DRIFT_LISTED)
)  # what `drift_records(only_open=True)` reads
_WINDOWS_OF_STACK = (
    select(break_glass_windows)
    .where(break_glass_windows.c.stack == bindparam("stack"))
    .order_by(break_glass_windows.c.id.desc())
    .limit(500)
)


class SqlDayTwoRecords(Records):
    """Drift records per stack and break-glass windows."""

    def open_drift_record(self, stack: str) -> DriftRecord | None:
        row = self.conn.execute(_OPEN_DRIFT, {"stack": stack}).mappings().first()
        return as_drift_record(row) if row else None

    def open_drift_records(self, stacks: Collection[str]) -> dict[str, DriftRecord]:
        if not stacks:
            return {}
        found: dict[str, DriftRecord] = {}
        ahead = self.ahead.rows("drift") if self.ahead else None
        if ahead is not None and len(ahead) < DRIFT_LISTED:  # every open record was read ahead, newest first
            rows: Iterable[Mapping[str, Any]] = [r for r in ahead if r["stack"] in stacks]
        else:
            rows = self.conn.execute(_OPEN_DRIFT_ON, {"stacks": sorted(set(stacks))}).mappings()
        for row in rows:
            found.setdefault(row["stack"], as_drift_record(row))  # newest first, as `open_drift_record` takes it
        return found

    def drift_records(self, stack: str | None = None, only_open: bool = False) -> list[DriftRecord]:
        ahead = self.ahead.rows("drift") if self.ahead and stack is None and only_open else None
        if ahead is not None:
            return [as_drift_record(r) for r in ahead]
        query = select(drift_records).order_by(drift_records.c.id.desc())
        if stack is not None:
            query = query.where(drift_records.c.stack == stack)
        if only_open:
            query = query.where(drift_records.c.status == DriftStatus.OPEN.value)
        return [as_drift_record(r) for r in self.conn.execute(query.limit(DRIFT_LISTED)).mappings()]

    def add_drift_record(
        self, stack: str, resources: Sequence[DriftEntry], expected: bool, break_glass_id: int | None
    ) -> int:
        moment = now()
        return int(
            self.conn.execute(
                insert(drift_records).values(
                    stack=stack,
                    status=DriftStatus.OPEN.value,
                    resources=entries_to_json(resources),
                    expected=expected,
                    break_glass_id=break_glass_id,
                    opened_at=moment,
                    updated_at=moment,
                )
            ).inserted_primary_key[0]
        )

    def update_drift_record(
        self, record_id: int, resources: Sequence[DriftEntry], expected: bool, break_glass_id: int | None
    ) -> None:
        self.conn.execute(
            update(drift_records)
            .where(drift_records.c.id == record_id)
            .values(
                resources=entries_to_json(resources), expected=expected, break_glass_id=break_glass_id, updated_at=now()
            )
        )

    def close_drift_record(self, record_id: int, by: str, reason: str, proposal_id: int | None) -> None:
        self.conn.execute(
            update(drift_records)
            .where(drift_records.c.id == record_id)
            .values(
                status=DriftStatus.CLOSED.value,
                closed_at=now(),
                closed_by=by,
                closed_reason=reason,
                closed_by_proposal=proposal_id,
            )
        )

    def add_break_glass(self, stack: str, reason: str, opened_by: str, duration_seconds: int, confirmed: bool) -> int:
        moment = now()
        values: dict[str, Any] = {
            "stack": stack,
            "reason": reason,
            "opened_by": opened_by,
            "requested_at": moment,
            "duration_seconds": duration_seconds,
        }
        if confirmed:
            values.update(opened_at=moment, ends_at=moment + timedelta(seconds=duration_seconds))
        return int(self.conn.execute(insert(break_glass_windows).values(**values)).inserted_primary_key[0])

    def break_glass(self, window_id: int) -> BreakGlassWindow:
        row = (
            self.conn.execute(select(break_glass_windows).where(break_glass_windows.c.id == window_id))
            .mappings()
            .first()
        )
        if row is None:
            raise NotFound(f"no break-glass window {window_id}")
        return _window(aware_row(row))

    def break_glass_windows(self, stack: str | None = None) -> list[BreakGlassWindow]:
        ahead = self.ahead.rows("window") if self.ahead and stack is None else None
        if ahead is not None:
            return [_window(aware_row(r)) for r in ahead]
        rows = self.conn.execute(WINDOWS) if stack is None else self.conn.execute(_WINDOWS_OF_STACK, {"stack": stack})
        return [_window(aware_row(r)) for r in rows.mappings()]

    def confirm_break_glass(self, window_id: int, by: str, opened_at: datetime, ends_at: datetime) -> None:
        """A second person confirmed the window: it opens now and ends at `ends_at`."""
        self._set_break_glass(window_id, confirmed_by=by, opened_at=opened_at, ends_at=ends_at)

    def close_break_glass(self, window_id: int, at: datetime) -> None:
        self._set_break_glass(window_id, closed_at=at)

    def acknowledge_break_glass(self, window_id: int, by: str, at: datetime, note: str) -> None:
        self._set_break_glass(window_id, acknowledged_by=by, acknowledged_at=at, acknowledgement=note)

    def _set_break_glass(self, window_id: int, **values: Any) -> None:
        self.conn.execute(update(break_glass_windows).where(break_glass_windows.c.id == window_id).values(**values))

    def mark_break_glass(self, window_id: int, column: str, moment: datetime) -> bool:
        """Set `column` (settled: codified_at, overdue: flagged_at) once: False when another worker already did,
        or the window was settled or acknowledged meanwhile."""
        c = break_glass_windows.c
        done = self.conn.execute(
            update(break_glass_windows)
            .where(c.id == window_id, c[column].is_(None), c.codified_at.is_(None), c.acknowledged_at.is_(None))
            .values({column: moment})
        )
        return done.rowcount == 1


def _window(row: Mapping[str, Any]) -> BreakGlassWindow:
    return BreakGlassWindow(row["id"], row["stack"], row["reason"], row["opened_by"], row["requested_at"],
                            timedelta(seconds=row["duration_seconds"]), row["confirmed_by"], row["opened_at"],
                            row["ends_at"], row["closed_at"], row["codified_at"], row["flagged_at"],
                            row["acknowledged_by"], row["acknowledged_at"], row["acknowledgement"])
