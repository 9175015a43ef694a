"""What workers read of each stack's state, kept for reads (which never ask an engine or a cloud)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select

from gateway.adapters.store.rows import Records
from gateway.adapters.store.schema import stack_serials


class SqlStackRecords(Records):
    """Each stack's state serial as a worker last read it, and when."""

    def record_serials(self, serials: Mapping[str, int], read_at: datetime) -> None:
        """One upsert per stack, sent as one batch in the stacks' order; a reading older than the one kept is dropped
        (two workers may finish out of order; of two of the same moment, the later written is kept)."""
        if not serials:
            return
        statement = self._insert()
        self.conn.execute(statement.on_conflict_do_update(
            index_elements=["stack"], set_={"serial": statement.excluded.serial,
                                            "observed_at": statement.excluded.observed_at},
            where=stack_serials.c.observed_at <= statement.excluded.observed_at),
            [{"stack": stack, "serial": serial, "observed_at": read_at} for stack, serial in sorted(serials.items())])

    def serials(self, stacks: Collection[str]) -> dict[str, int]:
        if not stacks:
            return {}
        ahead = self.ahead.serials(set(stacks)) if self.ahead else None
        if ahead is not None:
            return ahead
        rows = self.conn.execute(select(stack_serials.c.stack, stack_serials.c.serial)
                                 .where(stack_serials.c.stack.in_(sorted(stacks))))
        return {stack: int(serial) for stack, serial in rows}

    def _insert(self) -> Any:
        """The dialect's INSERT, which can say what to do on a conflict (imported when used)."""
        if self.conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        return insert(stack_serials)
