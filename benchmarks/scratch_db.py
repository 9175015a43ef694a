"""A PostgreSQL database of a benchmark run's own, dropped after it (the scripts import it as a sibling module)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


@contextmanager
def scratch_database(admin_url: str | None, purpose: str) -> Iterator[str | None]:
    """The URL of a new database on the server of `admin_url`, named for `purpose`, dropped when the run ends
    however it ends (None stays None: the run uses SQLite in its own directory)."""
    if admin_url is None:
        yield None
        return
    name = f"gw_bench_{purpose}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
