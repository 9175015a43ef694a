"""The declaration repositories the gateway serves."""

from __future__ import annotations

from sqlalchemy import RowMapping, insert, select, update

from gateway.adapters.store.rows import Records, aware, now
from gateway.adapters.store.schema import repositories
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.repositories import Repository


class SqlRepositories(Records):
    """The registry: one row a repository, kept when it is removed."""

    def add(self, name: str, by: str) -> Repository:
        if self.get(name) is not None:
            raise Conflict(f"repository {name} is already registered (`gateway repos list`); a removed repository's "
                           "name stays taken, so its trail never reads as another's")
        self.conn.execute(insert(repositories).values(name=name, added_at=now(), added_by=by))
        added = self.get(name)
        assert added is not None
        return added

    def get(self, name: str) -> Repository | None:
        row = self.conn.execute(select(repositories).where(repositories.c.name == name)).mappings().first()
        return None if row is None else _repository(row)

    def list(self) -> list[Repository]:
        return [_repository(r) for r in self.conn.execute(select(repositories).order_by(repositories.c.name)).mappings()]

    def remove(self, name: str, by: str) -> None:
        done = self.conn.execute(update(repositories).where(repositories.c.name == name,
                                                            repositories.c.removed_at.is_(None))
                                 .values(removed_at=now(), removed_by=by))
        if done.rowcount != 1:
            raise NotFound(f"no repository {name} to remove (`gateway repos list`)")


def _repository(row: RowMapping) -> Repository:
    removed = row["removed_at"]
    return Repository(row["name"], aware(row["added_at"]), row["added_by"],
                      aware(removed) if removed is not None else None, row["removed_by"])
