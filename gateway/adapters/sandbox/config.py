"""Loads one stack directory of `.tf` files into a StackConfig the sandbox engine can evaluate.

python-hcl2 parses the files into lark trees; this module sorts the top-level blocks
(variable, locals, resource, output, moved, import) and keeps expressions as trees, to be
evaluated later with values that may only be known during apply.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from gateway.adapters.sandbox.hcl_eval import Evaluator
from gateway.domain.errors import ConfigError

META_ARGUMENTS = frozenset({"count", "for_each", "lifecycle", "depends_on", "provider"})
IGNORED_BLOCKS = frozenset({"terraform", "provider", "check", "removed"})
NO_DEFAULT = object()


@dataclass
class Body:
    """A block body: attribute expressions and nested blocks, in file order."""

    attributes: dict[str, Tree] = field(default_factory=dict)
    blocks: list[tuple[str, Body]] = field(default_factory=list)


@dataclass
class Lifecycle:
    prevent_destroy: bool = False
    create_before_destroy: bool = False
    ignore_changes: tuple[str, ...] | None = ()  # None means `all`


@dataclass
class ResourceConfig:
    type: str
    name: str
    body: Body
    file: str
    count: Tree | None = None
    for_each: Tree | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    depends_on: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.type}.{self.name}"


@dataclass
class VariableConfig:
    name: str
    default: Any = NO_DEFAULT
    sensitive: bool = False


@dataclass
class OutputConfig:
    name: str
    value: Tree
    sensitive: bool = False


@dataclass
class StackConfig:
    directory: Path | None = None  # where the files are: file functions read relative to it
    variables: dict[str, VariableConfig] = field(default_factory=dict)
    locals: dict[str, Tree] = field(default_factory=dict)
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    outputs: dict[str, OutputConfig] = field(default_factory=dict)
    moved: list[tuple[str, str]] = field(default_factory=list)
    imports: dict[str, Tree] = field(default_factory=dict)  # target address -> id expression


def load_stack(directory: Path) -> StackConfig:
    """Parse every `.tf` file of one stack directory (not its subdirectories)."""
    files = sorted(directory.glob("*.tf"))
    if not files:
        raise ConfigError(f"{directory.name}: no .tf files in the stack directory")
    config = StackConfig(directory=directory)
    for path in files:
        if path.is_symlink():  # a link could point anywhere, e.g. at secrets; its text must not reach an error
            raise ConfigError(f"{directory.name}/{path.name}: symlinks are not read; commit the file itself")
        _add_file(config, f"{directory.name}/{path.name}", path.read_text(encoding="utf-8"))
    return config


@functools.lru_cache(maxsize=512)
def parse_hcl(filename: str, text: str) -> Tree:
    """Parse HCL text, turning the parser's errors into one readable line.

    Parsing dominates planning time, and plan, apply and re-plans of one commit read the same
    files, so trees are cached by content (nothing mutates them).
    """
    if not text.endswith("\n"):
        text += "\n"
    try:
        return hcl2.parses_to_tree(text)
    except UnexpectedInput as exc:
        raise ConfigError(
            f"{filename}:{exc.line}:{exc.column}: malformed HCL near {_snippet(text, exc)!r}"
        ) from None
    except LarkError as exc:
        raise ConfigError(f"{filename}: malformed HCL: {str(exc).splitlines()[0]}") from None


def _snippet(text: str, exc: UnexpectedInput) -> str:
    line = text.splitlines()[exc.line - 1] if 0 < exc.line <= len(text.splitlines()) else ""
    return line.strip()[:60]


def _add_file(config: StackConfig, filename: str, text: str) -> None:
    tree = parse_hcl(filename, text)
    for child in tree.children[0].children:
        if isinstance(child, Tree) and child.data == "attribute":
            name = node_name(child.children[0])
            raise ConfigError(f"{filename}:{child.meta.line}: unexpected top-level attribute `{name}`")
    for block_type, labels, block in _labelled_blocks(tree.children[0]):
        where = f"{filename}: {block_type} {' '.join(labels)}".rstrip()
        if block_type == "resource":
            _expect_labels(where, labels, 2)
            _add_resource(config, filename, labels[0], labels[1], block)
        elif block_type == "variable":
            _expect_labels(where, labels, 1)
            config.variables[labels[0]] = VariableConfig(
                name=labels[0],
                default=_constant(block.attributes["default"], where) if "default" in block.attributes else NO_DEFAULT,
                sensitive=bool(_constant(block.attributes["sensitive"], where)) if "sensitive" in block.attributes else False,
            )
        elif block_type == "locals":
            for name, expr in block.attributes.items():
                if name in config.locals:
                    raise ConfigError(f"{where}: local `{name}` is defined twice")
                config.locals[name] = expr
        elif block_type == "output":
            _expect_labels(where, labels, 1)
            if "value" not in block.attributes:
                raise ConfigError(f"{where}: an output needs a value")
            sensitive = block.attributes.get("sensitive")
            config.outputs[labels[0]] = OutputConfig(labels[0], block.attributes["value"],
                                                     bool(_constant(sensitive, where)) if sensitive else False)
        elif block_type == "moved":
            config.moved.append((traversal_text(block.attributes["from"], where),
                                 traversal_text(block.attributes["to"], where)))
        elif block_type == "import":
            config.imports[traversal_text(block.attributes["to"], where)] = block.attributes["id"]
        elif block_type == "data":
            raise ConfigError(f"{where}: data sources are not simulated by the sandbox engine")
        elif block_type == "module":
            raise ConfigError(f"{where}: module calls are not simulated by the sandbox engine")
        elif block_type not in IGNORED_BLOCKS:
            raise ConfigError(f"{where}: unknown block type `{block_type}`")


def _expect_labels(where: str, labels: list[str], n: int) -> None:
    if len(labels) != n:
        raise ConfigError(f"{where}: expected {n} label(s), got {len(labels)}")


def _add_resource(config: StackConfig, filename: str, rtype: str, name: str, body: Body) -> None:
    where = f"{filename}: resource {rtype}.{name}"
    key = f"{rtype}.{name}"
    if key in config.resources:
        raise ConfigError(f"{where}: defined twice (also in {config.resources[key].file})")
    if "count" in body.attributes and "for_each" in body.attributes:
        raise ConfigError(f"{where}: count and for_each cannot both be set")
    lifecycle = Lifecycle()
    for block_type, block in body.blocks:
        if block_type == "lifecycle":
            lifecycle = _lifecycle(block, where)
        elif block_type == "dynamic":
            raise ConfigError(f"{where}: dynamic blocks are not simulated by the sandbox engine")
    depends_on = body.attributes.get("depends_on")
    config.resources[key] = ResourceConfig(
        type=rtype,
        name=name,
        file=filename,
        body=Body(
            attributes={k: v for k, v in body.attributes.items() if k not in META_ARGUMENTS},
            blocks=[(t, b) for t, b in body.blocks if t != "lifecycle"],
        ),
        count=body.attributes.get("count"),
        for_each=body.attributes.get("for_each"),
        lifecycle=lifecycle,
        depends_on=tuple(traversal_text(t, where) for t in _tuple_items(depends_on)) if depends_on else (),
    )


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
    json.dumps(value)  # a constant must be plain data
    return value


def _tuple_items(expr: Tree) -> list[Tree]:
    term = _first(expr)
    if term is None or term.data != "tuple":
        return [expr]
    return [c for c in term.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _first(expr: Tree) -> Tree | None:
    subtrees = [c for c in expr.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    return subtrees[0] if expr.data == "expr_term" and subtrees else None


def traversal_text(expr: Tree, where: str, strict: bool = True) -> str:
    """`aws_vpc.main`, `aws_subnet.a[0]` or `tags` as text, from a reference expression."""
    node = expr
    while node.data == "expr_term":
        inner = _first(node)
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


def _body(node: Tree) -> Body:
    body = Body()
    for child in node.children:
        if not isinstance(child, Tree):
            continue
        if child.data == "attribute":
            name = node_name(child.children[0])
            if name in body.attributes:
                raise ConfigError(f"line {child.meta.line}: attribute `{name}` is set twice")
            body.attributes[name] = child.children[-1]
        elif child.data == "block":
            block_type, labels, inner = _block_parts(child)
            if labels and block_type != "dynamic":
                raise ConfigError(f"line {child.meta.line}: nested block `{block_type}` takes no labels")
            body.blocks.append((block_type, inner))
    return body


def _labelled_blocks(node: Tree) -> list[tuple[str, list[str], Body]]:
    return [_block_parts(c) for c in node.children if isinstance(c, Tree) and c.data == "block"]


def _block_parts(block: Tree) -> tuple[str, list[str], Body]:
    parts = [c for c in block.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    labels = [node_name(p) for p in parts[1:-1]]
    return node_name(parts[0]), labels, _body(parts[-1])


def node_name(node: Tree) -> str:
    if node.data == "string":
        return "".join(str(p.children[0]) for p in node.children if isinstance(p, Tree))
    token = node.children[0]
    return str(token.children[0]) if isinstance(token, Tree) else str(token)


def collect_references(expr: Tree) -> set[str]:
    """Root-and-first-attribute pairs an expression refers to: `aws_vpc.main`, `local.x`, `var.y`."""
    refs: set[str] = set()
    for node in expr.iter_subtrees():
        if node.data != "get_attr_expr_term":
            continue
        base, attr = [c for c in node.children if isinstance(c, Tree)]
        inner = _first(base)
        if inner is not None and inner.data == "identifier":
            attr_name = [c for c in attr.children if isinstance(c, Tree)][0].children[0]
            refs.add(f"{inner.children[0]}.{attr_name if not isinstance(attr_name, Token) else str(attr_name)}")
    return refs
