"""ASGI middleware: every response body leaves without a known secret value (the last line of defence)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.domain.scrubbing import Scrubber

SCRUBBED_BY = "gateway.scrubbed_by"  # on a body message: the scrubber its route already scrubbed it with


class ScrubbedResponse(Response):
    """A body the route has scrubbed with the app's own scrubber (in pieces, some kept by content): the middleware
    passes it on as it is. Only code holding that scrubber object can say so; any other body is scrubbed."""

    def __init__(self, body: bytes, scrubber: Scrubber, media_type: str = "application/json"):
        super().__init__(body, media_type=media_type)
        self.scrubber = scrubber

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, SCRUBBED_BY: self.scrubber})


class ScrubResponses:
    """Scrubs each body chunk; the start message waits for the first chunk to fix Content-Length."""

    def __init__(self, app: ASGIApp, scrubber: Scrubber):
        self.app = app
        self.scrubber = scrubber

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.scrubber:
            await self.app(scope, receive, send)
            return
        pending_start: list[Message] = []

        async def scrubbed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                pending_start.append(message)
                return
            if message["type"] == "http.response.body":
                scrubbed = message.pop(SCRUBBED_BY, None) is self.scrubber
                body = message.get("body", b"") if scrubbed else self.scrubber.scrub_bytes(message.get("body", b""))
                if pending_start:
                    start = pending_start.pop()
                    headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                    if not message.get("more_body"):  # whole body in one message: its length is known
                        headers.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": headers})
                message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, scrubbed_send)
