"""The ports the use cases talk through. Adapters implement them; tests may fake them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class EnginePlan:
    """A plan in Terraform's JSON format, with the state it was made against."""

    document: Mapping[str, Any]
    state_serial: int
    state_lineage: str
    artifact: bytes | None = None  # the engine's own saved plan (Terraform's plan file): what the apply runs


@dataclass(frozen=True)
class ApplyOutcome:
    succeeded: bool
    applied: tuple[str, ...]  # addresses whose change completed, in order
    failed_address: str | None
    error: str | None
    state_serial: int


@dataclass(frozen=True)
class StackInputs:
    """What the gateway supplies to a stack besides its files.

    Every supplied value and every variable main declares sensitive is secret by origin: an engine
    keeps it masked whatever the branch's files declare (DESIGN rule 6: a branch can never unmask).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    sensitive_on_main: frozenset[str] = frozenset()

    @property
    def secret(self) -> frozenset[str]:
        return frozenset(self.values) | self.sensitive_on_main


class Engine(Protocol):
    """Plans and applies one stack; every engine emits Terraform's JSON plan format."""

    name: str

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan: ...

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        """Apply exactly the saved plan; `progress` gets the engine's own lines as they come, secrets masked."""
        ...

    def state_serial(self, stack: str) -> int: ...

    def masks_by_origin(self, stack: str) -> bool:
        """Whether the engine keeps a secret masked through nonsensitive() (the sandbox does; Terraform cannot)."""
        ...

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        """Attributes of a resource type that the provider schema marks sensitive (non-empty when unknown)."""
        ...
