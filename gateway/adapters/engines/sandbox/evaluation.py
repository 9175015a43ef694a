"""Scopes and order for evaluating a stack: module instances, their variables, locals, outputs,
resource and data values, and the dependency order of every resource and data block.

A configuration is a tree of modules (the root, the modules it calls, theirs...). Each module
call may be repeated with `count` or `for_each`, so one block in a module's files becomes
instances under several module instances: `module.app["eu"].aws_instance.web[0]`. Ordering works
on the configuration (as Terraform's graph does): a block waits for every block its expressions
reach through locals, variables (the module call's input), module outputs and `depends_on`.
"""

from __future__ import annotations

import graphlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from lark import Tree

from gateway.adapters.engines.sandbox.config import (
    NO_DEFAULT,
    Body,
    ModuleCall,
    ResourceConfig,
    StackConfig,
    traversals_of,
)
from gateway.adapters.engines.sandbox.functions import CallContext, FileScope
from gateway.adapters.engines.sandbox.hcl_eval import Evaluator, Namespace
from gateway.adapters.engines.sandbox.schema import DEFAULT_REGION
from gateway.adapters.engines.sandbox.type_constraints import convert
from gateway.adapters.engines.sandbox.values import UNKNOWN, Secret, Sensitive, contains_unknown, unmark
from gateway.adapters.hcl.reading import line_of
from gateway.domain.errors import ConfigError, PlanError
from gateway.ports import StackInputs

Index = str | int | None
Path_ = tuple[str, ...]  # a module's place in the configuration: ("vpc",), ("app", "db")
Node = tuple[Path_, str]  # (module path, resource or data key)
_NOT_REFERENCES = frozenset({"count", "each", "path", "terraform", "self"})


def instance_address(key: str, index: Index, module: str = "") -> str:
    """`aws_vpc.main`, `aws_subnet.a[0]`, `module.net["eu"].aws_subnet.a[0]`."""
    local = key if index is None else f"{key}[{json.dumps(index)}]"
    return f"{module}.{local}" if module else local


def config_address(path: Path_, key: str) -> str:
    """A block's address in the configuration, module instance keys left out: `module.net.aws_subnet.a`."""
    return ".".join([*(f"module.{name}" for name in path), key])


def strip_keys(address: str) -> str:
    """The configuration address of an instance address: every `[key]` removed."""
    out, depth, quoted = [], 0, False
    for ch in address:
        if quoted:
            quoted = ch != '"'
            continue
        if depth and ch == '"':
            quoted = True
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def body_trees(body: Body) -> Iterator[Tree]:
    yield from body.attributes.values()
    for _, block in body.blocks:
        yield from body_trees(block)


def block_trees(resource: ResourceConfig) -> Iterator[Tree]:
    yield from body_trees(resource.body)
    for tree in (resource.count, resource.for_each):
        if tree is not None:
            yield tree


class Scope:
    """One module instance: its variables, locals, outputs and the values of its blocks' instances."""

    def __init__(self, ev: Evaluation, config: StackConfig, path: Path_, address: str,
                 parent: Scope | None = None, call: ModuleCall | None = None, extra: Mapping[str, Any] | None = None):
        self.ev = ev
        self.config = config
        self.path = path
        self.address = address
        self.parent = parent
        self.call = call
        self.extra = dict(extra or {})  # count.index / each.* of the module call, for its inputs
        self.values: dict[str, dict[Index, Any]] = {}
        self._vars: dict[str, Any] = {}
        self._locals: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}
        self._in_progress: set[str] = set()
        self._children: dict[str, dict[Index, Scope]] = {}
        self.names: dict[str, Any] = {
            "var": Namespace("var", self.var),
            "local": Namespace("local", self.local),
            "path": {"module": config.directory, "root": ".", "cwd": "."},  # relative: plans must not depend on where they ran
            "terraform": {"workspace": "default"},
            "data": Namespace("data", lambda dtype: Namespace(f"data.{dtype}", lambda n: self.block_value(f"data.{dtype}.{n}"))),
            "module": Namespace("module", self.module_value),
        }
        for rtype in config.resource_types:
            self.names[rtype] = Namespace(rtype, lambda name, rtype=rtype: self.block_value(f"{rtype}.{name}"))

    def label(self, key: str) -> str:
        return f"{self.address}.{key}" if self.address else key

    def evaluator(self, where: str, file: str | None = None, **extra: Any) -> Evaluator:
        """An evaluator for expressions of `file` (errors name their line in it), described by `where`."""
        return Evaluator({**self.names, **extra}, f"stack {self.ev.stack}: {where}", self.ev.context, file)

    # --- variables, locals, outputs ------------------------------------------------------

    def var(self, name: str) -> Any:
        if name in self._vars:
            return self._vars[name]
        decl = self.config.variables.get(name)
        if decl is None:
            raise ConfigError(f"stack {self.ev.stack}: {self.label('')}reference to undeclared variable var.{name}")
        if self.call is None:
            value = self.ev.root_variable(name)
        elif name in self.call.inputs:
            assert self.parent is not None
            tree = self.call.inputs[name]
            value = self.parent.evaluator(f"{self.call.file}:{line_of(tree)}: {self.address}: input {name}",
                                          self.call.file, **self.extra).eval(tree)
            if unmark(value)[0] is None and not decl.nullable and decl.default is not NO_DEFAULT:
                value = decl.default
        elif decl.default is not NO_DEFAULT:
            value = decl.default
        else:
            raise ConfigError(f"stack {self.ev.stack}: {self.call.where}: the module's variable `{name}` "
                              f"({decl.file}:{decl.line}) needs a value and has no default")
        value = convert(value, decl.type, f"stack {self.ev.stack}: {decl.file}:{decl.line}: {self.label('var.' + name)}")
        if decl.sensitive and not isinstance(value, Sensitive):
            value = Sensitive(value)
        self._vars[name] = value
        return value

    def local(self, name: str) -> Any:
        if name in self._locals:
            return self._locals[name]
        if name not in self.config.locals:
            raise ConfigError(f"stack {self.ev.stack}: reference to undeclared local value local.{name}")
        key = f"local.{name}"
        if key in self._in_progress:
            raise ConfigError(f"stack {self.ev.stack}: local.{name} refers to itself")
        self._in_progress.add(key)
        try:
            at = self.config.local_lines[name]
            value = self.evaluator(f"{at}: {self.label(key)}", at.rsplit(":", 1)[0]).eval(self.config.locals[name])
        finally:
            self._in_progress.discard(key)
        self._locals[name] = value
        return value

    def output(self, name: str) -> Any:
        if name in self._outputs:
            return self._outputs[name]
        out = self.config.outputs.get(name)
        if out is None:
            raise ConfigError(f"stack {self.ev.stack}: {self.address} has no output `{name}`")
        value = self.evaluator(f"{out.file}:{out.line}: {self.label('output.' + name)}", out.file).eval(out.value)
        if out.sensitive and not isinstance(value, Sensitive):
            value = Sensitive(value)
        self._outputs[name] = value
        return value

    # --- blocks and module calls ---------------------------------------------------------

    def block_value(self, key: str) -> Any:
        resource = self.config.block(key)
        if resource is None:
            raise ConfigError(f"stack {self.ev.stack}: reference to undeclared {'data source' if key.startswith('data.') else 'resource'} "
                              f"{self.label(key)}")
        instances = self.values.get(key, {})
        if resource.count is not None:
            return [instances[i] for i in sorted(i for i in instances if isinstance(i, int))]
        if resource.for_each is not None:
            return {str(k): v for k, v in instances.items()}
        return instances.get(None, UNKNOWN)

    def module_value(self, name: str) -> Any:
        call = self.config.module_calls.get(name)
        if call is None:
            raise ConfigError(f"stack {self.ev.stack}: reference to undeclared module {self.label('module.' + name)}")
        children = self.children(name)
        outputs = {i: ModuleOutputs(child) for i, child in children.items()}
        if call.count is not None:
            return [outputs[i] for i in sorted(i for i in outputs if isinstance(i, int))]
        if call.for_each is not None:
            return {str(k): v for k, v in outputs.items()}
        return outputs[None]

    def children(self, name: str) -> dict[Index, Scope]:
        """The instances of a module call, expanded by its count or for_each."""
        if name in self._children:
            return self._children[name]
        call = self.config.module_calls[name]
        assert call.module is not None
        children: dict[Index, Scope] = {}
        prefix = self.label(f"module.{name}")
        for index, extra in self.ev.repetitions(self, call.count, call.for_each, f"{call.file}:{call.line}: {prefix}",
                                                call.file):
            address = prefix if index is None else f"{prefix}[{json.dumps(index)}]"
            children[index] = Scope(self.ev, call.module, (*self.path, name), address, self, call, extra)
        self._children[name] = children
        return children

    def instances(self, resource: ResourceConfig) -> Iterator[tuple[Index, Evaluator]]:
        """Each instance's index and an evaluator with its count.index / each.* set."""
        where = f"{resource.file}:{resource.line}: {self.label(resource.key)}"
        for index, extra in self.ev.repetitions(self, resource.count, resource.for_each, where, resource.file):
            label = where if index is None else f"{where}[{json.dumps(index)}]"
            yield index, self.evaluator(label, resource.file, **extra)


class ModuleOutputs(dict[str, Any]):
    """A module instance's outputs as an object: each evaluated when first read, all of them when the
    object is used whole (an output of its own, a function's argument)."""

    def __init__(self, scope: Scope):
        super().__init__()
        self.scope = scope

    def __missing__(self, name: str) -> Any:
        value = self.scope.output(name)
        self[name] = value
        return value

    def __contains__(self, name: object) -> bool:
        return name in self.scope.config.outputs

    def _fill(self) -> None:
        for name in self.scope.config.outputs:
            if not dict.__contains__(self, name):
                self[name]  # noqa: B018 - evaluates and keeps it

    def items(self):  # type: ignore[no-untyped-def, override]
        self._fill()
        return super().items()

    def keys(self):  # type: ignore[no-untyped-def, override]
        self._fill()
        return super().keys()

    def values(self):  # type: ignore[no-untyped-def, override]
        self._fill()
        return super().values()

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        return len(self.scope.config.outputs)


class Evaluation:
    """What plan and apply share: the module instances, variables and the order of blocks."""

    applying = False  # timestamp() and uuid() are known only while applying

    def __init__(self, stack: str, config: StackConfig, inputs: StackInputs):
        self.stack = stack
        self.config = config
        self.context = CallContext(files=_file_scope(stack, config), applying=self.applying)
        self._root_vars = self._resolve_variables(inputs)
        self.referenced = self._check_references()
        self.root = Scope(self, config, (), "")
        self._scopes: dict[Path_, list[Scope]] = {(): [self.root]}
        self._regions: dict[tuple[str, str], str] = {}  # (module instance, provider reference) -> its region
        self._dependencies: dict[Node, frozenset[Node]] = {}

    def configs(self) -> Iterator[tuple[Path_, StackConfig]]:
        pending: list[tuple[Path_, StackConfig]] = [((), self.config)]
        while pending:
            path, config = pending.pop()
            yield path, config
            pending.extend(((*path, c.name), c.module) for c in config.module_calls.values() if c.module)

    def config_at(self, path: Path_) -> StackConfig:
        config = self.config
        for name in path:
            module = config.module_calls[name].module
            assert module is not None
            config = module
        return config

    def scopes(self, path: Path_) -> list[Scope]:
        """Every instance of the module at `path`."""
        if path not in self._scopes:
            self._scopes[path] = [child for parent in self.scopes(path[:-1])
                                  for child in parent.children(path[-1]).values()]
        return self._scopes[path]

    # --- variables -------------------------------------------------------------------------

    def _resolve_variables(self, inputs: StackInputs) -> dict[str, Any]:
        """Each root variable's value, masked by origin (Secret) or by this configuration's declaration.

        Precedence as in Terraform: the gateway's values (workspace values and secrets) win over the
        variable files beside the stack, which win over defaults.
        """
        values: dict[str, Any] = {}
        for name, var in self.config.variables.items():
            if name in inputs.values:
                value = inputs.values[name]
            elif name in self.config.tfvars:
                value = self.config.tfvars[name]
            elif var.default is not NO_DEFAULT:
                value = var.default
            else:
                raise ConfigError(f"stack {self.stack}: {var.file}:{var.line}: variable `{name}` has no value "
                                  "and no default")
            value = convert(value, var.type, f"stack {self.stack}: {var.file}:{var.line}: var.{name}")
            if name in inputs.secret:
                values[name] = Secret(value)
            else:
                values[name] = Sensitive(value) if var.sensitive else value
        return values

    def root_variable(self, name: str) -> Any:
        return self._root_vars[name]

    # --- references ------------------------------------------------------------------------

    def traversals(self, tree: Tree) -> frozenset[str]:
        return traversals_of(tree)

    def _check_references(self) -> dict[Path_, dict[str, set[str]]]:
        """Refuse references to undeclared names, naming file and line; note which attributes are read."""
        referenced: dict[Path_, dict[str, set[str]]] = {}
        for path, config in self.configs():
            for call in config.module_calls.values():
                unknown = sorted(set(call.inputs) - set(call.module.variables if call.module else ()))
                if unknown:
                    raise ConfigError(f"stack {self.stack}: {call.where}: the module declares no variable "
                                      f"`{unknown[0]}` (an input must match a variable block)")
            attrs = referenced.setdefault(path, {})
            types = config.resource_types
            for tree, file in _config_trees(config):
                for ref in self.traversals(tree):
                    parts = ref.split(".")
                    problem = _undeclared(config, types, parts)
                    if problem:
                        raise ConfigError(f"stack {self.stack}: {file}:{line_of(tree)}: {problem}")
                    key = ".".join(parts[:3] if parts[0] == "data" else parts[:2])
                    if parts[0] == "self" and len(parts) > 1:
                        continue
                    if config.block(key) is not None and len(parts) > len(key.split(".")):
                        attrs.setdefault(key, set()).add(parts[len(key.split("."))])
        return referenced

    # --- order -----------------------------------------------------------------------------

    def order(self) -> list[tuple[Path_, ResourceConfig]]:
        """Every resource and data block, in dependency order; a cycle is a configuration error."""
        graph: graphlib.TopologicalSorter[Node] = graphlib.TopologicalSorter()
        blocks: dict[Node, ResourceConfig] = {}
        for path, config in self.configs():
            for resource in (*config.resources.values(), *config.data.values()):
                node = (path, resource.key)
                blocks[node] = resource
                graph.add(node, *(d for d in self.dependency_nodes(path, resource) if d != node))
        try:
            ordered = [(path, blocks[(path, key)]) for path, key in graph.static_order()]
        except graphlib.CycleError as exc:
            cycle = ", ".join(f"{config_address(p, k)} ({blocks[(p, k)].file}:{blocks[(p, k)].line})"
                              for p, k in exc.args[1][:-1])
            raise ConfigError(f"stack {self.stack}: dependency cycle between {cycle}") from None
        return ordered

    def instances_in_order(self) -> Iterator[tuple[Scope, ResourceConfig, Index, Evaluator, str]]:
        """Every instance of every block, in dependency order, with its address; a scope's values for a block are
        reset as it starts, and the caller stores each instance's value before asking for the next."""
        for path, resource in self.order():
            for scope in self.scopes(path):
                scope.values[resource.key] = {}
                for index, ev in scope.instances(resource):
                    yield scope, resource, index, ev, instance_address(resource.key, index, scope.address)

    def expand_all(self) -> None:
        """Expand every module call, even one without resources of its own (its count may be wrong)."""
        for path, _ in self.configs():
            self.scopes(path)

    def dependencies(self, path: Path_, resource: ResourceConfig) -> list[str]:
        """The managed resources this one waits for, as configuration addresses (what state records)."""
        return sorted(config_address(p, k) for p, k in self.dependency_nodes(path, resource)
                      if not k.startswith("data.") and (p, k) != (path, resource.key))

    def dependency_nodes(self, path: Path_, resource: ResourceConfig) -> set[Node]:
        """The blocks this one waits for (the same for each of its instances: worked out once per block)."""
        key = (path, resource.key)
        if key not in self._dependencies:
            seeds: set[tuple[Path_, str]] = {(path, d) for d in resource.depends_on}
            for tree in block_trees(resource):
                seeds |= {(path, r) for r in self.traversals(tree)}
            seeds |= self._call_refs(path)
            self._dependencies[key] = frozenset(self._reach(seeds))
        return set(self._dependencies[key])

    def _call_refs(self, path: Path_) -> set[tuple[Path_, str]]:
        """What every block of the module at `path` waits for: its calls' count, for_each and depends_on."""
        refs: set[tuple[Path_, str]] = set()
        for depth in range(len(path)):
            call = self.config_at(path[:depth]).module_calls[path[depth]]
            refs |= {(path[:depth], d) for d in call.depends_on}
            for tree in (call.count, call.for_each):
                if tree is not None:
                    refs |= {(path[:depth], r) for r in self.traversals(tree)}
        return refs

    def _reach(self, seeds: set[tuple[Path_, str]]) -> set[Node]:
        nodes: set[Node] = set()
        seen: set[tuple[Path_, str]] = set()
        pending = list(seeds)
        while pending:
            item = pending.pop()
            if item in seen:
                continue
            seen.add(item)
            path, ref = item
            config = self.config_at(path)
            parts = ref.split(".")
            if parts[0] == "local" and len(parts) > 1 and parts[1] in config.locals:
                pending.extend((path, r) for r in self.traversals(config.locals[parts[1]]))
            elif parts[0] == "var" and len(parts) > 1 and path:
                call = self.config_at(path[:-1]).module_calls[path[-1]]
                if parts[1] in call.inputs:
                    pending.extend((path[:-1], r) for r in self.traversals(call.inputs[parts[1]]))
            elif parts[0] == "module" and len(parts) > 1 and parts[1] in config.module_calls:
                pending.extend(self._module_refs(path, config.module_calls[parts[1]], parts[2:]))
            else:
                key = ".".join(parts[:3] if parts[0] == "data" else parts[:2])
                if config.block(key) is not None:
                    nodes.add((path, key))
        return nodes

    def _module_refs(self, path: Path_, call: ModuleCall, rest: list[str]) -> list[tuple[Path_, str]]:
        """A reference to `module.x.out` waits for what the output refers to; to `module.x`, for all of it."""
        child = (*path, call.name)
        module = call.module
        assert module is not None
        refs = [(path, r) for tree in (call.count, call.for_each) if tree is not None for r in self.traversals(tree)]
        if rest and rest[0] in module.outputs:
            return refs + [(child, r) for r in self.traversals(module.outputs[rest[0]].value)]
        refs += [(child, r) for out in module.outputs.values() for r in self.traversals(out.value)]
        refs += [(child, key) for key in module.resources]
        refs += [(child, f"module.{name}") for name in module.module_calls]
        return refs

    # --- providers -------------------------------------------------------------------------

    def region_of(self, scope: Scope, resource: ResourceConfig) -> str:
        """The region of the AWS provider configuration an instance uses: its `provider` (or the default `aws`),
        followed up through the module calls' `providers` maps, as Terraform passes provider configurations."""
        if not resource.type.startswith("aws_"):
            return DEFAULT_REGION
        return self._provider_region(scope, resource.provider or "aws")

    def _provider_region(self, scope: Scope, ref: str) -> str:
        key = (scope.address, ref)
        if key not in self._regions:
            self._regions[key] = self._find_region(scope, ref)
        return self._regions[key]

    def _find_region(self, scope: Scope, ref: str) -> str:
        name, _, alias = ref.partition(".")
        for provider in scope.config.providers:
            if provider.name == name and (provider.alias or "") == alias:
                if "region" not in provider.body.attributes:
                    return DEFAULT_REGION
                tree = provider.body.attributes["region"]
                value, _ = unmark(scope.evaluator(f"{provider.file}:{line_of(tree)}: provider {ref}",
                                                  provider.file).eval(tree))
                return value if isinstance(value, str) and value else DEFAULT_REGION
        if scope.parent is None or scope.call is None:
            return DEFAULT_REGION
        if scope.call.providers:  # passed explicitly: the module has only those
            passed = scope.call.providers.get(ref)
            return self._provider_region(scope.parent, passed) if passed else DEFAULT_REGION
        # without a `providers` map a module inherits its caller's default configurations, never an aliased one
        return DEFAULT_REGION if alias else self._provider_region(scope.parent, ref)

    # --- repetition ------------------------------------------------------------------------

    def repetitions(self, scope: Scope, count: Tree | None, for_each: Tree | None,
                    where: str, file: str) -> list[tuple[Index, dict[str, Any]]]:
        """(index, names for count.index / each.*) of each instance of a block or module call."""
        if count is not None:
            value, mark = unmark(scope.evaluator(where, file).eval(count))
            if mark:  # instance addresses are shown to everyone: they cannot come from a secret
                raise ConfigError(f"stack {self.stack}: {where}: count cannot be derived from a sensitive value")
            if value is UNKNOWN:
                raise PlanError(f"{where}: count depends on values known only after apply"
                                + self._unsimulated_hint(scope, count))
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"stack {self.stack}: {where}: count must be a whole number, got {value!r}")
            return [(i, {"count": {"index": i}}) for i in range(value)]
        if for_each is not None:
            items, mark = unmark(scope.evaluator(where, file).eval(for_each))
            if mark:  # as in Terraform: the keys become addresses, shown to everyone
                raise ConfigError(f"stack {self.stack}: {where}: for_each cannot be derived from a sensitive value")
            if items is UNKNOWN or contains_unknown(items if isinstance(items, list) else list(items or {})):
                raise PlanError(f"{where}: for_each depends on values known only after apply"
                                + self._unsimulated_hint(scope, for_each))
            if items is None:
                raise ConfigError(f"stack {self.stack}: {where}: for_each cannot be null")
            pairs = items.items() if isinstance(items, dict) else ((str(v), v) for v in items)
            return [(str(k), {"each": {"key": str(k), "value": v}}) for k, v in sorted(pairs, key=lambda kv: str(kv[0]))]
        return [(None, {})]

    def _unsimulated_hint(self, scope: Scope, tree: Tree) -> str:
        """Which data sources the sandbox cannot read made a count or for_each unknown, if any."""
        from gateway.adapters.engines.sandbox.data_sources import READERS

        names = sorted(config_address(p, k) for p, k in self._reach({(scope.path, r) for r in self.traversals(tree)})
                       if k.startswith("data.") and k.split(".")[1] not in READERS)
        if not names:
            return ""
        return (f" ({', '.join(names)}: the sandbox does not simulate that data source type, "
                "so its values are unknown until apply)")


def _file_scope(stack: str, config: StackConfig) -> FileScope | None:
    """Where file functions read: as Terraform, relative paths start in the root module's directory (a module
    names its own files through path.module); nothing outside the repository (or the stack, if none) is read."""
    if config.root is None or config.checkout is None:
        return None
    inside = config.checkout.resolve() == config.root.resolve()
    return FileScope(config.root, config.checkout,
                     f"the stack directory {stack}" if inside else f"the repository holding stack {stack}")


def _undeclared(config: StackConfig, types: frozenset[str], parts: list[str]) -> str | None:
    root = parts[0]
    if len(parts) < 2 or root in _NOT_REFERENCES:
        return None
    if root == "var" and parts[1] not in config.variables:
        return f"reference to undeclared variable var.{parts[1]}"
    if root == "local" and parts[1] not in config.locals:
        return f"reference to undeclared local value local.{parts[1]}"
    if root == "module" and parts[1] not in config.module_calls:
        return f"reference to undeclared module module.{parts[1]}"
    if root == "data" and len(parts) >= 3 and f"data.{parts[1]}.{parts[2]}" not in config.data:
        return f"reference to undeclared data source data.{parts[1]}.{parts[2]}"
    if root in types and f"{root}.{parts[1]}" not in config.resources:
        return f"reference to undeclared resource {root}.{parts[1]}"
    if root == "module" and len(parts) >= 3:
        module = config.module_calls[parts[1]].module
        if module is not None and parts[2] not in module.outputs:
            return f"module.{parts[1]} has no output `{parts[2]}`"
    return None


def _config_trees(config: StackConfig) -> Iterator[tuple[Tree, str]]:
    for resource in (*config.resources.values(), *config.data.values()):
        for tree in block_trees(resource):
            yield tree, resource.file
    for name, tree in config.locals.items():
        yield tree, config.local_lines[name].rsplit(":", 1)[0]
    for out in config.outputs.values():
        yield out.value, out.file
    for call in config.module_calls.values():
        for tree in (*call.inputs.values(), call.count, call.for_each):
            if tree is not None:
                yield tree, call.file
