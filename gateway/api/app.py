"""The FastAPI application: the JSON API under /api/v1 and the review pages, over one workspace."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.middleware.sessions import SessionMiddleware
from uvicorn.config import STARTUP_FAILURE

from gateway.api import audit, day_two, git_http, notifications, pages, repositories, routes
from gateway.api.access_log import AccessLog
from gateway.api.deps import read_lane, repository_asked
from gateway.api.errors import error_body, invalid_request, status_for
from gateway.api.repositories import RepositoryPrefix, elsewhere
from gateway.api.scrubbing import ScrubResponses
from gateway.composition import install_prometheus, open_service_workspace, session_secret
from gateway.config import Settings
from gateway.domain.backoff import Backoff
from gateway.domain.errors import AuthError, GatewayError, InAnotherRepository, Refused
from gateway.logs import configure_service_logging, get_logger
from gateway.mcp_server import McpMount
from gateway.services.admin.startup import bring_database_up, log_start
from gateway.services.change.code_host import require_webhook_secret
from gateway.worker import Worker

log = get_logger(__name__)


def create_app(settings: Settings | None = None, workers: int = 1) -> FastAPI:
    """The app over one workspace; `workers` job loops run in this process (0: separate `gateway worker`s do).

    It starts whatever the database is doing: one attempt to reach it (and bring its schema up) now, and while it
    does not answer, the app serves anyway (`/api/v1/ready` answers 503 naming the database) and keeps trying, one
    log line per backoff step."""
    settings = settings or Settings()
    workspace = open_service_workspace(settings)
    require_webhook_secret(workspace)  # a forge without a webhook secret does not start
    metrics = install_prometheus(workspace)  # before the job loops copy the workspace
    log_start(workspace, "api", workers=workers)
    stop, backoff = threading.Event(), Backoff()
    database_up = bring_database_up(workspace, "api", stop, backoff, attempts=1)

    mcp = McpMount(workspace)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = Worker(workspace, workers, poll_seconds=0.2).start() if workers else None
        if not database_up:
            threading.Thread(target=bring_database_up, args=(workspace, "api", stop, backoff), name="database",
                             daemon=True).start()
        try:
            async with mcp.running():
                yield
        finally:
            stop.set()
            if worker:
                worker.stop()

    app = FastAPI(title="Change gateway", version="1.0.0", lifespan=lifespan,
                  description="Proposals, approvals bound to exact plans, exact-plan applies, and the audit trail.")
    app.state.workspace = workspace
    app.state.read_lanes = read_lane()
    app.add_middleware(SessionMiddleware, secret_key=session_secret(settings), session_cookie="gateway_session",
                       same_site="lax", https_only=settings.cookies_secure,
                       max_age=None)  # ends with the browser; the server-side session's expiry is what counts
    app.add_middleware(ScrubResponses, scrubber=app.state.workspace.scrubber)
    app.add_middleware(RepositoryPrefix)  # /api/v1/repos/NAME/...: the same routes, in repository NAME
    app.add_middleware(AccessLog)  # outermost: its line has the status the client got, after every other layer
    app.include_router(repositories.api)
    app.include_router(routes.router)
    app.include_router(pages.router)
    app.include_router(day_two.api)
    app.include_router(day_two.pages)
    app.include_router(notifications.api)
    app.include_router(git_http.router)  # /git/declarations.git: clone and push with a gateway token
    app.include_router(audit.api)
    app.include_router(audit.pages)
    app.mount("/mcp", mcp)  # external agents: the MCP server over streamable HTTP, bearer token

    @app.get("/metrics", include_in_schema=False)
    def _metrics() -> Response:
        """Prometheus' scrape: no secret, no unbounded label (see README, Operating the gateway)."""
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        if isinstance(exc, InAnotherRepository) and repository_asked(request) is None:
            return elsewhere(request.url.path, request.url.query, exc)  # asked where it is not: sent where it is
        if request.url.path.startswith("/api/"):
            headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
            return JSONResponse(error_body(exc), status_code=status_for(exc), headers=headers)
        if isinstance(exc, AuthError):
            return RedirectResponse("/login", status_code=303)
        reasons = exc.reasons if isinstance(exc, Refused) else [str(exc)]
        return pages.render(request, "error.html", None, status_code=status_for(exc),
                            title="Refused" if isinstance(exc, Refused) else "Could not do that", reasons=reasons,
                            back=request.headers.get("referer"))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return await _gateway_error(request, invalid_request(exc))

    return app


def app_from_environment() -> FastAPI:
    """For `gateway serve --processes N`: each API process builds its app from the environment. One that cannot
    (a setting wrong, the workspace unwritable) says why and exits with uvicorn's start-up failure, which stops the
    others and `serve` with it; any other exit would have uvicorn start it again, forever."""
    configure_service_logging()
    try:
        return create_app(Settings(), int(os.environ.get("GATEWAY_SERVE_WORKERS", "1")))
    except GatewayError as exc:
        log.error("api.cannot_start", reason=str(exc))
    except Exception:
        log.exception("api.cannot_start")
    sys.exit(STARTUP_FAILURE)
