"""The terraform engine's own local state, sealed at rest and in clear only while Terraform runs.

A stack without a declared backend keeps its state in the gateway's workspace, in `<state_dir>/<stack>/` (0700):

    terraform.tfstate.sealed   the state at rest, sealed (Fernet, the workspace's data key), 0600, replaced atomically
    terraform.tfstate          the live file Terraform's local backend reads and writes; it exists only while a plan
                               or apply runs (or was left by one that died). Saved plans name this path, so a plan
                               and its apply, in any process, use the same one.
    terraform.tfstate.backup   Terraform's copy of the previous state: removed with the live file
    .gateway-state.lock        flock: one run at a time per stack, across processes and threads

A run takes the lock, seals any live file it finds (a state written in clear before sealing existed, or one a
killed run left: either is the newest truth), opens the sealed state into the live file, and when the run ends,
whichever way, seals the live file back and deletes it. The lock's descriptor is handed to Terraform, so a
Terraform that outlives a killed worker (it finishes on SIGINT) keeps the stack until it has written its state.
Reads of the state between runs (the serial check of pages) read the sealed file and never wait for a run.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.adapters.sealing import Sealer
from gateway.domain.errors import BackendError, ConfigError

LIVE_FILE = "terraform.tfstate"
SEALED_FILE = "terraform.tfstate.sealed"
LOCK_FILE = ".gateway-state.lock"


class SealedLocalState:
    """One stack's gateway-owned local state (see the module docstring for the layout)."""

    def __init__(self, directory: Path, sealer: Sealer, stack: str):
        self.directory, self._sealer, self._stack = directory, sealer, stack
        self.live = directory / LIVE_FILE
        self.sealed = directory / SEALED_FILE
        self.backup = directory / (LIVE_FILE + ".backup")

    @contextmanager
    def in_use(self, wait_seconds: float) -> Iterator[int]:
        """The live file, in clear, for one run; yields the lock's descriptor (for Terraform to inherit)."""
        with self._locked(wait_seconds) as fd:
            if fd is None:
                raise BackendError(f"the state of stack {self._stack} is busy: another plan or apply has held it "
                                   f"for more than {wait_seconds:g} s ({self.directory / LOCK_FILE}); try again")
            self._seal_live()
            opened = self._open_sealed() if self.sealed.exists() else None
            if opened is not None:
                _write_private(self.live, opened, exclusive=True)
            try:
                yield fd
            finally:
                self._seal_live(unchanged=opened)

    def read_live(self) -> dict[str, Any]:
        """The state as the running Terraform has it (only while `in_use`; empty until Terraform writes one)."""
        content = self.live.read_bytes() if self.live.exists() else b""
        return self._parse(content, self.live) if content.strip() else {}

    def read(self) -> dict[str, Any]:
        """The state at rest, without waiting: a live file is sealed first unless a run is using it."""
        if not self.directory.exists():  # never planned: nothing to read, nothing to make
            return {}
        with self._locked(0) as fd:
            if fd is not None:
                self._seal_live()
            if not self.sealed.exists():
                return {}
            return self._parse(self._open_sealed(), self.sealed)

    @contextmanager
    def _locked(self, wait_seconds: float) -> Iterator[int | None]:
        """The stack's lock (None when it is still held by another run after `wait_seconds`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)  # the live file is in clear while Terraform runs
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + wait_seconds
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield None
                        return
                    time.sleep(0.1)
            yield fd
        finally:
            os.close(fd)  # releases the lock unless a Terraform still running holds the descriptor too

    def _seal_live(self, unchanged: bytes | None = None) -> None:
        """Seal the live file (when it holds a state) and remove it and Terraform's backup: under the lock only.

        A live file still holding `unchanged` (what was opened from the sealed file: a plan writes no state) is
        already sealed as it is, and is only removed."""
        if self.live.exists():
            content = self.live.read_bytes()
            if content.strip() and content != unchanged:  # Terraform makes an empty file when it locks a new stack
                self._parse(content, self.live)  # a state cut short is kept for a person, never sealed over
                _write_private(self.sealed, self._sealer.seal_bytes(content))
            self.live.unlink()
        self.backup.unlink(missing_ok=True)

    def _open_sealed(self) -> bytes:
        try:
            return self._sealer.open_bytes(self.sealed.read_bytes())
        except (BackendError, ConfigError) as exc:
            raise type(exc)(f"{self.sealed}: {exc}") from None

    def _parse(self, content: bytes, path: Path) -> dict[str, Any]:
        try:
            return dict(json.loads(content))
        except (ValueError, TypeError) as exc:
            raise BackendError(f"{path}: the Terraform state of stack {self._stack} is not valid JSON ({exc}); "
                               f"restore it by hand (the last sealed state is {self.sealed})") from None


def _write_private(path: Path, content: bytes, exclusive: bool = False) -> None:
    """Write `path` readable by its owner only; atomically (a reader sees the old or the new file) unless new."""
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        return
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
