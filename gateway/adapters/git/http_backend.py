"""git's smart HTTP protocol for the declaration repo, by git's own implementation: `git http-backend` (a CGI run
once per request), with the gateway's hooks.

Nothing here decides who may push: the route authenticates and the service says which branches are held. The
hooks enforce what holds for every push, before git updates a ref: only branches (`refs/heads/…`), never the main
branch (only the gateway merges), never the deletion of a branch an open proposal stands on. A push a hook refuses
writes nothing: git keeps the objects it received in a quarantine directory until the pre-receive hook accepts them,
and removes them when it refuses (git ≥ 2.11). The hooks live in the gateway's home (`core.hooksPath`, given to
this git alone): the repository's own hooks directory is not used.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gateway.domain.errors import BackendError

HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"  # Debian's git package puts it here
ZERO = "0" * 40

PRE_RECEIVE = """#!/bin/sh
# The change gateway's git endpoint (written by the gateway; edits are overwritten at its next start).
# Refuses, before any ref moves, a push to the main branch, to anything but a branch, and the deletion of a
# branch an open proposal stands on. A refused push writes nothing: git drops the quarantined objects.
status=0
while read old new ref; do
  case "$ref" in
    "refs/heads/$GATEWAY_MAIN_BRANCH")
      echo "refused $ref: only the change gateway merges into $GATEWAY_MAIN_BRANCH, exactly what was approved and applied; push a branch and propose it" >&2
      status=1 ;;
    refs/heads/*)
      if [ "$new" = "%(zero)s" ] && [ -n "$GATEWAY_HELD_BRANCHES" ] && grep -qxF -- "${ref#refs/heads/}" "$GATEWAY_HELD_BRANCHES"; then
        echo "refused deleting $ref: an open proposal stands on it; abandon the proposal first" >&2
        status=1
      fi ;;
    *)
      echo "refused $ref: only branches (refs/heads/...) may be pushed; $ref is the gateway's own" >&2
      status=1 ;;
  esac
done
exit $status
""" % {"zero": ZERO}

POST_RECEIVE = """#!/bin/sh
# The change gateway's git endpoint: tells the gateway which refs this push moved.
if [ -n "$GATEWAY_PUSHED" ]; then cat >> "$GATEWAY_PUSHED"; else cat > /dev/null; fi
"""


@dataclass(frozen=True)
class RefUpdate:
    """One ref a push moved: from `old` to `new` (all zeros: created, or deleted)."""

    old: str
    new: str
    ref: str

    @property
    def branch(self) -> str | None:
        return self.ref.removeprefix("refs/heads/") if self.ref.startswith("refs/heads/") else None

    @property
    def deleted(self) -> bool:
        return self.new == ZERO


@dataclass
class BackendAnswer:
    """What git http-backend answered: status, headers, the body as it comes, and, once the body has been read to
    its end, the refs the push moved."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]
    pushed: list[RefUpdate]


class GitHttpBackend:
    """One bare repository served by `git http-backend`."""

    def __init__(self, repo_path: Path, hooks_dir: Path, executable: str = HTTP_BACKEND):
        self.repo_path = repo_path
        self.hooks_dir = hooks_dir
        self.executable = executable

    def install_hooks(self) -> None:
        """Write the hooks (idempotent: rewritten when they differ)."""
        self.hooks_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (("pre-receive", PRE_RECEIVE), ("post-receive", POST_RECEIVE)):
            path = self.hooks_dir / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            path.chmod(0o755)

    async def serve(self, method: str, path_info: str, query: str, headers: Mapping[str, str], body: IO[bytes],
                    remote_user: str, main_branch: str, held_branches: list[str]) -> BackendAnswer:
        """Run http-backend for one request (`path_info` below the repository, e.g. `/info/refs`)."""
        if not os.access(self.executable, os.X_OK):
            raise BackendError(f"git http-backend is not installed at {self.executable} (Debian's git package)")
        self.install_hooks()
        work = Path(tempfile.mkdtemp(prefix="gw-git-"))
        held = work / "held"
        held.write_text("".join(f"{b}\n" for b in held_branches))
        pushed = work / "pushed"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
            "GIT_PROJECT_ROOT": str(self.repo_path.parent), "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{self.repo_path.name}{path_info}", "QUERY_STRING": query, "REQUEST_METHOD": method,
            "REMOTE_USER": remote_user, "REMOTE_ADDR": "127.0.0.1", "GATEWAY_INTERFACE": "CGI/1.1",
            "CONTENT_TYPE": headers.get("content-type", ""), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_COUNT": "2",
            "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": str(self.hooks_dir),
            "GIT_CONFIG_KEY_1": "http.receivepack", "GIT_CONFIG_VALUE_1": "true",
            "GATEWAY_MAIN_BRANCH": main_branch, "GATEWAY_HELD_BRANCHES": str(held), "GATEWAY_PUSHED": str(pushed),
        }
        for name in ("content-encoding", "git-protocol", "content-length"):
            if name in headers:
                key = {"git-protocol": "GIT_PROTOCOL", "content-length": "CONTENT_LENGTH"}.get(
                    name, "HTTP_" + name.upper().replace("-", "_"))
                env[key] = headers[name]
        process = await asyncio.create_subprocess_exec(self.executable, stdin=body, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE, env=env)
        assert process.stdout is not None
        raw_headers = await _read_headers(process.stdout)
        status, answer_headers = _cgi_headers(raw_headers)
        updates: list[RefUpdate] = []

        async def stream() -> AsyncIterator[bytes]:
            assert process.stdout is not None and process.stderr is not None
            try:
                while chunk := await process.stdout.read(64 * 1024):
                    yield chunk
                await process.wait()
                if pushed.exists():
                    updates.extend(RefUpdate(*line.split()) for line in pushed.read_text().splitlines()
                                   if len(line.split()) == 3)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                shutil.rmtree(work, ignore_errors=True)

        return BackendAnswer(status, answer_headers, stream(), updates)


async def _read_headers(stdout: asyncio.StreamReader) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stdout.read(1)
        if not chunk:
            break
        data += chunk
        if len(data) > 64 * 1024:
            raise BackendError("git http-backend answered with headers longer than 64 KiB")
    return data


def _cgi_headers(raw: bytes) -> tuple[int, list[tuple[str, str]]]:
    status, headers = 200, []
    for line in raw.decode("latin-1").splitlines():
        if not line.strip() or ":" not in line:
            continue
        name, value = (part.strip() for part in line.split(":", 1))
        if name.lower() == "status":
            status = int(value.split()[0])
        else:
            headers.append((name, value))
    return status, headers
