"""The agent's conversations and runs."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, insert, or_, select, update

from gateway.adapters.store.rows import (
    Records,
    as_agent_run,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    agent_runs,
    conversations,
    jobs,
)
from gateway.domain.agent_runs import UNFINISHED, AgentRun, AgentRunStatus, Conversation
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.principals import Principal


class SqlConversations(Records):
    """Conversations with the agent and the runs (turns) of each."""

    def add(self, conversation_id: str, requester: Principal, branch: str) -> None:
        self.conn.execute(
            insert(conversations).values(id=conversation_id, requester_id=requester.id, branch=branch, created_at=now())
        )

    def get(self, conversation_id: str) -> Conversation | None:
        row = self.conn.execute(select(conversations).where(conversations.c.id == conversation_id)).mappings().first()
        return _conversation(row) if row else None

    def link(self, conversation_id: str, proposal_id: int) -> None:
        self.conn.execute(
            update(conversations).where(conversations.c.id == conversation_id).values(proposal_id=proposal_id)
        )

    def hold(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """Hold the conversation for `turn` until `until`; refused while another turn holds it (a lapsed hold is free)."""
        free = or_(conversations.c.running_until.is_(None), conversations.c.running_until < now())
        query = update(conversations).where(conversations.c.id == conversation_id, free)
        return self.conn.execute(query.values(running_turn=turn, running_until=until)).rowcount == 1

    def renew(self, conversation_id: str, turn: str, until: datetime) -> bool:
        """`turn`, still working, extends its hold; False when it holds the conversation no more (another turn took
        it over after its hold lapsed)."""
        query = update(conversations).where(conversations.c.id == conversation_id, conversations.c.running_turn == turn)
        return self.conn.execute(query.values(running_until=until)).rowcount == 1

    def release(self, conversation_id: str, turn: str) -> bool:
        """`turn` lets go of the conversation; a turn that lost its hold leaves the new holder's alone (False)."""
        query = update(conversations).where(conversations.c.id == conversation_id, conversations.c.running_turn == turn)
        return self.conn.execute(query.values(running_turn=None, running_until=None)).rowcount == 1

    def busy(self, conversation_id: str) -> bool:
        """A turn holds this conversation now."""
        return (
            self.conn.scalar(
                select(func.count())
                .select_from(conversations)
                .where(conversations.c.id == conversation_id, conversations.c.running_until >= now())
            )
            == 1
        )

    def of_proposal(self, proposal_id: int) -> Conversation | None:
        row = (
            self.conn.execute(select(conversations).where(conversations.c.proposal_id == proposal_id))
            .mappings()
            .first()
        )
        return _conversation(row) if row else None

    def add_run(self, run_id: str, requester: Principal, request: str, conversation_id: str, job_id: int) -> None:
        self.conn.execute(
            insert(agent_runs).values(
                id=run_id,
                requester_id=requester.id,
                request=request,
                conversation_id=conversation_id,
                job_id=job_id,
                status=AgentRunStatus.QUEUED.value,
                progress=[],
                created_at=now(),
                updated_at=now(),
            )
        )

    def begin_run(self, run_id: str) -> bool:
        """A worker starts the queued run; False when it is no longer queued (the breaker stopped it meanwhile)."""
        return self._move_agent_run(run_id, {AgentRunStatus.QUEUED}, status=AgentRunStatus.RUNNING.value) == 1

    def record_run_progress(self, run_id: str, steps: Sequence[str]) -> None:
        self.conn.execute(
            update(agent_runs).where(agent_runs.c.id == run_id).values(progress=list(steps), updated_at=now())
        )

    def finish_run(
        self, run_id: str, status: AgentRunStatus, message: str | None, proposal_id: int | None = None
    ) -> bool:
        """The turn's own end. A run the breaker marked stopped while it ran takes the turn's fuller account; one
        that recovery already recorded interrupted keeps that (its job says so too)."""
        return (
            self._move_agent_run(
                run_id,
                {AgentRunStatus.RUNNING, AgentRunStatus.STOPPED},
                status=status.value,
                message=message,
                proposal_id=proposal_id,
            )
            == 1
        )

    def end_abandoned_run(self, run_id: str, status: AgentRunStatus, message: str) -> bool:
        """Recovery's end of a run whose job ended without it (its worker died): only while it is unfinished."""
        return self._move_agent_run(run_id, UNFINISHED, status=status.value, message=message) == 1

    def abandoned_runs(self) -> list[tuple[AgentRun, Job]]:
        """Unfinished runs whose job has ended: what a dead worker left behind."""
        unfinished = [s.value for s in UNFINISHED]
        rows = self.conn.execute(
            select(agent_runs, jobs.c.status.label("job_status"), jobs.c.runner.label("job_runner"))
            .join(jobs, jobs.c.id == agent_runs.c.job_id)
            .where(agent_runs.c.status.in_(unfinished), jobs.c.status.not_in(unfinished))
        ).mappings()
        return [(as_agent_run(r), self._job_of_run(r)) for r in rows]

    def _job_of_run(self, row: Mapping[str, Any]) -> Job:
        return Job(
            id=row["job_id"],
            kind=JobKind.AGENT_TURN,
            proposal_id=None,
            requested_by=row["requester_id"],
            status=JobStatus(row["job_status"]),
            runner=row["job_runner"],
        )

    def has_unfinished_run(self, conversation_id: str) -> bool:
        """A message to this conversation is queued or running (a second one waits for it to end)."""
        return (
            self.conn.scalar(
                select(func.count())
                .select_from(agent_runs)
                .where(
                    agent_runs.c.conversation_id == conversation_id,
                    agent_runs.c.status.in_([s.value for s in UNFINISHED]),
                )
            )
            > 0
        )

    def run(self, run_id: str) -> AgentRun | None:
        row = self.conn.execute(select(agent_runs).where(agent_runs.c.id == run_id)).mappings().first()
        return as_agent_run(row) if row else None

    def _move_agent_run(self, run_id: str, from_statuses: Collection[AgentRunStatus], **values: Any) -> int:
        query = update(agent_runs).where(
            agent_runs.c.id == run_id, agent_runs.c.status.in_([s.value for s in from_statuses])
        )
        return int(self.conn.execute(query.values(updated_at=now(), **values)).rowcount)

    def stop_runs(self, reason: str) -> list[str]:
        """Mark every queued or running agent request stopped (each run also checks the breaker between its steps,
        and a queued one is not started)."""
        unfinished = [s.value for s in UNFINISHED]
        running = list(self.conn.scalars(select(agent_runs.c.id).where(agent_runs.c.status.in_(unfinished))))
        if running:
            self.conn.execute(
                update(agent_runs)
                .where(agent_runs.c.id.in_(running))
                .values(status=AgentRunStatus.STOPPED.value, message=reason, updated_at=now())
            )
        return running


def _conversation(row: RowMapping) -> Conversation:
    until = row["running_until"]
    return Conversation(row["id"], row["requester_id"], row["branch"], row["proposal_id"], aware(row["created_at"]),
                        row["running_turn"], aware(until) if until else None)
