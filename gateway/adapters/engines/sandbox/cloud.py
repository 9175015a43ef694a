"""The SimulatedCloud port: the sandbox's cloud changed behind the gateway's back, and read for imports."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.sandbox.schema import schema_for
from gateway.adapters.engines.sandbox.state import StackState
from gateway.adapters.engines.sandbox.store import SqlSandboxStore


class SandboxCloud:
    def __init__(self, engine: SandboxEngine, store: SqlSandboxStore):
        self.engine = engine
        self.store = store

    def edit_object(self, stack: str, address: str, changes: Mapping[str, Any]) -> None:
        self.engine.edit_object(stack, address, changes)

    def delete_object(self, stack: str, address: str) -> None:
        self.engine.delete_object(stack, address)

    def inject_fault(self, stack: str, address: str, message: str) -> None:
        self.store.inject_fault(stack, address, message)

    def inject_delay(self, stack: str, address: str, seconds: float) -> None:
        self.store.inject_delay(stack, address, seconds)

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None:
        return self.store.get_object(rtype, rid)

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        self.store.put_object(rtype, rid, attributes)

    def read_state(self, stack: str) -> StackState | None:
        return self.store.read_state(stack)

    def managed_by(self, rtype: str, rid: str, stacks: Collection[str]) -> tuple[str, str] | None:
        for stack in sorted(stacks):
            state = self.store.read_state(stack)
            for address, resource in (state.resources.items() if state else ()):
                if resource.type == rtype and resource.id == rid:
                    return stack, address
        return None

    def declarable_attributes(self, rtype: str, live: Mapping[str, Any]) -> dict[str, Any]:
        schema = schema_for(rtype)
        return {k: v for k, v in live.items() if k != "id" and k not in schema.computed and k not in schema.sensitive}
