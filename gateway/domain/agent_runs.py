"""Agent runs: one message of a person to the agent, run as a job, and where it ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class AgentRunStatus(StrEnum):
    QUEUED = "queued"  # its job waits for a worker
    RUNNING = "running"  # a worker runs the turn
    WAITING = "waiting"  # the turn ended in a question: the person answers in the same conversation
    DONE = "done"  # the turn opened or updated its proposal
    STOPPED = "stopped"  # a bound, the circuit breaker, or nothing to propose ended the turn
    FAILED = "failed"  # the turn could not run (model unreachable, a rule not met, an internal error)
    INTERRUPTED = "interrupted"  # its worker stopped heart-beating mid-turn; recorded by the next one


UNFINISHED = frozenset({AgentRunStatus.QUEUED, AgentRunStatus.RUNNING})

# What the person reads on the request page and in the API under a run that ended without a proposal.
ASK_AGAIN = "Ask again in this conversation: it is free, and the agent goes on from the branch as it is."


@dataclass(frozen=True)
class Conversation:
    """A person's conversation with the built-in agent: its branch, and the proposal it opened (if it did)."""

    id: str
    requester_id: str
    branch: str
    proposal_id: int | None
    created_at: datetime
    running_turn: str | None = None  # the turn that holds it now, until `running_until`
    running_until: datetime | None = None


@dataclass(frozen=True)
class AgentRun:
    id: str
    requester_id: str
    request: str
    conversation_id: str | None
    status: AgentRunStatus
    progress: tuple[str, ...]
    proposal_id: int | None
    message: str | None
    job_id: int | None
    created_at: datetime
    updated_at: datetime

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED

    @property
    def question(self) -> str | None:
        """The agent's question, while it waits for the person's answer."""
        return self.message if self.status == AgentRunStatus.WAITING else None
