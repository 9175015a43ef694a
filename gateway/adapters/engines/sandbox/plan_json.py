"""The parts of Terraform's JSON plan that describe configuration and values, for sandbox plans.

`configuration` holds each module's resources with their expressions' references, module calls,
variables, outputs and provider configurations, as `terraform show -json` writes them, so policy
and risk judge a sandbox plan as they judge a Terraform plan (which bucket a public access block
refers to, for one). `values_json` nests resource values by module (prior_state, planned_values).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from lark import Tree

from gateway.adapters.engines.sandbox.config import NO_DEFAULT, Body, ResourceConfig, StackConfig
from gateway.adapters.engines.sandbox.hcl_eval import Evaluator
from gateway.adapters.engines.sandbox.values import contains_unknown, unmark
from gateway.domain.errors import ConfigError

_REFERENCE_ROOTS = frozenset({"var", "local", "module", "data", "count", "each", "path", "terraform", "self"})


class _References(Protocol):
    def traversals(self, tree: Tree) -> frozenset[str]: ...


def configuration_json(refs: _References, config: StackConfig) -> dict[str, Any]:
    providers: dict[str, Any] = {}
    for provider in config.providers:
        key = f"{provider.name}.{provider.alias}" if provider.alias else provider.name
        entry: dict[str, Any] = {"name": provider.name, "full_name": f"registry.terraform.io/hashicorp/{provider.name}"}
        if provider.alias:
            entry["alias"] = provider.alias
        entry["expressions"] = _body_json(refs, config, provider.body, skip={"alias"})
        providers[key] = entry
    return {"provider_config": providers, "root_module": _module_json(refs, config)}


def _module_json(refs: _References, config: StackConfig) -> dict[str, Any]:
    module: dict[str, Any] = {}
    if config.outputs:
        module["outputs"] = {
            name: {"expression": _expression(refs, config, out.value),
                   **({"sensitive": True} if out.sensitive else {}),
                   **({"description": out.description} if out.description else {})}
            for name, out in config.outputs.items()
        }
    resources = [_resource_json(refs, config, r) for r in (*config.resources.values(), *config.data.values())]
    if resources:
        module["resources"] = resources
    if config.module_calls:
        module["module_calls"] = {}
        for name, call in config.module_calls.items():
            entry: dict[str, Any] = {"source": call.source,
                                     "expressions": {k: _expression(refs, config, v) for k, v in call.inputs.items()}}
            if call.count is not None:
                entry["count_expression"] = _expression(refs, config, call.count)
            if call.for_each is not None:
                entry["for_each_expression"] = _expression(refs, config, call.for_each)
            if call.module is not None:
                entry["module"] = _module_json(refs, call.module)
            if call.version:
                entry["version_constraint"] = call.version
            if call.depends_on:
                entry["depends_on"] = list(call.depends_on)
            module["module_calls"][name] = entry
    if config.variables:
        module["variables"] = {}
        for name, var in config.variables.items():
            entry = {}
            if var.default is not NO_DEFAULT:
                entry["default"] = var.default
            if var.description:
                entry["description"] = var.description
            if var.sensitive:
                entry["sensitive"] = True
            module["variables"][name] = entry
    return module


def _resource_json(refs: _References, config: StackConfig, resource: ResourceConfig) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "address": resource.key, "mode": resource.mode, "type": resource.type, "name": resource.name,
        "provider_config_key": resource.provider or resource.type.split("_")[0],
        "expressions": _body_json(refs, config, resource.body),
        "schema_version": 0,
    }
    if resource.count is not None:
        entry["count_expression"] = _expression(refs, config, resource.count)
    if resource.for_each is not None:
        entry["for_each_expression"] = _expression(refs, config, resource.for_each)
    if resource.depends_on:
        entry["depends_on"] = list(resource.depends_on)
    if resource.provisioners:
        entry["provisioners"] = [{"type": p.labels[0] if p.labels else "",
                                  "expressions": _body_json(refs, config, p)} for p in resource.provisioners]
    return entry


def _body_json(refs: _References, config: StackConfig, body: Body, skip: frozenset[str] | set[str] = frozenset()) -> dict:
    out: dict[str, Any] = {k: _expression(refs, config, v) for k, v in body.attributes.items() if k not in skip}
    for block_type, block in body.blocks:
        if block_type == "dynamic" and block.labels:
            content = next((b for t, b in block.blocks if t == "content"), Body())
            out.setdefault(block.labels[0], []).append(_body_json(refs, config, content))
        else:
            out.setdefault(block_type, []).append(_body_json(refs, config, block))
    return out


def _expression(refs: _References, config: StackConfig, tree: Tree) -> dict[str, Any]:
    """`{"references": [...]}` for an expression that refers to something, else its constant value."""
    types = config.resource_types
    found: set[str] = set()
    for ref in refs.traversals(tree):
        parts = ref.split(".")
        if parts[0] not in _REFERENCE_ROOTS and parts[0] not in types:
            continue  # a for-expression's own names
        found.add(ref)
        prefix = 3 if parts[0] == "data" else 2
        if len(parts) > prefix:
            found.add(".".join(parts[:prefix]))
    if found:
        return {"references": sorted(found, key=lambda r: (-r.count("."), r))}
    try:
        value, mark = unmark(Evaluator({}, "configuration").eval(tree))
    except (ConfigError, RecursionError):
        return {}
    if mark or contains_unknown(value):  # uuid(), timestamp(), sensitive("..."): no constant to show
        return {}
    return {"constant_value": value}


def values_json(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Resource value entries (each naming its module_address) nested as Terraform's module tree."""
    modules: dict[str, dict[str, Any]] = {"": {"resources": []}}
    for entry in sorted(entries, key=lambda e: (e.get("module_address", ""), e["address"])):
        address = entry.get("module_address", "")
        item = {k: v for k, v in entry.items() if k != "module_address"}
        _module_at(modules, address).setdefault("resources", []).append(item)
    return modules[""]


def _module_at(modules: dict[str, dict[str, Any]], address: str) -> dict[str, Any]:
    if address in modules:
        return modules[address]
    parent_address = address[: address.rfind(".module.")] if ".module." in address else ""
    parent = _module_at(modules, parent_address)
    module: dict[str, Any] = {"address": address, "resources": []}
    parent.setdefault("child_modules", []).append(module)
    modules[address] = module
    return module


def walk_modules(module: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield module
    for child in module.get("child_modules", []):
        yield from walk_modules(child)
