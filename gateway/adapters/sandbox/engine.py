"""The sandbox engine: plans and applies Terraform stacks against a simulated cloud.

It behaves like Terraform where the gateway cares: state with serial and lineage, refresh and
drift, dependency order, force-new replacement in both orders, unknown computed values,
lifecycle rules, `moved` and `import` blocks, and half-done applies; modules (their instances'
addresses as Terraform writes them) and data sources read at plan time, or during the apply when
they wait on it. Its plans are Terraform's JSON plan format, `configuration` included. Everything
it creates exists only in the gateway's store.
"""

from __future__ import annotations

import copy
import graphlib
import json
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from gateway.adapters.sandbox.config import (
    Body,
    ResourceConfig,
    StackConfig,
    collector_paused,
    line_of,
    load_stack,
    traversal_text,
)
from gateway.adapters.sandbox.data_sources import data_object_id, read_data, unsimulated_data
from gateway.adapters.sandbox.evaluation import (
    Evaluation,
    Index,
    Path_,
    Scope,
    instance_address,
    strip_keys,
)
from gateway.adapters.sandbox.hcl_eval import Evaluator, MaskedFailure
from gateway.adapters.sandbox.plan_json import configuration_json, values_json
from gateway.adapters.sandbox.schema import plausible_value, schema_for
from gateway.adapters.sandbox.values import UNKNOWN, Secret, Sensitive, contains_unknown, marked, unmark
from gateway.domain.errors import ApplyError, ConfigError, PlanError
from gateway.domain.plan import ChangeKind, ResourceChange, load_plan
from gateway.ports import ApplyOutcome, EnginePlan, StackInputs

log = structlog.get_logger(__name__)

ENGINE_LABEL = "sandbox simulator"
DELAY_PREFIX = "delay:"  # a fault that slows a step down instead of failing it


@dataclass
class StateResource:
    type: str
    name: str
    index: Index
    id: str
    attributes: dict[str, Any]
    sensitive_attributes: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    module: str = ""  # the module instance's address, "" in the root module


@dataclass
class StackState:
    lineage: str
    serial: int = 0
    resources: dict[str, StateResource] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackState:
        return cls(
            lineage=data["lineage"],
            serial=data["serial"],
            resources={a: StateResource(**r) for a, r in data["resources"].items()},
            outputs=dict(data.get("outputs", {})),
        )


class SandboxStore(Protocol):
    """Where the sandbox keeps each stack's state and the simulated cloud's objects."""

    def read_state(self, stack: str) -> StackState | None: ...
    def read_serial(self, stack: str) -> int: ...
    def write_state(self, stack: str, state: StackState, expected_serial: int,
                    changed: Collection[str] | None = None) -> None:
        """Save state if its serial is still `expected_serial`; `changed` limits the write to those addresses."""
        ...

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None: ...
    def get_objects(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]: ...
    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None: ...
    def delete_object(self, rtype: str, rid: str) -> None: ...
    def take_fault(self, stack: str, address: str) -> str | None: ...


def resource_key(address: str) -> str:
    """The configuration address of a resource instance address (instance keys removed)."""
    return strip_keys(address)


class SandboxEngine:
    """Plans and applies one stack at a time against the simulated cloud in `store`."""

    name = "sandbox"

    def __init__(self, store: SandboxStore):
        self.store = store

    def state_serial(self, stack: str) -> int:
        return self.store.read_serial(stack)

    def masks_by_origin(self, stack: str) -> bool:
        return True  # its evaluator keeps the Secret mark through nonsensitive()

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        return schema_for(resource_type).sensitive

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        state = self.store.read_state(stack) or StackState(lineage=str(uuid.uuid4()))
        with collector_paused():
            config = load_stack(directory)
            planner = _Planner(stack, config, state, self.store, inputs)
            document = planner.plan()
        log.info("sandbox.plan", stack=stack, changes=len(document["resource_changes"]), serial=state.serial)
        return EnginePlan(document=document, state_serial=state.serial, state_lineage=state.lineage)

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        """Apply exactly `document`'s changes (the sandbox keeps no plan file of its own: `artifact` is unused;
        it applies in one go, so it reports no progress lines)."""
        state = self.store.read_state(stack) or StackState(lineage=str(uuid.uuid4()))
        if state.serial != expected_serial:
            raise ApplyError(
                f"state of stack {stack} moved since the plan (serial {expected_serial} -> {state.serial})"
            )
        with collector_paused():
            config = load_stack(directory)
            applier = _Applier(stack, config, state, self.store, inputs, load_plan(document).resource_changes)
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
        resource = self._state_resource(stack, address)
        self.store.delete_object(resource.type, resource.id)

    def _state_resource(self, stack: str, address: str) -> StateResource:
        state = self.store.read_state(stack)
        if state is None or address not in state.resources:
            raise ConfigError(f"stack {stack} has no resource {address} in its state")
        return state.resources[address]


# --- shared evaluation -----------------------------------------------------------------------


class _Evaluation(Evaluation):
    """What plan and apply add to the shared scopes: block bodies, data reads and outputs."""

    store: SandboxStore

    def evaluator(self, where: str, **extra: Any) -> Evaluator:
        return self.root.evaluator(where, **extra)

    def desired(self, resource: ResourceConfig, ev: Evaluator) -> dict[str, Any]:
        """The instance's configured attributes, nested blocks (dynamic ones expanded) as lists of objects.

        An error names the line of the attribute it comes from, not only the block's.
        """
        block_at = f"{resource.file}:{resource.line}:"
        if block_at not in ev.where:
            return eval_body(resource.body, ev)
        return eval_body(resource.body, ev, lambda line: ev.where.replace(block_at, f"{resource.file}:{line}:", 1))

    def outputs(self) -> dict[str, tuple[Any, bool]]:
        return {name: (self.root.output(name), out.sensitive) for name, out in self.config.outputs.items()}

    def referenced_attributes(self, path: Path_, resource: ResourceConfig) -> set[str]:
        """Attributes of this block that expressions read: each must have a value, known or not."""
        return self.referenced.get(path, {}).get(resource.key, set())

    def with_referenced(self, path: Path_, resource: ResourceConfig, value: dict[str, Any]) -> ResourceObject:
        """An object as references see it: an attribute it does not hold is unknown while its id is,
        then plausible (the schema table is not the provider's whole schema)."""
        rid, _ = unmark(value.get("id"))
        if rid is UNKNOWN:
            return ResourceObject(value, lambda name: UNKNOWN)
        missing = self.referenced_attributes(path, resource) - {k for k, v in value.items() if v is not None}
        filled = {**value, **{k: plausible_value(resource.type, k, str(rid), value) for k in missing}}
        return ResourceObject(filled, lambda name: plausible_value(resource.type, name, str(rid), filled))

    def read(self, scope: Scope, resource: ResourceConfig, ev: Evaluator, at_apply: bool) -> tuple[Any, Any]:
        """(the data source's value, its arguments); the value is UNKNOWN until its arguments are known."""
        args = self.desired(resource, ev)
        if contains_unknown(args):
            return UNKNOWN, args
        plain, mark = unmark(args)
        try:
            value = read_data(resource.type, plain, self.store.get_object)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(f"{ev.where}: {exc}") from None
        if value is None:  # not simulated: unknown until an apply has read it once (kept like an object)
            kind, rid = f"data.{resource.type}", data_object_id(plain)
            seen = self.store.get_object(kind, rid) is not None
            if not seen and not at_apply:
                return UNKNOWN, args
            value = unsimulated_data(resource.type, plain, self.referenced_attributes(scope.path, resource))
            if not seen:
                self.store.put_object(kind, rid, plain)
        return marked(self.with_referenced(scope.path, resource, value), mark), args


class ResourceObject(dict[str, Any]):
    """A resource's or data source's attributes, open to any attribute name.

    Expressions may read attributes the schema table does not list (`v.arn` in a for expression
    over a resource's instances): the evaluator asks `name in obj`, then `obj[name]`, and gets the
    value `missing(name)` gives instead of an error. Everything else sees the stored attributes.
    """

    def __init__(self, attributes: Mapping[str, Any], missing: Callable[[str], Any]):
        super().__init__(attributes)
        self.missing = missing

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> Any:
        return self.missing(name)


def eval_body(body: Body, ev: Evaluator, where_at: Callable[[int], str] | None = None) -> dict[str, Any]:
    """A block body's values; `where_at(line)` names a line in errors (the attribute's)."""
    out: dict[str, Any] = {}
    for name, tree in body.attributes.items():
        try:
            out[name] = ev.eval(tree)
        except ConfigError as exc:
            if where_at is None:
                raise
            raise _located(exc, ev.where, where_at(line_of(tree))) from None
    for block_type, block in body.blocks:
        if block_type == "dynamic":
            _eval_dynamic(block, ev, out)
        elif out.get(block_type) is not UNKNOWN:
            out.setdefault(block_type, []).append(eval_body(block, ev, where_at))
    return out


def _located(exc: ConfigError, where: str, located: str) -> ConfigError:
    """The same error, naming the attribute's line instead of the block's (a masked failure stays masked)."""
    message = str(exc)
    if not message.startswith(where):
        return exc  # raised elsewhere (a local, a variable): it names its own line
    message = located + message[len(where):]
    return MaskedFailure(message, exc.mark) if isinstance(exc, MaskedFailure) else ConfigError(message)


def _eval_dynamic(block: Body, ev: Evaluator, out: dict[str, Any]) -> None:
    """A `dynamic "x"` block: one `x` block per item of for_each, its `content` evaluated with the iterator."""
    if len(block.labels) != 1:
        raise ConfigError(f"{ev.where}: line {block.line}: a dynamic block takes one label, the block type")
    label = block.labels[0]
    content = next((b for t, b in block.blocks if t == "content"), None)
    if "for_each" not in block.attributes or content is None:
        raise ConfigError(f"{ev.where}: line {block.line}: dynamic \"{label}\" needs for_each and a content block")
    iterator = traversal_text(block.attributes["iterator"], ev.where) if "iterator" in block.attributes else label
    items, mark = unmark(ev.eval(block.attributes["for_each"]))
    if items is UNKNOWN or (isinstance(items, list) and contains_unknown(items) and not items):
        out[label] = UNKNOWN  # how many blocks there will be is known only after apply
        return
    if items is None:
        raise ConfigError(f"{ev.where}: line {block.line}: dynamic \"{label}\": for_each cannot be null")
    blocks = out.setdefault(label, [])
    if blocks is UNKNOWN:
        return
    pairs = items.items() if isinstance(items, dict) else enumerate(items)
    for key, value in pairs:
        child = ev.child(**{iterator: {"key": marked(key, mark), "value": marked(value, mark)}})
        blocks.append(marked(eval_body(content, child), mark))


def proposed_attributes(resource: ResourceConfig, prior: Mapping[str, Any], desired: Mapping[str, Any],
                        computed: Collection[str] = ()) -> dict:
    """Prior attributes overlaid with config; unset optional ones fall back to their defaults."""
    schema = schema_for(resource.type)
    keep = {"id", *schema.computed, *computed}
    proposed = {k: (v if k in keep else schema.defaults.get(k)) for k, v in prior.items()}
    # an attribute the provider computes keeps its value while the configuration leaves it null
    proposed.update({k: v for k, v in desired.items() if unmark(v)[0] is not None or k not in keep})
    ignore = resource.lifecycle.ignore_changes
    for name in (prior if ignore is None else ignore):
        if name in prior:
            proposed[name] = prior[name]
    return {k: v for k, v in proposed.items() if v is not None or k in desired or k in keep}


def split_marks(value: Any) -> tuple[Any, Any, Any]:
    """(plain value with unknowns as null, sensitive mask, unknown mask), Terraform-shaped."""
    if value is UNKNOWN:
        return None, False, True
    if isinstance(value, Sensitive):
        plain, _, unknown = split_marks(value.value)
        return plain, True, unknown
    if isinstance(value, dict):
        plain, sens, unk = {}, {}, {}
        for k, v in value.items():
            p, s, u = split_marks(v)
            if u is not True:
                plain[k] = p
            if s not in (False, {}, []):
                sens[k] = s
            if u not in (False, {}, []):
                unk[k] = u
        return plain, sens, unk
    if isinstance(value, list):
        parts = [split_marks(v) for v in value]
        return [p for p, _, _ in parts], [s for _, s, _ in parts], [u for _, _, u in parts]
    return value, False, False


def _any_marked(mask: Any) -> bool:
    """Whether a Terraform-shaped mask (bool, or nested dicts and lists of them) marks anything."""
    if isinstance(mask, dict):
        return any(_any_marked(m) for m in mask.values())
    if isinstance(mask, list):
        return any(_any_marked(m) for m in mask)
    return mask is True


def _mark_sensitive(attrs: Mapping[str, Any], names: set[str] | frozenset[str]) -> dict[str, Any]:
    """Mark the named attributes secret: the schema or the state says so, whatever the configuration says."""
    return {k: Secret(v) if k in names and not isinstance(v, Secret) else v for k, v in attrs.items()}


def _state_value(res: StateResource) -> dict[str, Any]:
    """A resource's attributes as references see them: what was sensitive when applied stays masked."""
    return _mark_sensitive(res.attributes, set(res.sensitive_attributes) | schema_for(res.type).sensitive)


def _sensitive_names(value: Mapping[str, Any]) -> list[str]:
    return sorted(k for k, v in value.items() if unmark(v)[1])


# --- planning --------------------------------------------------------------------------------


class _Planner(_Evaluation):
    def __init__(self, stack: str, config: StackConfig, state: StackState, store: SandboxStore,
                 inputs: StackInputs):
        super().__init__(stack, config, inputs)
        self.state = state
        self.store = store
        self.changes: list[dict[str, Any]] = []
        self.drift: list[dict[str, Any]] = []
        self.refusals: list[str] = []
        self.data_read: list[dict[str, Any]] = []  # data sources read at plan time (prior_state)
        self.planned: list[dict[str, Any]] = []  # every instance's planned values (planned_values)

    def plan(self) -> dict[str, Any]:
        refreshed = self._refresh()
        previous = self._apply_moves(refreshed)
        planned: set[str] = set()
        for scope, resource, index, ev, address in self.instances_in_order():
            if resource.mode == "data":
                scope.values[resource.key][index] = self._plan_read(scope, resource, index, ev, address)
                continue
            planned.add(address)
            scope.values[resource.key][index] = self._plan_instance(
                scope, resource, index, ev, refreshed.get(address), previous.get(address)
            )
        self.expand_all()
        for address, prior in sorted(refreshed.items()):
            if address not in planned:
                self._plan_orphan(address, prior, previous.get(address))
        if self.refusals:
            raise PlanError("; ".join(self.refusals))
        document: dict[str, Any] = {
            "format_version": "1.2",
            "gateway_engine": ENGINE_LABEL,
            "planned_values": {"root_module": values_json(self.planned)},
            "resource_changes": sorted(self.changes, key=lambda c: c["address"]),
            "resource_drift": sorted(self.drift, key=lambda c: c["address"]),
            "output_changes": self._output_changes(),
            "configuration": configuration_json(self, self.config),
            "applyable": any(c["change"]["actions"] not in (["no-op"], ["read"]) for c in self.changes),
            "complete": True,
            "errored": False,
        }
        prior = [_state_json(address, res) for address, res in sorted(refreshed.items())] + self.data_read
        if prior:
            document["prior_state"] = {"format_version": "1.0", "values": {"root_module": values_json(prior)}}
        return document

    def _refresh(self) -> dict[str, StateResource]:
        """Read every object the state knows from the simulated cloud; record what drifted."""
        refreshed: dict[str, StateResource] = {}
        cloud = self.store.get_objects([(r.type, r.id) for r in self.state.resources.values()])
        for address, res in self.state.resources.items():
            live = cloud.get((res.type, res.id))
            if live is None:
                self.drift.append(_change_json(address, res, ["delete"], res.attributes, None,
                                               res.sensitive_attributes))
                continue
            if live != res.attributes:
                self.drift.append(_change_json(address, res, ["update"], res.attributes, live,
                                               res.sensitive_attributes))
            refreshed[address] = replace(res, attributes=live)
        return refreshed

    def _apply_moves(self, refreshed: dict[str, StateResource]) -> dict[str, str]:
        """Follow `moved` blocks: the root's (full addresses) and each module's (relative to its instances)."""
        previous: dict[str, str] = {}
        for path, config in self.configs():
            for source, target in config.moved:
                for address in list(refreshed):
                    prefix = _module_prefix(refreshed[address].module, len(path))
                    if prefix is None or strip_keys(prefix) != strip_keys(".".join(f"module.{p}" for p in path)):
                        continue
                    local = address[len(prefix) + 1:] if prefix else address
                    if not (local == source or local.startswith((source + "[", source + "."))):
                        continue
                    new_address = (f"{prefix}." if prefix else "") + target + local[len(source):]
                    if new_address in refreshed:
                        self.refusals.append(f"moved block: {new_address} already exists, cannot move {address} onto it")
                        continue
                    refreshed[new_address] = relocated(refreshed.pop(address), new_address)
                    previous[new_address] = previous.pop(address, address)
        return previous

    def _plan_read(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator, address: str) -> Any:
        """Read a data source now; when its arguments wait on apply, the plan says it will be read then."""
        value, args = self.read(scope, resource, ev, at_apply=False)
        base = {"address": address, "mode": "data", "type": resource.type, "name": resource.name, "index": index,
                "module_address": scope.address}
        if value is UNKNOWN:
            after = {**args, **{k: UNKNOWN for k in self.referenced_attributes(scope.path, resource) if k not in args}}
            reason = "read_because_config_unknown" if contains_unknown(args) else "read_because_dependency_pending"
            self._record(base, ["read"], None, after if contains_unknown(args) else UNKNOWN, None, reason=reason)
            self.planned.append(_values_entry(base, after))
            return value
        entry = _values_entry(base, value)
        self.data_read.append(entry)
        self.planned.append(entry)
        return value

    def _plan_instance(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator,
                       prior: StateResource | None, previous_address: str | None) -> Any:
        value = self._plan_change(scope, resource, index, ev, prior, previous_address)
        base = {"address": instance_address(resource.key, index, scope.address), "mode": "managed",
                "type": resource.type, "name": resource.name, "index": index, "module_address": scope.address}
        change = self.changes[-1]["change"]  # just recorded: its after is the planned value, already split
        self.planned.append(_values_entry(base, None, (change["after"], change["after_sensitive"])))
        return value if value is UNKNOWN else self.with_referenced(scope.path, resource, value)

    def _plan_change(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator,
                     prior: StateResource | None, previous_address: str | None) -> Any:
        schema = schema_for(resource.type)
        address = instance_address(resource.key, index, scope.address)
        desired = _mark_sensitive(self.desired(resource, ev), schema.sensitive)
        computed = self.referenced_attributes(scope.path, resource)
        importing = None
        if prior is None and address in self.config.imports:
            prior, importing = self._import(resource, index, address, scope.address)
        base = {"address": address, "type": resource.type, "name": resource.name, "index": index,
                "previous_address": previous_address, "module_address": scope.address}
        if prior is None:
            after = {**schema.defaults, **desired}
            after.update({k: UNKNOWN for k in ("id", *schema.computed, *computed) if unmark(desired.get(k))[0] is None})
            self._record(base, ["create"], None, after, None)
            return after
        before = _mark_sensitive(prior.attributes, set(prior.sensitive_attributes) | schema.sensitive)
        proposed = proposed_attributes(resource, before, desired, computed)  # kept values (ignore_changes) keep their marks
        changed = sorted(k for k in set(proposed) | set(prior.attributes)
                         if unmark(proposed.get(k))[0] != prior.attributes.get(k)
                         or contains_unknown(proposed.get(k)))
        if not changed:
            self._record(base, ["no-op"], before, before, importing)
            return before
        forced = [k for k in changed if k in schema.force_new]
        if not forced:
            self._record(base, ["update"], before, proposed, importing)
            return proposed
        if resource.lifecycle.prevent_destroy:
            self.refusals.append(
                f"{address} has lifecycle.prevent_destroy set, but the plan would replace it "
                f"({', '.join(forced)} cannot change in place)"
            )
        after = dict(proposed)
        after.update({k: UNKNOWN for k in ("id", *schema.computed, *computed) if unmark(desired.get(k))[0] is None})
        actions = ["create", "delete"] if resource.lifecycle.create_before_destroy else ["delete", "create"]
        self._record(base, actions, before, after, importing,
                     replace_paths=[[k] for k in forced], reason="replace_because_cannot_update")
        return after

    def _import(self, resource: ResourceConfig, index: Index, address: str,
                module: str) -> tuple[StateResource, dict]:
        rid, _ = unmark(self.evaluator(f"import {address}").eval(self.config.imports[address]))
        if not isinstance(rid, str):
            raise ConfigError(f"stack {self.stack}: import {address}: the id must be a known string")
        live = self.store.get_object(resource.type, rid)
        if live is None:
            raise PlanError(f"import {address}: no {resource.type} with id {rid!r} exists to import")
        return StateResource(resource.type, resource.name, index, rid, live, module=module), {"id": rid}

    def _plan_orphan(self, address: str, prior: StateResource, previous_address: str | None) -> None:
        resource, module_exists = self._config_of(prior)
        if not module_exists:
            reason = "delete_because_no_module"
        elif resource is None:
            reason = "delete_because_no_move_target" if previous_address else "delete_because_no_resource_config"
        elif resource.count is not None:
            reason = "delete_because_count_index" if isinstance(prior.index, int) else "delete_because_wrong_repetition"
        elif resource.for_each is not None:
            reason = "delete_because_each_key" if isinstance(prior.index, str) else "delete_because_wrong_repetition"
        else:
            reason = "delete_because_wrong_repetition"
        schema = schema_for(prior.type)
        before = _mark_sensitive(prior.attributes, set(prior.sensitive_attributes) | schema.sensitive)
        base = {"address": address, "type": prior.type, "name": prior.name, "index": prior.index,
                "previous_address": previous_address, "module_address": prior.module}
        self._record(base, ["delete"], before, None, None, reason=reason)

    def _config_of(self, prior: StateResource) -> tuple[ResourceConfig | None, bool]:
        """The block a state entry belongs to, and whether its module instance still exists."""
        path = tuple(p.removeprefix("module.") for p in strip_keys(prior.module).split(".module.") if p) \
            if prior.module else ()
        try:
            config = self.config_at(path)
        except KeyError:
            return None, False
        if prior.module and prior.module not in {s.address for s in self.scopes(path)}:
            return config.resources.get(f"{prior.type}.{prior.name}"), False
        return config.resources.get(f"{prior.type}.{prior.name}"), True

    def _record(self, base: dict, actions: list[str], before: Any, after: Any,
                importing: dict | None, replace_paths: list | None = None, reason: str | None = None) -> None:
        before_plain, before_sens, _ = split_marks(before) if before is not None else (None, False, False)
        after_plain, after_sens, after_unknown = split_marks(after) if after is not None else (None, False, False)
        change: dict[str, Any] = {
            "actions": actions,
            "before": before_plain,
            "after": after_plain,
            "after_unknown": after_unknown,
            "before_sensitive": before_sens,
            "after_sensitive": after_sens,
        }
        if replace_paths:
            change["replace_paths"] = replace_paths
        if importing:
            change["importing"] = importing
        entry: dict[str, Any] = {"address": base["address"]}
        if base.get("module_address"):
            entry["module_address"] = base["module_address"]
        entry.update({
            "mode": base.get("mode", "managed"),
            "type": base["type"],
            "name": base["name"],
            "provider_name": provider_name(base["type"]),
            "change": change,
        })
        if base["index"] is not None:
            entry["index"] = base["index"]
        if base.get("previous_address"):
            entry["previous_address"] = base["previous_address"]
        if reason:
            entry["action_reason"] = reason
        self.changes.append(entry)

    def _output_changes(self) -> dict[str, Any]:
        out = {}
        for name, (value, declared_sensitive) in self.outputs().items():
            plain, sens, unknown = split_marks(value)
            prior = self.state.outputs.get(name)
            before = prior["value"] if prior else None
            if prior is None:
                actions = ["create"]
            elif contains_unknown(value) or before != plain:
                actions = ["update"]
            else:
                actions = ["no-op"]
            # a secret anywhere in the value masks the whole output (outputs have one flag)
            sensitive = declared_sensitive or _any_marked(sens) or bool(prior and prior.get("sensitive"))
            out[name] = {"actions": actions, "before": before, "after": plain, "after_unknown": unknown,
                         "before_sensitive": bool(prior and prior.get("sensitive")), "after_sensitive": sensitive}
        for name, prior in self.state.outputs.items():
            if name not in out:
                out[name] = {"actions": ["delete"], "before": prior["value"], "after": None,
                             "after_unknown": False, "before_sensitive": prior.get("sensitive", False),
                             "after_sensitive": False}
        return out


def _module_prefix(module: str, depth: int) -> str | None:
    """The first `depth` module steps of a module instance address ("" for the root); None if it is shallower."""
    steps = [f"module.{step}" for step in module.removeprefix("module.").split(".module.")] if module else []
    return ".".join(steps[:depth]) if len(steps) >= depth else None


def relocated(res: StateResource, address: str) -> StateResource:
    """A state entry under a new address (a `moved` block): its module, type, name and index follow the address."""
    body, index = address, None
    if body.endswith("]"):
        for start in range(len(body) - 2, -1, -1):
            if body[start] == "[":
                try:
                    index = json.loads(body[start + 1:-1])
                except ValueError:
                    continue
                body = body[:start]
                break
    parts = body.rsplit(".", 2)
    module, rtype, name = parts if len(parts) == 3 else ("", *parts)
    return replace(res, module=module, type=rtype, name=name, index=index)


def provider_name(resource_type: str) -> str:
    return f"registry.terraform.io/hashicorp/{'aws' if resource_type.startswith('aws_') else resource_type.split('_')[0]}"


def _values_entry(base: Mapping[str, Any], value: Any, split: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """One resource in Terraform's values representation (prior_state, planned_values)."""
    if split is not None:
        plain, sens = split
    else:
        plain, sens, _ = split_marks(value) if value is not UNKNOWN else ({}, False, True)
    entry: dict[str, Any] = {"address": base["address"], "mode": base.get("mode", "managed"), "type": base["type"],
                             "name": base["name"]}
    if base.get("index") is not None:
        entry["index"] = base["index"]
    entry.update({"provider_name": provider_name(base["type"]), "schema_version": 0,
                  "values": plain if isinstance(plain, dict) else {},
                  "sensitive_values": sens if isinstance(sens, dict) else {}})
    entry["module_address"] = base.get("module_address") or ""
    return entry


def _state_json(address: str, res: StateResource) -> dict[str, Any]:
    sensitive = {k: True for k in set(res.sensitive_attributes) | schema_for(res.type).sensitive if k in res.attributes}
    return _values_entry({"address": address, "type": res.type, "name": res.name, "index": res.index,
                          "module_address": res.module}, None, (res.attributes, sensitive))


def _change_json(address: str, res: StateResource, actions: list[str], before: Any, after: Any,
                 sensitive: list[str]) -> dict[str, Any]:
    names = set(sensitive) | schema_for(res.type).sensitive
    mask = {k: True for k in names}
    entry: dict[str, Any] = {"address": address}
    if res.module:
        entry["module_address"] = res.module
    entry.update({
        "mode": "managed", "type": res.type, "name": res.name,
        "change": {"actions": actions, "before": before, "after": after, "after_unknown": False,
                   "before_sensitive": mask, "after_sensitive": mask if after is not None else False},
    })
    if res.index is not None:
        entry["index"] = res.index
    return entry


# --- apply -----------------------------------------------------------------------------------


class _Applier(_Evaluation):
    """Executes exactly the changes of one saved plan, writing state after every step."""

    applying = True

    def __init__(self, stack: str, config: StackConfig, state: StackState, store: SandboxStore,
                 inputs: StackInputs, changes: tuple[ResourceChange, ...]):
        super().__init__(stack, config, inputs)
        self.state = state
        self.store = store
        self.changes = {rc.address: rc for rc in changes}
        self.done: list[str] = []

    def run(self) -> ApplyOutcome:
        address = None
        try:
            self._moves()
            for address in self._orphan_deletes():
                self._step(address, lambda a=address: self._delete(a))
            address = None
            for scope, resource, index, ev, address in self.instances_in_order():
                if resource.mode == "data":
                    scope.values[resource.key][index] = self.read(scope, resource, ev, at_apply=True)[0]
                else:
                    self._apply_instance(scope, resource, index, ev, address)
            address = None
            self._save_outputs()
        except (ApplyError, ConfigError, PlanError) as exc:
            log.warning("sandbox.apply_failed", stack=self.stack, address=address, error=str(exc))
            return ApplyOutcome(False, tuple(self.done), address, str(exc), self.state.serial)
        log.info("sandbox.apply_done", stack=self.stack, applied=len(self.done), serial=self.state.serial)
        return ApplyOutcome(True, tuple(self.done), None, None, self.state.serial)

    def _persist(self, changed: Collection[str]) -> None:
        expected = self.state.serial
        self.state.serial += 1
        self.store.write_state(self.stack, self.state, expected, changed)

    def _step(self, address: str, operation: Callable[[], None]) -> None:
        fault = self.store.take_fault(self.stack, address)
        if fault and fault.startswith(DELAY_PREFIX):  # a slow provider: the step takes that long, then goes on
            time.sleep(float(fault[len(DELAY_PREFIX):]))
        elif fault:
            raise ApplyError(f"{address}: {fault}")
        operation()
        self._persist({address})
        self.done.append(address)

    def _moves(self) -> None:
        moved: set[str] = set()
        for rc in self.changes.values():
            if rc.previous_address and rc.previous_address in self.state.resources:
                self.state.resources[rc.address] = relocated(self.state.resources.pop(rc.previous_address), rc.address)
                moved |= {rc.address, rc.previous_address}
        if moved:
            self._persist(moved)

    def _orphan_deletes(self) -> list[str]:
        """Planned pure deletes, dependents first."""
        doomed = [a for a, rc in self.changes.items() if rc.kind == ChangeKind.DELETE]
        graph = graphlib.TopologicalSorter()
        for address in doomed:
            res = self.state.resources.get(address)
            deps = res.dependencies if res else []
            graph.add(address, *[d for d in doomed if resource_key(d) in deps])  # deps: configuration addresses
        return list(reversed(list(graph.static_order())))

    def _apply_instance(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator,
                        address: str) -> None:
        rc = self.changes.get(address)
        current = self.state.resources.get(address)
        at = (scope, resource, index, ev, address)
        if rc is None:
            if current is None:
                raise ApplyError(f"{address} is in the configuration but not in the approved plan; re-plan")
            scope.values[resource.key][index] = self.with_referenced(scope.path, resource, _state_value(current))
            return
        kind = rc.kind
        if kind in (ChangeKind.NO_OP, ChangeKind.READ):
            if rc.change.importing and current is None:
                self._step(address, lambda: self._adopt(scope, resource, index, address, str(rc.change.importing["id"])))
            elif current is None:
                raise ApplyError(f"{address} vanished from state since the plan; re-plan")
            else:
                self._keep_refreshed(address, current, rc)
        elif kind == ChangeKind.CREATE:
            self._step(address, lambda: self._create(*at, rc))
        elif kind == ChangeKind.UPDATE:
            if rc.change.importing and current is None:
                self._adopt(scope, resource, index, address, str(rc.change.importing["id"]))
            self._step(address, lambda: self._update(scope, resource, ev, address, rc))
        elif kind == ChangeKind.REPLACE:
            self._step(address, lambda: (self._delete(address), self._create(*at, rc)))
        elif kind == ChangeKind.REPLACE_CREATE_FIRST:
            old = self.state.resources[address]
            self._step(address, lambda: (self._create(*at, rc),
                                         self.store.delete_object(old.type, old.id)))
        else:
            raise ApplyError(f"{address}: the sandbox cannot apply a `{kind}` change")
        scope.values[resource.key][index] = self.with_referenced(scope.path, resource,
                                                                 _state_value(self.state.resources[address]))

    def _keep_refreshed(self, address: str, current: StateResource, rc: ResourceChange) -> None:
        """As Terraform's apply does, the state takes what the plan's refresh read: drift the plan keeps is no longer
        drift. An object changed again after the plan is left as it is in state, so the next check still finds it."""
        live = self.store.get_object(current.type, current.id)
        if live is None or live == current.attributes:
            return
        planned = rc.change.before if isinstance(rc.change.before, Mapping) else {}
        masked = rc.change.before_sensitive if isinstance(rc.change.before_sensitive, Mapping) else {}
        if any(live.get(k) != v for k, v in planned.items() if not masked.get(k)):
            return  # not what the plan saw: the apply never absorbs what it did not plan
        self.state.resources[address] = replace(current, attributes=live)
        self._persist({address})

    def _evaluate(self, resource: ResourceConfig, ev: Evaluator, address: str, rc: ResourceChange) -> tuple[dict, list[str]]:
        desired = self.desired(resource, ev)
        if contains_unknown(desired):
            raise ApplyError(f"{address}: a value is still unknown during apply")
        sensitive = sorted(set(_sensitive_names(desired)) | schema_for(resource.type).sensitive & set(desired))
        plain, _ = unmark(desired)
        self._check_consistent(address, plain, rc, frozenset(sensitive))
        return plain, sensitive

    @staticmethod
    def _check_consistent(address: str, actual: Mapping[str, Any], rc: ResourceChange,
                          sensitive: frozenset[str]) -> None:
        """Every value the approved plan showed as known must come out the same now."""
        planned = rc.change.after or {}
        unknown = rc.change.after_unknown if isinstance(rc.change.after_unknown, dict) else {}
        for name, value in actual.items():
            if name in unknown or name not in planned:
                continue
            if planned[name] != value:
                if name in sensitive:
                    raise ApplyError(f"{address}: `{name}` (sensitive) differs from the approved plan; re-plan")
                raise ApplyError(
                    f"{address}: `{name}` was planned as {json.dumps(planned[name])} but is now "
                    f"{json.dumps(value)}; the approved plan no longer matches, re-plan"
                )

    def _create(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator, address: str,
                rc: ResourceChange) -> None:
        schema = schema_for(resource.type)
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        attrs = {**schema.defaults, **attrs}
        rid = schema.make_id(attrs, f"{self.stack}/{address}/{secrets.token_hex(8)}")
        attrs["id"] = rid
        for name, compute in schema.computed.items():
            if attrs.get(name) is None:
                try:
                    attrs[name] = compute(attrs, rid)
                except (KeyError, ValueError, TypeError, AttributeError):  # the configuration lacks what it uses
                    attrs[name] = plausible_value(resource.type, name, rid, attrs)
        for name in sorted(self.referenced_attributes(scope.path, resource)):
            if attrs.get(name) is None:
                attrs[name] = plausible_value(resource.type, name, rid, attrs)
        if self.store.get_object(resource.type, rid) is not None and rc.kind != ChangeKind.REPLACE_CREATE_FIRST:
            raise ApplyError(f"{address}: a {resource.type} with id {rid!r} already exists in the simulated cloud")
        self.store.put_object(resource.type, rid, attrs)
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, attrs, sensitive, self.dependencies(scope.path, resource),
            scope.address,
        )

    def _update(self, scope: Scope, resource: ResourceConfig, ev: Evaluator, address: str, rc: ResourceChange) -> None:
        current = self.state.resources[address]
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        merged = proposed_attributes(resource, current.attributes, attrs, self.referenced_attributes(scope.path, resource))
        self.store.put_object(current.type, current.id, merged)
        self.state.resources[address] = StateResource(
            current.type, current.name, current.index, current.id, merged, sensitive,
            self.dependencies(scope.path, resource), scope.address,
        )

    def _adopt(self, scope: Scope, resource: ResourceConfig, index: Index, address: str, rid: str) -> None:
        live = self.store.get_object(resource.type, rid)
        if live is None:
            raise ApplyError(f"{address}: the object to import ({rid!r}) no longer exists")
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, copy.deepcopy(live), [], self.dependencies(scope.path, resource),
            scope.address,
        )

    def _delete(self, address: str) -> None:
        res = self.state.resources.pop(address)
        self.store.delete_object(res.type, res.id)

    def _save_outputs(self) -> None:
        outputs = {}
        for name, (value, declared) in self.outputs().items():
            plain, mark = unmark(value)
            outputs[name] = {"value": plain, "sensitive": declared or bool(mark)}
        if outputs != self.state.outputs:
            self.state.outputs = outputs
            self._persist(())
