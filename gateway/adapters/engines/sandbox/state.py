"""The sandbox's state model: what it remembers of one stack, and the store port it keeps it in.

A stack's state is Terraform's: a lineage fixed at the first apply, a serial that every write
raises (the store refuses a write based on an older serial), one entry per resource instance
(its id in the simulated cloud, its attributes, which of them were sensitive, what it depended
on) and the outputs. Planner, applier and the SQL store (`store.py`) all read this model, so it
lives apart from each of them; `SandboxStore` is here too, so the planner and applier depend on
the port, not on SQL.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the evaluator (lark, the function library) only once a stack is planned or applied
    from gateway.adapters.engines.sandbox.evaluation import Index


@dataclass
class StateResource:
    type: str
    name: str
    index: Index
    id: str
    attributes: dict[str, Any]
    sensitive_attributes: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    module: str = ""  # the module instance's address, "" in the root module


@dataclass
class StackState:
    lineage: str
    serial: int = 0
    resources: dict[str, StateResource] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackState:
        return cls(
            lineage=data["lineage"],
            serial=data["serial"],
            resources={a: StateResource(**r) for a, r in data["resources"].items()},
            outputs=dict(data.get("outputs", {})),
        )


class SandboxStore(Protocol):
    """Where the sandbox keeps each stack's state and the simulated cloud's objects."""

    def read_state(self, stack: str) -> StackState | None: ...
    def read_serial(self, stack: str) -> int: ...
    def write_state(self, stack: str, state: StackState, expected_serial: int,
                    changed: Collection[str] | None = None) -> None:
        """Save state if its serial is still `expected_serial`; `changed` limits the write to those addresses."""
        ...

    def write_apply(self, stack: str, state: StackState, expected_serial: int, changed: Collection[str],
                    objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> None:
        """Objects (None: deleted) and state in one transaction; the state as `write_state`."""
        ...

    def fault_addresses(self, stack: str) -> frozenset[str]: ...
    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None: ...
    def get_objects(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]: ...
    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None: ...
    def delete_object(self, rtype: str, rid: str) -> None: ...
    def take_fault(self, stack: str, address: str) -> str | None: ...


def resource_key(address: str) -> str:
    """The configuration address of a resource instance address (instance keys removed)."""
    from gateway.adapters.engines.sandbox.evaluation import strip_keys

    return strip_keys(address)



def relocated(res: StateResource, address: str) -> StateResource:
    """A state entry under a new address (a `moved` block): its module, type, name and index follow the address."""
    body, index = address, None
    if body.endswith("]"):
        for start in range(len(body) - 2, -1, -1):
            if body[start] == "[":
                try:
                    index = json.loads(body[start + 1:-1])
                except ValueError:
                    continue
                body = body[:start]
                break
    parts = body.rsplit(".", 2)
    module, rtype, name = parts if len(parts) == 3 else ("", *parts)
    return replace(res, module=module, type=rtype, name=name, index=index)
