"""LangGraph checkpointers on the gateway's own database, so conversations survive a restart."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver
from sqlalchemy.engine import make_url

from gateway.domain.errors import ConfigError

_SET_UP: set[str] = set()


@contextmanager
def open_checkpointer(database_url: str) -> Iterator[BaseCheckpointSaver]:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(url.database or ":memory:", check_same_thread=False, timeout=60)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
    elif url.get_backend_name() == "postgresql":
        from langgraph.checkpoint.postgres import PostgresSaver

        plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with PostgresSaver.from_conn_string(plain) as saver:
            if plain not in _SET_UP:  # its tables and migrations: once per database and process
                saver.setup()
                _SET_UP.add(plain)
            yield saver
    else:
        raise ConfigError(f"conversations cannot be kept in a {url.get_backend_name()} database")
