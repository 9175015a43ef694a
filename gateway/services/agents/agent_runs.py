"""Agent requests as jobs: queued by the API, the pages or the CLI, run by a worker, followed from anywhere.

A run is one message of a person to the agent. Its job heart-beats while the turn runs, so a turn whose
worker died is found by the queue's recovery like any other job; the run then ends `interrupted` and its
conversation is let go, so the person can ask again. Progress is kept on the run (any API process can
answer "how far is it?").

The agent's libraries are imported only where a turn runs or is checked: the worker and the CLI import
this module to recover runs, and must start fast.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.domain.agent_runs import ASK_AGAIN, AgentRun, AgentRunStatus
from gateway.domain.errors import GatewayError, NotFound, Refused
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.principals import GATEWAY, Principal
from gateway.logs import get_logger
from gateway.services.workspace import Records, Workspace

if TYPE_CHECKING:
    from gateway.services.agents.agent_requests import RequestOutcome

log = get_logger(__name__)


@dataclass(frozen=True)
class TurnResult:
    """What a turn's job records as its result: the outcome of `submit_request`, the proposal by id."""
    conversation_id: str
    proposal_id: int | None
    opened: bool
    summary: str | None
    stopped: str | None
    question: str | None
    steps: int
    tokens: int
    changed_files: list[str] = field(default_factory=list)
    claim_issues: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, outcome: RequestOutcome) -> TurnResult:
        return cls(outcome.conversation_id, outcome.proposal.id if outcome.proposal else None, outcome.opened,
                   outcome.summary, outcome.stopped, outcome.question, outcome.steps, outcome.tokens,
                   list(outcome.changed_files), list(outcome.claim_issues))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnResult:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})

    @property
    def status(self) -> AgentRunStatus:
        if self.question:
            return AgentRunStatus.WAITING
        return AgentRunStatus.STOPPED if self.stopped or self.proposal_id is None else AgentRunStatus.DONE


def start_agent_run(ws: Workspace, person: Principal, text: str, conversation_id: str | None = None) -> AgentRun:
    """Check what can be checked now (the request, a model configured, the breaker closed, the conversation
    free), then queue the turn as a job and return its run at once."""
    from gateway.services.agents.agent_requests import (
        agent_principal,
        check_conversation_free,
        check_request,
        model_from_settings,
        open_conversation,
    )
    from gateway.services.change.breaker import agent_stop_reason
    from gateway.services.change.recovery import interrupt_stale_jobs

    text = check_request(person, text)
    model_from_settings(ws)  # no model configured: say so now, not from the job
    stopped = agent_stop_reason(ws, agent_principal(ws))
    if stopped:
        raise Refused([stopped])
    if conversation_id:
        interrupt_stale_jobs(ws)  # a turn whose worker died must not keep its conversation busy
        interrupt_abandoned_turns(ws)
        check_conversation_free(ws, person, conversation_id)
    else:
        conversation_id = open_conversation(ws, person)
    run_id = uuid.uuid4().hex[:12]
    with ws.store.session() as session:
        job_id = session.jobs.add(JobKind.AGENT_TURN, None, person, {"run": run_id})
        session.conversations.add_run(run_id, person, text, conversation_id, job_id)
        session.audit.append(person, "job.queued", {"job": job_id, "kind": JobKind.AGENT_TURN.value, "run": run_id,
                                                    "conversation": conversation_id})
        run = session.conversations.run(run_id)
    assert run is not None  # written just now, in this transaction
    return run


def run_agent_turn(ws: Workspace, job: Job, progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any]]:
    """The agent_turn job: run the turn, keeping its run's progress and end; every way out is recorded on the run."""
    from gateway.services.agents.agent_requests import submit_request

    run_id = str(job.args.get("run"))
    with ws.store.session() as session:
        run = session.conversations.run(run_id)
        if run is None:
            raise NotFound(f"job {job.id} names no agent request ({run_id})")
        if not session.conversations.begin_run(run_id):  # stopped before it started (the breaker): nothing to run
            return JobStatus.SUCCEEDED, {"run": run_id, "status": run.status.value}
        person = session.principals.get(run.requester_id)
    steps: list[str] = []

    def step(line: str) -> None:
        steps.append(line)
        with ws.store.session() as session:
            session.conversations.record_run_progress(run_id, steps)
        progress(line)

    try:
        outcome = submit_request(ws, person, run.request, run.conversation_id, progress=step, turn_id=run_id)
    except GatewayError as exc:  # recorded on the run; the job records it too (refused or failed)
        _finish(ws, run_id, AgentRunStatus.FAILED, str(exc))
        raise
    except Exception as exc:
        _finish(ws, run_id, AgentRunStatus.FAILED, f"internal error: {type(exc).__name__}")
        raise
    result = TurnResult.of(outcome)
    _finish(ws, run_id, result.status, outcome.stopped or outcome.question or outcome.summary, result.proposal_id)
    return JobStatus.SUCCEEDED, {"run": run_id, **asdict(result)}


def _finish(ws: Records, run_id: str, status: AgentRunStatus, message: str | None,
            proposal_id: int | None = None) -> None:
    with ws.store.session() as session:
        if not session.conversations.finish_run(run_id, status, message, proposal_id):
            log.warning("agent_run.already_ended", run=run_id, status=status.value)


def interrupt_abandoned_turns(ws: Records) -> list[str]:
    """Runs whose job ended without them (their worker died mid-turn): recorded interrupted, and their
    conversation let go at once (its hold would otherwise lapse only after `agent_turn_hold_seconds`)."""
    recovered = []
    with ws.store.session() as session:
        for run, job in session.conversations.abandoned_runs():
            interrupted = job.status == JobStatus.INTERRUPTED
            status = AgentRunStatus.INTERRUPTED if interrupted else AgentRunStatus.FAILED
            why = (f"interrupted: the worker running it ({job.runner}) stopped before the agent finished, and its "
                   "edits not yet committed are lost" if interrupted else f"its job {job.id} {job.status.value}")
            if not session.conversations.end_abandoned_run(run.id, status, f"{why}. {ASK_AGAIN}"):
                continue
            if run.conversation_id:
                session.conversations.release(run.conversation_id, run.id)  # only this turn's own hold
            session.audit.append(GATEWAY, f"agent.{status.value}", {
                "run": run.id, "job": job.id, "runner": job.runner, "conversation": run.conversation_id})
            recovered.append(f"agent request {run.id} of worker {job.runner}")
    return recovered


def get_agent_run(ws: Records, person: Principal, run_id: str) -> AgentRun:
    """A run, for its requester (and admins and auditors)."""
    with ws.store.session(readonly=True) as session:
        run = session.conversations.run(run_id)
    if run is None or (run.requester_id != person.id and not person.roles & {"admin", "auditor"}):
        raise NotFound(f"no request {run_id}")
    return run


def turn_result(job: Job) -> TurnResult | None:
    """The outcome an agent_turn job recorded (None when the turn did not end on its own)."""
    return TurnResult.from_json(job.result) if "conversation_id" in job.result else None


def run_agent_turn_job(ws: Workspace, job: Job, runner: str,
                       progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], None]:
    """The job handler of agent turns (see gateway/composition.py)."""
    status, result = run_agent_turn(ws, job, progress)
    return status, result, None
