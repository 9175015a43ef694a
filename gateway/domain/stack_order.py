"""The order an apply takes a change's stacks: gateway.yaml's `after:`, and the stacks whose state another reads.

A stack that reads another's outputs through `data "terraform_remote_state"` is applied after it, so that what
it reads is what the change made there. A read names a stack by where that stack's state lives:

    local backend        its `path` (relative to the reading stack's directory, default `terraform.tfstate`)
                         resolves to the other stack's state file (its own `backend "local"` path, or
                         `terraform.tfstate` in its directory when it declares no backend), or into its directory
    s3, gcs, azurerm,    the same backend type with the same settings that name a state (`STATE_NAMED_BY`:
    http, consul...      bucket and key, bucket and prefix, ...) as the other stack's `terraform { backend }`
    remote               the same organization and workspace name as the other stack's `remote` backend or
                         `cloud` block (HCP Terraform)
    any other type       the same backend type with exactly the same settings

A read whose naming settings are expressions (`bucket = var.bucket`) names no stack that can be known without
planning; it adds no order (declare one with `after:`). So does a read of a workspace other than `default`: the
gateway plans and applies every stack in its default workspace. The sandbox simulator has no convention of its
own: its remote-state reads give plausible outputs, whatever they name.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.domain.errors import ConfigError

STATE_NAMED_BY: dict[str, tuple[str, ...]] = {  # backend type -> the settings that say which state it is
    "s3": ("bucket", "key"),
    "gcs": ("bucket", "prefix"),
    "azurerm": ("storage_account_name", "container_name", "key"),
    "http": ("address",),
    "consul": ("path",),
    "pg": ("conn_str", "schema_name"),
    "cos": ("bucket", "prefix", "key"),
    "oss": ("bucket", "prefix", "key"),
    "kubernetes": ("namespace", "secret_suffix"),
}
DEFAULT_STATE_FILE = "terraform.tfstate"  # the local backend's, in the stack's directory
REMOTE_HOST = "app.terraform.io"  # the `remote` backend's and `cloud` block's hostname when none is set


@dataclass(frozen=True)
class RemoteStateRead:
    """One `data "terraform_remote_state"` block of a stack, with the settings its text gives as literals."""

    address: str  # data.terraform_remote_state.network
    backend: str  # local, s3, remote...
    config: Mapping[str, Any] = field(default_factory=dict)  # the literal settings
    unresolved: frozenset[str] = frozenset()  # settings given by an expression: unknown until planned
    workspace: str = "default"


@dataclass(frozen=True)
class StackDeclarations:
    """Where a stack keeps its state, and whose state it reads, as its files declare."""

    path: str  # the stack's directory in the repository
    backend: Mapping[str, Any] | None = None  # `{TYPE: {setting: value}}` (`cloud` for a cloud block); None: local
    reads: tuple[RemoteStateRead, ...] = ()


def state_reads(stacks: Mapping[str, StackDeclarations]) -> dict[str, dict[str, str]]:
    """Each stack -> the other stacks of `stacks` whose state it reads, each with why (the reading block)."""
    found: dict[str, dict[str, str]] = {}
    for name, stack in stacks.items():
        for read in stack.reads:
            other = _stack_named(read, stack.path, {n: s for n, s in stacks.items() if n != name})
            if other is not None:
                found.setdefault(name, {}).setdefault(other, f"{read.address} reads its state")
    return found


def order_stacks(stacks: Iterable[str], before: Mapping[str, Mapping[str, str]]) -> list[str]:
    """`stacks` in order: each after those `before[stack]` names among them (with why), otherwise by name.

    Orders that go round in a circle leave no stack to go first: refused, naming the stacks and each step.
    """
    todo, done = sorted(set(stacks)), []
    while todo:
        ready = next((s for s in todo if not set(before.get(s, {})) & set(todo)), None)
        if ready is None:
            raise ConfigError(_circle(todo, before))
        done.append(ready)
        todo.remove(ready)
    return done


def _circle(todo: list[str], before: Mapping[str, Mapping[str, str]]) -> str:
    """Every stack left waits for another left: walk back along those waits until one repeats."""
    path = [todo[0]]
    while True:
        waits_for = sorted(set(before.get(path[-1], {})) & set(todo))[0]
        if waits_for in path:
            circle = path[path.index(waits_for):]
            break
        path.append(waits_for)
    steps = [f"{stack} is applied after {waits} ({before[stack][waits]})"
             for stack, waits in zip(circle, circle[1:] + circle[:1], strict=True)]
    return (f"the stacks' apply orders go round in a circle among {', '.join(sorted(circle))}: {'; '.join(steps)}. "
            f"Remove one of these reads or `after:` entries")


def _stack_named(read: RemoteStateRead, reader_path: str, others: Mapping[str, StackDeclarations]) -> str | None:
    if read.workspace != "default":
        return None
    if read.backend == "local":
        return _local_stack(read, reader_path, others)
    wanted = _state_identity(read.backend, read.config, read.unresolved)
    if wanted is None:
        return None
    for name in sorted(others):
        backend = others[name].backend or {}
        if any(_state_identity(kind, config or {}, frozenset()) == wanted for kind, config in backend.items()):
            return name
    return None


def _local_stack(read: RemoteStateRead, reader_path: str, others: Mapping[str, StackDeclarations]) -> str | None:
    """The stack whose state file the path is, else the stack whose directory it is in (the deepest)."""
    if "path" in read.unresolved or not isinstance(read.config.get("path", DEFAULT_STATE_FILE), str):
        return None
    state = _resolve(reader_path, read.config.get("path", DEFAULT_STATE_FILE))
    for name in sorted(others):
        if _local_state_file(others[name]) == state:
            return name
    inside = [name for name, other in others.items()
              if state.startswith(posixpath.normpath(other.path).rstrip("/") + "/")]
    return max(inside, key=lambda name: len(posixpath.normpath(others[name].path)), default=None)


def _local_state_file(stack: StackDeclarations) -> str | None:
    if stack.backend is None:
        return _resolve(stack.path, DEFAULT_STATE_FILE)
    path = (stack.backend.get("local") or {}).get("path", DEFAULT_STATE_FILE) if "local" in stack.backend else None
    return _resolve(stack.path, path) if isinstance(path, str) else None


def _resolve(directory: str, path: str) -> str:
    return posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(directory, path))


def _state_identity(kind: str, config: Mapping[str, Any], unresolved: frozenset[str]) -> tuple[Any, ...] | None:
    """What says which state a backend of `kind` with `config` holds (None: it cannot be told from the text)."""
    if kind in ("remote", "cloud"):
        workspaces = config.get("workspaces")
        if isinstance(workspaces, list):  # a nested block, as the stack's own backend writes it
            workspaces = workspaces[0] if len(workspaces) == 1 else None
        name = workspaces.get("name") if isinstance(workspaces, Mapping) else None
        if name is None or {"workspaces", "organization", "hostname"} & unresolved:
            return None
        return ("remote", config.get("hostname", REMOTE_HOST), config.get("organization"), name)
    keys = STATE_NAMED_BY.get(kind)
    if keys is None:  # a backend this module does not know: only the very same settings name the same state
        return None if unresolved else (kind, tuple(sorted((k, repr(v)) for k, v in config.items())))
    if set(keys) & unresolved or all(config.get(k) is None for k in keys):
        return None
    return (kind, *(config.get(k) for k in keys))
