"""Keys kept in files beside the workspace: made once (several processes may race to make one), readable by
their owner only."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from gateway.domain.errors import ConfigError


def private_key_file(path: Path, make: Callable[[], bytes], what: str) -> bytes:
    """The content of `path`, written by `make()` with mode 0600 the first time; refused if others may read it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it a moment ago
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(make())
    for _ in range(50):  # another process may be writing it this instant
        content = path.read_bytes().strip()
        if content:
            break
        time.sleep(0.02)
    else:
        raise ConfigError(f"{path} is empty; delete it to make a new {what}")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{path}: the {what} must be readable by its owner only (chmod 600)")
    return content
