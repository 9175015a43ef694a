"""ASGI middleware: one JSON line per request, and a request id to find it by.

The line names the route's template (`/api/v1/proposals/{proposal_id}`), never the path as sent or its query (a
sign-in callback's `code`, a search's words), the status, the duration, the principal the request acted as (by id)
and the request id, which the response carries in `X-Request-ID`: taken from the caller when it sends a plausible
one (a proxy's), else made here.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.logs import get_logger

log = get_logger("gateway.api.access")

REQUEST_ID_HEADER = b"x-request-id"
_PLAUSIBLE_ID = re.compile(rb"[A-Za-z0-9._:-]{8,128}")
PRINCIPAL_KEY = "principal_id"  # in the request's state: set where a route learns who is acting


def note_principal(state: Any, principal_id: str) -> None:
    """Name the principal a request acts as in its access line (`request.state`)."""
    setattr(state, PRINCIPAL_KEY, principal_id)


class AccessLog:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        started = time.perf_counter()
        status = 500  # what the client gets if the app fails before it answers

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (REQUEST_ID_HEADER, request_id)]}
            await send(message)

        scope.setdefault("state", {})
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info("http.request", method=scope["method"], route=_route(scope), status=status,
                     duration_ms=round((time.perf_counter() - started) * 1000, 1),
                     principal=scope["state"].get(PRINCIPAL_KEY), request_id=request_id.decode())


def _request_id(scope: Scope) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER and _PLAUSIBLE_ID.fullmatch(value):
            return bytes(value)
    return secrets.token_hex(8).encode()


def _route(scope: Scope) -> str:
    """The matched route's template; a mounted app's prefix; else that nothing matched (a 404's path is not logged:
    it is whatever the caller typed)."""
    route = scope.get("route")
    if route is not None and hasattr(route, "path"):
        return str(scope.get("root_path", "")) + route.path
    if scope.get("root_path"):
        return str(scope["root_path"]) + "/*"
    return "(no route)"
