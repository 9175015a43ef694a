"""The DeclarationReader port over python-hcl2: what a stack's files declare, engine-neutral.

The readers are imported on first use: a command that reads records never loads the HCL parser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.domain.declarations import LiteralSecret, Unmasking
from gateway.domain.stack_order import RemoteStateRead


class HclDeclarations:
    def sensitive_variables(self, files: Mapping[str, str]) -> frozenset[str]:
        from gateway.adapters.hcl.sensitivity import declared_sensitive_variables

        return declared_sensitive_variables(files)

    def unmaskings(self, files: Mapping[str, str], secret_variables: frozenset[str], main_sensitive: frozenset[str],
                   sensitive_attributes: Callable[[str], frozenset[str]]) -> list[Unmasking]:
        from gateway.adapters.hcl.sensitivity import find_unmaskings

        return find_unmaskings(files, secret_variables, main_sensitive, sensitive_attributes)

    def outside_reads(self, files: Mapping[str, str]) -> list[Unmasking]:
        from gateway.adapters.hcl.sensitivity import find_outside_reads

        return find_outside_reads(files)

    def literal_secrets(self, files: Mapping[str, str]) -> list[LiteralSecret]:
        from gateway.adapters.hcl.sensitivity import find_literal_secrets

        return find_literal_secrets(files)

    def backend(self, files: Mapping[str, str]) -> dict[str, Any] | None:
        from gateway.adapters.hcl.backend import declared_backend

        return declared_backend(files)

    def local_modules(self, stack_path: str, root: Path) -> tuple[str, ...]:
        from gateway.adapters.modules.sources import local_module_directories, read_directory_on_disk

        return local_module_directories(stack_path, read_directory_on_disk(root))

    def remote_state_reads(self, files: Mapping[str, str], module: str = ".") -> tuple[RemoteStateRead, ...]:
        from gateway.adapters.hcl.remote_state import remote_state_reads

        return remote_state_reads(files, module)
