"""Reads that go together, in one statement: on PostgreSQL each statement is a round trip.

A view of a proposal asks for the proposal (its people, decisions, overrides and current plans), then for its jobs,
the pushes to main nobody acknowledged, the break-glass windows, the open drift, whether it rolls something back and
its stacks' recorded state serials: a dozen statements, one after another. In a read unit of work (one snapshot,
which nothing writes to while it is open) `SqlProposals.get` reads them all at once, and each repository answers
from what was read, exactly as its own query would have (the same rows, in the same order).

`Parts` is how several queries become one: a UNION ALL whose columns are slots by type (text, integer, time, JSON,
boolean), each part's columns in slots of their type and NULL (cast to the slot's type) in the others, so both
databases decode every value as they would from the part's own query.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    CompoundSelect,
    Connection,
    DateTime,
    Integer,
    Select,
    String,
    Text,
    cast,
    literal_column,
    null,
    select,
    union_all,
)

Row = dict[str, Any]


def _slot_type(column: ColumnElement[Any]) -> tuple[str, Any]:
    """The slot kind a column goes in, and the type its NULL is cast to elsewhere."""
    kind = column.type
    if isinstance(kind, Boolean):
        return "b", Boolean()
    if isinstance(kind, Integer):
        return "i", BigInteger()
    if isinstance(kind, DateTime):
        return "t", DateTime(timezone=True)
    if isinstance(kind, JSON):
        return "j", JSON()
    if isinstance(kind, String):
        return "s", Text()
    raise TypeError(f"no slot for column {column.key} of type {kind!r}")


class Parts:
    """Queries (`name`, select) read as one statement; `order` puts each part's rows back in its query's order."""

    def __init__(self, parts: Sequence[tuple[str, Select[Any]]], order: Mapping[str, Callable[[Row], Any]],
                 descending: frozenset[str] = frozenset()):
        self.order, self.descending = order, descending
        subqueries = {name: query.subquery(f"part_{name}") for name, query in parts}
        self._columns: dict[str, list[tuple[str, str]]] = {}  # part -> (column, slot)
        slots: dict[str, Any] = {}
        for name, sub in subqueries.items():
            used: dict[str, int] = {}
            self._columns[name] = []
            for column in sub.c:
                kind, slot_type = _slot_type(column)
                used[kind] = used.get(kind, 0) + 1
                slot = f"{kind}{used[kind]}"
                slots.setdefault(slot, slot_type)
                self._columns[name].append((column.key, slot))
        selects = []
        for name, sub in subqueries.items():
            own = {slot: sub.c[column] for column, slot in self._columns[name]}
            selects.append(select(literal_column(f"'{name}'").label("part"), *(
                (own[slot] if slot in own else cast(null(), slot_type)).label(slot) for slot, slot_type in slots.items()
            )))
        self.statement: CompoundSelect = union_all(*selects)

    def read(self, conn: Connection, params: Mapping[str, Any]) -> dict[str, list[Row]]:
        """Each part's rows, as its own query would return them (column names and order)."""
        found: dict[str, list[Row]] = {name: [] for name in self._columns}
        for row in conn.execute(self.statement, dict(params)).mappings():
            part = row["part"]
            found[part].append({column: row[slot] for column, slot in self._columns[part]})
        for name, rows in found.items():
            if name in self.order:
                rows.sort(key=self.order[name], reverse=name in self.descending)
        return found


class ReadAhead:
    """What one read unit of work has read ahead, by part and key (a proposal's id; None for what is not one
    proposal's): each repository asks here before it asks the database."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, Hashable], list[Row]] = {}
        self._serial_stacks: set[str] = set()
        self._serials: dict[str, int] = {}

    def keep(self, part: str, key: Hashable, rows: list[Row]) -> None:
        self._rows[part, key] = rows

    def rows(self, part: str, key: Hashable = None) -> list[Row] | None:
        """The rows read ahead (None: not read ahead; ask the database)."""
        return self._rows.get((part, key))

    def keep_serials(self, stacks: set[str], rows: list[Row]) -> None:
        """The recorded serials of `stacks` (those with none recorded have no row)."""
        self._serial_stacks |= stacks
        self._serials.update({row["stack"]: int(row["serial"]) for row in rows})

    def serials(self, stacks: set[str]) -> dict[str, int] | None:
        """The recorded serials of `stacks`, if all of them were read ahead (None: ask the database)."""
        if not stacks <= self._serial_stacks:
            return None
        return {stack: self._serials[stack] for stack in sorted(stacks) if stack in self._serials}

