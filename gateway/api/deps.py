"""Dependencies of the routes, as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.domain.errors import AuthError, NotFound
from gateway.domain.principals import Principal
from gateway.services.admin.users import authenticate
from gateway.services.workspace import Workspace

bearer = HTTPBearer(auto_error=False, description="the API token `gateway users add` printed")


def request_workspace(request: Request) -> Workspace:
    """This request's workspace, with its own git handle; kept on the request so its page chrome reuses it."""
    ws: Workspace = request.app.state.workspace.for_request()
    request.state.workspace = ws
    return ws


async def get_workspace(request: Request) -> Workspace:
    """The dependency: opening the handles touches no database and spawns nothing, so it need not take a thread
    of the pool (each hop to the pool costs a read as much as a query)."""
    return request_workspace(request)


WorkspaceDep = Annotated[Workspace, Depends(get_workspace)]


def api_actor(ws: WorkspaceDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    return authenticate(ws, credentials.credentials if credentials else None)


ActorDep = Annotated[Principal, Depends(api_actor)]


def page_actor(request: Request, ws: WorkspaceDep) -> Principal:
    """The signed-in person of a page, from the session cookie."""
    principal_id = request.session.get("principal")
    if not principal_id:
        raise AuthError("sign in first")
    # only "no such person" ends the session; a database error is the database's (503), not a sign-out
    try:
        with ws.store.session(readonly=True) as session:
            principal: Principal | None = session.principals.get(principal_id)
    except NotFound:
        principal = None
    if principal is None or principal.disabled:  # a disabled person's sessions end at once
        request.session.clear()
        raise AuthError("your session is no longer valid; sign in again")
    return principal


PageActorDep = Annotated[Principal, Depends(page_actor)]

ProposalId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the proposal's number")]
JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the job's number")]
