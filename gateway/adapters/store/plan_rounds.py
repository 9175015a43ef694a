"""Plan rounds: a proposal's stacks planned by jobs of their own, each stack's plan held here until the last is done.

Which job finishes a round is decided by the database: each stack's end decrements the round's `remaining` in an
UPDATE, which on PostgreSQL waits for any other stack's end of the same round to commit and then counts from it
(READ COMMITTED re-reads the row it waited for), and on SQLite runs alone (BEGIN IMMEDIATE). So exactly one job sees
0, whatever two workers race, and a stack ended twice (a job run again after its worker seemed dead) counts once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update

from gateway.adapters.store.rows import Records, aware, now
from gateway.adapters.store.schema import plan_round_stacks, plan_rounds
from gateway.domain.errors import NotFound
from gateway.domain.plan_rounds import UNFINISHED, PlanRound, RoundState, StackProgress, StackStatus, StagedPlan
from gateway.domain.policy import Finding
from gateway.domain.proposal import PlanSummary
from gateway.domain.risk import Risk, RiskLevel

_UNFINISHED = [s.value for s in UNFINISHED]
_PROGRESS = (plan_round_stacks.c.stack, plan_round_stacks.c.status, plan_round_stacks.c.job_id,
             plan_round_stacks.c.error, plan_round_stacks.c.error_kind)

_NEWEST = select(func.max(plan_rounds.c.id)).where(plan_rounds.c.proposal_id == bindparam("proposal_id"))
_LATEST = (select(plan_rounds, *_PROGRESS).join(plan_round_stacks, plan_round_stacks.c.round_id == plan_rounds.c.id)
           .where(plan_rounds.c.id == _NEWEST.scalar_subquery()).order_by(plan_round_stacks.c.position))


class SqlPlanRounds(Records):
    """Rounds and their stacks, inside a use case's transaction."""

    def add(self, proposal_id: int | None, head_sha: str, main_sha: str, merged_sha: str, stacks: Sequence[str],
            spec: Mapping[str, Any]) -> int:
        result = self.conn.execute(insert(plan_rounds).values(
            proposal_id=proposal_id, head_sha=head_sha, main_sha=main_sha, merged_sha=merged_sha, spec=dict(spec),
            state=RoundState.PLANNING.value, remaining=len(stacks), created_at=now()))
        round_id = int(result.inserted_primary_key[0])
        self.conn.execute(insert(plan_round_stacks), [
            {"round_id": round_id, "stack": stack, "position": i, "status": StackStatus.QUEUED.value}
            for i, stack in enumerate(stacks)])
        return round_id

    def link_jobs(self, round_id: int, jobs: Mapping[str, int]) -> None:
        if jobs:
            self.conn.execute(update(plan_round_stacks).where(
                plan_round_stacks.c.round_id == round_id, plan_round_stacks.c.stack == bindparam("linked_stack"))
                .values(job_id=bindparam("linked_job")),
                [{"linked_stack": stack, "linked_job": job_id} for stack, job_id in jobs.items()])

    def get(self, round_id: int, with_stacks: bool = True) -> PlanRound:
        row = self.conn.execute(select(plan_rounds).where(plan_rounds.c.id == round_id)).mappings().first()
        if row is None:
            raise NotFound(f"no plan round {round_id}")
        return self._round(row, None if with_stacks else [])

    def latest(self, proposal_id: int) -> PlanRound | None:
        """One statement (a view reads it): the newest round's row beside each of its stacks."""
        rows = self.conn.execute(_LATEST, {"proposal_id": proposal_id}).mappings().all()
        if not rows:
            return None
        return self._round(rows[0], [tuple(r[c.name] for c in _PROGRESS) for r in rows])

    def _round(self, row: Mapping[str, Any], stacks: Sequence[Any] | None = None) -> PlanRound:
        if stacks is None:
            stacks = self.conn.execute(select(*_PROGRESS).where(plan_round_stacks.c.round_id == row["id"])
                                       .order_by(plan_round_stacks.c.position)).all()
        spec = dict(row["spec"] or {})
        return PlanRound(
            id=row["id"], proposal_id=row["proposal_id"], head_sha=row["head_sha"], main_sha=row["main_sha"],
            merged_sha=row["merged_sha"], state=RoundState(row["state"]),
            stacks=tuple(StackProgress(s, StackStatus(status), job, error, kind) for s, status, job, error, kind in stacks),
            changed_paths=tuple(spec.get("changed_paths", ())), changes=tuple(spec.get("changes", ())),
            by_agent=bool(spec.get("by_agent")), requester=str(spec.get("requester", "")),
            result=row["result"], created_at=aware(row["created_at"]),
            finished_at=aware(row["finished_at"]) if row["finished_at"] else None)

    def supersede(self, proposal_id: int) -> list[int]:
        planning = select(plan_rounds.c.id).where(plan_rounds.c.proposal_id == proposal_id,
                                                  plan_rounds.c.state == RoundState.PLANNING.value)
        ended = [int(i) for i in self.conn.scalars(planning)]
        if not ended:
            return []
        for round_id in ended:
            self.close(round_id, RoundState.SUPERSEDED, {"reasons": ["a newer plan of the proposal replaced it"]})
        return [int(j) for j in self.conn.scalars(select(plan_round_stacks.c.job_id).where(
            plan_round_stacks.c.round_id.in_(ended), plan_round_stacks.c.status == StackStatus.QUEUED.value,
            plan_round_stacks.c.job_id.is_not(None)))]

    def start_stack(self, round_id: int, stack: str) -> bool:
        planning = select(plan_rounds.c.id).where(plan_rounds.c.id == round_id,
                                                  plan_rounds.c.state == RoundState.PLANNING.value).exists()
        started = self.conn.execute(update(plan_round_stacks).where(
            plan_round_stacks.c.round_id == round_id, plan_round_stacks.c.stack == stack,
            plan_round_stacks.c.status.in_(_UNFINISHED), planning).values(status=StackStatus.RUNNING.value))
        return started.rowcount == 1

    def finish_stack(self, round_id: int, stack: str, staged: StagedPlan | None, error: str | None = None,
                     error_kind: str | None = None) -> int | None:
        values: dict[str, Any] = {"finished_at": now()}
        if staged is not None:
            values.update(status=StackStatus.PLANNED.value, staged=_staged_json(staged),
                          document=self.sealer.seal_text(staged.document),
                          artifact=self.sealer.seal_bytes(staged.artifact) if staged.artifact is not None else None)
        else:
            values.update(status=StackStatus.FAILED.value, error=self.scrubber.scrub(error or "failed"),
                          error_kind=error_kind)
        ended = self.conn.execute(update(plan_round_stacks).where(
            plan_round_stacks.c.round_id == round_id, plan_round_stacks.c.stack == stack,
            plan_round_stacks.c.status.in_(_UNFINISHED)).values(**values))
        if ended.rowcount != 1:
            return None
        return int(self.conn.scalar(update(plan_rounds).where(plan_rounds.c.id == round_id)
                                    .values(remaining=plan_rounds.c.remaining - 1)  # locked to the commit
                                    .returning(plan_rounds.c.remaining)) or 0)

    def staged(self, round_id: int) -> list[StagedPlan]:
        rows = self.conn.execute(select(plan_round_stacks.c.stack, plan_round_stacks.c.staged,
                                        plan_round_stacks.c.document, plan_round_stacks.c.artifact)
                                 .where(plan_round_stacks.c.round_id == round_id,
                                        plan_round_stacks.c.status == StackStatus.PLANNED.value,
                                        plan_round_stacks.c.document.is_not(None))
                                 .order_by(plan_round_stacks.c.position)).all()
        return [_staged_plan(stack, data, self.sealer.open_text(str(document)),
                             self.sealer.open_bytes(bytes(artifact)) if artifact is not None else None)
                for stack, data, document, artifact in rows]

    def close(self, round_id: int, state: RoundState, result: Mapping[str, Any] | None = None) -> bool:
        closed = self.conn.execute(update(plan_rounds).where(
            plan_rounds.c.id == round_id, plan_rounds.c.state == RoundState.PLANNING.value).values(
            state=state.value, result=dict(result) if result is not None else None, finished_at=now()))
        if closed.rowcount == 1 and state != RoundState.PLANNED:
            self.discard_staged(round_id)
        return closed.rowcount == 1

    def set_result(self, round_id: int, result: Mapping[str, Any]) -> None:
        self.conn.execute(update(plan_rounds).where(plan_rounds.c.id == round_id).values(result=dict(result)))

    def discard_staged(self, round_id: int) -> None:
        self.conn.execute(update(plan_round_stacks).where(plan_round_stacks.c.round_id == round_id,
                                                          plan_round_stacks.c.document.is_not(None))
                          .values(document=None, artifact=None, staged=None))


def _staged_json(staged: StagedPlan) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sha": staged.sha, "digest": staged.digest, "state_serial": staged.state_serial,
        "state_lineage": staged.state_lineage, "findings": [f.to_json() for f in staged.findings],
        "risk": staged.risk.to_json(), "read_at": staged.read_at.isoformat() if staged.read_at else None,
        "engine": staged.engine}
    if staged.summary is not None and staged.preview is not None:  # its risk and findings are kept once, above
        data["summary"] = {k: v for k, v in staged.summary.to_json().items() if k not in ("risk", "findings")}
        data["preview"] = staged.preview
    return data


def _staged_plan(stack: str, data: Mapping[str, Any], document: str, artifact: bytes | None) -> StagedPlan:
    risk_data = data["risk"]
    risk = Risk(RiskLevel(risk_data["level"]), tuple(risk_data["reasons"]))
    findings = tuple(Finding.from_json(f) for f in data["findings"])
    summary = data.get("summary")
    return StagedPlan(
        stack=stack, sha=data["sha"], digest=data["digest"], document=document,
        state_serial=int(data["state_serial"]), state_lineage=data["state_lineage"], artifact=artifact,
        findings=findings, risk=risk,
        read_at=datetime.fromisoformat(data["read_at"]) if data.get("read_at") else None,
        summary=replace(PlanSummary.from_json(summary), risk=risk, findings=findings) if summary is not None else None,
        preview=data.get("preview"), engine=str(data.get("engine") or ""))
