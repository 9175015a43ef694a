"""A person's plain-words request becomes commits on a proposal branch, made by the agent.

The requester is the person; the proposer is the agent principal, which can never approve or
apply. The agent works on a fresh clone of the branch; only what it wrote, committed by the
gateway, reaches the repo. A follow-up in the same conversation adds a commit to the same proposal.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agents.graph import Limits, Progress, build_graph
from agents.llm import ChatModel, Model
from agents.prompts import Prompt, fill_conventions, load_prompt
from agents.state import GATEWAY_NOTE, HISTORY, compact_history
from agents.tools import PreviewReport, RepoTools
from gateway.domain.errors import Conflict, GatewayError, InputError, NotFound, Refused
from gateway.domain.permissions import Action, require
from gateway.domain.preview import render_text
from gateway.domain.principals import BUILTIN_AGENT_NAME, GATEWAY, Principal, PrincipalKind, Role, hash_token, new_token
from gateway.domain.proposal import Proposal
from gateway.ports import WorkingCopy
from gateway.services.change.breaker import agent_stop_reason
from gateway.services.change.planning import ChangeOrigin, plan_directory
from gateway.services.change.proposals import claim_issues, open_proposal, sync_proposal
from gateway.services.workspace import Configured, Records, Workspace

AGENT_NAME = BUILTIN_AGENT_NAME
MAX_REQUEST = 8000
PROMPT = "agent_system"


@dataclass
class RequestOutcome:
    conversation_id: str
    proposal: Proposal | None
    summary: str | None
    stopped: str | None
    steps: int
    tokens: int
    changed_files: list[str] = field(default_factory=list)
    claim_issues: list[str] = field(default_factory=list)
    question: str | None = None  # the agent waits for the person's answer (given in the same conversation)
    opened: bool = False  # this turn opened the proposal (rather than adding a commit to it)


def model_from_settings(ws: Configured) -> ChatModel:
    s = ws.settings
    return ChatModel(s.openai_base_url, s.openai_api_key.get_secret_value() if s.openai_api_key else None, s.model,
                     s.model_timeout, s.model_retries, s.model_max_tokens)


def agent_principal(ws: Records) -> Principal:
    """The agent's own principal (created on first use): kind agent, requester role only."""
    with ws.store.session() as session:
        agent = session.principals.by_name(AGENT_NAME)
        if agent is None:
            agent = session.principals.add(AGENT_NAME, PrincipalKind.AGENT, frozenset({Role.REQUESTER}), frozenset(),
                                          hash_token(new_token()))
            session.audit.append(GATEWAY, "principal.added", {"name": AGENT_NAME, "kind": "agent", "roles": ["requester"]})
    return agent


def check_request(person: Principal, text: str) -> str:
    """The request as the agent gets it (stripped), or why it cannot be asked at all."""
    require(person, Action.REQUEST)
    text = text.strip()
    if not text:
        raise InputError("the request is empty: say what you want changed")
    if len(text) > MAX_REQUEST:
        raise InputError(f"the request is too long ({len(text)} characters, at most {MAX_REQUEST})")
    return text


def submit_request(ws: Workspace, person: Principal, text: str, conversation_id: str | None = None,
                   model: Model | None = None, progress: Progress | None = None,
                   turn_id: str | None = None) -> RequestOutcome:
    """Run the agent on one request (or a follow-up) and open or update its proposal.

    `turn_id` names the turn's hold on the conversation, so that the recovery of a turn whose worker died can
    let go of it (a fresh id when not given)."""
    text = check_request(person, text)
    model = model or model_from_settings(ws)
    agent = agent_principal(ws)
    stopped = agent_stop_reason(ws, agent)
    if stopped:
        raise Refused([stopped])
    conversation = _conversation(ws, person, conversation_id)
    with _holding(ws, conversation.id, turn_id or uuid.uuid4().hex) as hold:
        return _run_turn(ws, person, agent, conversation, text, model, progress, hold)


def open_conversation(ws: Records, person: Principal) -> str:
    """A new conversation of `person` with the agent, on a branch of its own; its id."""
    return _conversation(ws, person, None).id


@dataclass(frozen=True)
class _Conversation:
    id: str
    branch: str
    proposal_id: int | None  # its proposal, once a turn opened one


@dataclass
class _Hold:
    """A turn's hold on its conversation: a lease under the turn's own id, renewed at every model and tool call.
    Once it lapsed and another turn took the conversation over, it is lost for good: this turn stops."""
    ws: Configured
    conversation_id: str
    turn: str
    lost: bool = False

    def renew(self) -> bool:
        """Extend the hold; False (from now on) once another turn holds the conversation."""
        if not self.lost:
            with self.ws.store.session() as session:
                self.lost = not session.conversations.renew(self.conversation_id, self.turn, _hold_until(self.ws))
        return not self.lost

    def stop_reason(self) -> str | None:
        """Why this turn must stop before its next model call (None: it still holds the conversation)."""
        if self.renew():
            return None
        return (f"this turn's hold on conversation {self.conversation_id} lapsed and another turn took it over: "
                "stopped, its edits dropped and nothing committed, so the two turns do not interleave")


@contextmanager
def _holding(ws: Configured, conversation_id: str, turn: str) -> Iterator[_Hold]:
    """One turn at a time per conversation: a second concurrent turn is refused, not interleaved."""
    hold = _Hold(ws, conversation_id, turn)
    with ws.store.session() as session:
        held = session.conversations.hold(conversation_id, hold.turn, _hold_until(ws))
    if not held:
        raise Conflict(_busy(conversation_id))
    try:
        yield hold
    finally:
        with ws.store.session() as session:
            session.conversations.release(conversation_id, hold.turn)  # never another turn's hold


def check_conversation_free(ws: Records, person: Principal, conversation_id: str) -> None:
    """Refuse at once (before queueing a turn) a conversation that is not the person's, or that a turn holds or
    waits to run in."""
    _conversation(ws, person, conversation_id)
    with ws.store.session(readonly=True) as session:
        if session.conversations.busy(conversation_id) or session.conversations.has_unfinished_run(conversation_id):
            raise Conflict(_busy(conversation_id))


def _busy(conversation_id: str) -> str:
    return (f"conversation {conversation_id} is busy: the agent is still working on its previous message; "
            "wait for that turn to end, then send yours")


def _hold_until(ws: Configured) -> datetime:
    """A turn holds its conversation this long past its last model or tool call (a crashed turn lets go by itself)."""
    return datetime.now(UTC) + timedelta(seconds=ws.settings.agent_turn_hold_seconds)


@dataclass(frozen=True)
class _Turn:
    """One message of a person to the agent, and what it runs with."""
    ws: Workspace
    person: Principal
    agent: Principal
    conversation: _Conversation
    text: str
    model: Model
    progress: Progress | None
    prompt: Prompt
    hold: _Hold


def _run_turn(ws: Workspace, person: Principal, agent: Principal, conversation: _Conversation, text: str,
              model: Model, progress: Progress | None, hold: _Hold) -> RequestOutcome:
    turn = _Turn(ws, person, agent, conversation, text, model, progress, load_prompt(PROMPT), hold)
    with tempfile.TemporaryDirectory(prefix="gw-agent-") as tmp:
        clone = ws.working_copies.clone(Path(tmp) / "repo", branch=conversation.branch)
        restored = _restore_work(clone, conversation.id)
        settings = ws.repo_settings()
        tools = RepoTools(clone.root, settings.protected_paths, _preview_tool(ws, person),
                          {name: stack.path for name, stack in settings.stacks.items()},
                          ws.modules.installed if ws.modules else None)
        tools.restore(restored)
        outcome = _converse(turn, tools, restored)
        lost = hold.stop_reason()
        if lost:  # the branch and the kept work belong to the turn that took over: touch neither
            outcome.stopped, outcome.summary, outcome.question = lost, None, None
        _record_request(ws, person, agent, text, outcome, turn.prompt.version, model.model)
        if lost or not _settle(turn, clone, outcome, tools, restored):
            return outcome
    outcome.proposal = _propose(ws, agent, person, conversation.branch, text, outcome.summary or "",
                                conversation.proposal_id, conversation.id, turn.prompt.version, model.model)
    outcome.opened = conversation.proposal_id is None
    outcome.claim_issues = claim_issues(ws, outcome.proposal)
    return outcome


def _converse(turn: _Turn, tools: RepoTools, restored: list[str]) -> RequestOutcome:
    """The graph's run for this message, on the conversation's checkpointed (and compacted) history."""
    ws, conversation = turn.ws, turn.conversation
    limits = Limits(ws.settings.agent_max_steps, ws.settings.agent_max_tokens, ws.settings.agent_prompt_budget)
    with ws.open_checkpointer() as checkpointer:
        graph = build_graph(turn.model, tools, fill_conventions(turn.prompt.text, ws.repo_settings()), limits,
                            checkpointer, turn.progress, ws.scrubber, lambda: _stop_reason(turn),
                            _trail_of_calls(turn))
        config = {"configurable": {"thread_id": conversation.id}, "recursion_limit": 4 * limits.max_steps + 10}
        previous = graph.get_state(config).values
        messages = [{"role": HISTORY, "messages": compact_history(previous.get("messages") or [])},
                    *_carry_over_note(previous, restored), {"role": "user", "content": turn.text}]
        try:
            state = graph.invoke({"messages": messages, "steps": 0, "tokens": 0, "summary": None, "stopped": None,
                                  "question": None, "written": []}, config)
        except Exception as exc:  # the trail keeps the request whatever ended it (the turn's steps so far too)
            so_far = graph.get_state(config).values
            failed = str(exc) if isinstance(exc, GatewayError) else f"internal error: {type(exc).__name__}"
            _record_request(ws, turn.person, turn.agent, turn.text, RequestOutcome(
                conversation.id, None, None, None, so_far.get("steps", 0), so_far.get("tokens", 0),
                sorted(tools.written)), turn.prompt.version, turn.model.model, failed)
            raise
    said = {key: ws.scrubber.scrub(state[key]) if state.get(key) else None for key in ("summary", "question")}
    outcome = RequestOutcome(conversation.id, None, said["summary"], state.get("stopped"), state["steps"],
                             state["tokens"], sorted(tools.written), question=said["question"])
    if outcome.stopped:
        outcome.question = None
    if outcome.summary is None and outcome.stopped is None and outcome.question is None:
        outcome.stopped = "the model stopped without calling finish"
    return outcome


def _stop_reason(turn: _Turn) -> str | None:
    """Asked before each model call: a lost hold on the conversation, or the agent's circuit breaker."""
    return turn.hold.stop_reason() or agent_stop_reason(turn.ws, turn.agent)


def _settle(turn: _Turn, clone: WorkingCopy, outcome: RequestOutcome, tools: RepoTools, restored: list[str]) -> bool:
    """Commit the turn's edits to the branch (True), or keep them for the next turn, or find nothing to propose."""
    dirty = clone.is_dirty()
    if (outcome.stopped or outcome.question) and dirty:  # the next turn of the conversation goes on from here
        _keep_work(clone, turn.conversation.id, turn.agent)
        return False
    if restored:
        _drop_work(clone, turn.conversation.id)
    if outcome.stopped or outcome.question or not tools.written:
        return False
    if not dirty:  # it wrote files back as they were: nothing to propose
        outcome.stopped = "the agent's edits left every file as it was: nothing to propose"
        return False
    _commit_and_push(clone, turn.conversation.branch, turn.text, outcome.summary or "", turn.agent)
    return True


def _carry_over_note(previous: dict, restored: list[str]) -> list[dict[str, str]]:
    """What became of the edits of a turn that ended without a commit: kept (a question or a stop) or lost."""
    notes = []
    if restored:
        notes.append(f"{GATEWAY_NOTE}Your uncommitted edits from the previous turn are still in the working copy: "
                     f"{', '.join(restored)}. Go on from them (preview before you finish).")
    lost = [] if previous.get("summary") else sorted(set(previous.get("written") or []) - set(restored))
    if lost:
        notes.append(f"{GATEWAY_NOTE}Your previous turn ended without a commit, so its edits to {', '.join(lost)} were "
                     "discarded: the files are as they are on the proposal branch (or main). Redo whatever edits "
                     "are still needed.")
    return [{"role": "user", "content": note} for note in notes]


# --- work in progress: a turn that ends in a question or a stop keeps its edits for the next turn -------


def _wip_ref(conversation_id: str) -> str:
    return f"refs/gateway/wip/{conversation_id}"


def _keep_work(clone: WorkingCopy, conversation_id: str, agent: Principal) -> None:
    clone.commit_and_push(f"work in progress of conversation {conversation_id}", agent.name,
                          _wip_ref(conversation_id), force=True)


def _restore_work(clone: WorkingCopy, conversation_id: str) -> list[str]:
    """Put the kept edits back as uncommitted changes; edits made on top of a branch that moved since are dropped."""
    ref = _wip_ref(conversation_id)
    kept = clone.fetch(ref)
    if kept is None:
        return []  # nothing kept
    if kept[1] != clone.head():
        _drop_work(clone, conversation_id)
        return []
    return clone.uncommit_onto(ref)


def _drop_work(clone: WorkingCopy, conversation_id: str) -> None:
    clone.delete_remote(_wip_ref(conversation_id))


def _conversation(ws: Records, person: Principal, conversation_id: str | None) -> _Conversation:
    with ws.store.session() as session:
        if conversation_id is None:
            conversation_id = uuid.uuid4().hex[:12]
            branch = f"agent/{conversation_id}"
            session.conversations.add(conversation_id, person, branch)
            return _Conversation(conversation_id, branch, None)
        record = session.conversations.get(conversation_id)
    if record is None or record.requester_id != person.id:
        raise NotFound(f"no conversation {conversation_id} of yours")
    return _Conversation(conversation_id, record.branch, record.proposal_id)


def _preview_tool(ws: Workspace, person: Principal) -> Callable[[str, Path], PreviewReport]:
    """The agent's preview: engine truth, masked, with policy findings; errors as text."""
    settings = ws.repo_settings()

    def preview(stack: str, root: Path) -> PreviewReport:
        if stack not in settings.stacks:
            return PreviewReport(f"error: unknown stack {stack!r} (stacks: {', '.join(sorted(settings.stacks))})", True)
        try:
            result = plan_directory(ws, settings, stack, root / settings.stacks[stack].path, "(working copy)",
                                    ChangeOrigin(by_agent=True, requester=person.name))
        except GatewayError as exc:
            return PreviewReport(f"error: the engine could not plan stack {stack}: {exc}", True)
        text = render_text(result.preview())
        denies = tuple(f"{f.rule} {f.address}" for f in result.findings if f.severity == "deny")
        verdict = (f"{len(denies)} policy deny finding(s): fix them before finishing." if denies
                   else "No policy denies.")
        return PreviewReport(f"{text}\n{verdict}", denies=denies)

    return preview


def _commit_and_push(clone: WorkingCopy, branch: str, request: str, summary: str, agent: Principal) -> None:
    message = f"{request.splitlines()[0][:72]}\n\n{summary}\n\nProposed-by: {agent.name}"
    clone.commit_and_push(message, agent.name, f"refs/heads/{branch}")


def _propose(ws: Workspace, agent: Principal, person: Principal, branch: str, request: str, summary: str,
             proposal_id: int | None, conversation_id: str, prompt_version: str, model: str) -> Proposal:
    if proposal_id is None:
        proposal = open_proposal(ws, agent, branch, request, requester=person, agent_claim=summary)
        with ws.store.session() as session:
            session.conversations.link(conversation_id, proposal.id)
            session.proposals.set_agent_details(proposal.id, prompt_version, model)
        return proposal
    with ws.store.session() as session:
        session.proposals.set_agent_details(proposal_id, prompt_version, model, agent_claim=summary)
    proposal, _ = sync_proposal(ws, proposal_id)
    return proposal


def _trail_of_calls(turn: _Turn) -> Callable[[str, dict], None]:
    """Every model call and tool call of the run, in the trail (what and how long, never the content)."""
    def record(kind: str, data: dict) -> None:
        turn.hold.renew()  # still working: keep holding it (a lost hold stops the turn before its next model call)
        with turn.ws.store.session() as session:
            session.audit.append(turn.agent, f"agent.{kind}", {
                **data, "conversation": turn.conversation.id, "model": turn.model.model,
                "prompt_version": turn.prompt.version})
    return record


def _record_request(ws: Records, person: Principal, agent: Principal, text: str, outcome: RequestOutcome,
                    prompt_version: str, model: str, failed: str | None = None) -> None:
    """The turn in the trail: what was asked and how it ended (`failed`: the error that ended it)."""
    with ws.store.session() as session:
        session.audit.append(person, "agent.request", {
            "request": text, "conversation": outcome.conversation_id, "agent": agent.name, "model": model,
            "prompt_version": prompt_version, "steps": outcome.steps, "tokens": outcome.tokens,
            "changed_files": outcome.changed_files, "summary": outcome.summary, "stopped": outcome.stopped,
            "waiting_for_answer": outcome.question, "failed": failed})

