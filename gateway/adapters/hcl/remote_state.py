"""Whose state a stack reads, as its HCL says: its `data "terraform_remote_state"` blocks, read without planning."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.domain.stack_order import RemoteStateRead

# The directories a path may be built from and still be known: the module's own, and the stack's (the root's, where
# Terraform runs, which a relative local `path` is taken from).
_MODULE_DIRECTORY = re.compile(r"\$\{\s*path\.module\s*\}")
_STACK_DIRECTORY = re.compile(r"\$\{\s*path\.(root|cwd)\s*\}")


class _Unresolved:
    """A setting given by an expression (a variable, a function call): its value is known only to a plan."""


UNRESOLVED = _Unresolved()


def remote_state_reads(files: Mapping[str, str], module: str = ".") -> tuple[RemoteStateRead, ...]:
    """Every `data "terraform_remote_state"` block of these files whose backend type and config are written out
    (settings given by expressions are listed as unresolved). `module`: the files' directory relative to the
    stack's, what `path.module` is there."""
    from gateway.adapters.hcl.reading import documents_mentioning

    found: list[RemoteStateRead] = []
    for _, document in documents_mentioning(files, "terraform_remote_state"):
        for block in document.get("data", []):
            for kind, labelled in block.items():
                if _value(kind) != "terraform_remote_state" or not isinstance(labelled, dict):
                    continue
                for label, body in labelled.items():
                    read = _read(f"data.terraform_remote_state.{_value(label)}", _known_paths(body, module))
                    if read is not None:
                        found.append(read)
    return tuple(found)


def _read(address: str, body: Mapping[str, Any]) -> RemoteStateRead | None:
    backend, workspace = _value(body.get("backend")), _value(body.get("workspace", '"default"'))
    if not isinstance(backend, str) or not isinstance(workspace, str):
        return None
    config = body.get("config", {})
    if not isinstance(config, dict):  # the whole config is an expression (`config = var.state`): unknown
        return None
    settings = {_value(k): _value(v) for k, v in config.items()}
    return RemoteStateRead(address, backend, {k: v for k, v in settings.items() if not _unknown(v)},
                           frozenset(k for k, v in settings.items() if _unknown(v)), workspace)


def _known_paths(value: Any, module: str) -> Any:
    """`value` with `${path.module}`, `${path.root}` and `${path.cwd}` in its strings written as the directories."""
    if isinstance(value, str):
        return _STACK_DIRECTORY.sub(".", _MODULE_DIRECTORY.sub(module, value))
    if isinstance(value, dict):
        return {k: _known_paths(v, module) for k, v in value.items()}
    if isinstance(value, list):
        return [_known_paths(v, module) for v in value]
    return value


def _value(value: Any) -> Any:
    """python-hcl2's rendering of a setting as its value: a quoted string with no interpolation is a literal;
    anything else written as `${...}` is UNRESOLVED."""
    if isinstance(value, str):
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            return UNRESOLVED if "${" in value else json.loads(value)
        return UNRESOLVED if value.startswith("${") else value
    if isinstance(value, dict):
        return {_value(k): _value(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _unknown(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_unknown(v) for v in value)
    return value is UNRESOLVED
