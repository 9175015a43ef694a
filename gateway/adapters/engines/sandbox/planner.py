"""The plan walk: what applying a stack's configuration to its state would change, as Terraform says it.

Refresh first (every object the state knows, read from the simulated cloud; what changed is
drift), then `moved` blocks, then every resource and data instance in dependency order (create,
update, replace in either order, import, read), then what the state holds that the configuration
no longer does (each with Terraform's reason), then outputs. The result is Terraform's JSON plan:
`resource_changes`, `resource_drift`, `output_changes`, `prior_state`, `planned_values` and
`configuration`, with unknown and sensitive values split into Terraform's masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.adapters.engines.sandbox.config import ResourceConfig, StackConfig
from gateway.adapters.engines.sandbox.evaluation import Index, Scope, instance_address, strip_keys
from gateway.adapters.engines.sandbox.hcl_eval import Evaluator
from gateway.adapters.engines.sandbox.instances import InstanceEvaluation, mark_sensitive, proposed_attributes
from gateway.adapters.engines.sandbox.plan_json import configuration_json, values_json
from gateway.adapters.engines.sandbox.schema import in_region, schema_for
from gateway.adapters.engines.sandbox.state import SandboxStore, StackState, StateResource, relocated
from gateway.adapters.engines.sandbox.values import UNKNOWN, Sensitive, contains_unknown, unmark
from gateway.domain.errors import ConfigError, PlanError
from gateway.ports import StackInputs

ENGINE_LABEL = "sandbox simulator"


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



class Planner(InstanceEvaluation):
    """Plans one stack's configuration against its state and the simulated cloud, changing neither."""

    store: SandboxStore

    def __init__(self, stack: str, config: StackConfig, state: StackState, store: SandboxStore,
                 inputs: StackInputs) -> None:
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
            with in_region(self.region_of(scope, resource)):
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
        if self.config.cloud:
            document["gateway_notices"] = [
                f"{self.config.cloud}: the stack declares a `cloud` block (HCP Terraform): the sandbox simulator "
                "plans against its own simulated state, not the cloud workspace's state"]
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
        desired = mark_sensitive(self.desired(resource, ev), schema.sensitive)
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
        before = mark_sensitive(prior.attributes, set(prior.sensitive_attributes) | schema.sensitive)
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
                module: str) -> tuple[StateResource, dict[str, Any]]:
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
        before = mark_sensitive(prior.attributes, set(prior.sensitive_attributes) | schema.sensitive)
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

    def _record(self, base: dict[str, Any], actions: list[str], before: Any, after: Any,
                importing: dict[str, Any] | None, replace_paths: list[list[str]] | None = None,
                reason: str | None = None) -> None:
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
        out: dict[str, Any] = {}
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

