"""Terraform's JSON plan representation (`show -json`) as typed objects.

Every engine emits this format, so preview, policy and risk are written once. The reader accepts
format 0.x and 1.x (only a major bump breaks consumers) and rejects anything else by name.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from gateway.domain.errors import PlanFormatError

SUPPORTED_MAJOR_VERSIONS = frozenset({"0", "1"})


class ChangeKind(StrEnum):
    """What a resource change does, with both replace orders told apart."""

    NO_OP = "no-op"
    CREATE = "create"
    READ = "read"
    UPDATE = "update"
    DELETE = "delete"
    REPLACE = "replace"  # delete then create (the default)
    REPLACE_CREATE_FIRST = "replace-create-first"  # create_before_destroy
    FORGET = "forget"  # removed from state, object left alone
    CREATE_FORGET = "create-forget"  # old object forgotten, new one created


_KINDS: dict[tuple[str, ...], ChangeKind] = {
    ("no-op",): ChangeKind.NO_OP,
    ("create",): ChangeKind.CREATE,
    ("read",): ChangeKind.READ,
    ("update",): ChangeKind.UPDATE,
    ("delete",): ChangeKind.DELETE,
    ("delete", "create"): ChangeKind.REPLACE,
    ("create", "delete"): ChangeKind.REPLACE_CREATE_FIRST,
    ("forget",): ChangeKind.FORGET,
    ("create", "forget"): ChangeKind.CREATE_FORGET,
}


@dataclass(frozen=True)
class Change:
    """The before/after pair of one resource or output, with its masks."""

    actions: tuple[str, ...]
    before: Any = None
    after: Any = None
    after_unknown: Any = False
    before_sensitive: Any = False
    after_sensitive: Any = False
    replace_paths: tuple[tuple[str | int, ...], ...] = ()
    importing: Mapping[str, Any] | None = None
    generated_config: str | None = None

    @property
    def kind(self) -> ChangeKind:
        return _KINDS[self.actions]

    @property
    def is_destructive(self) -> bool:
        """Terraform's documented rule: any change containing `delete` destroys an object."""
        return "delete" in self.actions


@dataclass(frozen=True)
class ResourceChange:
    address: str
    mode: str
    type: str
    name: str
    change: Change
    index: str | int | None = None
    module_address: str | None = None
    previous_address: str | None = None
    provider_name: str | None = None
    deposed: str | None = None
    action_reason: str | None = None

    @property
    def kind(self) -> ChangeKind:
        return self.change.kind


@dataclass(frozen=True)
class Plan:
    format_version: str
    resource_changes: tuple[ResourceChange, ...]
    resource_drift: tuple[ResourceChange, ...] = ()
    output_changes: Mapping[str, Change] = field(default_factory=dict)
    terraform_version: str | None = None
    errored: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @cached_property  # a plan never changes, and summary, preview, risk and policy each read this
    def changes(self) -> tuple[ResourceChange, ...]:
        """Resource changes that do something: no-ops and reads left out, except a no-op that moves a resource
        to a new address or imports it (a rename through `moved` never looks like nothing happened)."""
        return tuple(
            rc for rc in self.resource_changes if rc.kind not in (ChangeKind.NO_OP, ChangeKind.READ)
            or rc.previous_address or rc.change.importing is not None
        )

    def moves_and_imports(self) -> dict[str, int]:
        """How many resources change address (`moved`) and how many are imported, as Terraform's summary counts them."""
        tally = {"moved": sum(1 for rc in self.resource_changes if rc.previous_address),
                 "import": sum(1 for rc in self.resource_changes if rc.change.importing is not None)}
        return {k: n for k, n in tally.items() if n}

    @property
    def destructive(self) -> tuple[ResourceChange, ...]:
        return tuple(rc for rc in self.resource_changes if rc.change.is_destructive)

    @property
    def has_changes(self) -> bool:
        return bool(self.changes) or any(
            c.kind != ChangeKind.NO_OP for c in self.output_changes.values()
        )

    def counts(self) -> dict[ChangeKind, int]:
        tally: dict[ChangeKind, int] = {}
        for rc in self.changes:
            if rc.kind != ChangeKind.NO_OP:  # a moved or imported no-op is counted by moves_and_imports
                tally[rc.kind] = tally.get(rc.kind, 0) + 1
        return tally

    def find(self, address: str) -> ResourceChange | None:
        return next((rc for rc in self.resource_changes if rc.address == address), None)


def canonical_json(data: Any) -> bytes:
    """The one byte form a plan is hashed and stored in."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def plan_digest(data: Mapping[str, Any], artifact: bytes | None = None) -> str:
    """What an approval binds to: the JSON plan, and the engine's own plan file when it keeps one."""
    return canonical_plan_digest(canonical_json(data), artifact)


def canonical_plan_digest(canonical: bytes, artifact: bytes | None = None) -> str:
    """`plan_digest` of a plan already in its canonical byte form (`canonical_json`): a big plan is written once."""
    digest = hashlib.sha256(canonical)
    if artifact is not None:
        digest.update(b"\0artifact:" + hashlib.sha256(artifact).digest())
    return "sha256:" + digest.hexdigest()


def decode_plan_bytes(content: bytes) -> Any:
    """Parse plan JSON bytes, accepting the UTF-16/UTF-8 BOMs Windows tools write."""
    for bom, encoding in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                          (codecs.BOM_UTF16_BE, "utf-16")):
        if content.startswith(bom):
            text = content.decode(encoding)
            break
    else:
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanFormatError(f"plan is not UTF-8 or UTF-16 text: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"plan is not valid JSON: {exc}") from exc


def load_plan(data: Any) -> Plan:
    """Read a `show -json` document (already parsed) into a Plan, or say precisely why not."""
    if not isinstance(data, Mapping):
        raise PlanFormatError("plan must be a JSON object with a format_version")
    version = data.get("format_version")
    if not isinstance(version, str) or not version:
        raise PlanFormatError("plan has no format_version: is this `terraform show -json` output?")
    major = version.split(".", 1)[0]
    if major not in SUPPORTED_MAJOR_VERSIONS:
        raise PlanFormatError(
            f"plan format_version {version} is not supported (this gateway reads 0.x and 1.x)"
        )
    try:
        return Plan(
            format_version=version,
            terraform_version=data.get("terraform_version"),
            resource_changes=tuple(_resource_change(rc) for rc in data.get("resource_changes") or ()),
            resource_drift=tuple(_resource_change(rc) for rc in data.get("resource_drift") or ()),
            output_changes={
                name: _change(ch) for name, ch in (data.get("output_changes") or {}).items()
            },
            errored=bool(data.get("errored", False)),
            raw=data,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanFormatError(f"plan has a malformed change: {exc}") from exc


def _change(data: Mapping[str, Any]) -> Change:
    actions = tuple(data["actions"])
    if actions not in _KINDS:
        raise ValueError(f"unknown action list {list(actions)}")
    return Change(
        actions=actions,
        before=data.get("before"),
        after=data.get("after"),
        after_unknown=data.get("after_unknown", False),
        before_sensitive=data.get("before_sensitive", False),
        after_sensitive=data.get("after_sensitive", False),
        replace_paths=tuple(tuple(p) for p in data.get("replace_paths") or ()),
        importing=data.get("importing"),
        generated_config=data.get("generated_config"),
    )


def _resource_change(data: Mapping[str, Any]) -> ResourceChange:
    address = data["address"]
    if not isinstance(address, str):
        raise ValueError("resource change address must be a string")
    return ResourceChange(
        address=address,
        mode=data.get("mode", "managed"),
        type=data["type"],
        name=data["name"],
        index=data.get("index"),
        module_address=data.get("module_address"),
        previous_address=data.get("previous_address"),
        provider_name=data.get("provider_name"),
        deposed=data.get("deposed"),
        action_reason=data.get("action_reason"),
        change=_change(data["change"]),
    )


def iter_leaves(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Yield (path, leaf) for every scalar in a nested JSON value; empty containers are leaves."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from iter_leaves(item, path + (key,))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from iter_leaves(item, path + (i,))
    else:
        yield path, value


def mask_at(mask: Any, path: tuple[str | int, ...]) -> bool:
    """Whether a `*_sensitive` / `after_unknown` mask marks `path` (or any parent of it)."""
    node = mask
    for step in path:
        if node is True:
            return True
        if isinstance(node, Mapping) and isinstance(step, str):
            node = node.get(step, False)
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        else:
            return False
    return node is True


def format_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out
