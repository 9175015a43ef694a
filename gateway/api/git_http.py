"""`/git/declarations.git`: git's smart HTTP protocol for the declaration repo (clone, fetch, push).

Thin: the service authenticates and says which branches are held, `git http-backend` speaks the protocol, the
service records the push once the answer has been sent (a proposal's plan never holds up `git push`).
"""

from __future__ import annotations

import tempfile
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import WorkspaceDep
from gateway.composition import git_http_backend
from gateway.domain.errors import AuthError, Refused
from gateway.services.forge.git_endpoint import after_push, git_principal, held_branches

router = APIRouter(include_in_schema=False)
REALM = 'Basic realm="change gateway (user: your name, password: your gateway token)"'
GitPath = Annotated[str, Path(pattern=r"^(info/refs|git-upload-pack|git-receive-pack|HEAD|objects/.*)$")]


@router.api_route("/git/declarations.git/{path:path}", methods=["GET", "POST"])
async def git_smart_http(path: GitPath, request: Request, ws: WorkspaceDep) -> Response:
    """Clone and fetch with any person's token; push branches with the token of someone who may request."""
    pushing = path == "git-receive-pack" or request.query_params.get("service") == "git-receive-pack"
    try:
        principal = await run_in_threadpool(git_principal, ws, request.headers.get("authorization"), pushing)
    except AuthError as exc:
        return PlainTextResponse(f"{exc}\n", status_code=401, headers={"WWW-Authenticate": REALM})
    except Refused as exc:
        return PlainTextResponse("; ".join(exc.reasons) + "\n", status_code=403)
    limit = ws.settings.git_max_push_bytes
    body = tempfile.TemporaryFile()
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            body.close()
            return PlainTextResponse(f"a push is at most {limit // (1024 * 1024)} MiB "
                                     f"(GATEWAY_GIT_MAX_PUSH_BYTES)\n", status_code=413)
        body.write(chunk)
    body.seek(0)
    held = await run_in_threadpool(held_branches, ws) if pushing else []
    answer = await git_http_backend(ws.settings).serve(
        request.method, f"/{path}", request.url.query, request.headers, body, principal.name, ws.main_branch(), held)

    async def record() -> None:
        body.close()
        if answer.pushed:
            await run_in_threadpool(after_push, ws, principal, [(u.old, u.new, u.ref) for u in answer.pushed])

    headers = {name: value for name, value in answer.headers if name.lower() != "content-length"}
    return StreamingResponse(answer.body, status_code=answer.status, headers=headers,
                             media_type=headers.pop("Content-Type", None), background=BackgroundTask(record))
