"""The sandbox engine: plans and applies Terraform stacks against a simulated cloud.

It behaves like Terraform where the gateway cares: state with serial and lineage, refresh and
drift, dependency order, force-new replacement in both orders, unknown computed values,
lifecycle rules, `moved` and `import` blocks, and half-done applies; modules (their instances'
addresses as Terraform writes them) and data sources read at plan time, or during the apply when
they wait on it. Its plans are Terraform's JSON plan format, `configuration` included. Everything
it creates exists only in the gateway's store.

This module is the engine port's face and nothing more; the work lives by purpose beside it:
`state.py` (the state model and the store port), `planner.py` (the plan walk), `applier.py`
(applying a saved plan), `instances.py` (what those two share), `store.py` (the SQL store). Those
and the HCL reader are imported when a stack is first planned or applied: a read, which only asks
for a serial, loads none of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.adapters.engines.sandbox.schema import schema_for
from gateway.adapters.engines.sandbox.state import SandboxStore, StackState, StateResource
from gateway.domain.errors import ApplyError, ConfigError
from gateway.domain.plan import load_plan
from gateway.logs import get_logger
from gateway.ports import ApplyOutcome, EnginePlan, StackInputs

log = get_logger(__name__)


class SandboxEngine:
    """Plans and applies one stack at a time against the simulated cloud in `store`."""

    name = "sandbox"

    def __init__(self, store: SandboxStore) -> None:
        self.store = store

    def state_serial(self, stack: str) -> int:
        """The stack's state serial (0 before its first apply)."""
        return self.store.read_serial(stack)

    def masks_by_origin(self, stack: str) -> bool:
        """Whether values the gateway supplies stay masked whatever the branch declares."""
        return True  # its evaluator keeps the Secret mark through nonsensitive()

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        """The attributes of `resource_type` its schema table calls sensitive."""
        return schema_for(resource_type).sensitive

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        """Plan the stack in `directory` against its state; nothing changes in the store."""
        from gateway.adapters.collector import collector_paused
        from gateway.adapters.engines.sandbox.config import load_stack
        from gateway.adapters.engines.sandbox.planner import Planner

        state = self.store.read_state(stack) or StackState(lineage=str(uuid.uuid4()))
        with collector_paused():
            config = load_stack(directory)
            planner = Planner(stack, config, state, self.store, inputs)
            document = planner.plan()
        log.info("sandbox.plan", stack=stack, changes=len(document["resource_changes"]), serial=state.serial)
        return EnginePlan(document=document, state_serial=state.serial, state_lineage=state.lineage)

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        """Apply exactly `document`'s changes (the sandbox keeps no plan file of its own: `artifact` is unused;
        it applies in one go, so it reports no progress lines)."""
        from gateway.adapters.collector import collector_paused
        from gateway.adapters.engines.sandbox.applier import Applier
        from gateway.adapters.engines.sandbox.config import load_stack

        state = self.store.read_state(stack) or StackState(lineage=str(uuid.uuid4()))
        if state.serial != expected_serial:
            raise ApplyError(
                f"state of stack {stack} moved since the plan (serial {expected_serial} -> {state.serial})"
            )
        with collector_paused():
            config = load_stack(directory)
            applier = Applier(stack, config, state, self.store, inputs, load_plan(document).resource_changes)
            return applier.run()

    # --- out-of-band changes to the simulated cloud (console edits, for drift) ----------

    def edit_object(self, stack: str, address: str, changes: Mapping[str, Any]) -> None:
        """Change a live object behind the gateway's back, as someone in a console would."""
        resource = self._state_resource(stack, address)
        current = self.store.get_object(resource.type, resource.id)
        if current is None:
            raise ConfigError(f"{address} no longer exists in the simulated cloud")
        self.store.put_object(resource.type, resource.id, {**current, **changes})

    def delete_object(self, stack: str, address: str) -> None:
        """Delete a live object behind the gateway's back; its state entry stays."""
        resource = self._state_resource(stack, address)
        self.store.delete_object(resource.type, resource.id)

    def _state_resource(self, stack: str, address: str) -> StateResource:
        state = self.store.read_state(stack)
        if state is None or address not in state.resources:
            raise ConfigError(f"stack {stack} has no resource {address} in its state")
        return state.resources[address]
