"""External agents through the MCP server, driven by the official SDK's own client over stdio (the real
`gateway mcp` command) and over streamable HTTP (the real app under uvicorn, bearer tokens)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from gateway.api.app import create_app
from gateway.domain.errors import Refused
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision
from gateway.services.admin.users import add_principal, authenticate, disable_principal, enable_principal, set_access
from gateway.services.agents import external_agents
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People

QUEUE = ('resource "aws_sqs_queue" "refunds" {\n  name = "refund-events"\n'
         '  tags = { owner = "payments", "cost-centre" = "cc-42" }\n}\n')
PUBLIC = ('resource "aws_s3_bucket" "site" {\n  bucket = "orders-site"\n  acl    = "public-read"\n'
          '  tags   = { owner = "web", "cost-centre" = "cc-1" }\n}\n')


@pytest.fixture
def agents(workspace: Workspace, people: People) -> dict[str, str]:
    """Tokens: an external agent acting for alice, and one acting for nobody."""
    bound = add_principal(workspace, people.admin, "editor-agent", frozenset({Role.REQUESTER}),
                          kind=PrincipalKind.AGENT, acting_for="alice")[1]
    loose = add_principal(workspace, people.admin, "loose-agent", frozenset({Role.REQUESTER}),
                          kind=PrincipalKind.AGENT)[1]
    return {"bound": bound, "loose": loose}


def stdio(workspace: Workspace, token: str) -> Client:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(workspace.settings.home), "GATEWAY_TOKEN": token, "GATEWAY_LOG_LEVEL": "error"})
    return Client(StdioServerParameters(command=sys.executable, args=["-m", "gateway.cli", "mcp"], env=env))


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(test)


async def text(client: Client, tool: str, **arguments: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), "".join(getattr(c, "text", "") for c in result.content)


def test_an_external_agent_previews_and_proposes_over_stdio_and_can_do_nothing_more(
        workspace: Workspace, people: People, agents: dict[str, str]) -> None:
    secret = str(stack_secrets(workspace.settings, "data")["db_password"])
    said: list[str] = []

    async def session() -> int:
        async with stdio(workspace, agents["bound"]) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == {"list_repositories", "list_stacks", "read_file", "read_module", "search", "preview", "propose",
                             "proposal_status"}
            error, stacks = await text(client, "list_stacks")
            assert not error and "app-staging" in stacks
            error, compliant = await text(client, "preview", changes={"stacks/app-staging/queue.tf": QUEUE})
            said.append(compliant)
            assert not error and json.loads(compliant)["stacks"]["app-staging"]["denies"] == 0
            assert "aws_sqs_queue.refunds" in json.loads(compliant)["stacks"]["app-staging"]["preview"]
            error, denied = await text(client, "preview", changes={"stacks/app-staging/site.tf": PUBLIC})
            said.append(denied)
            assert json.loads(denied)["stacks"]["app-staging"]["denies"] >= 1
            error, db = await text(client, "preview", changes={"stacks/data/main.tf": workspace.repo.read_file(
                workspace.repo.resolve("main"), "stacks/data/main.tf").replace("db.t4g.medium", "db.r6g.large")})
            said.append(db)
            error, escaped = await text(client, "read_file", path="../../../etc/passwd")
            assert error and "would leave the repository" in escaped
            error, protected = await text(client, "propose", changes={"gateway.yaml": "stacks: {}\n"}, reason="x")
            assert error and "protected path" in protected
            conventions = (await client.read_resource("gateway://conventions")).contents[0].text
            assert "approvers" in conventions
            policies = (await client.read_resource("gateway://policies")).contents[0].text
            assert "Built-in rules" in policies and "package" in policies  # main's Rego, as it is
            error, found = await text(client, "search", pattern="db_password")
            said.append(found)  # where the variable is declared and used; never its value
            assert not error and "stacks/data/" in found, found
            error, opened = await text(client, "propose", changes={"stacks/app-staging/queue.tf": QUEUE},
                                       reason="a queue for refund events")
            said.append(opened)
            assert not error, opened
            proposal_id = int(json.loads(opened)["proposal"])
            error, status = await text(client, "proposal_status", proposal=proposal_id)
            said.append(status)
            assert not error and "needs 1 approval" in " ".join(json.loads(status)["blocked_by"])
            error, other = await text(client, "proposal_status", proposal=proposal_id + 100)
            assert error and "no proposal" in other
            return proposal_id

    proposal_id = run(session)
    proposal = get_proposal(workspace, proposal_id)
    assert (proposal.requester.name, proposal.proposer.name) == ("alice", "editor-agent")
    with pytest.raises(Refused, match="editor-agent is an agent; agents can never approve"):
        decide(workspace, proposal.proposer, proposal_id, Decision.APPROVE, "")
    assert all(secret not in s for s in said)
    with workspace.store.session(readonly=True) as session:
        calls = [e for e in session.audit.events(kind="mcp.call")]
    assert {e.actor for e in calls} == {"editor-agent"} and {e.payload["for"] for e in calls} == {"alice"}
    assert any(e.payload["outcome"].startswith("refused:") for e in calls)

    async def loose() -> str:
        async with stdio(workspace, agents["loose"]) as client:
            error, answer = await text(client, "list_stacks")
            assert error
            return answer

    assert "acts for no person" in run(loose)


@pytest.fixture
def served(workspace: Workspace) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(workspace.settings, workers=0), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_the_service_serves_mcp_over_http_with_bearer_tokens(workspace: Workspace, people: People,
                                                              agents: dict[str, str], served: str) -> None:
    assert httpx.post(f"{served}/mcp/", json={}).status_code == 401

    async def session(token: str) -> tuple[bool, str]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
                Client(streamable_http_client(f"{served}/mcp/", http_client=http)) as client:
            return await text(client, "propose", changes={"stacks/app-staging/queue.tf": QUEUE}, reason="a queue")

    error, opened = run(lambda: session(agents["bound"]))
    assert not error, opened
    assert get_proposal(workspace, int(json.loads(opened)["proposal"])).requester.name == "alice"
    error, refused = run(lambda: session(people.tokens["alice"]))  # a person's token: not an agent
    assert error and "is not an agent" in refused


def test_the_call_limit_is_one_per_agent_across_every_process_serving_it(workspace: Workspace, people: People,
                                                                         agents: dict[str, str]) -> None:
    ws = replace(workspace, settings=workspace.settings.model_copy(update={"mcp_calls_per_minute": 3}))
    caller = external_agents.caller_of(ws, authenticate(ws, agents["bound"]))
    with ws.store.session() as session:  # two calls another process served a moment ago
        for _ in range(2):
            session.audit.append(caller.agent, "mcp.call", {"tool": "list_stacks", "outcome": "ok"})
    assert external_agents.call(ws, caller, "list_stacks", {}, lambda: "ok") == "ok"  # the third
    with pytest.raises(Refused, match="editor-agent made 3 calls in the last minute"):
        external_agents.call(ws, caller, "list_stacks", {}, lambda: "ok")


def test_an_agent_stops_acting_for_a_person_the_moment_they_are_disabled_or_lose_the_role(
        workspace: Workspace, people: People, agents: dict[str, str]) -> None:
    answers: dict[str, tuple[bool, str]] = {}

    async def session() -> None:
        async with stdio(workspace, agents["bound"]) as client:  # one long session: nothing is kept from its start
            answers["before"] = await text(client, "read_file", path="gateway.yaml")
            disable_principal(workspace, people.admin, "alice", "left the company")
            answers["read_file"] = await text(client, "read_file", path="gateway.yaml")
            answers["search"] = await text(client, "search", pattern="bucket")
            answers["preview"] = await text(client, "preview", changes={"stacks/app-staging/queue.tf": QUEUE})
            answers["propose"] = await text(client, "propose", changes={"stacks/app-staging/queue.tf": QUEUE},
                                            reason="a queue for refund events")
            enable_principal(workspace, people.admin, "alice", "came back")
            set_access(workspace, people.admin, "alice", frozenset({Role.AUDITOR}), None)
            answers["auditor"] = await text(client, "propose", changes={"stacks/app-staging/queue.tf": QUEUE},
                                            reason="a queue for refund events")
            set_access(workspace, people.admin, "alice", frozenset({Role.REQUESTER}), None)
            answers["after"] = await text(client, "read_file", path="gateway.yaml")

    run(session)
    assert answers["before"] == (False, answers["after"][1]) and "stacks:" in answers["after"][1]
    for tool in ("read_file", "search", "preview", "propose"):
        error, said = answers[tool]
        assert error and "alice is disabled" in said, (tool, said)
    error, said = answers["auditor"]
    assert error and "alice, who may not request changes" in said, said
    with workspace.store.session(readonly=True) as session:
        assert session.proposals.list() == []
        refused = [e.payload for e in session.audit.events(kind="mcp.call") if e.payload["outcome"].startswith("refused")]
    # the refusals are in the trail, for whom the agent tried to act
    assert {p["tool"] for p in refused} >= {"read_file", "search", "preview", "propose"}
    assert {p["for"] for p in refused} == {"alice"}


def test_a_disabled_requester_opens_no_proposal_whatever_the_way_in(
        workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("queue").write("stacks/app-staging/queue.tf", QUEUE).push()
    disable_principal(workspace, people.admin, "alice", "left the company")
    # the principals as they were read before she was disabled: the rule reads who she is now
    with pytest.raises(Refused, match="alice is disabled"):
        open_proposal(workspace, people.alice, "queue", "a queue")
    with pytest.raises(Refused, match="alice is disabled"):
        open_proposal(workspace, people.agent, "queue", "a queue", requester=people.alice)
    disable_principal(workspace, people.admin, "infra-agent", "retired")
    enable_principal(workspace, people.admin, "alice", "came back")
    with pytest.raises(Refused, match="infra-agent is disabled"):
        open_proposal(workspace, people.agent, "queue", "a queue", requester=people.alice)
    with workspace.store.session(readonly=True) as session:
        assert session.proposals.list() == []
    assert open_proposal(workspace, people.alice, "queue", "a queue").requester.name == "alice"


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|aa)+$", r"(a|a)+$"])
def test_a_catastrophic_search_pattern_answers_quickly_and_holds_no_worker(
        workspace: Workspace, people: People, agents: dict[str, str], clone: Clone, pattern: str) -> None:
    # a line that makes a backtracking engine take longer than anyone waits on these patterns
    clone.write("stacks/app-staging/notes.tf", "# " + "a" * 64 + "b\n").push("notes", author="admin")
    answers: list[tuple[bool, str, float]] = []

    async def session() -> None:
        async with stdio(workspace, agents["bound"]) as client:
            with anyio.fail_after(60):  # before the fix the server never answered; fail rather than hang
                started = time.monotonic()
                error, said = await text(client, "search", pattern=pattern)
                answers.append((error, said, time.monotonic() - started))
                error, said = await text(client, "search", pattern="aaab")  # the server is free again
                answers.append((error, said, 0.0))

    run(session)
    (error, said, took), (after_error, after, _) = answers
    assert took < 20, took
    # refused in words, or answered (the line of a's ends in b, so it is no match); never a held worker
    assert (error and "took too long" in said) or (not error and "notes.tf" not in said), said
    if pattern != r"(a+)+$":  # the engine answers that one at once; these two it must stop
        assert error and "refused: the search took too long" in said, said
    assert not after_error and "stacks/app-staging/notes.tf:1:" in after
