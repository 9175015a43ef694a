"""The sandbox's state and simulated cloud, kept in the gateway's database."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import bindparam, delete, select, update

from gateway.adapters.engines.sandbox.state import StackState
from gateway.adapters.sealing import UNSEALED, Sealer
from gateway.adapters.store.schema import (
    Database,
    dumps,
    sandbox_faults,
    sandbox_objects,
    stack_states,
    state_resources,
)
from gateway.domain.errors import BackendError

_SERIAL = select(stack_states.c.serial).where(stack_states.c.stack == bindparam("stack"))  # every read asks it


class SqlSandboxStore:
    """Implements SandboxStore on the shared Database."""

    def __init__(self, db: Database, sealer: Sealer = UNSEALED):
        self.db = db
        self.sealer = sealer  # the simulated cloud holds secrets in clear: its state and objects are sealed

    def read_serial(self, stack: str) -> int:
        """The state's serial alone (0 before the first apply): what staleness checks need."""
        with self.db.transaction(readonly=True) as conn:
            return int(conn.scalar(_SERIAL, {"stack": stack}) or 0)

    def read_state(self, stack: str) -> StackState | None:
        with self.db.transaction(readonly=True) as conn:
            header = conn.scalar(select(stack_states.c.body).where(stack_states.c.stack == stack))
            rows = conn.execute(select(state_resources.c.address, state_resources.c.body)
                                .where(state_resources.c.stack == stack)).all()
        if header is None:
            return None
        open_ = self.sealer.open_text
        return StackState.from_json({**json.loads(open_(header)),
                                     "resources": {a: json.loads(open_(b)) for a, b in rows}})

    def write_state(self, stack: str, state: StackState, expected_serial: int,
                    changed: Collection[str] | None = None) -> None:
        """Compare-and-swap on the serial: a write based on an older state is refused.

        Only the `changed` addresses are rewritten; None rewrites every resource.
        """
        with self.db.transaction() as conn:
            self._write_state(conn, stack, state, expected_serial, changed)

    def write_apply(self, stack: str, state: StackState, expected_serial: int, changed: Collection[str],
                    objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> None:
        """What a stretch of an apply did, in one transaction: the simulated cloud's objects (None: deleted) and the
        state (compare-and-swap on the serial, as `write_state`), so the two never disagree."""
        with self.db.transaction() as conn:
            by_type: dict[str, list[str]] = {}
            for rtype, rid in objects:
                by_type.setdefault(rtype, []).append(rid)
            for rtype, ids in by_type.items():
                for start in range(0, len(ids), 500):
                    conn.execute(delete(sandbox_objects).where(sandbox_objects.c.type == rtype,
                                                               sandbox_objects.c.id.in_(ids[start:start + 500])))
            rows = [{"type": rtype, "id": rid, "attributes": self.sealer.seal_text(dumps(attributes))}
                    for (rtype, rid), attributes in objects.items() if attributes is not None]
            if rows:
                conn.execute(sandbox_objects.insert(), rows)
            self._write_state(conn, stack, state, expected_serial, changed)

    def _write_state(self, conn: Any, stack: str, state: StackState, expected_serial: int,
                     changed: Collection[str] | None) -> None:
        header = self.sealer.seal_text(dumps({"lineage": state.lineage, "serial": state.serial,
                                              "outputs": state.outputs}))
        exists = conn.scalar(select(stack_states.c.serial).where(stack_states.c.stack == stack)) is not None
        if not exists and expected_serial == 0:
            conn.execute(stack_states.insert().values(stack=stack, serial=state.serial, body=header))
        else:
            result = conn.execute(
                update(stack_states)
                .where(stack_states.c.stack == stack, stack_states.c.serial == expected_serial)
                .values(serial=state.serial, body=header))
            if result.rowcount != 1:
                raise BackendError(f"state of stack {stack} changed underneath this write "
                                   f"(expected serial {expected_serial})")
        addresses = list(state.resources) if changed is None else list(changed)
        if changed is None:
            conn.execute(delete(state_resources).where(state_resources.c.stack == stack))
        else:
            for at in range(0, len(addresses), 500):  # bound the statement's parameters
                conn.execute(delete(state_resources).where(state_resources.c.stack == stack,
                                                           state_resources.c.address.in_(addresses[at:at + 500])))
        # vars(), not asdict(): a resource's fields are plain data already, and asdict copies all of it first
        rows = [{"stack": stack, "address": a, "body": self.sealer.seal_text(dumps(vars(state.resources[a])))}
                for a in addresses if a in state.resources]
        if rows:
            conn.execute(state_resources.insert(), rows)

    def fault_addresses(self, stack: str) -> frozenset[str]:
        """The addresses of `stack` that have a fault or delay waiting (read once per apply)."""
        with self.db.transaction(readonly=True) as conn:
            return frozenset(conn.scalars(select(sandbox_faults.c.address).where(sandbox_faults.c.stack == stack)))

    def get_objects(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        found: dict[tuple[str, str], dict[str, Any]] = {}
        wanted = set(keys)
        with self.db.transaction(readonly=True) as conn:
            for rtype in {t for t, _ in wanted}:
                ids = [i for t, i in wanted if t == rtype]
                for start in range(0, len(ids), 500):
                    rows = conn.execute(select(sandbox_objects.c.id, sandbox_objects.c.attributes).where(
                        sandbox_objects.c.type == rtype, sandbox_objects.c.id.in_(ids[start:start + 500])))
                    found.update({(rtype, rid): json.loads(self.sealer.open_text(body)) for rid, body in rows})
        return found

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None:
        with self.db.transaction(readonly=True) as conn:
            body = conn.scalar(
                select(sandbox_objects.c.attributes).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid)
            )
        return json.loads(self.sealer.open_text(body)) if body else None

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_objects).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid))
            conn.execute(sandbox_objects.insert().values(type=rtype, id=rid,
                                                         attributes=self.sealer.seal_text(dumps(attributes))))

    def delete_object(self, rtype: str, rid: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_objects).where(sandbox_objects.c.type == rtype, sandbox_objects.c.id == rid))

    def inject_fault(self, stack: str, address: str, message: str) -> None:
        """Make the next apply of `address` in `stack` fail, leaving the apply half done."""
        with self.db.transaction() as conn:
            conn.execute(delete(sandbox_faults).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address))
            conn.execute(sandbox_faults.insert().values(stack=stack, address=address, message=message))

    def inject_delay(self, stack: str, address: str, seconds: float) -> None:
        """Make the next apply of `address` in `stack` take `seconds` longer, as a slow provider would."""
        from gateway.adapters.engines.sandbox.applier import DELAY_PREFIX  # the applier only where a fault is injected

        self.inject_fault(stack, address, f"{DELAY_PREFIX}{seconds}")

    def take_fault(self, stack: str, address: str) -> str | None:
        with self.db.transaction() as conn:
            message = conn.scalar(
                select(sandbox_faults.c.message).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address)
            )
            if message is not None:
                conn.execute(delete(sandbox_faults).where(sandbox_faults.c.stack == stack, sandbox_faults.c.address == address))
        return message
