"""Pausing Python's cycle collector around work that allocates many objects which all live until it ends."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector while big trees are built and walked (HCL parsing and planning) or a big batch of
    audit events is encoded, written or streamed to verify.

    Such work allocates millions of small objects that live until it ends, and the collector would walk all of them
    (and, once they outlive two young collections, every other object of the process) again and again: half of a
    parse, a third of an append. Nothing that runs under it makes reference cycles, so memory is still freed as it
    goes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
