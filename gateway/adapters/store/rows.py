"""Row conversions and what every repository shares."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway.domain.agent_runs import AgentRun, AgentRunStatus
from gateway.domain.audit import AuditEvent
from gateway.domain.drift import DriftRecord, DriftStatus, entries_from_json
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.locks import UNMERGED, StackLock
from gateway.domain.principals import Principal, PrincipalKind, Role

if TYPE_CHECKING:
    from gateway.adapters.store.unit_of_work import SqlUnitOfWork

MAX_ID = 2**31 - 1  # ids are 32-bit in both databases; anything larger cannot exist


NEVER = datetime(9999, 1, 1, tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


def as_stack_lock(row: Mapping[str, Any]) -> StackLock:
    proposal_id = row.get("proposal_id")
    if proposal_id is None and str(row["holder"]).startswith(UNMERGED):  # kept before locks named their proposal
        proposal_id = int(str(row["holder"]).removeprefix(UNMERGED))
    return StackLock(
        stack=row["stack"],
        holder=row["holder"],
        acquired_at=aware(row["acquired_at"]),
        expires_at=aware(row["expires_at"]),
        proposal_id=proposal_id,
        apply_id=row["apply_id"],
    )


def as_job(row: Mapping[str, Any]) -> Job:
    return Job(
        id=row["id"],
        kind=JobKind(row["kind"]),
        proposal_id=row["proposal_id"],
        requested_by=row["requested_by"],
        status=JobStatus(row["status"]),
        runner=row["runner"],
        progress=tuple(row["progress"] or ()),
        result=dict(row["result"] or {}),
        error=row["error"],
        created_at=aware(row["created_at"]) if row["created_at"] else None,
        started_at=aware(row["started_at"]) if row["started_at"] else None,
        finished_at=aware(row["finished_at"]) if row["finished_at"] else None,
        args=dict(row.get("args") or {}),
        attempts=int(row.get("attempts") or 0),
        run_after=aware(row["run_after"]) if row.get("run_after") else None,
    )


def as_agent_run(row: Mapping[str, Any]) -> AgentRun:
    return AgentRun(
        row["id"],
        row["requester_id"],
        row["request"],
        row["conversation_id"],
        AgentRunStatus(row["status"]),
        tuple(row["progress"] or ()),
        row["proposal_id"],
        row["message"],
        row["job_id"],
        aware(row["created_at"]),
        aware(row["updated_at"]),
    )


def as_drift_record(row: Mapping[str, Any]) -> DriftRecord:
    return DriftRecord(
        row["id"],
        row["stack"],
        DriftStatus(row["status"]),
        entries_from_json(row["resources"]),
        bool(row["expected"]),
        aware(row["opened_at"]),
        aware(row["updated_at"]),
        aware(row["closed_at"]) if row["closed_at"] else None,
        row["closed_by"],
        row["closed_reason"],
        row["closed_by_proposal"],
        row["break_glass_id"],
    )


def aware_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (aware(v) if isinstance(v, datetime) else v) for k, v in row.items()}


def aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def as_principal(row: Mapping[str, Any]) -> Principal:
    return Principal(
        row["id"],
        row["name"],
        PrincipalKind(row["kind"]),
        frozenset(Role(r) for r in row["roles"]),
        frozenset(row["groups"]),
        row["acting_for"],
        row.get("disabled_at") is not None,
    )


def as_event(row: Mapping[str, Any]) -> AuditEvent:
    """The event as its stored bytes say (the index columns beside them only find it)."""
    return AuditEvent.from_canonical(row["canonical"], row["prev_hash"], row["hash"])


class Records:
    """What every repository of one unit of work shares: its connection, scrubber and sealer, and the declaration
    repository it works in (not its siblings: a repository is a collection of one aggregate; what spans several is
    the unit of work's, or a use case's)."""

    def __init__(self, uow: SqlUnitOfWork):
        self.conn = uow.conn
        self.scrubber = uow.scrubber
        self.sealer = uow.sealer
        self.repository = uow.repository
        self.ahead = uow.read_ahead  # a read unit of work's records read ahead (None in a write)
