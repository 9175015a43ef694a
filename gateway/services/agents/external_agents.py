"""What an external agent (an MCP client) may do through the gateway, and nothing more: read the
declarations, try changes against the engine and the policies, propose, and see where its proposals
stand. It never holds cloud keys, and it can never approve, override or apply.

It works in any repository of the gateway its person may request changes in (`request_refusals`): a tool names
one (`repository`, default: the repository the server works in, the gateway's default one unless it was started
in another), and a tool given a proposal works in that proposal's repository: there its person's proposals stay
readable (`follow_refusals`) after the repository is removed, so an agent sees how its change ended; nothing new
starts in a removed one.

Every call is made by an agent principal for the person it is bound to (`gateway users add NAME
--agent --for PERSON`), is rate-limited per agent, and lands in the trail (the arguments as a digest) as an event
of the repository it was about, which the trail's repository filter finds it by.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from agents.tools import PreviewReport, RepoTools
from gateway.domain.audit import EventQuery
from gateway.domain.errors import GatewayError, InputError, NotFound, Refused, ToolRefused
from gateway.domain.permissions import Action, follow_refusals, refusals, request_refusals
from gateway.domain.policy import RULES
from gateway.domain.preview import render_text
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.domain.repositories import Repository
from gateway.ports import WorkingCopy
from gateway.services.change.planning import ChangeOrigin, plan_directory
from gateway.services.change.proposals import get_proposal, open_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Configured, MainRules, Records, Workspace

T = TypeVar("T")
MAX_CHANGES = 50


@dataclass(frozen=True)
class Caller:
    agent: Principal
    person: Principal


def caller_of(ws: Records, principal: Principal) -> Caller:
    """The agent and the person it acts for, as the store holds them now; anything else is refused."""
    if not principal.is_agent:
        raise Refused([f"{principal.name} is not an agent: the MCP server is for agents acting for a person"])
    if principal.acting_for is None:
        raise Refused([f"{principal.name} acts for no person; an admin binds it with "
                       f"`gateway users add NAME --agent --for PERSON`"])
    with ws.store.session(readonly=True) as session:
        return Caller(session.principals.get(principal.id), session.principals.get(principal.acting_for))


def call(ws: Workspace, caller: Caller, tool: str, arguments: Mapping[str, Any], work: Callable[[], T]) -> T:
    """One tool call: rate-limited, allowed only while the agent and its person may act, recorded (arguments
    as a digest) with its outcome in the repository it was about, secrets scrubbed."""
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).hexdigest()
    outcome = "ok"
    try:
        _rate_limit(ws, caller.agent)
        _require_standing(ws, caller)
        result = work()
        return ws.scrubber.scrub(result) if isinstance(result, str) else ws.scrubber.scrub_data(result)
    except GatewayError as exc:
        outcome = f"refused: {exc}"
        raise
    finally:
        where = _repository_of_call(ws, arguments)
        with ws.store.for_repository(where).session() as session:
            session.audit.append(caller.agent, "mcp.call", {
                "tool": tool, "for": caller.person.name, "repository": where, "arguments_sha256": digest,
                "outcome": ws.scrubber.scrub(outcome)[:500]})


def _repository_of_call(ws: Records, arguments: Mapping[str, Any]) -> str:
    """The repository a call was about: its proposal's (where a tool given one works), else the one it names, else
    the server's. A name the gateway never served is the server's: the trail's repositories are registered ones (the
    arguments' digest keeps what was asked)."""
    proposal, named = arguments.get("proposal"), arguments.get("repository")
    with ws.store.session(readonly=True) as session:
        if isinstance(proposal, int) and (of_proposal := session.proposals.repository_of(proposal)) is not None:
            return of_proposal
        if isinstance(named, str) and session.repositories.get(named) is not None:
            return named
    return ws.store.repository


def _require_standing(ws: Records, caller: Caller) -> None:
    """At every call, read again: a person disabled or stripped of the role since the agent connected (a stdio
    session lasts as long as its client likes) stops the agent's very next call, reads included."""
    with ws.store.session(readonly=True) as session:
        agent, person = session.principals.get(caller.agent.id), session.principals.get(caller.person.id)
    if agent.disabled:
        raise Refused([f"{agent.name} is disabled"])
    reasons = refusals(person, Action.REQUEST)
    if reasons:
        raise Refused([f"{agent.name} acts for {person.name}, who may not request changes: {'; '.join(reasons)}"])


def _rate_limit(ws: Configured, agent: Principal) -> None:
    """Counted from the trail's `mcp.call` events, so every process serving agents (stdio, each API process)
    shares one limit per agent; refused calls count too."""
    limit = ws.settings.mcp_calls_per_minute
    since = (ws.clock.now() - timedelta(minutes=1)).isoformat(timespec="microseconds")
    with ws.store.session(readonly=True) as session:
        recent = session.audit.count(EventQuery(actor=agent.name, kind="mcp.call", since=since))
    if recent >= limit:
        raise Refused([f"{agent.name} made {limit} calls in the last minute (the limit); wait and try again"])


# --- repositories --------------------------------------------------------------------------------


def list_repositories(ws: Workspace, caller: Caller) -> list[dict[str, Any]]:
    """The repositories the agent may work in: every one the gateway serves whose changes its person may request;
    `default` marks the one a tool works in when it names none."""
    with ws.store.session(readonly=True) as session:
        person = session.principals.get(caller.person.id)
        known = session.repositories.list()
    return [{"name": r.name, "default": r.name == ws.repository} for r in known if not request_refusals(person, r)]


def in_repository(ws: Workspace, caller: Caller, name: str | None) -> Workspace:
    """The workspace of repository `name` (None: the server's own), once the agent's person may request changes
    there; an unknown or removed one is refused in words that say what to do instead."""
    return _repository_workspace(ws, caller, ws.repository if name is None else name, request_refusals)


def _repository_workspace(ws: Workspace, caller: Caller, name: str,
                          rule: Callable[[Principal, Repository], list[str]]) -> Workspace:
    with ws.store.session(readonly=True) as session:
        person = session.principals.get(caller.person.id)
        known = session.repositories.get(name)
    if known is None:
        raise NotFound(f"no repository {name!r} in this gateway: list_repositories names those "
                       f"{caller.agent.name} may work in")
    reasons = rule(person, known)
    if reasons:
        raise Refused([f"{caller.agent.name} may not work in repository {name} for {person.name}: "
                       f"{'; '.join(reasons)}; list_repositories names those it may work in"])
    return ws.in_repository(name)


def _of_proposal(ws: Workspace, caller: Caller, proposal_id: int,
                 repository: str | None = None) -> tuple[Workspace, Proposal]:
    """One of the person's or agent's proposals, and the workspace of its own repository, where every tool given a
    proposal only reads: its person's proposals stay readable there once the repository is removed."""
    there = ws.for_proposal(proposal_id)
    proposal = _own(there, caller, proposal_id)
    if repository is not None and repository != there.repository:
        raise InputError(f"proposal {proposal_id} is in repository {there.repository}, not {repository}: "
                         "leave `repository` out to work on a proposal where it is")
    return _repository_workspace(there, caller, there.repository, follow_refusals), proposal


# --- reading ------------------------------------------------------------------------------------


def list_stacks(ws: Workspace, caller: Caller, repository: str | None = None) -> list[dict[str, Any]]:
    """The stacks of the repository's main, by the names the gateway gives them (`repo/stack` in an added one)."""
    settings = in_repository(ws, caller, repository).repo_settings()
    return [{"name": s.name, "path": s.path, "engine": s.engine, "approver_groups": sorted(s.approver_groups),
             "protected": sorted(s.protected)} for s in settings.stacks.values()]


def read_file(ws: Workspace, caller: Caller, path: str, proposal: int | None = None,
              repository: str | None = None) -> str:
    ws, ref = _ref(ws, caller, proposal, repository)
    with _working_copy(ws, ref) as tools:
        return ws.scrubber.scrub(_tool(lambda: tools.read_text(path)))


def read_module(ws: Workspace, caller: Caller, stack: str, path: str | None = None, proposal: int | None = None,
                repository: str | None = None) -> str:
    """A file of a remote module a stack calls, as the engines plan it (read-only)."""
    ws, ref = _ref(ws, caller, proposal, repository)
    with _working_copy(ws, ref) as tools:
        return ws.scrubber.scrub(_tool(lambda: tools.tool_read_module(stack, path)))


def search(ws: Workspace, caller: Caller, pattern: str, proposal: int | None = None,
           repository: str | None = None) -> str:
    ws, ref = _ref(ws, caller, proposal, repository)
    with _working_copy(ws, ref) as tools:
        return ws.scrubber.scrub(_tool(lambda: tools.tool_search(pattern)))


def conventions(ws: Workspace, caller: Caller, repository: str | None = None) -> str:
    """Main's gateway.yaml: the stacks, approvers, protected paths and policy settings a change meets."""
    there: MainRules = in_repository(ws, caller, repository)
    return there.repo.read_file(there.repo.resolve(there.main_branch()), "gateway.yaml")


def policy_rules(ws: Workspace, caller: Caller, repository: str | None = None) -> str:
    """The built-in rules, and main's Rego policies as they are."""
    there: MainRules = in_repository(ws, caller, repository)
    main = there.repo.resolve(there.main_branch())
    rego = {path: text for path, text in there.repo.read_tree(main, "policies").items() if path.endswith(".rego")}
    lines = ["Built-in rules (every plan):"] + [f"- {rule.__name__}: {(rule.__doc__ or '').strip()}" for rule in RULES]
    lines += ["", "Rego policies on main:"] + [f"--- {path}\n{text}" for path, text in sorted(rego.items())]
    return "\n".join(lines)


# --- trying and proposing -------------------------------------------------------------------------


def preview(ws: Workspace, caller: Caller, changes: Mapping[str, str], repository: str | None = None) -> dict[str, Any]:
    """Plan the edits (path -> new content) on top of main, opening nothing: the masked preview per stack,
    its policy findings and its risk."""
    ws = in_repository(ws, caller, repository)
    with _working_copy(ws, ws.main_branch()) as tools:
        paths = _write(tools, changes)
        settings = ws.repo_settings()
        stacks = settings.stacks_touched(paths, lambda path: ws.declarations.local_modules(path, tools.root))
        out: dict[str, Any] = {"repository": ws.repository, "changed_paths": paths, "stacks": {}}
        for stack in stacks:
            try:
                result = plan_directory(ws, settings, stack, tools.root / settings.stacks[stack].path,
                                        "(preview)", ChangeOrigin(True, caller.person.name, tuple(paths)))
            except GatewayError as exc:
                out["stacks"][stack] = {"error": ws.scrubber.scrub(str(exc))}
                continue
            out["stacks"][stack] = {
                "preview": ws.scrubber.scrub(render_text(result.preview())), "risk": result.risk.to_json(),
                "findings": [f.to_json() for f in result.findings],
                "denies": sum(1 for f in result.findings if f.severity == "deny")}
    return out


def propose(ws: Workspace, caller: Caller, changes: Mapping[str, str], reason: str,
            repository: str | None = None) -> dict[str, Any]:
    """Open a proposal of the edits on a new branch, for the person; the agent is its proposer."""
    if not reason.strip():
        raise InputError("say why: a proposal needs a reason")
    ws = in_repository(ws, caller, repository)
    branch = f"mcp/{caller.agent.name}-{uuid.uuid4().hex[:8]}"
    with _clone(ws, ws.main_branch()) as clone:
        _write(_tools(ws, clone), changes)
        clone.new_branch(branch)
        clone.commit_and_push(f"{reason.strip().splitlines()[0][:72]}\n\n"
                              f"Proposed-by: {caller.agent.name} for {caller.person.name}",
                              caller.agent.name, f"refs/heads/{branch}")
    proposal = open_proposal(ws, caller.agent, branch, reason, requester=caller.person)
    return {"proposal": proposal.id, "repository": ws.repository, "branch": branch, "status": proposal.status.value,
            "stacks": list(proposal.stacks), "review": f"{ws.settings.public_url.rstrip('/')}/proposals/{proposal.id}"}


def proposal_status(ws: Workspace, caller: Caller, proposal_id: int) -> dict[str, Any]:
    """Where a proposal of this person or agent stands, and what blocks it; never a way to approve."""
    ws, proposal = _of_proposal(ws, caller, proposal_id)
    view = view_proposal(ws, caller.agent, proposal.id)
    return {"proposal": proposal.id, "repository": ws.repository, "stacks": list(proposal.stacks), "status": proposal.status.value, "risk": proposal.risk.value,
            "required_approvals": view.required_approvals, "blocked_by": view.blocked_by,
            "approvals": sorted({d.principal.name for d in proposal.current_approvals}),
            "pending": view.pending, "findings": [f.to_json() for f in proposal.findings],
            "review": f"{ws.settings.public_url.rstrip('/')}/proposals/{proposal.id}"}


# -------------------------------------------------------------------------------------------------


def _own(ws: Records, caller: Caller, proposal_id: int) -> Proposal:
    try:
        proposal = get_proposal(ws, proposal_id)
    except NotFound:
        proposal = None
    if proposal is None or caller.person.id != proposal.requester.id and caller.agent.id != proposal.proposer.id:
        raise NotFound(f"no proposal {proposal_id} of {caller.person.name}'s")
    return proposal


def _ref(ws: Workspace, caller: Caller, proposal_id: int | None, repository: str | None) -> tuple[Workspace, str]:
    """Where to read: the proposal's head in its own repository, or main of the repository named (or the server's)."""
    if proposal_id is not None:
        there, proposal = _of_proposal(ws, caller, proposal_id, repository)
        return there, proposal.head_sha
    there = in_repository(ws, caller, repository)
    return there, there.main_branch()


@contextmanager
def _working_copy(ws: Workspace, ref: str) -> Iterator[RepoTools]:
    """A clone of the declaration repo at `ref`, with the built-in agent's confined tools over it."""
    with _clone(ws, ref) as clone:
        yield _tools(ws, clone)


@contextmanager
def _clone(ws: Workspace, ref: str) -> Iterator[WorkingCopy]:
    with tempfile.TemporaryDirectory(prefix="gw-mcp-") as tmp:
        yield ws.working_copies.clone(Path(tmp) / "repo", at=ref)


def _tools(ws: Workspace, clone: WorkingCopy) -> RepoTools:
    settings = ws.repo_settings()
    return RepoTools(clone.root, settings.protected_paths, lambda _s, _p: PreviewReport(""),
                     {name: stack.path for name, stack in settings.stacks.items()},
                     ws.modules.installed if ws.modules else None)


def _write(tools: RepoTools, changes: Mapping[str, str]) -> list[str]:
    if not changes:
        raise InputError("no changes: give at least one path and its new content")
    if len(changes) > MAX_CHANGES:
        raise InputError(f"too many files at once ({len(changes)}, at most {MAX_CHANGES})")
    for path, content in changes.items():
        if not isinstance(content, str):
            raise InputError(f"{path}: the new content must be text")
        _tool(lambda path=path, content=content: tools.tool_write_file(path, content))
    return sorted(tools.written)


def _tool(work: Callable[[], str]) -> str:
    """The built-in agent's confined tools; what they refuse is a refusal here too."""
    try:
        return work()
    except ToolRefused as exc:
        raise Refused([str(exc)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{type(exc).__name__}: {exc}") from None
