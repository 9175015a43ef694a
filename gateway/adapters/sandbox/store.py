"""The sandbox's state and simulated cloud, kept in the gateway's database."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, select, update

from gateway.adapters.sandbox.engine import StackState
from gateway.adapters.sql_store import Database, dumps, sandbox_faults, sandbox_objects, stack_states
from gateway.domain.errors import BackendError


class SqlSandboxStore:
    """Implements SandboxStore on the shared Database."""

    def __init__(self, db: Database):
        self.db = db

    def read_state(self, stack: str) -> StackState | None:
        with self.db.transaction() as conn:
            body = conn.scalar(select(stack_states.c.body).where(stack_states.c.stack == stack))
        return StackState.from_json(json.loads(body)) if body else None

    def write_state(self, stack: str, state: StackState, expected_serial: int) -> None:
        """Compare-and-swap on the serial: a write based on an older state is refused."""
        body = dumps(state.to_json())
        with self.db.transaction() as conn:
            if expected_serial == 0 and conn.scalar(
                select(stack_states.c.serial).where(stack_states.c.stack == stack)
            ) is None:
                conn.execute(stack_states.insert().values(stack=stack, serial=state.serial, body=body))
                return
            result = conn.execute(
                update(stack_states)
                .where(stack_states.c.stack == stack, stack_states.c.serial == expected_serial)
                .values(serial=state.serial, body=body)
            )
            if result.rowcount != 1:
                raise BackendError(f"state of stack {stack} changed underneath this write (expected serial {expected_serial})")

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None:
        with self.db.transaction() as conn:
            body = conn.scalar(
                select(sandbox_objects.c.attributes).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid)
            )
        return json.loads(body) if body else None

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_objects).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid))
            conn.execute(sandbox_objects.insert().values(type=rtype, id=rid, attributes=dumps(attributes)))

    def delete_object(self, rtype: str, rid: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_objects).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid))

    def inject_fault(self, stack: str, address: str, message: str) -> None:
        """Make the next apply of `address` in `stack` fail, leaving the apply half done."""
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_faults).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address))
            conn.execute(sandbox_faults.insert().values(stack=stack, address=address, message=message))

    def take_fault(self, stack: str, address: str) -> str | None:
        with self.db.transaction() as conn:
            message = conn.scalar(
                select(sandbox_faults.c.message).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address)
            )
            if message is not None:
                conn.execute(delete(sandbox_faults).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address))
        return message
