"""Engines: plan and apply one stack, the modules it calls, what its HCL declares, the sandbox's cloud."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.domain.declarations import LiteralSecret, Unmasking
from gateway.domain.stack_order import RemoteStateRead


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


class RemoteModules(Protocol):
    """The registry, git and HTTP modules a stack calls, laid out as `terraform init` lays them out."""

    def installed(self, directory: Path) -> AbstractContextManager[tuple[Path, Sequence[Any]]]:
        """A private copy of the stack in `directory` with its remote modules under `.terraform/modules` (and
        the pins of what was installed); removed when the context ends, so callers can only read it."""
        ...


class SimulatedCloud(Protocol):
    """The sandbox engine's cloud, changed behind the gateway's back as people outside it would (a console edit, a
    failing provider), and read for imports. It stands for real infrastructure only in the simulator."""

    def edit_object(self, stack: str, address: str, changes: Mapping[str, Any]) -> None: ...

    def delete_object(self, stack: str, address: str) -> None: ...

    def inject_fault(self, stack: str, address: str, message: str) -> None: ...

    def inject_delay(self, stack: str, address: str, seconds: float) -> None: ...

    def get_object(self, rtype: str, rid: str) -> Mapping[str, Any] | None:
        """A live object's attributes, or None when no such object exists."""
        ...

    def managed_by(self, rtype: str, rid: str, stacks: Collection[str]) -> tuple[str, str] | None:
        """The (stack, address) among `stacks` whose state holds the object, if any does."""
        ...

    def declarable_attributes(self, rtype: str, live: Mapping[str, Any]) -> Mapping[str, Any]:
        """The attributes of a live object a declaration sets (neither computed nor sensitive)."""
        ...


class DeclarationReader(Protocol):
    """What HCL files declare, read without planning them. `files` maps a shown path to its text."""

    def sensitive_variables(self, files: Mapping[str, str]) -> frozenset[str]:
        """The variables declared with `sensitive = true`."""
        ...

    def unmaskings(self, files: Mapping[str, str], secret_variables: frozenset[str], main_sensitive: frozenset[str],
                   sensitive_attributes: Callable[[str], frozenset[str]]) -> list[Unmasking]:
        """Every place the files try to show a secret in clear, by address."""
        ...

    def outside_reads(self, files: Mapping[str, str]) -> list[Unmasking]:
        """File functions reading outside their directory."""
        ...

    def literal_secrets(self, files: Mapping[str, str]) -> list[LiteralSecret]:
        """Secret-like attributes set from a string literal (a file that cannot be read is a ConfigError)."""
        ...

    def backend(self, files: Mapping[str, str]) -> Mapping[str, Any] | None:
        """The backend the files declare, as `{TYPE: {setting: value}}` (None: none)."""
        ...

    def local_modules(self, stack_path: str, root: Path) -> tuple[str, ...]:
        """The local module directories (repo-relative) the stack at `stack_path` calls, in a checkout at `root`."""
        ...

    def remote_state_reads(self, files: Mapping[str, str], module: str = ".") -> tuple[RemoteStateRead, ...]:
        """The `data "terraform_remote_state"` blocks of the files, with the settings they give as literals (`module`:
        the files' directory relative to the stack's, what `${path.module}` means there)."""
        ...
