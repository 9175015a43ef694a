"""Plan rounds: a proposal's stacks planned as jobs of their own, any worker planning any stack.

A round names the commit planned (the branch merged onto main) and its stacks; each stack is planned by a job of
its own and its plan held (staged) in the round until the last stack is done. The proposal's plans are then written
together, by whichever job finished last, so an approval never binds to half a round. A stack whose plan failed
fails the round: the proposal keeps the plans it had, and says which stack failed and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from gateway.domain.policy import Finding
from gateway.domain.proposal import PlanSummary
from gateway.domain.risk import Risk

FANOUT_AT = 2  # a proposal of fewer stacks is planned in the process that asks, as one job


class RoundState(StrEnum):
    PLANNING = "planning"  # some stacks are not planned yet
    PLANNED = "planned"  # every stack planned, for a proposal being opened: its opener writes the plans
    ASSEMBLED = "assembled"  # every stack planned, and the proposal's plans written from them
    FAILED = "failed"  # a stack's plan failed (or the change was refused): the proposal's plans are as they were
    SUPERSEDED = "superseded"  # a newer round of the proposal took its place, or the proposal left review


class StackStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PLANNED = "planned"
    FAILED = "failed"


UNFINISHED = frozenset({StackStatus.QUEUED, StackStatus.RUNNING})


@dataclass(frozen=True)
class StackProgress:
    """One stack of a round: where its plan is, and why it failed if it did."""

    stack: str
    status: StackStatus
    job_id: int | None = None
    error: str | None = None
    error_kind: str | None = None  # the class of the error raised (ConfigError, PlanError...)

    def to_public(self) -> dict[str, Any]:
        return {"stack": self.stack, "status": self.status.value, "job": self.job_id, "error": self.error}


@dataclass(frozen=True)
class PlanRound:
    id: int
    proposal_id: int | None
    head_sha: str
    main_sha: str
    merged_sha: str
    state: RoundState
    stacks: tuple[StackProgress, ...]
    changed_paths: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()  # what moved since the proposal's plans, in words (a re-plan's reason)
    by_agent: bool = False
    requester: str = ""
    result: Mapping[str, Any] | None = None  # the assembly's words, or the failure's reasons
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.state != RoundState.PLANNING

    @property
    def planned(self) -> int:
        return sum(1 for s in self.stacks if s.status == StackStatus.PLANNED)

    @property
    def failed(self) -> list[StackProgress]:
        return [s for s in self.stacks if s.status == StackStatus.FAILED]

    @property
    def remaining(self) -> int:
        return sum(1 for s in self.stacks if s.status in UNFINISHED)

    def summary(self) -> str:
        """How far the round is, as a person reads it: `planned 37 of 100 stacks, 4 planning now`."""
        words = f"planned {self.planned} of {len(self.stacks)} stacks"
        running = sum(1 for s in self.stacks if s.status == StackStatus.RUNNING)
        if self.failed:
            words += f", {len(self.failed)} failed"
        if running and not self.finished:
            words += f", {running} planning now"
        if self.state == RoundState.FAILED:
            words += ": planning failed, the proposal keeps its earlier plans"
        return words

    def reasons(self) -> list[str]:
        """Why the round failed: each failed stack and its error, or what refused the change."""
        failed = [f"stack {s.stack}: {_without_stack(s.stack, s.error or 'failed')}" for s in self.failed]
        return failed or [str(r) for r in (self.result or {}).get("reasons", [])]

    def to_public(self) -> dict[str, Any]:
        return {"round": self.id, "state": self.state.value, "head_sha": self.head_sha, "summary": self.summary(),
                "planned": self.planned, "failed": len(self.failed), "total": len(self.stacks),
                "reasons": self.reasons() if self.state == RoundState.FAILED else [],
                "stacks": [s.to_public() for s in self.stacks]}


def _without_stack(stack: str, error: str) -> str:
    """Errors of a stack's plan mostly start with its name already: say it once."""
    return error.removeprefix(f"stack {stack}: ")


@dataclass(frozen=True)
class StagedPlan:
    """A stack's plan as a proposal records it, made where the stack was planned (a round holds it until the round's
    plans are written together): so the job writing a round's plans parses and renders none of them."""

    stack: str
    sha: str  # the commit planned (the merge preview)
    digest: str
    document: str  # the plan's canonical JSON, as it will be stored (the digest is of these bytes)
    state_serial: int
    state_lineage: str
    artifact: bytes | None
    findings: tuple[Finding, ...]
    risk: Risk
    read_at: datetime | None
    # None in a plan staged by a gateway that kept neither (its document is then not canonical): made when written
    summary: PlanSummary | None = None
    preview: str | None = None  # the masked preview, as stored with the plan
    engine: str = ""  # which engine planned it, as the trail names it
