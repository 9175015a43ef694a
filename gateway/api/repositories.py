"""Routes in one declaration repository: `/api/v1/repos/{repo}/...` and `/repos/{repo}/...` are the gateway's routes
as they are without the prefix, working in that repository; without one, a route works in the workspace's own
repository (or `?repo=NAME`). A proposal asked for where it is not is redirected to where it is (307: the method and
body kept), so links made before a repository had a name, and pages' plain links, keep working.
"""

from __future__ import annotations

import re

from fastapi import APIRouter
from fastapi.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.deps import REPOSITORY_KEY, ActorDep, WorkspaceDep
from gateway.api.schemas import RepositoryPublic
from gateway.domain.errors import InAnotherRepository
from gateway.domain.repositories import DEFAULT_REPOSITORY
from gateway.services.admin.repositories import list_repositories

_PREFIXED = re.compile(r"^(/api/v1)?/repos/([a-z0-9][a-z0-9._-]{0,62})(/.*)?$")

api = APIRouter(prefix="/api/v1")


@api.get("/repos", response_model=list[RepositoryPublic], tags=["repositories"])
def repositories(ws: WorkspaceDep, actor: ActorDep) -> list[RepositoryPublic]:
    """The declaration repositories the gateway serves (removed ones too, marked)."""
    return [RepositoryPublic(name=r.name, active=r.active, added_at=r.added_at, added_by=r.added_by,
                             removed_at=r.removed_at) for r in list_repositories(ws)]


class RepositoryPrefix:
    """ASGI middleware: `/api/v1/repos/NAME/rest` is `/api/v1/rest` in repository NAME (and `/repos/NAME/rest`,
    a page's, `/rest`)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (found := _PREFIXED.match(scope["path"])):
            api_prefix, name, rest = found.groups()
            path = (api_prefix or "") + (rest or "/")  # `/repos/NAME` alone: its front page
            scope = {**scope, "path": path, "raw_path": path.encode(), "state": {**scope.get("state", {}),
                                                                                 REPOSITORY_KEY: name}}
        await self.app(scope, receive, send)


def elsewhere(path: str, query: str, exc: InAnotherRepository) -> RedirectResponse:
    """Where a request for something in another repository goes: the same route under that repository's prefix."""
    api_prefix = "/api/v1" if path.startswith("/api/v1/") else ""
    target = f"{api_prefix}/repos/{exc.repository}{path.removeprefix(api_prefix)}"
    return RedirectResponse(target + (f"?{query}" if query else ""), status_code=307)


def page_root(repository: str) -> str:
    """Where repository `repository`'s pages are: a page's links start with it, so a person moving about an added
    repository's pages stays in it and never goes through a redirect (the workspace's own repository's have none)."""
    return "" if repository == DEFAULT_REPOSITORY else f"/repos/{repository}"
