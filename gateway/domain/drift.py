"""Drift records: what changed outside the gateway on a stack, kept until a person settles it.

A check (a refresh of main's declaration against reality) opens a record per stack when it finds drift,
updates it while the drift stays, and closes it when a later check finds none (after a revert or a codify was
applied, or the cloud went back). Every proposal touching a stack with an open record shows it first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from gateway.domain.errors import ConfigError
from gateway.domain.preview import AttributeDiff, DriftEntry, OpenDrift


class DriftStatus(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class DriftRecord:
    id: int
    stack: str
    status: DriftStatus
    resources: tuple[DriftEntry, ...]  # masked, attribute by attribute: before = recorded, after = reality
    expected: bool  # found while a break-glass window was open on the stack
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    closed_by: str | None = None
    closed_reason: str | None = None
    closed_by_proposal: int | None = None
    break_glass_id: int | None = None

    @property
    def addresses(self) -> list[str]:
        return [r.address for r in self.resources]

    def describe(self) -> str:
        """One line: the addresses and the attributes that differ."""
        return "; ".join(f"{r.address} ({', '.join(a.path for a in r.attributes) or r.summary})"
                         for r in self.resources)

    def to_public(self) -> dict[str, Any]:
        return {"id": self.id, "stack": self.stack, "status": self.status.value, "expected": self.expected,
                "opened_at": self.opened_at.isoformat(), "updated_at": self.updated_at.isoformat(),
                "closed_at": self.closed_at.isoformat() if self.closed_at else None, "closed_by": self.closed_by,
                "closed_reason": self.closed_reason, "closed_by_proposal": self.closed_by_proposal,
                "break_glass_id": self.break_glass_id, "resources": entries_to_json(self.resources)}


def entries_to_json(entries: Sequence[DriftEntry]) -> list[dict[str, Any]]:
    return [{"address": e.address, "summary": e.summary, "reverted_by_apply": e.reverted_by_apply,
             "attributes": [{"path": a.path, "before": a.before, "after": a.after} for a in e.attributes]}
            for e in entries]


def entries_from_json(items: Sequence[Mapping[str, Any]]) -> tuple[DriftEntry, ...]:
    return tuple(DriftEntry(i["address"], i["summary"], bool(i["reverted_by_apply"]),
                            tuple(AttributeDiff(a["path"], a["before"], a["after"]) for a in i["attributes"]))
                 for i in items)


def open_drift_notice(record: DriftRecord, plan_drift: Sequence[DriftEntry],
                      planned_at: datetime | None = None) -> OpenDrift:
    """Split the record by what this proposal's plan does with each drifted resource.

    A resource the plan's own refresh no longer sees as drifted is counted as kept: nothing would revert it;
    unless the record is newer than the plan (`planned_at`): then the plan never saw it and cannot say.
    """
    by_address = {d.address: d for d in plan_drift}
    reverts = tuple(r for r in record.resources if (p := by_address.get(r.address)) is not None and p.reverted_by_apply)
    rest = tuple(r for r in record.resources if r not in reverts)
    if planned_at is not None and record.updated_at > planned_at:
        unseen = tuple(r for r in rest if r.address not in by_address)
        return OpenDrift(record.id, record.opened_at.isoformat(), record.expected, reverts,
                         tuple(r for r in rest if r not in unseen), unseen)
    return OpenDrift(record.id, record.opened_at.isoformat(), record.expected, reverts, rest)


_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
MAX_DURATION = timedelta(days=365)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_interval(text: str, where: str) -> timedelta:
    """`90s`, `15m`, `6h`, `1d`: a duration from gateway.yaml or a command line; `where` names the setting."""
    match = _INTERVAL.match(str(text))
    if not match:
        raise ConfigError(f"{where}: {text!r} is not a duration (write e.g. 30m, 6h or 1d)")
    try:
        delta = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    except OverflowError:
        delta = MAX_DURATION + timedelta(seconds=1)
    if delta <= timedelta(0):
        raise ConfigError(f"{where}: a duration must be longer than zero")
    if delta > MAX_DURATION:  # a bigger one overflows the dates computed from it
        raise ConfigError(f"{where}: {text!r} is longer than the longest duration the gateway takes "
                          f"({MAX_DURATION.days}d)")
    return delta


def check_due(last_checked: datetime | None, interval: timedelta, moment: datetime) -> bool:
    return last_checked is None or moment - last_checked >= interval
