"""Main as the gateway saw it, and pushes made outside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, update

from gateway.adapters.store.rows import (
    Records,
    now,
)
from gateway.adapters.store.schema import (
    main_pushes,
    markers,
)
from gateway.domain.apply_blockers import MainPush
from gateway.domain.repositories import stack_prefix

# asked by every read of a proposal and every page: built once
MARKER = select(markers.c.value).where(markers.c.name == bindparam("name"))
UNACKNOWLEDGED = (
    select(main_pushes).where(main_pushes.c.repository == bindparam("repository"),
                              main_pushes.c.acknowledged_at.is_(None)).order_by(main_pushes.c.detected_at)
)


class SqlMainRecords(Records):
    """What the gateway last saw of main, and the pushes made to it outside the gateway: the unit of work's
    repository's (an added repository's markers are kept under `repo/` before their names)."""

    def _named(self, name: str) -> str:
        return stack_prefix(self.repository) + name

    def marker(self, name: str) -> str | None:
        name = self._named(name)
        ahead = self.ahead.rows("marker", name) if self.ahead else None
        if ahead is not None:
            return ahead[0]["value"] if ahead else None
        return self.conn.scalar(MARKER, {"name": name})

    def set_marker(self, name: str, value: str) -> None:
        """One upsert: two workers setting the same marker at once (both saw main move) both succeed, the later
        value kept (a delete then an insert let the second fail on the first's row, under READ COMMITTED)."""
        statement = self._insert_marker(self._named(name), value)
        self.conn.execute(statement.on_conflict_do_update(index_elements=["name"], set_={"value": value}))

    def swap_marker(self, name: str, expected: str | None, value: str) -> bool:
        """Set the marker to `value` only if it still holds `expected` (None: absent); False when another
        worker changed it first. A compare-and-set: of workers racing for the same claim, one wins."""
        name = self._named(name)
        if expected is not None:
            done = self.conn.execute(
                update(markers).where(markers.c.name == name, markers.c.value == expected).values(value=value)
            )
            return done.rowcount == 1
        created = self.conn.execute(
            self._insert_marker(name, value).on_conflict_do_nothing(index_elements=["name"]).returning(markers.c.name)
        )  # psycopg reports no rowcount for ON CONFLICT DO NOTHING: the returned row says whether it was inserted
        return created.first() is not None

    def _insert_marker(self, name: str, value: str) -> Any:
        """The dialect's INSERT of a marker, which can say what to do on a conflict (imported when used)."""
        if self.conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        return insert(markers).values(name=name, value=value)

    def add_push(self, sha: str, stacks: Sequence[str], paths: Sequence[str], author: str) -> bool:
        if self.conn.scalar(select(main_pushes.c.sha).where(main_pushes.c.sha == sha)) is not None:
            return False
        self.conn.execute(
            insert(main_pushes).values(
                sha=sha, stacks=list(stacks), paths=list(paths)[:500], author=author[:200], detected_at=now(),
                repository=self.repository,
            )
        )
        return True

    def unacknowledged_pushes(self) -> list[MainPush]:
        ahead = self.ahead.rows("push") if self.ahead else None
        rows = ahead if ahead is not None else \
            self.conn.execute(UNACKNOWLEDGED, {"repository": self.repository}).mappings()
        return [_push(r) for r in rows]

    def acknowledge_push(self, sha: str, by: str, reason: str) -> MainPush | None:
        row = (
            self.conn.execute(
                select(main_pushes).where(
                    main_pushes.c.repository == self.repository,
                    main_pushes.c.sha.startswith(sha, autoescape=True), main_pushes.c.acknowledged_at.is_(None)
                )
            )
            .mappings()
            .all()
        )
        if len(row) != 1:
            return None
        self.conn.execute(
            update(main_pushes)
            .where(main_pushes.c.sha == row[0]["sha"])
            .values(acknowledged_by=by, acknowledged_at=now(), reason=reason)
        )
        return _push(row[0])


def _push(row: Mapping[str, Any]) -> MainPush:
    return MainPush(row["sha"], row["author"], frozenset(row["stacks"]))
