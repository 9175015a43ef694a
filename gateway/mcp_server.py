"""The gateway's MCP server (the official MCP Python SDK): `gateway mcp` over stdio, and `/mcp` on the
service over streamable HTTP with a bearer token. Thin: every tool is a function of
services/agents/external_agents.py, run off the event loop, its refusals returned as tool errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from agents.prompts import load_prompt
from gateway.domain.errors import AuthError, GatewayError, Refused
from gateway.domain.principals import Principal
from gateway.services.admin.users import authenticate
from gateway.services.agents import external_agents as agents
from gateway.services.workspace import Workspace

INSTRUCTIONS = "mcp_instructions"  # agents/prompts/mcp_instructions.md: what the external agent is told


class GatewayTokens:
    """The SDK's bearer check with the gateway's own tokens: any valid token passes; the tools decide."""

    def __init__(self, ws: Workspace):
        self.ws = ws

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            principal = await anyio.to_thread.run_sync(authenticate, self.ws, token)
        except GatewayError:
            return None
        return AccessToken(token=token, client_id=principal.id, scopes=[], subject=principal.id)


def build_server(ws: Workspace, principal: Principal | None = None) -> MCPServer:
    """Over stdio, `principal` is who started it (GATEWAY_TOKEN); over HTTP, each request's bearer token."""
    http = principal is None
    public = ws.settings.public_url.rstrip("/")
    server = MCPServer(
        "change-gateway", instructions=load_prompt(INSTRUCTIONS).text,
        token_verifier=GatewayTokens(ws) if http else None,
        auth=AuthSettings(issuer_url=public, resource_server_url=f"{public}/mcp", validate_token_resource=False)
        if http else None)  # the gateway's own tokens: not issued for another resource

    def current() -> tuple[Workspace, agents.Caller]:
        request_ws = ws.for_request()
        who = principal
        if who is None:
            token = get_access_token()
            if token is None:
                raise AuthError("send `Authorization: Bearer TOKEN` with an agent's token")
            with request_ws.store.session(readonly=True) as session:
                who = session.principals.get(token.client_id)
        return request_ws, agents.caller_of(request_ws, who)

    async def run(tool: str, arguments: dict[str, Any], work: Callable[[Workspace, agents.Caller], Any]) -> str:
        def blocking() -> str:
            request_ws, caller = current()
            result = agents.call(request_ws, caller, tool, arguments, partial(work, request_ws, caller))
            return result if isinstance(result, str) else json.dumps(result, indent=2)
        try:
            return await anyio.to_thread.run_sync(blocking)
        except Refused as exc:
            raise ToolError("refused: " + "; ".join(exc.reasons)) from None
        except GatewayError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    default = ws.repository
    where = f" In `repository`, one of list_repositories (default {default})."
    where_or_proposal = where + " With `proposal`, in that proposal's own repository."

    @server.tool(description="The repositories of declarations you may work in (for the person you act for); "
                             f"every tool works in `{default}` unless given another as `repository`.")
    async def list_repositories() -> str:
        return await run("list_repositories", {}, agents.list_repositories)

    @server.tool(description="The stacks of a declaration repository: name, path, engine, approver groups, "
                             "protected resources." + where)
    async def list_stacks(repository: str | None = None) -> str:
        return await run("list_stacks", {"repository": repository},
                         lambda w, c: agents.list_stacks(w, c, repository))

    @server.tool(description="Read a file of main, or of one of your proposals' branches (by proposal number)."
                             + where_or_proposal)
    async def read_file(path: str, proposal: int | None = None, repository: str | None = None) -> str:
        return await run("read_file", {"path": path, "proposal": proposal, "repository": repository},
                         lambda w, c: agents.read_file(w, c, path, proposal, repository))

    @server.tool(description="Read a file of a registry, git or HTTP module a stack calls, as `terraform init` "
                             "installs it (read-only); path under .terraform/modules/, or null to list them."
                             + where_or_proposal)
    async def read_module(stack: str, path: str | None = None, proposal: int | None = None,
                          repository: str | None = None) -> str:
        return await run("read_module", {"stack": stack, "path": path, "proposal": proposal, "repository": repository},
                         lambda w, c: agents.read_module(w, c, stack, path, proposal, repository))

    @server.tool(description="Search main's (or a proposal's) text files for a regular expression."
                             + where_or_proposal)
    async def search(pattern: str, proposal: int | None = None, repository: str | None = None) -> str:
        return await run("search", {"pattern": pattern, "proposal": proposal, "repository": repository},
                         lambda w, c: agents.search(w, c, pattern, proposal, repository))

    @server.tool(description="Plan edits (path -> whole new file content) on top of main without opening anything: "
                             "the engine's preview per stack, policy findings and risk." + where)
    async def preview(changes: dict[str, str], repository: str | None = None) -> str:
        return await run("preview", {"changes": changes, "repository": repository},
                         lambda w, c: agents.preview(w, c, changes, repository))

    @server.tool(description="Open a proposal of the edits (path -> whole new file content) with a reason, for "
                             "the person you act for; returns its number and review link." + where)
    async def propose(changes: dict[str, str], reason: str, repository: str | None = None) -> str:
        return await run("propose", {"changes": changes, "reason": reason, "repository": repository},
                         lambda w, c: agents.propose(w, c, changes, reason, repository))

    @server.tool(description="Where one of your proposals stands, in whichever repository it is: status, risk, "
                             "findings, what still blocks it.")
    async def proposal_status(proposal: int) -> str:
        return await run("proposal_status", {"proposal": proposal},
                         lambda w, c: agents.proposal_status(w, c, proposal))

    @server.resource("gateway://conventions", mime_type="text/yaml",
                     description=f"Main's gateway.yaml in {default}: stacks, approvers, protected paths, policy "
                                 "settings.")
    async def conventions() -> str:
        return await run("conventions", {}, lambda w, c: agents.conventions(w, c))

    @server.resource("gateway://repos/{repository}/conventions", mime_type="text/yaml",
                     description="Main's gateway.yaml in a repository of list_repositories.")
    async def repository_conventions(repository: str) -> str:
        return await run("conventions", {"repository": repository},
                         lambda w, c: agents.conventions(w, c, repository))

    @server.resource("gateway://policies", mime_type="text/plain",
                     description=f"The built-in policy rules and main's Rego policies in {default}.")
    async def policies() -> str:
        return await run("policies", {}, lambda w, c: agents.policy_rules(w, c))

    @server.resource("gateway://repos/{repository}/policies", mime_type="text/plain",
                     description="The built-in policy rules and main's Rego policies in a repository of "
                                 "list_repositories.")
    async def repository_policies(repository: str) -> str:
        return await run("policies", {"repository": repository},
                         lambda w, c: agents.policy_rules(w, c, repository))

    return server


def http_app(server: MCPServer, ws: Workspace) -> Starlette:
    """The streamable-HTTP app to mount at /mcp, accepting the public URL's host and loopback."""
    host = urlsplit(ws.settings.public_url).netloc
    hosts = [host, "127.0.0.1:*", "localhost:*", "[::1]:*", "testserver"]
    security = TransportSecuritySettings(allowed_hosts=hosts,
                                         allowed_origins=[f"{urlsplit(ws.settings.public_url).scheme}://{host}",
                                                          "http://127.0.0.1:*", "http://localhost:*"])
    # stateless: any API process answers any request (no session lives in one process's memory)
    return server.streamable_http_app(streamable_http_path="/", transport_security=security, stateless_http=True,
                                      json_response=True)


class McpMount:
    """The ASGI app mounted at /mcp: a fresh MCP server for each run of the service's lifespan (an SDK session
    manager runs once), answering 503 outside one."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        self._app: Starlette | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        server = build_server(self.ws)
        self._app = http_app(server, self.ws)
        try:
            async with server.session_manager.run():
                yield
        finally:
            self._app = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            response = JSONResponse({"error": "NotConfigured", "detail": "the MCP server is not running"}, 503)
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)
