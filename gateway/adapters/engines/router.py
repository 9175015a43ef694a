"""The Engine port over several engines: each stack goes to the engine main's gateway.yaml names for it.

Each engine is made when a stack first needs it, so a process that never plans with Terraform never imports it.
A stack that calls remote modules is planned from a copy with them installed (module_installer.py), whatever
its engine; the plan records their pins, and the apply installs exactly those.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.adapters.modules.installer import PINS_KEY, ModuleInstaller, pins_of
from gateway.domain.errors import ConfigError
from gateway.ports import ApplyOutcome, Engine, EnginePlan, StackInputs


class EngineByStack:
    """Dispatches by stack; `engine_of(stack)` reads main's settings (never a branch's).

    `engines` maps each engine's name to what makes it: called once, on the first use of that engine.
    """

    def __init__(self, engines: Mapping[str, Callable[[], Engine]], engine_of: Callable[[str | None], str],
                 modules: ModuleInstaller | None = None):
        self._makers = dict(engines)
        self._modules = modules
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
        engine = self.for_stack(stack)
        if self._modules is None or not self._needs_modules(directory):
            return engine.plan(stack, directory, inputs)
        with self._modules.installed(directory) as (work, pins):
            result = engine.plan(stack, work, inputs)
        # the pins are part of the saved plan, so its digest (what an approval names) covers them
        return dataclasses.replace(result, document={**result.document, PINS_KEY: [p.to_json() for p in pins]})

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        engine = self.for_stack(stack)
        pins = pins_of(document)
        if self._modules is None or (pins is None and not self._needs_modules(directory)):
            return engine.apply(stack, directory, document, expected_serial, inputs, artifact, progress)
        try:
            with self._modules.installed(directory, pins or {}) as (work, _):
                return engine.apply(stack, work, document, expected_serial, inputs, artifact, progress)
        except ConfigError as exc:  # a module is not what was planned, or cannot be reached: nothing ran
            return ApplyOutcome(False, (), None, f"nothing applied: {exc}", engine.state_serial(stack))

    def _needs_modules(self, directory: Path) -> bool:
        """Remote calls to install, or a `.terraform/` the branch committed, which the installer's copy leaves out
        (an engine reads only a module manifest the gateway wrote)."""
        assert self._modules is not None
        return (directory / ".terraform").exists() or self._modules.calls_remote(directory)

    def state_serial(self, stack: str) -> int:
        return self.for_stack(stack).state_serial(stack)

    def masks_by_origin(self, stack: str) -> bool:
        return self.for_stack(stack).masks_by_origin(stack)

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        return self.for_stack(stack).sensitive_attributes(stack, resource_type)
