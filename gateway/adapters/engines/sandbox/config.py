"""Loads one stack directory of `.tf` files into a StackConfig the sandbox engine can evaluate.

python-hcl2's grammar parses the files into lark trees; this module sorts the top-level blocks
(variable, locals, resource, data, module, output, provider, moved, import) and keeps expressions
as trees, to be evaluated later with values that may only be known during apply. Module calls
are followed: local sources from the disk, registry and git sources from the directory
`terraform init` leaves (`.terraform/modules/modules.json`). Variable files beside the root
(`terraform.tfvars`, `*.auto.tfvars`, and their `.json` forms) are read in Terraform's order.
Every error names the file and the line.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lark import Tree

from gateway.adapters.engines.sandbox.hcl_eval import Evaluator
from gateway.adapters.engines.sandbox.type_constraints import ANY, TypeSpec, parse_type
from gateway.adapters.hcl.reading import first_term, line_of, node_name, parse_hcl
from gateway.adapters.modules.sources import repository_root
from gateway.domain.errors import ConfigError

META_ARGUMENTS = frozenset({"count", "for_each", "lifecycle", "depends_on", "provider"})
KEPT_NOT_RUN = frozenset({"provisioner", "connection"})  # part of the configuration, never run by the sandbox
IGNORED_BLOCKS = frozenset({"check", "removed"})  # settings for Terraform itself, not for a plan
MODULE_META = frozenset({"source", "version", "count", "for_each", "depends_on", "providers"})
MAX_MODULE_DEPTH = 16
NO_DEFAULT = object()
ROOT_DIR = "."


@dataclass
class Body:
    """A block body: attribute expressions and nested blocks, in file order."""

    attributes: dict[str, Tree] = field(default_factory=dict)
    blocks: list[tuple[str, Body]] = field(default_factory=list)
    labels: tuple[str, ...] = ()
    line: int = 0


@dataclass
class Lifecycle:
    prevent_destroy: bool = False
    create_before_destroy: bool = False
    ignore_changes: tuple[str, ...] | None = ()  # None means `all`


@dataclass
class ResourceConfig:
    """A `resource` block, or (mode "data") a `data` block."""

    type: str
    name: str
    body: Body
    file: str
    line: int = 0
    mode: str = "managed"
    count: Tree | None = None
    for_each: Tree | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    depends_on: tuple[str, ...] = ()
    provider: str | None = None
    provisioners: list[Body] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"data.{self.type}.{self.name}" if self.mode == "data" else f"{self.type}.{self.name}"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.key}"


@dataclass
class VariableConfig:
    name: str
    default: Any = NO_DEFAULT
    sensitive: bool = False
    description: str | None = None
    file: str = ""
    line: int = 0
    nullable: bool = True  # false: a null input takes the default instead
    type: TypeSpec = ANY


@dataclass
class OutputConfig:
    name: str
    value: Tree
    sensitive: bool = False
    file: str = ""
    line: int = 0
    description: str | None = None


@dataclass
class ProviderConfig:
    name: str
    alias: str | None
    body: Body
    file: str
    line: int


@dataclass
class ModuleCall:
    """A `module` block and the configuration its source holds."""

    name: str
    source: str
    inputs: dict[str, Tree]
    file: str
    line: int
    version: str | None = None
    count: Tree | None = None
    for_each: Tree | None = None
    depends_on: tuple[str, ...] = ()
    module: StackConfig | None = None
    providers: dict[str, str] = field(default_factory=dict)  # `providers = { aws = aws.east }`: name in the module -> the caller's

    @property
    def where(self) -> str:
        return f'{self.file}:{self.line}: module "{self.name}"'


@dataclass
class StackConfig:
    directory: Path | None = None  # where the files are: file functions read relative to it
    variables: dict[str, VariableConfig] = field(default_factory=dict)
    locals: dict[str, Tree] = field(default_factory=dict)
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    data: dict[str, ResourceConfig] = field(default_factory=dict)
    outputs: dict[str, OutputConfig] = field(default_factory=dict)
    moved: list[tuple[str, str]] = field(default_factory=list)
    imports: dict[str, Tree] = field(default_factory=dict)  # target address -> id expression
    module_calls: dict[str, ModuleCall] = field(default_factory=dict)
    providers: list[ProviderConfig] = field(default_factory=list)
    tfvars: dict[str, Any] = field(default_factory=dict)  # root only: values from the variable files
    directory: str = ROOT_DIR  # path.module, relative to the root
    root: Path | None = None  # root module only: the stack's directory, where relative file paths start
    checkout: Path | None = None  # root module only: what file functions may read (the repository, or the stack)
    local_lines: dict[str, str] = field(default_factory=dict)  # local name -> "file:line"
    cloud: str | None = None  # "file:line" of a `cloud` block in `terraform {}` (HCP Terraform's workspace)

    @functools.cached_property
    def resource_types(self) -> frozenset[str]:
        """The resource types declared (read once the configuration is loaded)."""
        return frozenset(r.type for r in self.resources.values())

    def block(self, key: str) -> ResourceConfig | None:
        """A resource (`aws_vpc.main`) or data source (`data.aws_ami.x`) by its key."""
        return self.data.get(key) if key.startswith("data.") else self.resources.get(key)


# --- loading ---------------------------------------------------------------------------------


def load_stack(directory: Path) -> StackConfig:
    """Parse the root module of one stack directory, the modules it calls and its variable files."""
    files = sorted(directory.glob("*.tf"))
    if not files:
        raise ConfigError(f"{directory.name}: no .tf files in the stack directory")
    loader = _Loader(directory)
    config = loader.load_module(directory, (), depth=0)
    config.tfvars = loader.load_tfvars()
    config.root, config.checkout = directory, loader.base
    return config


class _Loader:
    def __init__(self, root: Path):
        self.root = root
        self.base = repository_root(root)
        self._manifest: dict[str, str] | None = None

    def display(self, path: Path) -> str:
        """A file's name in messages: under the stack's name, or (a module outside the stack) the repository's."""
        resolved = path.parent.resolve() / path.name  # a link is named as itself, never as what it points at
        if resolved.is_relative_to(self.root.resolve()):
            rel = resolved.relative_to(self.root.resolve()).as_posix()
            return f"{self.root.name}/{rel}" if rel != "." else self.root.name
        if resolved.is_relative_to(self.base):
            return resolved.relative_to(self.base).as_posix()
        return resolved.name

    def load_module(self, directory: Path, call_path: tuple[str, ...], depth: int) -> StackConfig:
        config = StackConfig(directory=self._module_dir(directory))
        for path in sorted(directory.glob("*.tf")):
            shown = self.display(path)
            if path.is_symlink():  # a link could point anywhere, e.g. at secrets; its text must not reach an error
                raise ConfigError(f"{shown}: symlinks are not read; commit the file itself")
            _add_file(config, shown, path.read_text(encoding="utf-8"))
        for call in config.module_calls.values():
            if depth >= MAX_MODULE_DEPTH:
                raise ConfigError(f"{call.where}: modules nest deeper than {MAX_MODULE_DEPTH} levels (a cycle?)")
            child_dir = self.resolve_source(call, directory, (*call_path, call.name))
            if not any(child_dir.glob("*.tf")):  # e.g. a `../../` that lands on the repository's top
                shown = self.display(child_dir)
                raise ConfigError(f"no Terraform files in {shown if shown != '.' else './ (the repository top)'} "
                                  f"(module {call.name}, {call.file}:{call.line}; source {call.source!r})")
            call.module = self.load_module(child_dir, (*call_path, call.name), depth + 1)
        return config

    def _module_dir(self, directory: Path) -> str:
        """path.module as Terraform makes it: relative to the root, `../` included for a module beside the stack."""
        rel = Path(os.path.relpath(directory.resolve(), self.root.resolve())).as_posix()
        return ROOT_DIR if rel == "." else rel

    def resolve_source(self, call: ModuleCall, directory: Path, call_path: tuple[str, ...]) -> Path:
        """The directory holding a module call's configuration."""
        if call.source.startswith(("./", "../")):
            target = (directory / call.source).resolve()
            if not target.is_relative_to(self.base):
                raise ConfigError(f"{call.where}: source {call.source!r} is outside the repository")
            if not target.is_dir():
                raise ConfigError(f"{call.where}: source {call.source!r} is not a directory")
            return target
        installed = self.manifest().get(".".join(call_path))
        if installed is None:
            raise ConfigError(
                f"{call.where}: source {call.source!r} is not installed: the sandbox reads registry and git "
                "modules from .terraform/modules (what `terraform init` leaves); run it, or use a local path"
            )
        target = (self.root / installed).resolve()
        if not target.is_relative_to(self.root.resolve()) or not target.is_dir():
            raise ConfigError(f"{call.where}: .terraform/modules/modules.json points at {installed!r}, "
                              "which is not a directory inside the stack")
        return target

    def manifest(self) -> dict[str, str]:
        """Call path ("vpc" or "eks.node_group") -> directory, from `terraform init`'s module manifest."""
        if self._manifest is None:
            path = self.root / ".terraform" / "modules" / "modules.json"
            self._manifest = {}
            if path.is_file() and not path.is_symlink():
                try:
                    entries = json.loads(path.read_text(encoding="utf-8")).get("Modules", [])
                except (ValueError, AttributeError) as exc:
                    raise ConfigError(f"{self.display(path)}: not a module manifest ({exc})") from None
                self._manifest = {str(e.get("Key", "")): str(e.get("Dir", "")) for e in entries
                                  if isinstance(e, dict) and e.get("Key")}
        return self._manifest

    def load_tfvars(self) -> dict[str, Any]:
        """Values from the root's variable files, later files winning, in Terraform's order."""
        names = ["terraform.tfvars", "terraform.tfvars.json"]
        names += sorted(p.name for p in self.root.iterdir()
                        if p.name.endswith((".auto.tfvars", ".auto.tfvars.json")))
        values: dict[str, Any] = {}
        for name in names:
            path = self.root / name
            if not path.is_file():
                continue
            shown = self.display(path)
            if path.is_symlink():
                raise ConfigError(f"{shown}: symlinks are not read; commit the file itself")
            text = path.read_text(encoding="utf-8")
            values.update(_json_tfvars(shown, text) if name.endswith(".json") else _hcl_tfvars(shown, text))
        return values


def _json_tfvars(shown: str, text: str) -> dict[str, Any]:
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{shown}:{getattr(exc, 'lineno', 1)}: malformed JSON ({exc})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{shown}:1: a variable file must hold one object of variable values")
    return values


def _hcl_tfvars(shown: str, text: str) -> dict[str, Any]:
    body = parse_hcl(shown, text).children[0]
    values: dict[str, Any] = {}
    for child in body.children:
        if isinstance(child, Tree) and child.data == "attribute":
            values[node_name(child.children[0])] = _constant(child.children[-1], f"{shown}:{line_of(child)}")
        elif isinstance(child, Tree) and child.data == "block":
            raise ConfigError(f"{shown}:{line_of(child)}: a variable file holds only `name = value` lines")
    return values


# --- sorting blocks --------------------------------------------------------------------------


def _add_file(config: StackConfig, filename: str, text: str) -> None:
    tree = parse_hcl(filename, text)
    for child in tree.children[0].children:
        if isinstance(child, Tree) and child.data == "attribute":
            name = node_name(child.children[0])
            raise ConfigError(f"{filename}:{line_of(child)}: unexpected top-level attribute `{name}`")
    for child in tree.children[0].children:
        if isinstance(child, Tree) and child.data == "block":
            block_type, labels, block = _block_parts(child, filename)
            _add_block(config, filename, block_type, labels, block)


def _add_block(config: StackConfig, filename: str, block_type: str, labels: list[str], block: Body) -> None:
    where = f"{filename}:{block.line}: {block_type} {' '.join(labels)}".rstrip()
    if block_type in ("resource", "data"):
        _expect_labels(where, labels, 2)
        _add_resource(config, filename, labels[0], labels[1], block, "data" if block_type == "data" else "managed")
    elif block_type == "variable":
        _expect_labels(where, labels, 1)
        attrs = block.attributes
        config.variables[labels[0]] = VariableConfig(
            name=labels[0],
            default=_constant(attrs["default"], where) if "default" in attrs else NO_DEFAULT,
            sensitive=bool(_constant(attrs["sensitive"], where)) if "sensitive" in attrs else False,
            description=_constant(attrs["description"], where) if "description" in attrs else None,
            file=filename, line=block.line,
            nullable=bool(_constant(attrs["nullable"], where)) if "nullable" in attrs else True,
            type=_type(attrs["type"], where) if "type" in attrs else ANY,
        )
    elif block_type == "locals":
        for name, expr in block.attributes.items():
            if name in config.locals:
                raise ConfigError(f"{filename}:{line_of(expr)}: local `{name}` is defined twice "
                                  f"(also at {config.local_lines[name]})")
            config.locals[name] = expr
            config.local_lines[name] = f"{filename}:{line_of(expr)}"
    elif block_type == "output":
        _expect_labels(where, labels, 1)
        if "value" not in block.attributes:
            raise ConfigError(f"{where}: an output needs a value")
        sensitive = block.attributes.get("sensitive")
        description = block.attributes.get("description")
        config.outputs[labels[0]] = OutputConfig(
            labels[0], block.attributes["value"], bool(_constant(sensitive, where)) if sensitive else False,
            filename, block.line, _constant(description, where) if description else None)
    elif block_type == "module":
        _expect_labels(where, labels, 1)
        _add_module_call(config, filename, labels[0], block, where)
    elif block_type == "provider":
        _expect_labels(where, labels, 1)
        alias = block.attributes.get("alias")
        config.providers.append(ProviderConfig(labels[0], str(_constant(alias, where)) if alias else None,
                                               block, filename, block.line))
    elif block_type == "moved":
        config.moved.append((traversal_text(_required(block, "from", where), where),
                             traversal_text(_required(block, "to", where), where)))
    elif block_type == "import":
        config.imports[traversal_text(_required(block, "to", where), where)] = _required(block, "id", where)
    elif block_type == "terraform":
        cloud = next((b for t, b in block.blocks if t == "cloud"), None)
        if cloud is not None:
            config.cloud = f"{filename}:{cloud.line}"
    elif block_type not in IGNORED_BLOCKS:
        raise ConfigError(f"{where}: unknown block type `{block_type}`")


def _type(expr: Tree, where: str) -> TypeSpec:
    """A variable's type constraint; one the sandbox does not understand constrains nothing (as `any`)."""
    try:
        return parse_type(expr, where)
    except ConfigError:
        return ANY


def _required(block: Body, name: str, where: str) -> Tree:
    if name not in block.attributes:
        raise ConfigError(f"{where}: the argument `{name}` is required")
    return block.attributes[name]


def _expect_labels(where: str, labels: list[str], n: int) -> None:
    if len(labels) != n:
        raise ConfigError(f"{where}: expected {n} label(s), got {len(labels)}")


def _add_module_call(config: StackConfig, filename: str, name: str, body: Body, where: str) -> None:
    if name in config.module_calls:
        raise ConfigError(f"{where}: defined twice (also at {config.module_calls[name].where})")
    if "source" not in body.attributes:
        raise ConfigError(f"{where}: a module call needs a source")
    if "count" in body.attributes and "for_each" in body.attributes:
        raise ConfigError(f"{where}: count and for_each cannot both be set")
    source = _constant(body.attributes["source"], where)
    if not isinstance(source, str):
        raise ConfigError(f"{where}: source must be a string")
    version = body.attributes.get("version")
    depends_on = body.attributes.get("depends_on")
    config.module_calls[name] = ModuleCall(
        name=name, source=source, file=filename, line=body.line,
        inputs={k: v for k, v in body.attributes.items() if k not in MODULE_META},
        version=str(_constant(version, where)) if version else None,
        count=body.attributes.get("count"), for_each=body.attributes.get("for_each"),
        depends_on=tuple(traversal_text(t, where) for t in _tuple_items(depends_on)) if depends_on else (),
        providers=_provider_map(body.attributes.get("providers"), where),
    )


def _provider_map(expr: Tree | None, where: str) -> dict[str, str]:
    """A module call's `providers = { aws = aws.east, "aws.west" = aws }` as {name in the module: the caller's}."""
    term = first_term(expr) if expr is not None else None
    if term is None or term.data != "object":
        return {}
    mapping: dict[str, str] = {}
    for elem in (c for c in term.children if isinstance(c, Tree) and c.data == "object_elem"):
        key, value = [c for c in elem.children if isinstance(c, Tree) and c.data != "new_line_or_comment"][:2]
        key_expr = [c for c in key.children if isinstance(c, Tree)][0]
        name = traversal_text(key_expr, where, strict=False) or str(_constant(key_expr, where))
        mapping[name] = traversal_text(value, where)
    return mapping


def _add_resource(config: StackConfig, filename: str, rtype: str, name: str, body: Body, mode: str) -> None:
    resource = ResourceConfig(type=rtype, name=name, body=body, file=filename, line=body.line, mode=mode)
    where = resource.where
    table = config.data if mode == "data" else config.resources
    if resource.key in table:
        raise ConfigError(f"{where}: defined twice (also at {table[resource.key].where})")
    if "count" in body.attributes and "for_each" in body.attributes:
        raise ConfigError(f"{where}: count and for_each cannot both be set")
    for block_type, block in body.blocks:
        if block_type == "lifecycle":
            resource.lifecycle = _lifecycle(block, where)
        elif block_type == "provisioner":
            resource.provisioners.append(block)
    depends_on = body.attributes.get("depends_on")
    provider = body.attributes.get("provider")
    resource.body = Body(
        attributes={k: v for k, v in body.attributes.items() if k not in META_ARGUMENTS},
        blocks=[(t, b) for t, b in body.blocks if t != "lifecycle" and t not in KEPT_NOT_RUN],
        line=body.line,
    )
    resource.count = body.attributes.get("count")
    resource.for_each = body.attributes.get("for_each")
    resource.depends_on = tuple(traversal_text(t, where) for t in _tuple_items(depends_on)) if depends_on else ()
    resource.provider = traversal_text(provider, where) if provider is not None else None
    table[resource.key] = resource


def _lifecycle(block: Body, where: str) -> Lifecycle:
    ignore = block.attributes.get("ignore_changes")
    ignore_changes: tuple[str, ...] | None = ()
    if ignore is not None:
        if traversal_text(ignore, where, strict=False) == "all":
            ignore_changes = None
        else:
            ignore_changes = tuple(traversal_text(t, where) for t in _tuple_items(ignore))
    return Lifecycle(
        prevent_destroy=bool(_constant(block.attributes["prevent_destroy"], where))
        if "prevent_destroy" in block.attributes else False,
        create_before_destroy=bool(_constant(block.attributes["create_before_destroy"], where))
        if "create_before_destroy" in block.attributes else False,
        ignore_changes=ignore_changes,
    )


def _constant(expr: Tree, where: str) -> Any:
    """Evaluate an expression that may not refer to anything (defaults, lifecycle flags)."""
    value = Evaluator({}, where).eval(expr)
    try:
        json.dumps(value)  # a constant must be plain data
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a constant value") from None
    return value


def _tuple_items(expr: Tree) -> list[Tree]:
    term = first_term(expr)
    if term is None or term.data != "tuple":
        return [expr]
    return [c for c in term.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def traversal_text(expr: Tree, where: str, strict: bool = True) -> str:
    """`aws_vpc.main`, `aws_subnet.a[0]` or `tags` as text, from a reference expression."""
    node = expr
    while node.data == "expr_term":
        inner = first_term(node)
        if inner is None:
            break
        node = inner
    if node.data == "identifier":
        return str(node.children[0])
    if node.data == "get_attr_expr_term":
        base, attr = [c for c in node.children if isinstance(c, Tree)]
        name = [c for c in attr.children if isinstance(c, Tree)][0].children[0]
        return f"{traversal_text(base, where, strict)}.{name}"
    if node.data == "index_expr_term":
        base, index = [c for c in node.children if isinstance(c, Tree)]
        key = Evaluator({}, where).eval([c for c in index.children if isinstance(c, Tree)][0]) \
            if index.data == "braces_index" else int(str(index.children[1]))
        return f"{traversal_text(base, where, strict)}[{json.dumps(key)}]"
    if strict:
        raise ConfigError(f"{where}: expected a reference such as aws_vpc.main")
    return ""


def _body(node: Tree, filename: str) -> Body:
    body = Body()
    for child in node.children:
        if not isinstance(child, Tree):
            continue
        if child.data == "attribute":
            name = node_name(child.children[0])
            if name in body.attributes:
                raise ConfigError(f"{filename}:{line_of(child)}: attribute `{name}` is set twice")
            body.attributes[name] = child.children[-1]
        elif child.data == "block":
            block_type, _, inner = _block_parts(child, filename)
            body.blocks.append((block_type, inner))
    return body


def _block_parts(block: Tree, filename: str) -> tuple[str, list[str], Body]:
    parts = [c for c in block.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    labels = [node_name(p) for p in parts[1:-1]]
    body = _body(parts[-1], filename)
    body.labels = tuple(labels)
    body.line = line_of(block)
    return node_name(parts[0]), labels, body


_CHAIN_NAMES = {"data": 4, "module": 3, "var": 2, "local": 2}  # root names to keep; a resource keeps 3
_CHAINS = frozenset({"get_attr_expr_term", "index_expr_term", "attr_splat_expr_term", "full_splat_expr_term"})


def collect_traversals(expr: Tree) -> set[str]:
    """The name chains (indexes skipped) an expression refers to, cut where the rest no longer matters.

    `module.vpc.vpc_id`, `data.aws_ami.ubuntu.id`, `aws_vpc.main.id`, `var.x`, `local.y`: enough to
    tell which output, data source or attribute is meant.
    """
    refs: set[str] = set()
    pending: list[Tree] = [expr]
    while pending:
        node = pending.pop()
        if node.data in _CHAINS:
            names, indexes = _chain(node)
            if names:
                refs.add(".".join(names[:_CHAIN_NAMES.get(names[0], 3)]))
            pending.extend(indexes)
            continue
        if node.data == "identifier":
            continue
        pending.extend(c for c in node.children if isinstance(c, Tree))
    return refs


def traversals_of(expr: Tree) -> frozenset[str]:
    """`collect_traversals`, kept on the tree: parsed trees are cached and shared, and never change."""
    found = expr.__dict__.get("_gateway_traversals")
    if found is None:
        found = frozenset(collect_traversals(expr))
        expr.__dict__["_gateway_traversals"] = found
    return found


def _chain(node: Tree) -> tuple[list[str], list[Tree]]:
    """The names along a reference chain, root first, and the subtrees of its indexes (to search on)."""
    names: list[str] = []
    others: list[Tree] = []
    current: Tree | None = node
    while current is not None:
        if current.data == "expr_term":
            inner = first_term(current)
            if inner is None:
                others.append(current)
                break
            current = inner
        elif current.data == "identifier":
            names.append(str(current.children[0]))
            break
        elif current.data in _CHAINS:
            base, step = [c for c in current.children if isinstance(c, Tree)][:2]
            if current.data == "get_attr_expr_term":
                names.append(str([c for c in step.children if isinstance(c, Tree)][0].children[0]))
            elif current.data == "index_expr_term":
                others.append(step)
            else:  # a splat: what follows it are attributes of each item
                others.extend(c for c in step.children if isinstance(c, Tree) and c.data != "get_attr")
                names.clear()
            current = base
        else:
            others.append(current)
            break
    names.reverse()
    return names, others
