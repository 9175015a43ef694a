"""Variable type constraints, as Terraform applies them to the values a variable receives.

`type = list(string)` turns `[1, 2]` into `["1", "2"]`; `object({ name = string, size = optional(number, 1) })`
fills an attribute left out with its default (or null) and drops attributes it does not declare, so
`var.x.size` reads a value instead of failing. A value that cannot convert is an error naming the
variable's file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lark import Token, Tree

from gateway.adapters.engines.sandbox.hcl_eval import Evaluator
from gateway.adapters.engines.sandbox.values import UNKNOWN, Sensitive, SetValue, marked
from gateway.domain.errors import ConfigError

PRIMITIVES = frozenset({"string", "number", "bool", "any"})
COLLECTIONS = frozenset({"list", "set", "map"})


@dataclass(frozen=True)
class TypeSpec:
    kind: str  # string, number, bool, any, list, set, map, tuple, object
    element: TypeSpec | None = None
    elements: tuple[TypeSpec, ...] = ()
    attributes: dict[str, tuple[TypeSpec, bool, Any]] = field(default_factory=dict)  # name -> (type, optional, default)


ANY = TypeSpec("any")


def parse_type(expr: Tree, where: str) -> TypeSpec:
    """A type constraint from its expression: `string`, `list(string)`, `object({...})`, `optional(...)` inside."""
    node = _inner(expr)
    if node.data == "identifier":
        name = str(node.children[0])
        if name in PRIMITIVES:
            return TypeSpec(name)
        raise ConfigError(f"{where}: unknown type `{name}`")
    if node.data == "function_call":
        name = str(node.children[0].children[0])
        args = _arguments(node)
        if name in COLLECTIONS and len(args) == 1:
            return TypeSpec(name, element=parse_type(args[0], where))
        if name == "tuple" and len(args) == 1 and _inner(args[0]).data == "tuple":
            return TypeSpec("tuple", elements=tuple(parse_type(e, where) for e in _subtrees(_inner(args[0]))))
        if name == "object" and len(args) == 1 and _inner(args[0]).data == "object":
            return TypeSpec("object", attributes=_object_attributes(_inner(args[0]), where))
    raise ConfigError(f"{where}: the sandbox does not understand this type constraint")


def _object_attributes(node: Tree, where: str) -> dict[str, tuple[TypeSpec, bool, Any]]:
    attributes: dict[str, tuple[TypeSpec, bool, Any]] = {}
    for elem in _subtrees(node):
        key_node, value = _subtrees(elem)
        key = _inner(_subtrees(key_node)[0]) if _subtrees(key_node) else key_node
        name = str(key.children[0]) if key.data == "identifier" else str(Evaluator({}, where).eval(key))
        inner = _inner(value)
        if inner.data == "function_call" and str(inner.children[0].children[0]) == "optional":
            args = _arguments(inner)
            default = Evaluator({}, where).eval(args[1]) if len(args) > 1 else None
            attributes[name] = (parse_type(args[0], where), True, default)
        else:
            attributes[name] = (parse_type(value, where), False, None)
    return attributes


def _inner(expr: Tree) -> Tree:
    while expr.data == "expr_term" and _subtrees(expr):
        expr = _subtrees(expr)[0]
    return expr


def _subtrees(node: Tree) -> list[Tree]:
    return [c for c in node.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _arguments(call: Tree) -> list[Tree]:
    args = next((c for c in call.children if isinstance(c, Tree) and c.data == "arguments"), None)
    return [] if args is None else [c for c in _subtrees(args) if not isinstance(c, Token)]


def convert(value: Any, spec: TypeSpec, where: str) -> Any:
    """`value` converted to `spec` as Terraform converts a variable's value; marks and unknowns kept."""
    if value is None or value is UNKNOWN or spec.kind == "any":
        return value
    if isinstance(value, Sensitive):
        return marked(convert(value.value, spec, where), value.mark)
    kind = spec.kind
    if kind == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if isinstance(value, str):
            return value
    elif kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value) if value.lstrip("-").isdigit() else float(value)
            except ValueError:
                pass
    elif kind == "bool":
        if isinstance(value, bool):
            return value
        if value in ("true", "false"):
            return value == "true"
    elif kind in ("list", "set") and isinstance(value, list):
        assert spec.element is not None
        items = [convert(v, spec.element, where) for v in value]
        if kind == "set" and all(isinstance(v, str) for v in items):
            return SetValue(sorted(set(items)))
        return items
    elif kind == "map" and isinstance(value, dict):
        assert spec.element is not None
        return {k: convert(v, spec.element, where) for k, v in value.items()}
    elif kind == "tuple" and isinstance(value, list) and len(value) == len(spec.elements):
        return [convert(v, t, where) for v, t in zip(value, spec.elements, strict=True)]
    elif kind == "object" and isinstance(value, dict):
        return _convert_object(value, spec, where)
    raise ConfigError(f"{where}: a {_shape(value)} does not fit the variable's type ({kind})")


def _convert_object(value: dict[str, Any], spec: TypeSpec, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (attr_type, optional, default) in spec.attributes.items():
        if value.get(name) is not None:
            out[name] = convert(value[name], attr_type, where)
        elif optional:
            out[name] = convert(default, attr_type, where)
        elif name in value:
            out[name] = None
        else:
            raise ConfigError(f"{where}: attribute `{name}` is required by the variable's type")
    return out


def _shape(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "bool"}.get(type(value), "number")
