"""Round trips to PostgreSQL, counted from libpq's own trace of the protocol (every connection of an engine).

A round trip is a message the client then waits on: a simple `Query`, or the `Sync` that ends an extended-protocol
exchange (Parse/Bind/Execute). The pool's pings, the driver's BEGIN and COMMIT all show, not only our statements.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from psycopg import pq
from sqlalchemy import Engine, event


class RoundTrips:
    """Counts the round trips of the connections an engine opens from now on (its pool is emptied first)."""

    def __init__(self, engine: Engine):
        self._trace = tempfile.TemporaryFile(mode="w+")
        self._mark = 0
        event.listen(engine, "connect", self._on_connect)
        engine.dispose()

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        pgconn = dbapi_connection.pgconn
        pgconn.trace(self._trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def messages(self) -> list[str]:
        """What the client sent since the last call, one line a round trip (`Query "..."` or `Sync`)."""
        self._trace.flush()
        self._trace.seek(self._mark)
        lines = self._trace.read().splitlines()
        self._mark = self._trace.tell()
        sent = [line.split("\t") for line in lines if line.startswith("F\t")]
        return [" ".join(part for part in fields[2:]).strip() for fields in sent if fields[2] in ("Query", "Sync")]

    def count(self) -> int:
        return len(self.messages())

    @staticmethod
    def summary(messages: list[str]) -> Counter[str]:
        return Counter(message[:60] for message in messages)
