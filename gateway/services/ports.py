"""The ports the use cases talk through. Adapters implement them; tests may fake them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class EnginePlan:
    """A plan in Terraform's JSON format, with the state it was made against."""

    document: Mapping[str, Any]
    state_serial: int
    state_lineage: str


@dataclass(frozen=True)
class ApplyOutcome:
    succeeded: bool
    applied: tuple[str, ...]  # addresses whose change completed, in order
    failed_address: str | None
    error: str | None
    state_serial: int


class Engine(Protocol):
    """Plans and applies one stack; every engine emits Terraform's JSON plan format."""

    name: str

    def plan(self, stack: str, directory: Path) -> EnginePlan: ...

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int) -> ApplyOutcome: ...

    def state_serial(self, stack: str) -> int: ...
