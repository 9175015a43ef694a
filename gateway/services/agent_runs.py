"""Agent requests run in the background for the web and API, with progress kept in the database
(so any API process can answer "how far is it?")."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import structlog

from agents.llm import Model
from gateway.domain.errors import GatewayError, NotFound, Refused
from gateway.domain.principals import Principal
from gateway.services.agent_requests import (
    agent_principal,
    check_conversation_free,
    model_from_settings,
    submit_request,
)
from gateway.services.breaker import agent_stop_reason
from gateway.services.workspace import Workspace

log = structlog.get_logger(__name__)


def start_agent_run(ws: Workspace, person: Principal, text: str, conversation_id: str | None = None,
                    model: Model | None = None) -> str:
    """Check what can be checked now (model configured, the breaker closed), then run the agent in a thread."""
    model = model or model_from_settings(ws)
    stopped = agent_stop_reason(ws, agent_principal(ws))
    if stopped:
        raise Refused([stopped])
    if conversation_id:
        check_conversation_free(ws, conversation_id)
    run_id = uuid.uuid4().hex[:12]
    with ws.store.session() as session:
        session.add_agent_run(run_id, person, text, conversation_id)
    worker = threading.Thread(target=_run, args=(ws, run_id, person, text, conversation_id, model), daemon=True)
    worker.start()
    return run_id


def _run(ws: Workspace, run_id: str, person: Principal, text: str, conversation_id: str | None,
         model: Model) -> None:
    steps: list[str] = []

    def progress(step: str) -> None:
        steps.append(step)
        with ws.store.session() as session:
            session.update_agent_run(run_id, progress=list(steps))

    try:
        outcome = submit_request(ws, person, text, conversation_id, model=model, progress=progress)
    except GatewayError as exc:
        with ws.store.session() as session:
            session.update_agent_run(run_id, status="failed", message=str(exc))
        return
    except Exception as exc:  # the thread must record its end whatever happens
        log.exception("agent_run.crashed", run=run_id)
        with ws.store.session() as session:
            session.update_agent_run(run_id, status="failed", message=f"internal error: {exc.__class__.__name__}")
        return
    status = ("waiting" if outcome.question else
              "stopped" if outcome.stopped or outcome.proposal is None else "done")
    with ws.store.session() as session:
        session.update_agent_run(run_id, status=status, conversation_id=outcome.conversation_id,
                                 proposal_id=outcome.proposal.id if outcome.proposal else None,
                                 message=outcome.stopped or outcome.question or outcome.summary)


def get_agent_run(ws: Workspace, person: Principal, run_id: str) -> dict[str, Any]:
    with ws.store.session(readonly=True) as session:
        run = session.agent_run(run_id)
    if run is None or (run["requester_id"] != person.id and not person.roles & {"admin", "auditor"}):
        raise NotFound(f"no request {run_id}")
    return run
