"""Evaluates HCL expressions from python-hcl2's parse tree, the way Terraform would.

The values and their marks (unknown, sensitive, secret) are in values.py; Terraform's functions in
functions/. This module walks expressions and templates and dispatches function calls.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from hcl2.utils import process_escape_sequences
from lark import Token, Tree

from gateway.adapters.engines.sandbox.functions import (
    FUNCTIONS,
    UNSUPPORTED,
    CallContext,
    FunctionCallError,
    FunctionError,
    call_function,
    issensitive,
    same_value,
    sensitive,
    to_bool,
    to_number,
    to_string,
)
from gateway.adapters.engines.sandbox.values import (
    UNKNOWN,
    Mark,
    Secret,
    Sensitive,
    SetValue,
    contains_unknown,
    decimal_arithmetic,
    marked,
    plain_number,
    type_name,
    unmark,
)
from gateway.domain.errors import ConfigError

NO_CONTEXT = CallContext()


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


class Evaluator:
    """Evaluates expression trees against a scope of root names."""

    def __init__(self, scope: Mapping[str, Any], where: str, context: CallContext = NO_CONTEXT,
                 file: str | None = None, lines: LineMap | None = None):
        self.scope = dict(scope)
        self.where = where
        self.context = context  # what file and time functions need
        self.file = file  # the file the expressions come from, for error messages
        self.lines = lines  # set while evaluating a re-parsed template: where its lines were

    def child(self, **names: Any) -> Evaluator:
        return Evaluator({**self.scope, **names}, self.where, self.context, self.file, self.lines)

    def fail(self, message: str, mark: Mark = Mark.NONE, node: Tree | None = None) -> ConfigError:
        """An evaluation error; `mark` says a masked value decided it (so even the failure is a secret).

        With `node`, the message names its line (and the file, when the evaluator knows it), as Terraform's do.
        """
        where = self._located(self._line(node) if node is not None else None)
        return MaskedFailure(f"{where}: {message}", mark) if mark else ConfigError(f"{where}: {message}")

    def _located(self, line: int | None) -> str:
        """`where` naming `line`: the engine's `file:N:` moved to that line, else `on FILE line N` added."""
        if line is None:
            return self.where
        if self.file:
            at = re.compile(rf"(?<![\w./-]){re.escape(self.file)}:\d+:")
            if at.search(self.where):
                return at.sub(lambda _: f"{self.file}:{line}:", self.where, count=1)
            return f"{self.where}: on {self.file} line {line}"
        return f"{self.where}: line {line}"

    def _line(self, node: Tree) -> int | None:
        line, column = _position(node)
        if self.lines is None:
            return line
        return None if column is None else self.lines.line_at(column)

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
            raise self.fail(f"unknown name `{name}`", node=node)
        return self.scope[name]

    def _literal_value(self, node: Tree) -> Any:
        return {"true": True, "false": False, "null": None}[str(node.children[0])]

    def _int_lit(self, node: Tree) -> int:
        return int(str(node.children[0]))

    def _float_lit(self, node: Tree) -> int | float:
        text = str(node.children[0])
        number = Decimal(text)
        return int(number) if number == number.to_integral_value() else float(text)  # 1e20 is a whole number

    def _tuple(self, node: Tree) -> list:
        return [self.eval(c) for c in _subtrees(node)]

    def _object(self, node: Tree) -> Any:
        out: dict[str, Any] = {}
        for elem in _subtrees(node):
            key_node, value_node = _subtrees(elem)
            key = self._object_key(_subtrees(key_node)[0])
            if key is UNKNOWN:
                return UNKNOWN
            out[self._key_text(key, Mark.NONE, key_node)] = self.eval(value_node)
        return out

    def _key_text(self, key: Any, mark: Mark, node: Tree) -> str:
        """An object key as Terraform makes it: a string (`true` is "true", `1` is "1"); null or a collection fails."""
        if key is None:
            raise self.fail("Invalid object key: the key expression produced null.", mark, node)
        try:
            return to_string(key)
        except FunctionError:
            raise self.fail(f"Invalid object key: a key must be a string, got {type_name(key)}.", mark, node) from None

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
        items = _strip_whitespace([p.children[0] for p in parts])
        if len(items) == 1 and isinstance(items[0], Tree) and items[0].data == "interpolation":
            return self.eval(_subtrees(items[0])[0])  # "${x}" is x itself, of its own type, even null
        sequence, rest = _nest(items, 0, ())
        if rest != len(items):
            raise self.fail(f"unexpected template directive `{_directive_word(items[rest])}`", node=items[rest])
        pieces, mark = self._render(sequence)
        if any(p is UNKNOWN for p in pieces):
            return marked(UNKNOWN, mark)
        return marked("".join(pieces), mark)

    def _render(self, sequence: list[Any]) -> tuple[list[Any], Mark]:
        """Each item's text (or UNKNOWN); a masked piece or condition masks the whole text."""
        pieces: list[Any] = []
        mark = Mark.NONE
        for item in sequence:
            if isinstance(item, str):
                pieces.append(item)
            elif isinstance(item, Tree):
                text, item_mark = self._interpolate(item)
                pieces.append(text)
                mark = max(mark, item_mark)
            elif item[0] == "if":
                _, directive, yes, no = item
                cond, cond_mark = unmark(self.eval(_subtrees(directive)[0]))
                mark = max(mark, cond_mark)
                if cond is UNKNOWN:
                    pieces.append(UNKNOWN)
                    continue
                try:
                    chosen = yes if to_bool(cond) else no
                except FunctionError:
                    raise self.fail(f"Invalid template directive: the condition must be a bool, got "
                                    f"{type_name(cond)}", cond_mark, directive) from None
                inner, inner_mark = self._render(chosen)
                pieces.extend(inner)
                mark = max(mark, inner_mark)
            else:
                _, directive, body = item
                for_mark, scopes = self._for_scopes(directive)
                mark = max(mark, for_mark)
                if scopes is None:
                    pieces.append(UNKNOWN)
                    continue
                for scope in scopes:
                    inner, inner_mark = scope._render(body)
                    pieces.extend(inner)
                    mark = max(mark, inner_mark)
        return pieces, mark

    def _interpolate(self, node: Tree) -> tuple[Any, Mark]:
        value, mark = unmark(self.eval(_subtrees(node)[0]))
        if value is None:
            raise self.fail("Invalid template interpolation value: the expression result is null. Cannot include "
                            "a null value in a string template.", mark, node)
        if value is UNKNOWN:
            return UNKNOWN, mark
        if isinstance(value, (list, dict)):
            raise self.fail(f"Invalid template interpolation value: cannot include the given value in a string "
                            f"template: string required, got {type_name(value)}.", mark, node)
        return to_string(value), mark

    def _heredoc_template(self, node: Tree, trim: bool = False) -> Any:
        text = str(node.children[0])
        body = text[text.index("\n") + 1 :].rstrip("\n")
        body = body[: body.rfind("\n") + 1] if "\n" in body else ""
        if trim:
            lines = body.split("\n")
            indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
            body = "\n".join(ln[indent:] for ln in lines)
        line = _position(node)[0]
        expression, line_map = _parse_template(body, line + 1 if line else 1, self.where, self.file)
        heredoc = Evaluator(self.scope, self.where, self.context, self.file, line_map if line else None)
        return heredoc.eval(expression)

    def _heredoc_template_trim(self, node: Tree) -> Any:
        return self._heredoc_template(node, trim=True)

    # --- operators -----------------------------------------------------------------------

    def _conditional(self, node: Tree) -> Any:
        cond_node, yes, no = _subtrees(node)
        cond, mark = unmark(self.eval(cond_node))
        if cond is UNKNOWN:
            return UNKNOWN
        if cond is None:
            raise self.fail("Null condition: the condition value is null. Conditions must either be true or false.",
                            mark, node)
        try:
            cond = to_bool(cond)
        except FunctionError:
            raise self.fail(f"Incorrect condition type: the condition expression must be of type bool, got "
                            f"{type_name(cond)}.", mark, node) from None
        return marked(self.eval(yes if cond else no), mark)

    def _binary_op(self, node: Tree) -> Any:
        left_node, term = _subtrees(node)[:2]
        op_node, right_node = _subtrees(term)[:2]
        op = str(op_node.children[0])
        # both sides are evaluated, as in Terraform: `false && null.x` is an error, not false
        left, right = self.eval(left_node), self.eval(right_node)
        if op in ("==", "!=") and _null_comparison(left, right):
            # as Terraform: against null only the top level counts, so a known map holding unknowns is not null
            return _apply_marked(lambda a, b: (a is None and b is None) == (op == "=="),
                                 [_top_level(left), _top_level(right)], self, node)
        return _apply_marked(_BINARY[op], [left, right], self, node)

    def _unary_op(self, node: Tree) -> Any:
        op = str(node.children[0])
        operand = self.eval(_subtrees(node)[0])
        negate = (lambda v: -_operand_number(v, "operand")) if op == "-" \
            else (lambda v: not _operand_bool(v, "operand"))
        return _apply_marked(negate, [operand], self, node)

    # --- references ----------------------------------------------------------------------

    def _get_attr_expr_term(self, node: Tree) -> Any:
        base_node, attr = _subtrees(node)
        return self._get_attr(self.eval(base_node), _attr_name(attr), node)

    def _get_attr(self, base: Any, name: str, node: Tree | None = None) -> Any:
        if isinstance(base, Namespace):
            return base.attr(name)
        if base is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Sensitive):
            return marked(self._get_attr(base.value, name, node), base.mark)
        if isinstance(base, dict):
            if name not in base:
                raise self.fail(f"Unsupported attribute: this object does not have an attribute named `{name}`.",
                                node=node)
            return base[name]
        if base is None:
            raise self.fail(f"Attempt to get attribute `{name}` from null value: this value is null, so it does not "
                            "have any attributes.", node=node)
        raise self.fail(f"Unsupported attribute: cannot read attribute `{name}` of {_type_name(base)}.", node=node)

    def _index_expr_term(self, node: Tree) -> Any:
        base_node, index_node = _subtrees(node)
        return self._index(self.eval(base_node), self._index_key(index_node), node)

    def _index_key(self, node: Tree) -> Any:
        if node.data == "short_index":
            return int(str(node.children[1]))
        return self.eval(_subtrees(node)[0])

    def _index(self, base: Any, key: Any, node: Tree | None = None) -> Any:
        key, key_sensitive = unmark(key)
        if base is UNKNOWN or key is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Sensitive):
            return marked(self._index(base.value, key, node), max(base.mark, key_sensitive))
        if key_sensitive:  # which element was picked tells about the key: the result is as secret as the key
            try:
                return marked(self._index(base, key, node), key_sensitive)
            except ConfigError:
                raise self.fail("Invalid index: the key (sensitive) does not identify an element", key_sensitive,
                                node) from None
        if base is None:
            raise self.fail("Attempt to index null value: this value is null, so it does not have any indices.",
                            node=node)
        if key is None:
            raise self.fail("Invalid index: can't use a null value as an indexing key.", node=node)
        if isinstance(base, list):
            try:
                position = to_number(key)
            except FunctionError:
                position = -1
            if not 0 <= position < len(base) or position != int(position):  # no negative indices, as Terraform
                raise self.fail(f"Invalid index: the given key ({json.dumps(key)}) does not identify an element in "
                                f"this collection value, a list of {len(base)}.", node=node)
            return base[int(position)]
        if isinstance(base, dict):
            try:
                text = to_string(key)
            except FunctionError:
                text = None
            if text is None or text not in base:
                raise self.fail(f"Invalid index: the given key ({json.dumps(key)}) does not identify an element in "
                                "this collection value.", node=node)
            return base[text]
        raise self.fail(f"Invalid index: cannot index {_type_name(base)}.", node=node)

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
                    self._get_attr(item, _attr_name(step), node)
                    if step.data == "get_attr"
                    else self._index(item, self._index_key(step), node)
                )
            out.append(item)
        return out

    def _function_call(self, node: Tree) -> Any:
        names = [str(c.children[0]) for c in node.children if isinstance(c, Tree) and c.data == "identifier"]
        name = "::".join(names)
        args_node = next((c for c in node.children if isinstance(c, Tree) and c.data == "arguments"), None)
        arg_nodes = _subtrees(args_node)
        if name in ("try", "can"):
            return self._try(arg_nodes, node) if name == "try" else self._can(arg_nodes, node)
        if name not in FUNCTIONS and name not in ("nonsensitive", "sensitive", "issensitive"):
            reason = UNSUPPORTED.get(name)
            if reason:
                raise self.fail(f"function `{name}` is not available in the sandbox: {reason}", node=node)
            if "::" in name:
                raise self.fail(f"provider-defined function `{name}` is not available in the sandbox", node=node)
            raise self.fail(f"function `{name}` is not available: Terraform has no function of that name",
                            node=node)
        args: list[Any] = [self.eval(a) for a in arg_nodes]
        if args_node and any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in args_node.children):
            spread, mark = unmark(args.pop())
            if spread is UNKNOWN:
                return UNKNOWN
            if not isinstance(spread, list):
                raise self.fail(f"Invalid expanding argument value: the expanding argument (indicated with ...) "
                                f"must be of a tuple, list, or set type, not {type_name(spread)}", mark, node)
            args.extend(marked(a, mark) for a in spread)
        if name in ("nonsensitive", "sensitive", "issensitive"):
            return self._mark_function(name, args, node)
        context = self.context
        if FUNCTIONS[name].contextual and context.render is None:
            context = dataclasses.replace(context, render=self.render_template)
        try:
            return call_function(name, args, context)
        except FunctionCallError as exc:
            raise self.fail(str(exc), exc.mark, node) from None

    def _mark_function(self, name: str, args: list[Any], node: Tree) -> Any:
        """sensitive(), nonsensitive(), issensitive(): they act on the marks, which call_function strips."""
        if len(args) != 1:
            raise self.fail(f'function "{name}" expects 1 argument(s), got {len(args)}', node=node)
        if name == "sensitive":
            return sensitive(args[0])
        if name == "issensitive":
            return issensitive(args[0])
        plain, mark = unmark(args[0])
        return Secret(plain) if mark is Mark.SECRET else plain  # a secret by origin stays masked

    def _try(self, candidates: list[Tree], node: Tree | None = None) -> Any:
        mark = Mark.NONE  # which candidate wins tells whether a masked value made the earlier ones fail
        for candidate in candidates:
            try:
                value = self.eval(candidate)
            except MaskedFailure as exc:
                mark = max(mark, exc.mark)
                continue
            except ConfigError:
                continue
            if contains_unknown(value):
                return UNKNOWN  # whether a later step fails is not known yet, as in Terraform
            return marked(value, mark)
        raise self.fail("Error in function call: try(): no expression succeeded", mark, node)

    def _can(self, candidates: list[Tree], node: Tree) -> Any:
        if len(candidates) != 1:
            raise self.fail(f'function "can" expects 1 argument(s), got {len(candidates)}', node=node)
        try:
            value = self.eval(candidates[0])
        except MaskedFailure as exc:
            return marked(False, exc.mark)
        except ConfigError:
            return False
        return UNKNOWN if contains_unknown(value) else True

    def render_template(self, text: str, where: str, variables: dict[str, Any]) -> Any:
        """Template text (templatefile, templatestring) rendered with only `variables` in scope."""
        expression, lines = _parse_template(text, 1, self.where, where)
        inside = dataclasses.replace(self.context, render=None, in_template=True)
        return Evaluator(variables, self.where, inside, where, lines).eval(expression)

    # --- for expressions -------------------------------------------------------------------

    def _for_tuple_expr(self, node: Tree) -> Any:
        intro, *rest = _subtrees(node)
        body = rest[0]
        cond = rest[1] if len(rest) > 1 else None
        mark, scopes = self._for_scopes(intro)
        if scopes is None:
            return marked(UNKNOWN, mark)
        out = []
        for scope in scopes:
            keep, cond_mark = _condition(scope, cond)
            mark = max(mark, cond_mark)  # which items were kept tells about the condition
            if keep is None:
                return marked(UNKNOWN, mark)
            if keep:
                out.append(scope.eval(body))
        return marked(out, mark)

    def _for_object_expr(self, node: Tree) -> Any:
        intro, key_node, value_node, *rest = _subtrees(node)
        cond = next((r for r in rest if r.data == "for_cond"), None)
        grouping = any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in node.children)
        mark, scopes = self._for_scopes(intro)
        if scopes is None:
            return marked(UNKNOWN, mark)
        out: dict[str, Any] = {}
        for scope in scopes:
            keep, cond_mark = _condition(scope, cond)
            mark = max(mark, cond_mark)
            if keep is None:
                return marked(UNKNOWN, mark)
            if not keep:
                continue
            key, key_mark = unmark(scope.eval(key_node))
            mark = max(mark, key_mark)  # a masked key (or collection) masks the whole result
            if key is UNKNOWN:
                return UNKNOWN
            value = scope.eval(value_node)
            text = self._key_text(key, mark, key_node)
            if grouping:
                out.setdefault(text, []).append(value)
            elif text in out:
                raise self.fail("duplicate key (sensitive) in a for expression" if mark
                                else f"duplicate key {json.dumps(text)} in a for expression; use `...` after the value "
                                "to group the values of equal keys", mark, key_node)
            else:
                out[text] = value
        return marked(out, mark)

    def _for_scopes(self, intro: Tree) -> tuple[Mark, list[Evaluator] | None]:
        """The collection's mark, and one scope per item (None while the collection is unknown, as the result then
        is); the items of a masked collection stay masked."""
        names = [str(c.children[0]) for c in intro.children if isinstance(c, Tree) and c.data == "identifier"]
        collection_node = [c for c in _subtrees(intro) if c.data != "identifier"][0]  # `in` may end a line
        collection, mark = unmark(self.eval(collection_node))
        if collection is UNKNOWN:
            return mark, None
        if not isinstance(collection, (list, dict)):
            problem = "a null value" if collection is None else f"a value of type {type_name(collection)}"
            raise self.fail(f"Iteration over {'null' if collection is None else 'non-iterable'} value: {problem} "
                            "cannot be used as the collection in a 'for' expression.", mark, intro)
        if isinstance(collection, dict):
            pairs: Any = sorted(collection.items())  # keys in order
        elif isinstance(collection, SetValue):
            pairs = ((v, v) for v in collection)  # a set's key is its element
        else:
            pairs = enumerate(collection)
        if len(names) == 2:
            return mark, [self.child(**{names[0]: marked(k, mark), names[1]: marked(v, mark)}) for k, v in pairs]
        return mark, [self.child(**{names[0]: marked(v, mark)}) for _, v in pairs]


def _position(node: Tree) -> tuple[int | None, int | None]:
    """Where a subtree starts; the engine parses without position tracking, so from its first token then."""
    if not node.meta.empty:
        return getattr(node.meta, "line", None), getattr(node.meta, "column", None)
    for token in node.scan_values(lambda v: isinstance(v, Token)):
        return getattr(token, "line", None), getattr(token, "column", None)
    return None, None


def _subtrees(node: Tree | None) -> list[Tree]:
    """A node's meaningful children: subtrees other than newlines and comments."""
    if node is None:
        return []
    return [c for c in node.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _attr_name(get_attr: Tree) -> str:
    return str(_subtrees(get_attr)[0].children[0])


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a bool"}.get(type(value), "a number" if isinstance(value, (int, float)) else "null")


def _condition(scope: Evaluator, cond: Tree | None) -> tuple[bool | None, Mark]:
    """A for-expression's `if` filter: whether to keep the item (None: not known yet), and the condition's mark."""
    if cond is None:
        return True, Mark.NONE
    plain, mark = unmark(scope.eval(_subtrees(cond)[0]))
    if plain is UNKNOWN:
        return None, mark
    if plain is None:
        raise scope.fail("Invalid 'for' condition: the filter expression produced null; it must be true or false.",
                         mark, cond)
    return bool(plain), mark


def _literal_text(token: Token) -> str:
    text = str(token)
    if token.type in ("ESCAPED_INTERPOLATION", "ESCAPED_DIRECTIVE"):
        return text[1:]  # $${ and %%{ are the literal ${ and %{
    return process_escape_sequences(text)


def _strip_whitespace(raw: list[Any]) -> list[Any]:
    """Template parts with literals as text, and `~` strip markers on directives applied to their neighbours."""
    items: list[Any] = [_literal_text(x) if isinstance(x, Token) else x for x in raw]
    for i, item in enumerate(items):
        if not (isinstance(item, Tree) and item.data.startswith("template_")):
            continue
        tokens = [c for c in item.children if isinstance(c, Token)]
        if len(tokens) > 2 and tokens[1] == "~" and i > 0 and isinstance(items[i - 1], str):
            items[i - 1] = _strip_before(items[i - 1])
        if len(tokens) > 2 and tokens[-2] == "~" and i + 1 < len(items) and isinstance(items[i + 1], str):
            items[i + 1] = _strip_after(items[i + 1])
    return items


def _strip_before(text: str) -> str:
    """What a `~` opening a directive or interpolation leaves of the text before it. As in Terraform, only the last
    line is trimmed (with its line break if the text ends with one): `"a \\n  "` becomes `"a \\n"`."""
    start = text.rfind("\n", 0, len(text) - 1) + 1 if text.endswith("\n") else text.rfind("\n") + 1
    return text[:start] + text[start:].rstrip()


def _strip_after(text: str) -> str:
    """What a `~` closing a directive or interpolation leaves of the text after it: the first line's whitespace
    and its line break go, the next line's indentation stays, as in Terraform."""
    end = text.find("\n") + 1 or len(text)
    return text[:end].lstrip() + text[end:]


def _directive_word(node: Tree) -> str:
    return node.data.removeprefix("template_").removesuffix("_start")


def _nest(items: list[Any], i: int, until: tuple[str, ...]) -> tuple[list[Any], int]:
    """Template items from `i` up to a directive named in `until`: literals, interpolations, ("if", ...), ("for", ...)."""
    out: list[Any] = []
    while i < len(items):
        item = items[i]
        word = _directive_word(item) if isinstance(item, Tree) and item.data.startswith("template_") else None
        if word in until:
            return out, i
        if word == "if":
            yes, i = _nest(items, i + 1, ("else", "endif"))
            no: list[Any] = []
            if i < len(items) and _directive_word(items[i]) == "else":
                no, i = _nest(items, i + 1, ("endif",))
            if i >= len(items):
                raise ConfigError("a template `if` directive has no `endif`")
            out.append(("if", item, yes, no))
        elif word == "for":
            body, i = _nest(items, i + 1, ("endfor",))
            if i >= len(items):
                raise ConfigError("a template `for` directive has no `endfor`")
            out.append(("for", item, body))
        elif word is not None:
            return out, i  # a stray else/endif/endfor: the caller reports it
        else:
            out.append(item)
        i += 1
    return out, i


_QUOTED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclasses.dataclass(frozen=True)
class LineMap:
    """Where a template's lines were: it is re-parsed as one quoted line, so columns stand for lines."""

    first: int  # the line of the template's first line in its file
    breaks: tuple[int, ...]  # the columns where its line breaks ended up

    def line_at(self, column: int) -> int:
        return self.first + bisect.bisect_left(self.breaks, column)


_PREFIX = "x = "  # the re-parsed template is the value of one attribute


def _parse_template(text: str, first_line: int, where: str, file: str | None) -> tuple[Tree, LineMap]:
    """A template's text as an expression tree, and where its lines were."""
    try:
        return _parse_template_text(text, first_line)
    except ConfigError as exc:
        raise ConfigError(f"{where}: on {file} {exc}" if file else f"{where}: {exc}") from None


@functools.lru_cache(maxsize=256)
def _parse_template_text(text: str, first_line: int) -> tuple[Tree, LineMap]:
    """Cached: a heredoc in a resource with for_each is parsed once, not once per instance. The files' parser
    reads it (tokens keep their columns), so no second grammar is loaded."""
    from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken

    from gateway.adapters.hcl.reading import parse_tree  # local: only templates need a re-parse

    source, breaks = _template_source(text)
    lines = LineMap(first_line, tuple(b + len(_PREFIX) + 1 for b in breaks))
    try:
        tree = parse_tree(f"{_PREFIX}{source}\n", keep=False)  # templatestring's text may hold a secret
    except LarkError as exc:
        column = getattr(exc, "column", 0) or 0
        line = lines.line_at(column)
        if isinstance(exc, UnexpectedToken) and column >= len(_PREFIX) + len(source):
            reason = "an interpolation or directive is not closed"  # the parser reached our closing quote
            line -= 1 if text.endswith("\n") else 0  # the text's last line, not the one after it
        elif isinstance(exc, (UnexpectedToken, UnexpectedCharacters)):
            found = str(exc.token if isinstance(exc, UnexpectedToken) else exc.char).split("\\n")[0].strip()
            reason = f"unexpected `{found}`"
        else:
            reason = str(exc).splitlines()[0]
        raise ConfigError(f"line {line}: invalid template syntax: {reason}") from None
    return next(tree.find_data("attribute")).children[-1], lines


def _template_source(text: str) -> tuple[str, tuple[int, ...]]:
    """Raw template text (a heredoc's body, a template file) as an HCL quoted template that means the same,
    and the offsets in it where the text's line breaks were."""
    out = ['"']
    size = 1
    breaks: list[int] = []
    for segment in _template_segments(text):
        breaks.extend([size - 1] * segment.lost_before)  # lines a `${~` took away still count
        if segment.code:
            breaks.extend(size + k for k, c in enumerate(segment.text) if c == "\n")
            pieces = [segment.text.replace("\n", " ")]  # expressions stay as written, on one line
        else:
            pieces = []
            j = 0
            while j < len(segment.text):
                if segment.text.startswith(("$${", "%%{"), j):
                    pieces.append(segment.text[j : j + 3])
                    j += 3
                    continue
                if segment.text[j] == "\n":
                    breaks.append(size + sum(len(p) for p in pieces))
                pieces.append(_QUOTED.get(segment.text[j], segment.text[j]))
                j += 1
        out.extend(pieces)
        size += sum(len(p) for p in pieces)
        breaks.extend([size] * segment.lost_after)
    out.append('"')
    return "".join(out), tuple(breaks)


@dataclasses.dataclass
class _Segment:
    code: bool  # an interpolation or directive, else literal text
    text: str
    lost_before: int = 0  # line breaks a strip marker removed before it
    lost_after: int = 0


def _template_segments(text: str) -> list[_Segment]:
    """Literal text and `${...}` / `%{...}` pieces, with the strip markers of interpolations (`${~ x ~}`, which
    python-hcl2's grammar lacks) applied here: the whitespace beside them is removed, the markers dropped."""
    segments: list[_Segment] = []
    i = literal_start = 0
    while i < len(text):
        if text.startswith(("$${", "%%{"), i):
            i += 3
        elif text.startswith(("${", "%{"), i):
            if literal_start < i:
                segments.append(_Segment(False, text[literal_start:i]))
            end = _closing_brace(text, i + 2)
            segments.append(_Segment(True, text[i : end + 1]))
            i = literal_start = end + 1
        else:
            i += 1
    if literal_start < len(text):
        segments.append(_Segment(False, text[literal_start:]))
    for n, segment in enumerate(segments):
        if not segment.code or not segment.text.startswith("${"):
            continue
        if segment.text.startswith("${~"):
            segment.text = "${" + segment.text[3:]
            if n > 0 and not segments[n - 1].code:
                before = segments[n - 1].text
                segments[n - 1].text = _strip_before(before)
                segment.lost_before = before[len(segments[n - 1].text):].count("\n")
        if segment.text.endswith("~}"):
            segment.text = segment.text[:-2] + "}"
            if n + 1 < len(segments) and not segments[n + 1].code:
                after = segments[n + 1].text
                segments[n + 1].text = _strip_after(after)
                segment.lost_after = after[: len(after) - len(segments[n + 1].text)].count("\n")
    return segments


def _closing_brace(text: str, i: int) -> int:
    """The index of the `}` closing an interpolation or directive that starts before `i`."""
    depth = 1
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text) - 1


def _apply_marked(func: Callable[..., Any], args: list[Any], ev: Evaluator, node: Tree | None = None) -> Any:
    """Call func on unmarked args; unknown in gives unknown out, sensitive in gives sensitive out."""
    plain, marks = zip(*(unmark(a) for a in args), strict=True) if args else ((), ())
    if any(contains_unknown(a) for a in plain):
        return UNKNOWN
    try:
        result = func(*plain)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # the library's message may quote its arguments; never quote a sensitive one
        raise ev.fail("an operation on a sensitive value failed" if any(marks) else str(exc) or type(exc).__name__,
                      max(marks, default=Mark.NONE), node) from None
    return marked(result, max(marks, default=Mark.NONE))


def _null_comparison(left: Any, right: Any) -> bool:
    """Whether one side of `==` / `!=` is null and the other's top level is known."""
    (a, _), (b, _) = unmark(left), unmark(right)
    return (a is None and b is not UNKNOWN) or (b is None and a is not UNKNOWN)


def _top_level(value: Any) -> Any:
    """A stand-in for a value that keeps only whether it is null, and its mark (nested unknowns dropped)."""
    plain, mark = unmark(value)
    return marked(None if plain is None else True, mark)


def _operand_number(value: Any, side: str) -> int | float:
    """An arithmetic operand, converted as Terraform converts (the string "5" is the number 5)."""
    if value is None:
        raise TypeError(f"Invalid operand: unsuitable value for {side}: a number is required, got null.")
    try:
        return to_number(value)
    except FunctionError as exc:
        raise TypeError(f"Invalid operand: unsuitable value for {side}: {exc.message}.") from None


def _operand_bool(value: Any, side: str) -> bool:
    try:
        if value is None:
            raise FunctionError("bool required, got null")
        return to_bool(value)
    except FunctionError as exc:
        raise TypeError(f"Invalid operand: unsuitable value for {side}: {exc.message}.") from None


def _arithmetic(op: Callable[[Decimal, Decimal], Decimal]) -> Callable[[Any, Any], int | float]:
    return lambda a, b: decimal_arithmetic(op, _operand_number(a, "left operand"), _operand_number(b, "right operand"))


def _divide(a: Any, b: Any) -> int | float:
    dividend, divisor = _operand_number(a, "left operand"), _operand_number(b, "right operand")
    if divisor == 0:  # as Terraform: 1 / 0 is +Inf, 0 / 0 an error
        if dividend == 0:
            raise ZeroDivisionError("Operation failed: can't divide zero by zero or infinity by infinity.")
        return math.copysign(math.inf, dividend)
    return decimal_arithmetic(Decimal.__truediv__, dividend, divisor)


def _modulo(a: Any, b: Any) -> int | float:
    dividend, divisor = _operand_number(a, "left operand"), _operand_number(b, "right operand")
    if divisor == 0:
        return dividend  # as Terraform: 5 % 0 is 5
    if isinstance(dividend, int) and isinstance(divisor, int):
        return abs(dividend) % abs(divisor) * (-1 if dividend < 0 else 1)  # the dividend's sign, as Go's
    return plain_number(math.fmod(dividend, divisor))


def _comparison(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    return lambda a, b: test(_operand_number(a, "left operand"), _operand_number(b, "right operand"))


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": _arithmetic(Decimal.__add__),
    "-": _arithmetic(Decimal.__sub__),
    "*": _arithmetic(Decimal.__mul__),
    "/": _divide,
    "%": _modulo,
    "==": same_value,
    "!=": lambda a, b: not same_value(a, b),
    "<": _comparison(operator.lt),
    ">": _comparison(operator.gt),
    "<=": _comparison(operator.le),
    ">=": _comparison(operator.ge),
    "&&": lambda a, b: all([_operand_bool(a, "left operand"), _operand_bool(b, "right operand")]),
    "||": lambda a, b: any([_operand_bool(a, "left operand"), _operand_bool(b, "right operand")]),
}
