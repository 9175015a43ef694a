"""Evaluates HCL expressions from python-hcl2's parse tree, the way Terraform would.

Values are plain Python (str, int, float, bool, None, list, dict) plus the marks Terraform has:
`UNKNOWN` (known only after apply) and `Sensitive(value)`. Both propagate through operators and
functions, so a value derived from a sensitive variable stays sensitive and one derived from a
computed id stays unknown.

One mark Terraform lacks: `Secret(value)`, a Sensitive value that is secret by where it comes from
(the workspace's secrets, a variable main declares sensitive, an attribute the schema marks
sensitive). `nonsensitive()` removes a declared mark, as in Terraform, but never this one: what a
branch writes cannot unmask what the gateway was given to keep.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from hcl2.utils import process_escape_sequences
from lark import Token, Tree

from gateway.domain.errors import ConfigError


class _Unknown:
    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class Mark(IntEnum):
    """How strongly a value is masked; a value derived from several takes the strongest."""

    NONE = 0
    SENSITIVE = 1  # declared sensitive: nonsensitive() removes it
    SECRET = 2  # secret by origin: nothing in a configuration removes it


@dataclass(frozen=True)
class Sensitive:
    value: Any

    mark = Mark.SENSITIVE


@dataclass(frozen=True)
class Secret(Sensitive):
    mark = Mark.SECRET


def marked(value: Any, mark: Mark) -> Any:
    """`value` carrying `mark` (unchanged when the mark is NONE)."""
    if mark is Mark.SECRET:
        return Secret(value)
    if mark is Mark.SENSITIVE:
        return Sensitive(value)
    return value


class MaskedFailure(ConfigError):
    """An evaluation error decided by a masked value: `try()` must not turn it into a clear yes or no."""

    def __init__(self, message: str, mark: Mark):
        super().__init__(message)
        self.mark = mark


class Namespace:
    """A root name (`var`, `local`, `aws_vpc`) whose attributes are resolved on demand."""

    def __init__(self, label: str, resolve: Callable[[str], Any]):
        self.label = label
        self._resolve = resolve

    def attr(self, name: str) -> Any:
        return self._resolve(name)


def unmark(value: Any) -> tuple[Any, Mark]:
    """Strip marks anywhere in a value; report the strongest there was (NONE, which is falsy, if none)."""
    if isinstance(value, Sensitive):
        inner, mark = unmark(value.value)
        return inner, max(mark, value.mark)
    if isinstance(value, dict):
        pairs = {k: unmark(v) for k, v in value.items()}
        mark = max((m for _, m in pairs.values()), default=Mark.NONE)
        if not mark and type(value) is not dict:  # an object the engine made (open to any attribute) stays one
            return value, mark
        return {k: v for k, (v, _) in pairs.items()}, mark
    if isinstance(value, list):
        items = [unmark(v) for v in value]
        return [v for v, _ in items], max((m for _, m in items), default=Mark.NONE)
    return value, Mark.NONE


def contains_unknown(value: Any) -> bool:
    if value is UNKNOWN:
        return True
    if isinstance(value, Sensitive):
        return contains_unknown(value.value)
    if isinstance(value, dict):
        return any(contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_unknown(v) for v in value)
    return False


class Evaluator:
    """Evaluates expression trees against a scope of root names."""

    def __init__(self, scope: Mapping[str, Any], where: str):
        self.scope = dict(scope)
        self.where = where

    def child(self, **names: Any) -> Evaluator:
        return Evaluator({**self.scope, **names}, self.where)

    def fail(self, message: str, mark: Mark = Mark.NONE) -> ConfigError:
        """An evaluation error; `mark` says a masked value decided it (so even the failure is a secret)."""
        return MaskedFailure(f"{self.where}: {message}", mark) if mark else ConfigError(f"{self.where}: {message}")

    def eval(self, node: Any) -> Any:
        if isinstance(node, Token):
            raise self.fail(f"unexpected token {node!r}")
        handler = getattr(self, f"_{node.data}", None)
        if handler is None:
            raise self.fail(f"the sandbox does not support `{node.data}` expressions")
        return handler(node)

    # --- terms ---------------------------------------------------------------------------

    def _expr_term(self, node: Tree) -> Any:
        return self.eval(_subtrees(node)[0])

    def _identifier(self, node: Tree) -> Any:
        name = str(node.children[0])
        if name not in self.scope:
            raise self.fail(f"unknown name `{name}`")
        return self.scope[name]

    def _literal_value(self, node: Tree) -> Any:
        return {"true": True, "false": False, "null": None}[str(node.children[0])]

    def _int_lit(self, node: Tree) -> int:
        return int(str(node.children[0]))

    def _float_lit(self, node: Tree) -> float:
        return float(str(node.children[0]))

    def _tuple(self, node: Tree) -> list:
        return [self.eval(c) for c in _subtrees(node)]

    def _object(self, node: Tree) -> Any:
        out: dict[str, Any] = {}
        for elem in _subtrees(node):
            key_node, value_node = _subtrees(elem)
            key = self._object_key(_subtrees(key_node)[0])
            if key is UNKNOWN:
                return UNKNOWN
            out[str(key)] = self.eval(value_node)
        return out

    def _object_key(self, node: Tree) -> Any:
        term = _subtrees(node)[0] if node.data == "expr_term" and _subtrees(node) else node
        if term.data in ("identifier", "keyword"):
            return str(term.children[0])  # a bare name is the key itself, not a reference
        key, sensitive = unmark(self.eval(node))
        if sensitive:
            raise self.fail("a sensitive value cannot be used as an object key", sensitive)
        return key

    def _string(self, node: Tree) -> Any:
        return self._template([p for p in node.children if isinstance(p, Tree)])

    def _template(self, parts: list[Tree]) -> Any:
        pieces: list[Any] = []
        skipping: list[bool] = []  # one entry per open %{if}
        condition_mark = Mark.NONE  # what the text says depends on its conditions: a masked one masks it
        for part in parts:
            inner = part.children[0]
            if isinstance(inner, Tree) and inner.data.startswith("template_"):
                skipping, mark = self._directive(inner, skipping)
                condition_mark = max(condition_mark, mark)
                continue
            if any(skipping):
                continue
            if isinstance(inner, Token):
                text = str(inner)
                if inner.type == "ESCAPED_INTERPOLATION":
                    pieces.append(text[1:])
                elif inner.type == "ESCAPED_DIRECTIVE":
                    pieces.append(text[1:])
                else:
                    pieces.append(process_escape_sequences(text))
            else:
                pieces.append(self.eval(_subtrees(inner)[0]))
        return marked(_concat(pieces, self), condition_mark) if condition_mark else _concat(pieces, self)

    def _directive(self, node: Tree, skipping: list[bool]) -> tuple[list[bool], Mark]:
        if node.data == "template_if_start":
            cond, mark = unmark(self.eval(_subtrees(node)[0]))
            if cond is UNKNOWN:
                raise self.fail("a template condition depends on a value known only after apply")
            return skipping + [not cond], mark
        if node.data == "template_else" and skipping:
            return skipping[:-1] + [not skipping[-1]], Mark.NONE
        if node.data == "template_endif" and skipping:
            return skipping[:-1], Mark.NONE
        raise self.fail("template for-directives are not supported by the sandbox")

    def _heredoc_template(self, node: Tree, trim: bool = False) -> Any:
        text = str(node.children[0])
        body = text[text.index("\n") + 1 :].rstrip("\n")
        body = body[: body.rfind("\n") + 1] if "\n" in body else ""
        if trim:
            lines = body.split("\n")
            indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
            body = "\n".join(ln[indent:] for ln in lines)
        escaped = body.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        from hcl2 import parses_to_tree  # local: only heredocs need a re-parse

        tree = parses_to_tree(f'x = "{escaped}"\n')
        attribute = next(tree.find_data("attribute"))
        return self.eval(attribute.children[-1])

    def _heredoc_template_trim(self, node: Tree) -> Any:
        return self._heredoc_template(node, trim=True)

    # --- operators -----------------------------------------------------------------------

    def _conditional(self, node: Tree) -> Any:
        cond_node, yes, no = _subtrees(node)
        cond, mark = unmark(self.eval(cond_node))
        if cond is UNKNOWN:
            return UNKNOWN
        return marked(self.eval(yes if cond else no), mark)

    def _binary_op(self, node: Tree) -> Any:
        left_node, term = _subtrees(node)[:2]
        op_node, right_node = _subtrees(term)[:2]
        op = str(op_node.children[0])
        left = self.eval(left_node)
        if op in ("&&", "||"):
            plain, _ = unmark(left)
            if plain is not UNKNOWN and (plain is False if op == "&&" else plain is True):
                return left
        return _apply_marked(_BINARY[op], [left, self.eval(right_node)], self)

    def _unary_op(self, node: Tree) -> Any:
        op = str(node.children[0])
        operand = self.eval(_subtrees(node)[0])
        return _apply_marked((lambda v: -v) if op == "-" else (lambda v: not v), [operand], self)

    # --- references ----------------------------------------------------------------------

    def _get_attr_expr_term(self, node: Tree) -> Any:
        base_node, attr = _subtrees(node)
        return self._get_attr(self.eval(base_node), _attr_name(attr))

    def _get_attr(self, base: Any, name: str) -> Any:
        if isinstance(base, Namespace):
            return base.attr(name)
        if base is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Sensitive):
            return marked(self._get_attr(base.value, name), base.mark)
        if isinstance(base, dict):
            if name not in base:
                raise self.fail(f"object has no attribute `{name}`")
            return base[name]
        raise self.fail(f"cannot read attribute `{name}` of {_type_name(base)}")

    def _index_expr_term(self, node: Tree) -> Any:
        base_node, index_node = _subtrees(node)
        return self._index(self.eval(base_node), self._index_key(index_node))

    def _index_key(self, node: Tree) -> Any:
        if node.data == "short_index":
            return int(str(node.children[1]))
        return self.eval(_subtrees(node)[0])

    def _index(self, base: Any, key: Any) -> Any:
        key, key_sensitive = unmark(key)
        if base is UNKNOWN or key is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Sensitive):
            return marked(self._index(base.value, key), max(base.mark, key_sensitive))
        if key_sensitive:  # which element was picked tells about the key: the result is as secret as the key
            try:
                return marked(self._index(base, key), key_sensitive)
            except ConfigError:
                raise self.fail("index (sensitive) is out of range", key_sensitive) from None
        try:
            if isinstance(base, list):
                return base[int(key)]
            if isinstance(base, dict):
                return base[str(key)]
        except (IndexError, KeyError, ValueError):
            shown = "(sensitive)" if key_sensitive or isinstance(base, Sensitive) else json.dumps(key)
            raise self.fail(f"index {shown} is out of range") from None
        raise self.fail(f"cannot index {_type_name(base)}")

    def _attr_splat_expr_term(self, node: Tree) -> Any:
        return self._splat(node)

    def _full_splat_expr_term(self, node: Tree) -> Any:
        return self._splat(node)

    def _splat(self, node: Tree) -> Any:
        base_node, splat = _subtrees(node)
        base = self.eval(base_node)
        if base is UNKNOWN:
            return UNKNOWN
        items = base if isinstance(base, list) else ([] if base is None else [base])
        out = []
        for item in items:
            for step in _subtrees(splat):
                item = (
                    self._get_attr(item, _attr_name(step))
                    if step.data == "get_attr"
                    else self._index(item, self._index_key(step))
                )
            out.append(item)
        return out

    def _function_call(self, node: Tree) -> Any:
        names = [str(c.children[0]) for c in node.children if isinstance(c, Tree) and c.data == "identifier"]
        name = "::".join(names)
        func = FUNCTIONS.get(name)
        if func is None:
            raise self.fail(f"function `{name}` is not available in the sandbox")
        args_node = next((c for c in node.children if isinstance(c, Tree) and c.data == "arguments"), None)
        if name == "try":
            return self._try(_subtrees(args_node))
        args: list[Any] = [self.eval(a) for a in _subtrees(args_node)] if args_node else []
        if name == "nonsensitive":
            if not args:
                return None
            plain, mark = unmark(args[0])
            return Secret(plain) if mark is Mark.SECRET else plain  # a secret by origin stays masked
        if args_node and any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in args_node.children):
            spread, mark = unmark(args.pop())
            if spread is UNKNOWN:
                return UNKNOWN
            args.extend(marked(a, mark) for a in spread)
        return _apply_marked(func, args, self)

    def _try(self, candidates: list[Tree]) -> Any:
        mark = Mark.NONE  # which candidate wins tells whether a masked value made the earlier ones fail
        for candidate in candidates:
            try:
                return marked(self.eval(candidate), mark)
            except MaskedFailure as exc:
                mark = max(mark, exc.mark)
            except ConfigError:
                continue
        raise self.fail("try: no argument could be evaluated", mark)

    # --- for expressions -------------------------------------------------------------------

    def _for_tuple_expr(self, node: Tree) -> Any:
        intro, *rest = _subtrees(node)
        body = rest[0]
        cond = rest[1] if len(rest) > 1 else None
        mark, scopes = self._for_scopes(intro)
        out = []
        for scope in scopes:
            keep, cond_mark = _condition(scope, cond)
            mark = max(mark, cond_mark)  # which items were kept tells about the condition
            if keep:
                out.append(scope.eval(body))
        return marked(out, mark)

    def _for_object_expr(self, node: Tree) -> Any:
        intro, key_node, value_node, *rest = _subtrees(node)
        cond = next((r for r in rest if r.data == "for_cond"), None)
        grouping = any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in node.children)
        mark, scopes = self._for_scopes(intro)
        out: dict[str, Any] = {}
        for scope in scopes:
            keep, cond_mark = _condition(scope, cond)
            mark = max(mark, cond_mark)
            if not keep:
                continue
            key, key_mark = unmark(scope.eval(key_node))
            mark = max(mark, key_mark)  # a masked key (or collection) masks the whole result
            if key is UNKNOWN:
                return UNKNOWN
            value = scope.eval(value_node)
            if grouping:
                out.setdefault(str(key), []).append(value)
            elif str(key) in out:
                raise self.fail("duplicate key (sensitive) in a for expression" if mark
                                else f"duplicate key {key!r} in a for expression")
            else:
                out[str(key)] = value
        return marked(out, mark)

    def _for_scopes(self, intro: Tree) -> tuple[Mark, list[Evaluator]]:
        """The collection's mark, and one scope per item; the items of a masked collection stay masked."""
        names = [str(c.children[0]) for c in intro.children if isinstance(c, Tree) and c.data == "identifier"]
        collection_node = [c for c in intro.children if isinstance(c, Tree) and c.data != "identifier"][0]
        collection, mark = unmark(self.eval(collection_node))
        if collection is UNKNOWN:
            raise self.fail("a for expression iterates over a value known only after apply")
        pairs = collection.items() if isinstance(collection, dict) else enumerate(collection)
        if len(names) == 2:
            return mark, [self.child(**{names[0]: marked(k, mark), names[1]: marked(v, mark)}) for k, v in pairs]
        return mark, [self.child(**{names[0]: marked(v, mark)}) for _, v in pairs]


def _subtrees(node: Tree | None) -> list[Tree]:
    """A node's meaningful children: subtrees other than newlines and comments."""
    if node is None:
        return []
    return [c for c in node.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _attr_name(get_attr: Tree) -> str:
    return str(_subtrees(get_attr)[0].children[0])


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a bool"}.get(type(value), "a number" if isinstance(value, (int, float)) else "null")


def _condition(scope: Evaluator, cond: Tree | None) -> tuple[bool, Mark]:
    """A for-expression's `if` filter: whether to keep the item, and the condition's mark."""
    if cond is None:
        return True, Mark.NONE
    plain, mark = unmark(scope.eval(_subtrees(cond)[0]))
    return bool(plain), mark


def _concat(pieces: list[Any], ev: Evaluator) -> Any:
    if len(pieces) == 1 and not isinstance(unmark(pieces[0])[0], str):
        return pieces[0]  # "${x}" keeps x's type, as in Terraform
    return _apply_marked(lambda *ps: "".join(_to_string(p) for p in ps), pieces, ev)


def _to_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        raise TypeError("cannot use an object or list in a string template")
    return str(value)


def _apply_marked(func: Callable[..., Any], args: list[Any], ev: Evaluator) -> Any:
    """Call func on unmarked args; unknown in gives unknown out, sensitive in gives sensitive out."""
    plain, marks = zip(*(unmark(a) for a in args), strict=True) if args else ((), ())
    if any(contains_unknown(a) for a in plain):
        return UNKNOWN
    try:
        result = func(*plain)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
        # the library's message may quote its arguments; never quote a sensitive one
        raise ev.fail("an operation on a sensitive value failed" if any(marks) else str(exc) or type(exc).__name__,
                      max(marks, default=Mark.NONE)) from None
    return marked(result, max(marks, default=Mark.NONE))


def _num(a: Any) -> float | int:
    if isinstance(a, bool) or not isinstance(a, (int, float, str)):
        raise TypeError(f"expected a number, got {_type_name(a)}")
    return a if not isinstance(a, str) else (int(a) if a.lstrip("-").isdigit() else float(a))


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: _num(a) + _num(b),
    "-": lambda a, b: _num(a) - _num(b),
    "*": lambda a, b: _num(a) * _num(b),
    "/": lambda a, b: _num(a) / _num(b),
    "%": lambda a, b: _num(a) % _num(b),
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: _num(a) < _num(b),
    ">": lambda a, b: _num(a) > _num(b),
    "<=": lambda a, b: _num(a) <= _num(b),
    ">=": lambda a, b: _num(a) >= _num(b),
    "&&": lambda a, b: bool(a) and bool(b),
    "||": lambda a, b: bool(a) or bool(b),
}


def _cidrsubnet(prefix: str, newbits: int, netnum: int) -> str:
    network = ipaddress.ip_network(prefix, strict=False)
    length = network.prefixlen + int(newbits)
    if length > network.max_prefixlen or not 0 <= int(netnum) < 2 ** int(newbits):
        raise ValueError(f"cidrsubnet: cannot make subnet {netnum} of /{length} in {prefix}")
    offset = int(netnum) << (network.max_prefixlen - length)
    return f"{network.network_address + offset}/{length}"


def _cidrhost(prefix: str, hostnum: int) -> str:
    return str(ipaddress.ip_network(prefix, strict=False)[int(hostnum)])


def _merge(*maps: dict) -> dict:
    out: dict = {}
    for m in maps:
        if m is not None:
            out.update(m)
    return out


def _flatten(items: list) -> list:
    out: list = []
    for item in items:
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


def _lookup(mapping: dict, key: str, *default: Any) -> Any:
    if key in mapping:
        return mapping[key]
    if default:
        return default[0]
    raise KeyError(f"lookup: no key {key!r} and no default")


def _format(fmt: str, *args: Any) -> str:
    return fmt.replace("%%", "\x00").replace("%v", "%s").replace("%q", '"%s"') % args if args else fmt


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "merge": _merge,
    "concat": lambda *ls: [x for lst in ls for x in lst],
    "toset": lambda xs: sorted(set(xs), key=str),
    "tolist": list,
    "tomap": dict,
    "tostring": _to_string,
    "tonumber": _num,
    "tobool": lambda v: v if isinstance(v, bool) else {"true": True, "false": False}[v],
    "length": len,
    "lower": str.lower,
    "upper": str.upper,
    "title": str.title,
    "trimspace": str.strip,
    "join": lambda sep, xs: sep.join(_to_string(x) for x in xs),
    "split": lambda sep, s: s.split(sep),
    "replace": lambda s, old, new: s.replace(old, new),
    "substr": lambda s, off, n: s[off:] if n == -1 else s[off : off + n],
    "startswith": str.startswith,
    "endswith": str.endswith,
    "format": lambda fmt, *args: _format(fmt, *args).replace("\x00", "%"),
    "cidrsubnet": _cidrsubnet,
    "cidrhost": _cidrhost,
    "lookup": _lookup,
    "coalesce": lambda *xs: next(x for x in xs if x not in (None, "")),
    "contains": lambda xs, v: v in xs,
    "keys": lambda m: sorted(m),
    "values": lambda m: [m[k] for k in sorted(m)],
    "element": lambda xs, i: xs[int(i) % len(xs)],
    "flatten": _flatten,
    "distinct": lambda xs: [json.loads(x) for x in dict.fromkeys(json.dumps(x, sort_keys=True) for x in xs)],
    "min": lambda *xs: min(_num(x) for x in xs),
    "max": lambda *xs: max(_num(x) for x in xs),
    "abs": lambda x: abs(_num(x)),
    "range": lambda *a: list(range(*(int(x) for x in a))),
    "zipmap": lambda ks, vs: dict(zip(ks, vs, strict=True)),
    "jsonencode": lambda v: json.dumps(v, separators=(",", ":")),
    "jsondecode": json.loads,
    "sensitive": Sensitive,
    "nonsensitive": lambda v: v,  # handled in _function_call: it removes the mark
    "try": lambda *xs: xs[0],  # handled in _function_call: it catches evaluation errors
}
