"""What reads of proposals derive once per process and keep: only what is a pure function of content that never changes.

A read derives, it does not store: nothing here is written to the database, and nothing here can go stale, because
every key names content that cannot change under it.

- A saved plan's masked preview, by the plan row that holds it: plans are only ever inserted, never updated, so
  (database, plan id, digest, planned at) names one text forever. The digest alone would not do: the preview also
  holds the policy findings and risk of the moment it was planned, and two plannings of the same document can differ
  in those.
- A text's scrubbed UTF-8 bytes, by the scrubber and the text itself.

What changes (status, decisions, overrides, checks, staleness, who may approve, which plan is current) is never kept:
each read asks the store, so an approval or a new plan shows on the very next read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Generic, TypeVar

from gateway.domain.scrubbing import Scrubber

V = TypeVar("V", str, bytes)

MAX_BYTES = 64 * 1024 * 1024  # per cache: the previews of some sixty 2,000-resource plans


class BoundedCache(Generic[V]):
    """Least recently used first out, bounded by the total length of what it holds; safe across threads."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, derive: Callable[[], V | None]) -> V | None:
        """The value kept under `key`, else `derive()` kept (None is returned, never kept)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        value = derive()  # outside the lock: two threads may derive the same value, never a different one
        if value is None or len(value) > self.max_bytes:
            return value
        with self._lock:
            if key not in self._entries:
                self._entries[key] = value
                self._size += len(value)
            while self._size > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._size -= len(dropped)
        return value

    def __len__(self) -> int:
        return len(self._entries)


_PREVIEWS: BoundedCache[str] = BoundedCache()
_SCRUBBED: BoundedCache[bytes] = BoundedCache()


def saved_preview(database: str, plan_id: int, digest: str, planned_at: datetime | None,
                  read: Callable[[], str | None]) -> str | None:
    """The stored preview of one saved plan; `read` fetches it from the store the first time."""
    if planned_at is None:
        return read()
    return _PREVIEWS.get((database, plan_id, digest, planned_at.isoformat()), read)


def scrubbed_bytes(scrubber: Scrubber, text: str) -> bytes:
    """`text` scrubbed and encoded, kept by its content (a big preview is a megabyte: scrubbing it costs a read more
    than building the rest of the document)."""
    value = _SCRUBBED.get((scrubber, text), lambda: scrubber.scrub(text).encode("utf-8"))
    assert value is not None
    return value
