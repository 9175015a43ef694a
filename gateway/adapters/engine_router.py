"""The Engine port over several engines: each stack goes to the engine main's gateway.yaml names for it.

Each engine is made when a stack first needs it, so a process that never plans with Terraform never imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.domain.errors import ConfigError
from gateway.ports import ApplyOutcome, Engine, EnginePlan, StackInputs


class EngineByStack:
    """Dispatches by stack; `engine_of(stack)` reads main's settings (never a branch's).

    `engines` maps each engine's name to what makes it: called once, on the first use of that engine.
    """

    def __init__(self, engines: Mapping[str, Callable[[], Engine]], engine_of: Callable[[str | None], str]):
        self._makers = dict(engines)
        self._made: dict[str, Engine] = {}
        self._lock = threading.Lock()  # engines are shared by threads: each is made once
        self.engine_of = engine_of

    @property
    def name(self) -> str:
        """The repo's default engine."""
        return self.engine_of(None)

    def for_stack(self, stack: str) -> Engine:
        name = self.engine_of(stack)
        if name not in self._makers:
            raise ConfigError(f"stack {stack} names engine {name!r}, which this gateway does not have")
        with self._lock:
            if name not in self._made:
                self._made[name] = self._makers[name]()
            return self._made[name]

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        return self.for_stack(stack).plan(stack, directory, inputs)

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        return self.for_stack(stack).apply(stack, directory, document, expected_serial, inputs, artifact, progress)

    def state_serial(self, stack: str) -> int:
        return self.for_stack(stack).state_serial(stack)

    def masks_by_origin(self, stack: str) -> bool:
        return self.for_stack(stack).masks_by_origin(stack)

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        return self.for_stack(stack).sensitive_attributes(stack, resource_type)
