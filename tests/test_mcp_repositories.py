"""An external agent works in every repository of the gateway its person may request changes in, and in no other:
over the real `gateway mcp` (stdio, the SDK's own client) it lists the repositories, reads and proposes in `data`
by data's own rules, follows a proposal to its repository, and is told in words (no traceback) when it names a
repository the gateway does not serve or no longer serves. The built-in agent works in the repository the
command is given (`gateway --repo data request ...`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.domain.errors import GatewayError, NotFound, Refused
from gateway.domain.principals import PrincipalKind, Role
from gateway.services.admin.audit import list_events
from gateway.services.admin.repositories import remove_repository
from gateway.services.admin.users import add_principal, authenticate, set_access
from gateway.services.agents import external_agents
from gateway.services.change.proposals import abandon_proposal, get_proposal
from gateway.services.workspace import Workspace

from .conftest import run_cli
from .model_stub import ModelStub, tool_call
from .test_mcp import run, stdio, text
from .test_repositories import QUEUE, Two, _two


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Two]:
    world = _two(tmp_path / "home", tmp_path)
    yield world
    world.ws.close()


@pytest.fixture
def token(two: Two) -> str:
    """An external agent acting for alice, who may request changes (in every repository of the gateway)."""
    return add_principal(two.ws, two.people.admin, "editor-agent", frozenset({Role.REQUESTER}),
                         kind=PrincipalKind.AGENT, acting_for="alice")[1]


def test_an_external_agent_lists_reads_and_proposes_in_another_repository_by_its_rules(two: Two, token: str) -> None:
    said: dict[str, tuple[bool, str]] = {}

    async def session() -> None:
        async with stdio(two.ws, token) as client:
            said["repositories"] = await text(client, "list_repositories")
            said["stacks"] = await text(client, "list_stacks", repository="data")
            said["own stacks"] = await text(client, "list_stacks")
            said["conventions"] = (False, (await client.read_resource("gateway://repos/data/conventions"))
                                   .contents[0].text)
            said["policies"] = (False, (await client.read_resource("gateway://repos/data/policies")).contents[0].text)
            said["denied"] = await text(client, "preview", changes={"stacks/network/extra.tf": QUEUE % "orders-q"},
                                        repository="data")
            said["proposed"] = await text(client, "propose", changes={"stacks/network/extra.tf": QUEUE % "data-q"},
                                          reason="a queue for data", repository="data")
            proposal = json.loads(said["proposed"][1])["proposal"]
            said["status"] = await text(client, "proposal_status", proposal=proposal)
            said["branch file"] = await text(client, "read_file", path="stacks/network/extra.tf", proposal=proposal)
            said["elsewhere"] = await text(client, "read_file", path="stacks/network/extra.tf", proposal=proposal,
                                           repository="declarations")
            said["unknown"] = await text(client, "list_stacks", repository="nope")
            said["unknown propose"] = await text(client, "propose", changes={"stacks/network/x.tf": "# x\n"},
                                                 reason="x", repository="nope")

    run(session)
    error, repositories = said["repositories"]
    assert not error and json.loads(repositories) == [{"name": "data", "default": False},
                                                      {"name": "declarations", "default": True}]
    error, stacks = said["stacks"]
    assert not error and [(s["name"], s["path"]) for s in json.loads(stacks)] == [("data/network", "stacks/network")]
    assert "data/network" not in said["own stacks"][1] and "app-staging" in said["own stacks"][1]
    assert "required_tags: [team]" in said["conventions"][1]  # data's gateway.yaml, not the workspace's
    assert "queue-prefix" in said["policies"][1]  # data's Rego
    error, denied = said["denied"]
    assert not error and json.loads(denied)["stacks"]["data/network"]["denies"] >= 1, denied

    error, proposed = said["proposed"]
    assert not error, proposed
    opened = json.loads(proposed)
    assert (opened["repository"], opened["stacks"]) == ("data", ["data/network"])
    error, status = said["status"]  # found in its own repository: the tool was given only its number
    assert not error and (json.loads(status)["repository"], json.loads(status)["stacks"]) == ("data", ["data/network"])
    error, on_branch = said["branch file"]
    assert not error and 'name = "data-q"' in on_branch
    error, elsewhere = said["elsewhere"]
    assert error and f"proposal {opened['proposal']} is in repository data, not declarations" in elsewhere
    for refused in ("unknown", "unknown propose"):
        error, answer = said[refused]
        assert error and "no repository 'nope' in this gateway: list_repositories names those" in answer, answer
        assert "Traceback" not in answer

    proposal = get_proposal(two.data, opened["proposal"])
    assert (proposal.requester.name, proposal.proposer.name) == ("alice", "editor-agent")
    with two.ws.store.session(readonly=True) as session:  # nothing was proposed in the workspace's own repository
        assert session.proposals.list() == []


def test_a_removed_repository_takes_no_new_work_but_the_agent_still_sees_how_its_change_ended(
        two: Two, token: str) -> None:
    caller = external_agents.caller_of(two.ws, authenticate(two.ws, token))
    opened = external_agents.propose(two.ws, caller, {"stacks/network/extra.tf": QUEUE % "data-q"}, "a queue", "data")
    remove_repository(two.ws, two.people.admin, "data")
    abandon_proposal(two.data, two.people.erin, opened["proposal"], "data is no longer served")

    assert external_agents.list_repositories(two.ws, caller) == [{"name": "declarations", "default": True}]
    with pytest.raises(Refused, match="editor-agent may not work in repository data for alice: repository data "
                                      "was removed from the gateway by admin; list_repositories names"):
        external_agents.list_stacks(two.ws, caller, "data")
    with pytest.raises(Refused, match="repository data was removed"):
        external_agents.propose(two.ws, caller, {"stacks/network/extra.tf": QUEUE % "data-r"}, "another", "data")
    status = external_agents.proposal_status(two.ws, caller, opened["proposal"])  # reading how it ended
    assert (status["repository"], status["status"]) == ("data", "abandoned")
    on_branch = external_agents.read_file(two.ws, caller, "stacks/network/extra.tf", proposal=opened["proposal"])
    assert 'name = "data-q"' in on_branch
    with pytest.raises(NotFound, match="no proposal"):  # a proposal of no one it acts for, wherever it is
        external_agents.proposal_status(two.ws, caller, opened["proposal"] + 1)
    assert external_agents.list_stacks(two.ws, caller)[0]["name"] in two.ws.repo_settings().stacks

    set_access(two.ws, two.people.admin, "alice", frozenset({Role.AUDITOR}), None)
    with pytest.raises(Refused, match="alice has no role that may request changes"):  # reading needs the standing
        external_agents.proposal_status(two.ws, caller, opened["proposal"])


def test_an_agent_s_calls_are_in_the_trail_of_the_repository_they_were_about(two: Two, token: str) -> None:
    caller = external_agents.caller_of(two.ws, authenticate(two.ws, token))

    def call(tool: str, arguments: dict[str, Any], work: Callable[[], Any]) -> None:
        try:
            external_agents.call(two.ws, caller, tool, arguments, work)
        except GatewayError:
            pass  # refused calls are recorded too

    changes = {"stacks/network/extra.tf": QUEUE % "data-q"}
    call("propose", {"changes": changes, "reason": "a queue", "repository": "data"},
         lambda: external_agents.propose(two.ws, caller, changes, "a queue", "data"))
    [proposal] = _proposals(two.data)
    call("proposal_status", {"proposal": proposal},  # named by its number only: data's, where it is
         lambda: external_agents.proposal_status(two.ws, caller, proposal))
    call("list_stacks", {"repository": None}, lambda: external_agents.list_stacks(two.ws, caller))
    call("list_stacks", {"repository": "nope"}, lambda: external_agents.list_stacks(two.ws, caller, "nope"))

    def tools_in(repository: str) -> list[tuple[str, str, bool]]:
        events = list_events(two.ws, two.people.dana, action="mcp.call", repository=repository)
        return [(e.payload["tool"], e.payload["repository"], e.payload["outcome"] == "ok") for e in events]

    assert tools_in("data") == [("propose", "data", True), ("proposal_status", "data", True)]
    # the server's own repository: its calls, and one naming a repository the gateway never served
    assert tools_in("declarations") == [("list_stacks", "declarations", True), ("list_stacks", "declarations", False)]
    listed = run_cli(["audit", "list", "--repo", "data", "--actor", "editor-agent", "--action", "mcp.call"],
                     two.ws.settings.home, two.people.tokens["dana"])
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[3] for line in listed.stdout.splitlines()] == ["mcp.call", "mcp.call"]


def _proposals(ws: Workspace) -> list[int]:
    with ws.store.session(readonly=True) as session:
        return [p.id for p in session.proposals.list()]


def test_the_built_in_agent_works_in_the_repository_the_command_names(two: Two) -> None:
    with ModelStub() as stub:
        stub.turns = [
            tool_call("write_file", path="stacks/network/extra.tf", content=QUEUE % "data-asked"),
            tool_call("run_preview", stack="data/network"),
            tool_call("finish", summary="Added aws_sqs_queue.extra; the plan only creates it."),
        ]
        result = run_cli(["--repo", "data", "request", "Add a queue named data-asked"], two.ws.settings.home,
                         token=two.people.tokens["alice"], OPENAI_BASE_URL=stub.base_url, OPENAI_API_KEY="k",
                         GATEWAY_MODEL="stub-model")
    assert result.returncode == 0, result.stderr
    assert "opened by gateway-agent for alice" in result.stdout and "data/network" in result.stdout
    with two.data.store.session(readonly=True) as session:
        [listed] = session.proposals.list()
    proposal = get_proposal(two.data, listed.id)
    assert proposal.stacks == ("data/network",) and proposal.requester.name == "alice"
    with two.ws.store.session(readonly=True) as session:
        assert session.proposals.list() == []
