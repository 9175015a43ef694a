"""The sandbox engine: plans and applies Terraform stacks against a simulated cloud.

It behaves like Terraform where the gateway cares: state with serial and lineage, refresh and
drift, dependency order, force-new replacement in both orders, unknown computed values,
lifecycle rules, `moved` and `import` blocks, and half-done applies. Its plans are Terraform's
JSON plan format. Everything it creates exists only in the gateway's store.
"""

from __future__ import annotations

import copy
import functools
import graphlib
import json
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from gateway.adapters.sandbox.config import (
    NO_DEFAULT,
    Body,
    ResourceConfig,
    StackConfig,
    collect_references,
    load_stack,
)
from gateway.adapters.sandbox.functions import CallContext, FileScope
from gateway.adapters.sandbox.hcl_eval import (
    UNKNOWN,
    Evaluator,
    Namespace,
    Secret,
    Sensitive,
    contains_unknown,
    unmark,
)
from gateway.adapters.sandbox.schema import schema_for
from gateway.domain.errors import ApplyError, ConfigError, PlanError
from gateway.domain.plan import ChangeKind, ResourceChange, load_plan
from gateway.services.ports import ApplyOutcome, EnginePlan, StackInputs

log = structlog.get_logger(__name__)

ENGINE_LABEL = "sandbox simulator"
DELAY_PREFIX = "delay:"  # a fault that slows a step down instead of failing it
_RESERVED_ROOTS = frozenset({"var", "local", "count", "each", "path", "terraform", "self", "data", "module"})

Index = str | int | None


@dataclass
class StateResource:
    type: str
    name: str
    index: Index
    id: str
    attributes: dict[str, Any]
    sensitive_attributes: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)


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


def instance_address(key: str, index: Index) -> str:
    return key if index is None else f"{key}[{json.dumps(index)}]"


def resource_key(address: str) -> str:
    return address.split("[", 1)[0]


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


class _Evaluation:
    """Scope building shared by plan and apply: variables, locals and resource values."""

    applying = False  # timestamp() and uuid() are known only while applying

    def __init__(self, stack: str, config: StackConfig, inputs: StackInputs):
        self.stack = stack
        self.config = config
        files = FileScope(config.directory, config.directory, f"the stack directory {self.stack}") \
            if config.directory else None
        self.context = CallContext(files=files, applying=self.applying)
        self.values: dict[str, dict[Index, Any]] = {}
        self._locals: dict[str, Any] = {}
        self._locals_in_progress: set[str] = set()
        self._vars = self._resolve_variables(inputs)
        self._root = {
            "var": Namespace("var", self._var),
            "local": Namespace("local", self._local),
            "path": {"module": ".", "root": ".", "cwd": "."},  # relative: plans must not depend on where they ran
            "terraform": {"workspace": "default"},
        }
        for rtype in {r.type for r in config.resources.values()}:
            self._root[rtype] = Namespace(rtype, lambda name, rtype=rtype: self._resource_value(rtype, name))

    def _resolve_variables(self, inputs: StackInputs) -> dict[str, Any]:
        """Each variable's value, masked by origin (Secret) or by this configuration's declaration."""
        values: dict[str, Any] = {}
        for name, var in self.config.variables.items():
            if name in inputs.values:
                value = inputs.values[name]
            elif var.default is not NO_DEFAULT:
                value = var.default
            else:
                raise ConfigError(f"stack {self.stack}: variable `{name}` has no value and no default")
            if name in inputs.secret:
                values[name] = Secret(value)
            else:
                values[name] = Sensitive(value) if var.sensitive else value
        return values

    def _var(self, name: str) -> Any:
        if name not in self._vars:
            raise ConfigError(f"stack {self.stack}: reference to undeclared variable var.{name}")
        return self._vars[name]

    def _local(self, name: str) -> Any:
        if name in self._locals:
            return self._locals[name]
        if name not in self.config.locals:
            raise ConfigError(f"stack {self.stack}: reference to undeclared local value local.{name}")
        if name in self._locals_in_progress:
            raise ConfigError(f"stack {self.stack}: local.{name} refers to itself")
        self._locals_in_progress.add(name)
        value = self.evaluator(f"local.{name}").eval(self.config.locals[name])
        self._locals_in_progress.discard(name)
        self._locals[name] = value
        return value

    def _resource_value(self, rtype: str, name: str) -> Any:
        key = f"{rtype}.{name}"
        resource = self.config.resources.get(key)
        if resource is None:
            raise ConfigError(f"stack {self.stack}: reference to undeclared resource {key}")
        instances = self.values.get(key, {})
        if resource.count is not None:
            return [instances[i] for i in sorted(i for i in instances if isinstance(i, int))]
        if resource.for_each is not None:
            return {str(k): v for k, v in instances.items()}
        return instances.get(None, UNKNOWN)

    def evaluator(self, where: str, file: str | None = None, **extra: Any) -> Evaluator:
        return Evaluator({**self._root, **extra}, f"stack {self.stack}: {where}", self.context, file)

    def order(self) -> list[ResourceConfig]:
        """Resources in dependency order; a cycle is a configuration error."""
        graph = graphlib.TopologicalSorter()
        for key, resource in self.config.resources.items():
            graph.add(key, *(d for d in self.dependencies(resource) if d != key))
        try:
            return [self.config.resources[k] for k in graph.static_order()]
        except graphlib.CycleError as exc:
            raise ConfigError(f"stack {self.stack}: dependency cycle between {', '.join(exc.args[1])}") from None

    def dependencies(self, resource: ResourceConfig) -> list[str]:
        """The resources this one refers to, directly or through locals and depends_on."""
        refs: set[str] = set(resource.depends_on)
        for tree in _resource_trees(resource):
            refs |= collect_references(tree)
        return sorted(d for d in self._expand_locals(refs, self._local_refs) if d in self.config.resources)

    @functools.cached_property
    def _local_refs(self) -> dict[str, set[str]]:
        return {name: collect_references(tree) for name, tree in self.config.locals.items()}

    @staticmethod
    def _expand_locals(refs: set[str], local_refs: Mapping[str, set[str]]) -> set[str]:
        seen: set[str] = set()
        pending = list(refs)
        while pending:
            ref = pending.pop()
            if ref in seen:
                continue
            seen.add(ref)
            if ref.startswith("local.") and ref[6:] in local_refs:
                pending.extend(local_refs[ref[6:]])
        return seen

    def instances(self, resource: ResourceConfig) -> Iterator[tuple[Index, Evaluator]]:
        """Each instance's index and an evaluator with its count.index / each.* set."""
        where = resource.key
        if resource.count is not None:
            count, mark = unmark(self.evaluator(where, resource.file).eval(resource.count))
            if mark:  # instance addresses are shown to everyone: they cannot come from a secret
                raise ConfigError(f"stack {self.stack}: {where}: count cannot be derived from a sensitive value")
            if count is UNKNOWN:
                raise PlanError(f"{where}: count depends on values known only after apply")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ConfigError(f"stack {self.stack}: {where}: count must be a whole number, got {count!r}")
            for i in range(count):
                yield i, self.evaluator(f"{where}[{i}]", resource.file, count={"index": i})
        elif resource.for_each is not None:
            items, mark = unmark(self.evaluator(where, resource.file).eval(resource.for_each))
            if mark:  # as in Terraform: the keys become addresses, shown to everyone
                raise ConfigError(f"stack {self.stack}: {where}: for_each cannot be derived from a sensitive value")
            if items is UNKNOWN or contains_unknown(items):
                raise PlanError(f"{where}: for_each depends on values known only after apply")
            pairs = items.items() if isinstance(items, dict) else ((str(v), v) for v in items)
            for key, value in sorted(pairs, key=lambda kv: str(kv[0])):
                yield str(key), self.evaluator(f'{where}["{key}"]', resource.file,
                                               each={"key": str(key), "value": value})
        else:
            yield None, self.evaluator(where, resource.file)

    def desired(self, resource: ResourceConfig, ev: Evaluator) -> dict[str, Any]:
        """The instance's configured attributes, nested blocks as lists of objects."""
        return _eval_body(resource.body, ev)

    def outputs(self) -> dict[str, tuple[Any, bool]]:
        return {
            name: (self.evaluator(f"output.{name}").eval(out.value), out.sensitive)
            for name, out in self.config.outputs.items()
        }


def _resource_trees(resource: ResourceConfig) -> Iterator[Any]:
    yield from _body_trees(resource.body)
    for tree in (resource.count, resource.for_each):
        if tree is not None:
            yield tree


def _body_trees(body: Body) -> Iterator[Any]:
    yield from body.attributes.values()
    for _, block in body.blocks:
        yield from _body_trees(block)


def _eval_body(body: Body, ev: Evaluator) -> dict[str, Any]:
    out: dict[str, Any] = {name: ev.eval(tree) for name, tree in body.attributes.items()}
    for block_type, block in body.blocks:
        out.setdefault(block_type, []).append(_eval_body(block, ev))
    return out


def proposed_attributes(resource: ResourceConfig, prior: Mapping[str, Any], desired: Mapping[str, Any]) -> dict:
    """Prior attributes overlaid with config; unset optional ones fall back to their defaults."""
    schema = schema_for(resource.type)
    keep = {"id", *schema.computed}
    proposed = {k: (v if k in keep else schema.defaults.get(k)) for k, v in prior.items()}
    proposed.update(desired)
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

    def plan(self) -> dict[str, Any]:
        refreshed = self._refresh()
        previous = self._apply_moves(refreshed)
        planned: set[str] = set()
        for resource in self.order():
            self.values[resource.key] = {}
            for index, ev in self.instances(resource):
                address = instance_address(resource.key, index)
                planned.add(address)
                self.values[resource.key][index] = self._plan_instance(
                    resource, index, ev, refreshed.get(address), previous.get(address)
                )
        for address, prior in sorted(refreshed.items()):
            if address not in planned:
                self._plan_orphan(address, prior, previous.get(address))
        if self.refusals:
            raise PlanError("; ".join(self.refusals))
        return {
            "format_version": "1.2",
            "gateway_engine": ENGINE_LABEL,
            "resource_changes": sorted(self.changes, key=lambda c: c["address"]),
            "resource_drift": sorted(self.drift, key=lambda c: c["address"]),
            "output_changes": self._output_changes(),
            "applyable": any(c["change"]["actions"] != ["no-op"] for c in self.changes),
            "complete": True,
            "errored": False,
        }

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
            refreshed[address] = StateResource(**{**asdict(res), "attributes": live})
        return refreshed

    def _apply_moves(self, refreshed: dict[str, StateResource]) -> dict[str, str]:
        previous: dict[str, str] = {}
        for source, target in self.config.moved:
            for address in [a for a in refreshed if a == source or a.startswith(source + "[")]:
                new_address = target + address[len(source):]
                if new_address in refreshed:
                    self.refusals.append(f"moved block: {new_address} already exists, cannot move {address} onto it")
                    continue
                refreshed[new_address] = refreshed.pop(address)
                previous[new_address] = address
        return previous

    def _plan_instance(self, resource: ResourceConfig, index: Index, ev: Evaluator,
                       prior: StateResource | None, previous_address: str | None) -> Any:
        schema = schema_for(resource.type)
        address = instance_address(resource.key, index)
        desired = _mark_sensitive(self.desired(resource, ev), schema.sensitive)
        importing = None
        if prior is None and address in self.config.imports:
            prior, importing = self._import(resource, index, address)
        base = {"address": address, "type": resource.type, "name": resource.name, "index": index,
                "previous_address": previous_address}
        if prior is None:
            after = {**schema.defaults, **desired}
            after.update({k: UNKNOWN for k in ("id", *schema.computed) if k not in desired})
            self._record(base, ["create"], None, after, None)
            return after
        before = _mark_sensitive(prior.attributes, set(prior.sensitive_attributes) | schema.sensitive)
        proposed = proposed_attributes(resource, before, desired)  # kept values (ignore_changes) keep their marks
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
        after.update({k: UNKNOWN for k in ("id", *schema.computed) if k not in desired})
        actions = ["create", "delete"] if resource.lifecycle.create_before_destroy else ["delete", "create"]
        self._record(base, actions, before, after, importing,
                     replace_paths=[[k] for k in forced], reason="replace_because_cannot_update")
        return after

    def _import(self, resource: ResourceConfig, index: Index, address: str) -> tuple[StateResource, dict]:
        rid, _ = unmark(self.evaluator(f"import {address}").eval(self.config.imports[address]))
        if not isinstance(rid, str):
            raise ConfigError(f"stack {self.stack}: import {address}: the id must be a known string")
        live = self.store.get_object(resource.type, rid)
        if live is None:
            raise PlanError(f"import {address}: no {resource.type} with id {rid!r} exists to import")
        return StateResource(resource.type, resource.name, index, rid, live), {"id": rid}

    def _plan_orphan(self, address: str, prior: StateResource, previous_address: str | None) -> None:
        key = resource_key(address)
        resource = self.config.resources.get(key)
        if resource is None:
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
                "previous_address": previous_address}
        self._record(base, ["delete"], before, None, None, reason=reason)

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
        entry: dict[str, Any] = {
            "address": base["address"],
            "mode": "managed",
            "type": base["type"],
            "name": base["name"],
            "provider_name": "registry.terraform.io/hashicorp/aws" if base["type"].startswith("aws_")
            else f"registry.terraform.io/hashicorp/{base['type'].split('_')[0]}",
            "change": change,
        }
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


def _change_json(address: str, res: StateResource, actions: list[str], before: Any, after: Any,
                 sensitive: list[str]) -> dict[str, Any]:
    names = set(sensitive) | schema_for(res.type).sensitive
    mask = {k: True for k in names}
    entry: dict[str, Any] = {
        "address": address, "mode": "managed", "type": res.type, "name": res.name,
        "change": {"actions": actions, "before": before, "after": after, "after_unknown": False,
                   "before_sensitive": mask, "after_sensitive": mask if after is not None else False},
    }
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
            for resource in self.order():
                self.values[resource.key] = {}
                for index, ev in self.instances(resource):
                    address = instance_address(resource.key, index)
                    self._apply_instance(resource, index, ev, address)
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
                self.state.resources[rc.address] = self.state.resources.pop(rc.previous_address)
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
            graph.add(address, *[d for d in doomed if resource_key(d) in deps])
        return list(reversed(list(graph.static_order())))

    def _apply_instance(self, resource: ResourceConfig, index: Index, ev: Evaluator, address: str) -> None:
        rc = self.changes.get(address)
        current = self.state.resources.get(address)
        if rc is None:
            if current is None:
                raise ApplyError(f"{address} is in the configuration but not in the approved plan; re-plan")
            self.values[resource.key][index] = _state_value(current)
            return
        kind = rc.kind
        if kind in (ChangeKind.NO_OP, ChangeKind.READ):
            if rc.change.importing and current is None:
                self._step(address, lambda: self._adopt(resource, index, address, str(rc.change.importing["id"])))
            elif current is None:
                raise ApplyError(f"{address} vanished from state since the plan; re-plan")
        elif kind == ChangeKind.CREATE:
            self._step(address, lambda: self._create(resource, index, ev, address, rc))
        elif kind == ChangeKind.UPDATE:
            if rc.change.importing and current is None:
                self._adopt(resource, index, address, str(rc.change.importing["id"]))
            self._step(address, lambda: self._update(resource, ev, address, rc))
        elif kind == ChangeKind.REPLACE:
            self._step(address, lambda: (self._delete(address), self._create(resource, index, ev, address, rc)))
        elif kind == ChangeKind.REPLACE_CREATE_FIRST:
            old = self.state.resources[address]
            self._step(address, lambda: (self._create(resource, index, ev, address, rc),
                                         self.store.delete_object(old.type, old.id)))
        else:
            raise ApplyError(f"{address}: the sandbox cannot apply a `{kind}` change")
        self.values[resource.key][index] = _state_value(self.state.resources[address])

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

    def _create(self, resource: ResourceConfig, index: Index, ev: Evaluator, address: str, rc: ResourceChange) -> None:
        schema = schema_for(resource.type)
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        attrs = {**schema.defaults, **attrs}
        rid = schema.make_id(attrs, f"{self.stack}/{address}/{secrets.token_hex(8)}")
        attrs["id"] = rid
        for name, compute in schema.computed.items():
            if name not in attrs:
                attrs[name] = compute(attrs, rid)
        if self.store.get_object(resource.type, rid) is not None and rc.kind != ChangeKind.REPLACE_CREATE_FIRST:
            raise ApplyError(f"{address}: a {resource.type} with id {rid!r} already exists in the simulated cloud")
        self.store.put_object(resource.type, rid, attrs)
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, attrs, sensitive, self.dependencies(resource)
        )

    def _update(self, resource: ResourceConfig, ev: Evaluator, address: str, rc: ResourceChange) -> None:
        current = self.state.resources[address]
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        merged = proposed_attributes(resource, current.attributes, attrs)
        self.store.put_object(current.type, current.id, merged)
        self.state.resources[address] = StateResource(
            current.type, current.name, current.index, current.id, merged, sensitive, self.dependencies(resource)
        )

    def _adopt(self, resource: ResourceConfig, index: Index, address: str, rid: str) -> None:
        live = self.store.get_object(resource.type, rid)
        if live is None:
            raise ApplyError(f"{address}: the object to import ({rid!r}) no longer exists")
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, copy.deepcopy(live), [], self.dependencies(resource)
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
