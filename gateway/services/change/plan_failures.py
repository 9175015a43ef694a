"""Why a proposal cannot be planned: its last plan job failed on what it planned from, and a plan now would start
from the same branch head and main head. Read by the views and the command (light: no job handlers here)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.domain.jobs import Job, PlanFailure, plan_failure
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.proposal import Proposal
from gateway.services.workspace import MainRules


def plan_inputs(ws: MainRules, branch: str, main_sha: str | None = None) -> tuple[str | None, str]:
    """What a plan of a proposal starts from now: its branch's head (None: gone) and main's head."""
    head = ws.repo.resolve(branch) if ws.repo.branch_exists(branch) else None
    return head, main_sha or ws.repo.resolve(ws.main_branch())


def standing_plan_failure(ws: MainRules, proposal: Proposal, jobs: Sequence[Job]) -> PlanFailure | None:
    """Why the proposal cannot be planned, while a plan now would start from what its last plan job failed on."""
    failure = plan_failure(jobs)
    if failure is None or proposal.status not in DECIDABLE:
        return None
    return failure if failure.holds(*plan_inputs(ws, proposal.branch)) else None
