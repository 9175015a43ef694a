"""Dependencies of the routes, as Annotated aliases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar
from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.api.access_log import note_principal
from gateway.domain.errors import AuthError
from gateway.domain.principals import Principal
from gateway.services.admin.sign_in import SignedIn, signed_in
from gateway.services.admin.users import LastUse, authenticate, record_use, token_read
from gateway.services.workspace import Workspace

T = TypeVar("T")

bearer = HTTPBearer(auto_error=False, description="the API token `gateway users add` printed")


REPOSITORY_KEY = "repository"  # in the request's state: the repository its path's prefix names


def repository_asked(request: Request) -> str | None:
    """The repository a request names: by its path's prefix (`/api/v1/repos/NAME/...`), else `?repo=NAME`."""
    return getattr(request.state, REPOSITORY_KEY, None) or request.query_params.get("repo")


def request_workspace(request: Request) -> Workspace:
    """This request's workspace, in the repository it names, with its own git handle; kept on the request so its
    page chrome reuses it."""
    base: Workspace = request.app.state.workspace
    name = repository_asked(request)
    ws = base.in_repository(name) if name else base.for_request()
    request.state.workspace = ws
    return ws


async def get_workspace(request: Request) -> Workspace:
    """The dependency: opening the handles touches no database and spawns nothing, so it need not take a thread
    of the pool (each hop to the pool costs a read as much as a query)."""
    return request_workspace(request)


WorkspaceDep = Annotated[Workspace, Depends(get_workspace)]


BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def api_actor(request: Request, ws: WorkspaceDep, credentials: BearerDep) -> Principal:
    actor = authenticate(ws, credentials.credentials if credentials else None)
    note_principal(request.state, actor.id)
    return actor


async def read_as_api_actor(request: Request, ws: Workspace, credentials: HTTPAuthorizationCredentials | None,
                            read: Callable[[Principal], T]) -> T:
    """`read` as the bearer token's principal: the token's check and the read in one read unit of work, on the read
    lane; the token's last use (a write, which may wait for the write lock) kept after, off the lane, whatever the
    read raised."""
    used: list[LastUse] = []

    def checked_read() -> T:
        with token_read(ws, credentials.credentials if credentials else None) as (actor, last_use):
            note_principal(request.state, actor.id)
            if last_use:
                used.append(last_use)
            return read(actor)

    try:
        return await in_read_lane(request, checked_read)
    finally:
        if used:
            await anyio.to_thread.run_sync(record_use, ws, used[0])


ActorDep = Annotated[Principal, Depends(api_actor)]


LANE_WAIT_SECONDS = 0.1  # longest a read waits for the lane before it runs on the pool anyway


async def in_read_lane(request: Request, read: Callable[..., T], *args: Any) -> T:
    """`read(*args)` on the app's read lane: a few threads for the reads of a proposal, not the pool's forty. A read
    is CPU in Python; eight of them at once on forty threads pass the GIL between them and each costs twice its CPU
    (benchmarks/reads.py: p95 at 8 clients 32 -> 18 ms on one lane), while a queue of reads on one thread costs
    each only its own. A read that waits (a declared backend's state pull, a session's end written) would hold the
    lane: one that finds it busy for `LANE_WAIT_SECONDS` runs on the pool, as every read did before. A limiter
    belongs to its event loop: the lane is one per loop (a `RunVar`, see `read_lane`)."""
    lanes: RunVar[CapacityLimiter] = request.app.state.read_lanes
    try:
        lane = lanes.get()
    except LookupError:
        lane = CapacityLimiter(request.app.state.workspace.settings.read_lane_threads)
        lanes.set(lane)
    with anyio.move_on_after(LANE_WAIT_SECONDS) as waited:
        await lane.acquire()
    try:
        return await anyio.to_thread.run_sync(read, *args)
    finally:
        if not waited.cancelled_caught:  # it was given the lane
            lane.release()


def read_lane() -> RunVar[CapacityLimiter]:
    """An app's read lanes (`app.state.read_lanes`): one limiter in each event loop that serves the app."""
    return RunVar("read_lane")


BROWSER_KEY = "browser"  # in the cookie: names this browser's sign-ins in progress (several tabs may each have one)


def clear_session(request: Request) -> None:
    """Forget what the cookie held (the session id, the CSRF token) but the browser's key: a sign-in another tab
    started is still this browser's."""
    browser = request.session.get(BROWSER_KEY)
    request.session.clear()
    if browser:
        request.session[BROWSER_KEY] = browser


def signed_in_person(request: Request, ws: WorkspaceDep) -> SignedIn:
    """The signed-in person of a page, from their server-side session (the cookie holds only its id)."""
    try:
        return signed_in(ws, request.session.get("sid"))
    except AuthError as exc:  # ended, expired, disabled: the cookie goes, and the sign-in page says why
        clear_session(request)
        if str(exc) != "sign in first":
            request.session["flash"] = str(exc)
        raise


SignedInDep = Annotated[SignedIn, Depends(signed_in_person)]


def page_actor(request: Request, who: SignedInDep) -> Principal:
    """The signed-in person's principal, with the groups their session counts."""
    note_principal(request.state, who.principal.id)
    return who.principal


PageActorDep = Annotated[Principal, Depends(page_actor)]

ProposalId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the proposal's number")]
JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the job's number")]
