"""Terraform's built-in functions, with its null, unknown and type rules, for the sandbox evaluator.

A function is a plain Python function registered with `@function`; its parameters' annotations say
what Terraform's parameter types say, and `call_function` applies Terraform's rules before the body
runs, so bodies see clean values:

- arity: too few or too many arguments is an error naming the function;
- null: an argument may not be null unless the function takes nulls (`null_ok`, or a `... | None` annotation);
- unknown: an argument known only after apply makes the result unknown; a `shallow` function (say
  `length`, `concat`, `keys`) also runs on known collections holding unknown elements, as Terraform's do;
- types: strings, numbers and bools convert into each other as Terraform converts them, anything
  else is `Invalid value for "str" parameter: string required`;
- marks: a sensitive argument makes the result sensitive (the strongest mark wins, see values.py),
  and an error decided by a masked argument never quotes it.

File functions read relative to the module's directory (`path.module` is ".") and refuse any path
that leaves the checkout the engine was given. `timestamp()`, `uuid()` and `bcrypt()` are unknown
until apply, as in Terraform (and `plantimestamp()`, unlike Terraform: see its comment).
"""

from __future__ import annotations

import base64
import codecs
import csv
import functools
import gzip
import hashlib
import inspect
import io
import ipaddress
import json
import math
import posixpath
import re
import secrets
import urllib.parse
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from gateway.adapters.sandbox.values import (
    UNKNOWN,
    Mark,
    Sensitive,
    contains_unknown,
    decimal_arithmetic,
    is_number,
    marked,
    number_text,
    plain_number,
    type_name,
    unmark,
)

Num = int | float  # Terraform's number

# Terraform 1.x's documented built-in functions (developer.hashicorp.com/terraform/language/functions),
# grouped as its documentation groups them. docs/SANDBOX_FUNCTIONS.md is checked against this list.
TERRAFORM_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "numeric": ("abs", "ceil", "floor", "log", "max", "min", "parseint", "pow", "signum"),
    "string": ("chomp", "endswith", "format", "formatlist", "indent", "join", "lower", "regex", "regexall",
               "replace", "split", "startswith", "strcontains", "strrev", "substr", "templatestring", "title",
               "trim", "trimprefix", "trimsuffix", "trimspace", "upper"),
    "collection": ("alltrue", "anytrue", "chunklist", "coalesce", "coalescelist", "compact", "concat", "contains",
                   "distinct", "element", "flatten", "index", "keys", "length", "lookup", "matchkeys", "merge",
                   "one", "range", "reverse", "setintersection", "setproduct", "setsubtract", "setunion", "slice",
                   "sort", "sum", "transpose", "values", "zipmap"),
    "encoding": ("base64decode", "base64encode", "base64gzip", "csvdecode", "jsondecode", "jsonencode",
                 "textdecodebase64", "textencodebase64", "urlencode", "yamldecode", "yamlencode"),
    "filesystem": ("abspath", "dirname", "pathexpand", "basename", "file", "fileexists", "fileset", "filebase64",
                   "templatefile"),
    "date and time": ("formatdate", "plantimestamp", "timeadd", "timecmp", "timestamp"),
    "hash and crypto": ("base64sha256", "base64sha512", "bcrypt", "filebase64sha256", "filebase64sha512", "filemd5",
                        "filesha1", "filesha256", "filesha512", "md5", "rsadecrypt", "sha1", "sha256", "sha512",
                        "uuid", "uuidv5"),
    "ip network": ("cidrhost", "cidrnetmask", "cidrsubnet", "cidrsubnets"),
    "type conversion": ("can", "ephemeralasnull", "issensitive", "nonsensitive", "sensitive", "tobool", "tolist",
                        "tomap", "tonumber", "toset", "tostring", "try", "type"),
}

# Not offered, and why (the documentation table shows these notes).
UNSUPPORTED: dict[str, str] = {
    "type": "Terraform offers it only in `terraform console`; configurations cannot call it either",
}

# Evaluated by the evaluator itself (they see expressions or marks, not values).
SPECIAL_FORMS = frozenset({"try", "can", "nonsensitive", "sensitive", "issensitive"})

VIRTUAL_ROOT = "/checkout"  # where abspath() says the checkout is: plans must not depend on where they ran
VIRTUAL_HOME = "/home/sandbox"  # what pathexpand() makes of `~`
MAX_RANGE = 1024  # Terraform refuses longer range() results


class FunctionError(Exception):
    """A call failed; `param` (0-based) names the argument at fault when one is."""

    def __init__(self, message: str, param: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class FunctionCallError(Exception):
    """A call failed, with Terraform's wording; `mark` says whether a masked argument decided it."""

    def __init__(self, message: str, mark: Mark = Mark.NONE):
        super().__init__(message)
        self.mark = mark


@dataclass(frozen=True)
class FileScope:
    """Where file functions read: relative paths start in `directory`; nothing outside `root` is read."""

    directory: Path
    root: Path
    root_label: str = "the repository checkout"  # what `root` is, for the refusal

    def virtual_directory(self) -> str:
        relative = self.directory.resolve().relative_to(self.root.resolve()).as_posix()
        return VIRTUAL_ROOT if relative == "." else f"{VIRTUAL_ROOT}/{relative}"

    def resolve(self, path: str) -> Path:
        """The real file `path` names, or a clear error when it leaves the checkout."""
        expanded = _expand_home(path)
        if posixpath.isabs(expanded):
            if not (expanded == VIRTUAL_ROOT or expanded.startswith(VIRTUAL_ROOT + "/")):
                raise self._outside(path)
            target = self.root / expanded[len(VIRTUAL_ROOT):].lstrip("/")
        else:
            target = self.directory / expanded
        root = self.root.resolve()
        real = target.resolve()
        if real != root and root not in real.parents:
            raise self._outside(path)
        return real

    def _outside(self, path: str) -> FunctionError:
        return FunctionError(f"{json.dumps(path)} is outside {self.root_label}; the sandbox reads only files "
                             "committed there", 0)


TemplateRenderer = Callable[[str, str, dict[str, Any]], Any]


@dataclass(frozen=True)
class CallContext:
    """What some functions need beyond their arguments."""

    files: FileScope | None = None
    applying: bool = False  # timestamp() and uuid() are known only while applying
    render: TemplateRenderer | None = None  # renders template text with variables (templatefile)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "string", "number", "bool", "list", "list(string)", "list(number)", "list(bool)", "map", "any"
    optional: bool = False
    nullable: bool = False  # annotated `... | None`: null reaches the body (lookup's default)


@dataclass(frozen=True)
class Function:
    name: str
    body: Callable[..., Any]
    params: tuple[Param, ...]
    variadic: Param | None
    shallow: bool  # known collections with unknown elements reach the body (length, concat, keys, ...)
    contextual: bool  # the body's first parameter is the CallContext
    until_apply: bool  # the result is unknown while planning (timestamp, uuid, bcrypt)


FUNCTIONS: dict[str, Function] = {}

_KINDS = {"str": "string", "Num": "number", "int": "number", "bool": "bool", "list": "list", "dict": "map",
          "Any": "any", "list[str]": "list(string)", "list[Num]": "list(number)", "list[bool]": "list(bool)",
          "list[list]": "list(list)", "list[dict]": "list(map)"}


def function(name: str | None = None, *, null_ok: bool = False, shallow: bool = False,
             until_apply: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a body as the Terraform function `name` (default: the body's name without `_`)."""

    def register(body: Callable[..., Any]) -> Callable[..., Any]:
        parameters = list(inspect.signature(body).parameters.values())
        contextual = bool(parameters) and parameters[0].annotation == "CallContext"
        params, variadic = [], None
        for p in parameters[1:] if contextual else parameters:
            annotation = str(p.annotation)
            param = Param(p.name.rstrip("_"), _KINDS[annotation.removesuffix(" | None")],
                          p.default is not inspect.Parameter.empty, null_ok or annotation.endswith(" | None"))
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                variadic = param
            else:
                params.append(param)
        fname = name or body.__name__.lstrip("_")
        FUNCTIONS[fname] = Function(fname, body, tuple(params), variadic, shallow, contextual, until_apply)
        return body

    return register


def call_function(name: str, args: list[Any], context: CallContext) -> Any:
    """Call Terraform function `name` on evaluated arguments, with Terraform's null, unknown and type rules."""
    fn = FUNCTIONS[name]
    plain_args, marks = zip(*(unmark(a) for a in args), strict=True) if args else ((), ())
    mark = max(marks, default=Mark.NONE)
    _check_arity(fn, len(args))
    unknown = False
    converted = []
    for i, value in enumerate(plain_args):
        param = _param(fn, i)
        if value is None and not param.nullable:
            raise _call_error(fn, FunctionError("argument must not be null", i), marks)
        if value is UNKNOWN or (not fn.shallow and contains_unknown(value)):
            unknown = True
            continue
        try:
            converted.append(value if value is None else _convert(value, param.kind))
        except FunctionError as exc:
            raise _call_error(fn, FunctionError(exc.message, i), marks) from None
    if unknown or (fn.until_apply and not context.applying):
        return UNKNOWN
    try:
        result = fn.body(context, *converted) if fn.contextual else fn.body(*converted)
    except FunctionError as exc:
        raise _call_error(fn, exc, marks) from None
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise _call_error(fn, FunctionError(str(exc) or type(exc).__name__), marks) from None
    return marked(plain_number(result) if isinstance(result, float) else result, mark)


def _check_arity(fn: Function, given: int) -> None:
    required = [p for p in fn.params if not p.optional]
    if given < len(required):
        missing = required[given].name
        raise FunctionCallError(f'Not enough function arguments: function "{fn.name}" expects at least '
                                f'{len(required)} argument(s). Missing value for "{missing}".')
    if fn.variadic is None and given > len(fn.params):
        raise FunctionCallError(f'Too many function arguments: function "{fn.name}" expects only '
                                f"{len(fn.params)} argument(s).")


def _param(fn: Function, index: int) -> Param:
    if index < len(fn.params):
        return fn.params[index]
    assert fn.variadic is not None  # _check_arity refused extra arguments already
    return fn.variadic


def _call_error(fn: Function, exc: FunctionError, marks: tuple[Mark, ...]) -> FunctionCallError:
    mark = max(marks, default=Mark.NONE)
    if exc.param is not None:
        param = _param(fn, exc.param)
        masked = marks[exc.param] if exc.param < len(marks) else mark
        detail = "the value is sensitive" if masked else exc.message
        return FunctionCallError(f'Invalid value for "{param.name}" parameter of {fn.name}(): {detail}.', mark)
    detail = "an argument is sensitive" if mark else exc.message
    return FunctionCallError(f'Call to function "{fn.name}" failed: {detail}.', mark)


# --- conversions, as Terraform converts between its types ---------------------------------------


def _convert(value: Any, kind: str) -> Any:
    if kind == "any":
        return value
    if kind == "string":
        return to_string(value)
    if kind == "number":
        return to_number(value)
    if kind == "bool":
        return to_bool(value)
    if kind == "map":
        if not isinstance(value, dict):
            raise FunctionError(f"map required, got {type_name(value)}")
        return value
    if not isinstance(value, list):
        raise FunctionError(f"{kind.replace('(', ' of ').rstrip(')')} required, got {type_name(value)}")
    element = kind[5:-1] if kind.startswith("list(") else "any"
    out = []
    for i, item in enumerate(value):
        try:
            out.append(item if item is None or item is UNKNOWN else _convert(item, element))
        except FunctionError as exc:
            raise FunctionError(f"element {i}: {exc.message}") from None
    return out


def to_string(value: Any) -> str:
    """A primitive as a string (numbers and bools convert, as in Terraform)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if is_number(value):
        return number_text(value)
    raise FunctionError(f"string required, got {type_name(value)}")


def to_number(value: Any) -> int | float:
    if is_number(value):
        return value
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise FunctionError(f"cannot convert {json.dumps(value)} to number; given string must be a decimal "
                                "representation of a number")
        return int(value) if value.lstrip("+-").isdigit() else plain_number(float(value))
    raise FunctionError(f"number required, got {type_name(value)}")


_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    if isinstance(value, str):
        raise FunctionError(f'cannot convert {json.dumps(value)} to bool; only the strings "true" or "false" '
                            "are allowed")
    raise FunctionError(f"bool required, got {type_name(value)}")


def _whole(value: int | float, what: str = "number") -> int:
    if isinstance(value, float) and not value.is_integer():
        raise FunctionError(f"{what} must be a whole number, got {number_text(value)}")
    return int(value)


def set_of(items: Iterable[Any]) -> list[Any]:
    """A set as the sandbox keeps one: distinct elements in Terraform's order (strings sorted, numbers ascending)."""
    unique = {json.dumps(item, sort_keys=True): item for item in items}
    return sorted(unique.values(), key=_set_order)


def _set_order(item: Any) -> tuple:
    if is_number(item):
        return (0, item, "")
    if isinstance(item, str):
        return (1, 0, item)
    return (2, 0, json.dumps(item, sort_keys=True))


# --- numeric -----------------------------------------------------------------------------------


@function()
def _abs(num: Num) -> Num:
    return abs(num)


@function()
def _ceil(num: Num) -> Num:
    return math.ceil(num) if math.isfinite(num) else num


@function()
def _floor(num: Num) -> Num:
    return math.floor(num) if math.isfinite(num) else num


@function()
def _log(num: Num, base: Num) -> Num:
    return math.log(num, base)


@function("max")
def _maximum(*numbers: Num) -> Num:
    if not numbers:
        raise FunctionError("must pass at least one number")
    return max(numbers)


@function("min")
def _minimum(*numbers: Num) -> Num:
    if not numbers:
        raise FunctionError("must pass at least one number")
    return min(numbers)


def _digit(c: str, base: int) -> int:
    """A digit's value: letters are case-insensitive up to base 36, above it `a`-`z` are 10-35 and `A`-`Z` 36-61."""
    if c.isascii() and c.isdigit():
        return int(c)
    if "a" <= c <= "z":
        return ord(c) - ord("a") + 10
    if "A" <= c <= "Z":
        return ord(c) - ord("A") + (10 if base <= 36 else 36)
    return base  # never a digit


@function()
def _parseint(number: str, base: Num) -> int:
    base = _whole(base, "base")
    if not 2 <= base <= 62:
        raise FunctionError("base must be a whole number between 2 and 62 inclusive", 1)
    text = number[1:] if number[:1] in "+-" else number
    digits = [_digit(c, base) for c in text]
    if not digits or any(d >= base for d in digits):
        raise FunctionError(f"cannot parse {json.dumps(number)} as a base {base} integer", 0)
    value = functools.reduce(lambda acc, d: acc * base + d, digits, 0)
    return -value if number.startswith("-") else value


@function("pow")
def _power(num: Num, power: Num) -> Num:
    return num ** power


@function()
def _signum(num: Num) -> int:
    whole = _whole(num)
    return (whole > 0) - (whole < 0)


# --- string ------------------------------------------------------------------------------------


@function()
def _chomp(str_: str) -> str:
    return re.sub(r"(?:\r\n|\n|\r)+\Z", "", str_)


@function()
def _endswith(str_: str, suffix: str) -> bool:
    return str_.endswith(suffix)


@function()
def _startswith(str_: str, prefix: str) -> bool:
    return str_.startswith(prefix)


@function()
def _strcontains(str_: str, substr: str) -> bool:
    return substr in str_


_VERB = re.compile(r"%(?:\[(\d+)\])?([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


@function()
def _format(format_: str, *args: Any | None) -> str:
    return format_string(format_, list(args))


def format_string(spec: str, args: list[Any]) -> str:
    """Terraform's format(): Go-style verbs (%s %d %v %q %t %f %e %g %b %o %x %X, widths, `%[n]`)."""
    out: list[str] = []
    position = 0
    used: set[int] = set()
    pos = 0
    for match in _VERB.finditer(spec):
        out.append(spec[pos:match.start()])
        pos = match.end()
        index, flags, width, precision, verb = match.groups()
        if verb == "%":
            out.append("%")
            continue
        if index is not None:
            position = int(index) - 1
        if position >= len(args):
            raise FunctionError(f'not enough arguments for "{match.group(0)}" at {match.start()}: need index '
                                f"{position + 1} but have {len(args)} total")
        used.add(position)
        out.append(_pad(_format_verb(verb, args[position], precision, match), flags, width))
        position += 1
    out.append(spec[pos:])
    if args and len(used) < len(args) and max(used, default=-1) < len(args) - 1:
        raise FunctionError(f"too many arguments; only {len(used)} used by format string")
    return "".join(out)


def _format_verb(verb: str, value: Any, precision: str | None, match: re.Match[str]) -> str:
    where = f'"{match.group(0)}" at {match.start()}'
    if value is None:
        raise FunctionError(f"unsupported value for {where}: null value cannot be formatted")
    try:
        if verb == "v":
            if is_number(value):
                return _shortest_g(float(value), "g")
            return to_string(value) if not isinstance(value, (list, dict)) else json.dumps(value, separators=(",", ":"))
        if verb == "s":
            text = to_string(value)
            return text[: int(precision)] if precision else text
        if verb == "q":
            return json.dumps(to_string(value), ensure_ascii=False)
        if verb == "t":
            return "true" if to_bool(value) else "false"
        number = to_number(value)
        if verb in "dbboxX":
            whole = _whole(number)
            return {"d": str(whole), "b": format(whole, "b"), "o": format(whole, "o"),
                    "x": format(whole, "x"), "X": format(whole, "X")}[verb]
        if verb in "feEgG":
            if precision is None and verb in "gG":
                return _shortest_g(float(number), verb)
            return format(float(number), f".{precision or 6}{verb}")
    except FunctionError as exc:
        raise FunctionError(f"unsupported value for {where}: {exc.message}") from None
    raise FunctionError(f"unrecognized format character {verb!r} at {match.start()}")


def _shortest_g(number: float, verb: str) -> str:
    """Go's %g (and %v of a number) without a precision: the shortest digits, in exponent form below 1e-4 or from
    1e6 on (`1.234567e+06`)."""
    digits = repr(abs(number)).replace(".", "").lstrip("0").split("e")[0].rstrip("0") or "0"
    exponent = math.floor(math.log10(abs(number))) if number else 0
    if exponent < -4 or exponent >= 6:
        return format(number, f".{max(len(digits) - 1, 0)}{'e' if verb == 'g' else 'E'}")
    return number_text(plain_number(number))


def _pad(text: str, flags: str, width: str | None) -> str:
    if not width:
        return text
    if "-" in flags:
        return text.ljust(int(width))
    if "0" in flags and text.lstrip("-").replace(".", "", 1).isdigit():
        sign = "-" if text.startswith("-") else ""
        return sign + text.lstrip("-").rjust(int(width) - len(sign), "0")
    return text.rjust(int(width))


@function()
def _formatlist(format_: str, *args: Any | None) -> list[str]:
    lengths = {len(a) for a in args if isinstance(a, list)}
    if len(lengths) > 1:
        raise FunctionError("all arguments that are lists must have the same length")
    if not lengths:
        return [format_string(format_, list(args))]
    n = lengths.pop()
    return [format_string(format_, [a[i] if isinstance(a, list) else a for a in args]) for i in range(n)]


@function()
def _indent(spaces: Num, str_: str) -> str:
    pad = " " * _whole(spaces)
    return str_.replace("\n", "\n" + pad)


@function()
def _join(separator: str, *lists: list[str]) -> str:
    if not lists:
        raise FunctionError("at least one list is required")
    items = [item for lst in lists for item in lst]
    for i, item in enumerate(items):
        if item is None:
            raise FunctionError(f"element {i} is null; cannot concatenate null values")
    return separator.join(items)


@function()
def _lower(str_: str) -> str:
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in str_)  # one letter for one, as Go maps


@function()
def _upper(str_: str) -> str:
    return "".join(c.upper() if len(c.upper()) == 1 else c for c in str_)  # "ß" stays "ß", as in Terraform


def _compile(pattern: str, param: int = 1) -> re.Pattern[str]:
    try:
        return re.compile(pattern.replace("\\z", "\\Z"))  # RE2's end of text
    except re.error as exc:
        raise FunctionError(f"invalid regular expression pattern: {exc}", param) from None


def _match_value(match: re.Match[str]) -> Any:
    if match.re.groupindex:  # a group that did not take part is null, as in Terraform
        return {name: match.group(name) for name in match.re.groupindex}
    if match.re.groups:
        return list(match.groups())
    return match.group(0)


@function()
def _regex(pattern: str, string: str) -> Any:
    match = _compile(pattern, 0).search(string)
    if match is None:
        raise FunctionError("pattern did not match any part of the given string")
    return _match_value(match)


@function()
def _regexall(pattern: str, string: str) -> list[Any]:
    return [_match_value(m) for m in _compile(pattern, 0).finditer(string)]


@function()
def _replace(str_: str, substr: str, replace: str) -> str:
    if len(substr) > 1 and substr.startswith("/") and substr.endswith("/"):
        pattern = _compile(substr[1:-1])
        return pattern.sub(lambda m: _expand(replace, m), str_)
    return str_.replace(substr, replace)


_REFERENCE = re.compile(r"\$(?:\{(\w+)\}|(\w+)|\$)")


def _expand(template: str, match: re.Match[str]) -> str:
    """Go's regexp Expand: `$1`, `${1}`, `$name`, `$$`."""
    def one(ref: re.Match[str]) -> str:
        name = ref.group(1) or ref.group(2)
        if name is None:
            return "$"
        try:
            return match.group(int(name) if name.isdigit() else name) or ""
        except IndexError:  # Go expands a group that does not exist to nothing
            return ""

    return _REFERENCE.sub(one, template)


@function()
def _split(separator: str, str_: str) -> list[str]:
    return str_.split(separator) if separator else list(str_)


@function()
def _strrev(str_: str) -> str:
    return str_[::-1]


@function()
def _substr(str_: str, offset: Num, length: Num) -> str:
    offset, length = _whole(offset), _whole(length)
    if offset < 0:
        offset = max(len(str_) + offset, 0)
    if offset > len(str_):
        return ""
    return str_[offset:] if length < 0 else str_[offset:offset + length]


@function()
def _templatestring(context: CallContext, template: str, vars_: dict) -> Any:
    return _render(context, template, "templatestring", vars_)


def _render(context: CallContext, text: str, where: str, variables: dict) -> Any:
    if context.render is None:
        raise FunctionError("templates cannot be rendered here")
    for name in variables:
        if not re.fullmatch(r"[A-Za-z_][\w-]*", name):
            raise FunctionError(f"invalid template variable name {json.dumps(name)}: must start with a letter, "
                                "followed by zero or more letters, digits, and underscores", 1)
    return context.render(text, where, variables)


@function()
def _title(str_: str) -> str:
    return re.sub(r"(?:^|(?<=[^\w]))(\w)", lambda m: m.group(1).upper(), str_)


@function()
def _trim(str_: str, cutset: str) -> str:
    return str_.strip(cutset)


@function()
def _trimprefix(str_: str, prefix: str) -> str:
    return str_.removeprefix(prefix)


@function()
def _trimsuffix(str_: str, suffix: str) -> str:
    return str_.removesuffix(suffix)


@function()
def _trimspace(str_: str) -> str:
    return str_.strip()


# --- collection --------------------------------------------------------------------------------


@function()
def _alltrue(list_: list[bool]) -> bool:
    _no_null_elements(list_)
    return all(list_)


@function()
def _anytrue(list_: list[bool]) -> bool:
    _no_null_elements(list_)
    return any(list_)


def _no_null_elements(items: list[Any], param: int = 0) -> None:
    for i, item in enumerate(items):
        if item is None:
            raise FunctionError(f"element {i} is null", param)


@function(shallow=True)
def _chunklist(list_: list, size: Num) -> list[list]:
    size = _whole(size)
    if size < 0:
        raise FunctionError("the size argument must be positive", 1)
    if size == 0:
        return [list_]
    return [list_[i:i + size] for i in range(0, len(list_), size)]


@function(null_ok=True)
def _coalesce(*vals: Any) -> Any:
    for value in vals:
        if value is not None and value != "":
            return value
    raise FunctionError("no non-null, non-empty-string arguments")


@function(null_ok=True, shallow=True)
def _coalescelist(*vals: Any) -> list:
    for i, value in enumerate(vals):
        if value is not None and not isinstance(value, list):
            raise FunctionError(f"list required, got {type_name(value)}", i)
        if value:
            return value
    raise FunctionError("no non-null arguments")


@function()
def _compact(list_: list[str]) -> list[str]:
    return [item for item in list_ if item not in (None, "")]


@function(shallow=True)
def _concat(*seqs: list) -> list:
    return [item for seq in seqs for item in seq]


@function()
def _contains(list_: list, value: Any | None) -> bool:
    return any(same_value(item, value) for item in list_)


def same_value(a: Any, b: Any) -> bool:
    """Terraform's equality: values of different types are never equal (`1` is not `true`, `"1"` is not `1`)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


@function()
def _distinct(list_: list) -> list:
    first: dict[str, Any] = {}
    for item in unify(list_):
        first.setdefault(json.dumps(item, sort_keys=True), item)
    return list(first.values())


@function(shallow=True)
def _element(list_: list, index: Num) -> Any:
    index = _whole(index, "index")
    if not list_:
        raise FunctionError("cannot use element function with an empty list")
    if index < 0:
        raise FunctionError("cannot use element function with a negative index")
    return list_[index % len(list_)]


@function()
def _flatten(list_: list) -> list:
    out: list = []
    for item in list_:
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


@function()
def _index(list_: list, value: Any) -> int:
    for i, item in enumerate(list_):
        if same_value(item, value):
            return i
    raise FunctionError("item not found")


@function(shallow=True)
def _keys(inputmap: dict) -> list[str]:
    return sorted(inputmap)


@function(shallow=True)
def _values(mapping: dict) -> list:
    return [mapping[k] for k in sorted(mapping)]


@function(shallow=True)
def _length(value: Any) -> int:
    if isinstance(value, (str, list, dict)):
        return len(value)
    raise FunctionError(f"argument must be a string, a collection type, or a structural type, "
                        f"got {type_name(value)}", 0)


@function(shallow=True)
def _lookup(inputmap: dict, key: str, *default: Any | None) -> Any:
    if len(default) > 1:
        raise FunctionError("lookup() takes at most three arguments")
    if key in inputmap:
        return inputmap[key]
    if default:
        return default[0]
    raise FunctionError(f"lookup failed to find key {json.dumps(key)}")


@function()
def _matchkeys(values: list, keys: list, searchset: list) -> list:
    if len(values) != len(keys):
        raise FunctionError("length of keys and values should be equal")
    return [v for v, k in zip(values, keys, strict=True) if k in searchset]


@function(null_ok=True, shallow=True)
def _merge(*maps: Any) -> dict:
    out: dict = {}
    for i, mapping in enumerate(maps):
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise FunctionError(f"map or object required, got {type_name(mapping)}", i)
        out.update(mapping)
    return out


@function(shallow=True)
def _one(list_: list) -> Any:
    if len(list_) > 1:
        raise FunctionError("must be a list, set, or tuple value with either zero or one elements", 0)
    return list_[0] if list_ else None


@function("range")
def _range(*params: Num) -> list[Num]:
    if not 1 <= len(params) <= 3:
        raise FunctionError("must have one, two, or three arguments")
    start: Num
    limit: Num
    step: Num
    start, limit, step = (0, params[0], 1) if len(params) == 1 else (params[0], params[1], 1)
    if len(params) == 2 and limit < start:
        step = -1
    if len(params) == 3:
        step = params[2]
        if step == 0:
            raise FunctionError("step must not be zero", 2)
        if (step > 0 and limit < start) or (step < 0 and limit > start):
            raise FunctionError("step must point from start toward limit" if step > 0 else
                                "step must be negative for a decreasing range", 2)
    out: list[Num] = []
    value = start
    while (value < limit) if step > 0 else (value > limit):
        if len(out) >= MAX_RANGE:
            raise FunctionError(f"more than {MAX_RANGE} values were generated; either decrease the difference "
                                "between start and end or use a smaller step")
        out.append(value)
        value = value + step
    return out


@function(shallow=True)
def _reverse(list_: list) -> list:
    return list_[::-1]


def _unify_sets(sets: tuple[list, ...]) -> list[list]:
    """Sets of one element type: a number in one and strings in another make all strings, as in Terraform."""
    flat = unify([item for s in sets for item in s])
    out, start = [], 0
    for s in sets:
        out.append(flat[start:start + len(s)])
        start += len(s)
    return out


@function()
def _setintersection(first_set: list, *other_sets: list) -> list:
    first, *others = _unify_sets((first_set, *other_sets))
    keys = set.intersection({json.dumps(x, sort_keys=True) for x in first},
                            *({json.dumps(x, sort_keys=True) for x in s} for s in others))
    return set_of(json.loads(k) for k in keys)


@function()
def _setproduct(*sets: list) -> list:
    if not sets:
        raise FunctionError("at least one argument is required")
    product: list[list] = [[]]
    for s in sets:
        product = [combo + [item] for combo in product for item in s]
    return product


@function()
def _setsubtract(a: list, b: list) -> list:
    a, b = _unify_sets((a, b))
    remove = {json.dumps(x, sort_keys=True) for x in b}
    return set_of(x for x in a if json.dumps(x, sort_keys=True) not in remove)


@function()
def _setunion(first_set: list, *other_sets: list) -> list:
    return set_of(unify([*first_set, *(x for s in other_sets for x in s)]))


@function(shallow=True)
def _slice(list_: list, start_index: Num, end_index: Num) -> list:
    start, end = _whole(start_index), _whole(end_index)
    if start < 0 or start > len(list_):
        raise FunctionError("start index must not be greater than the length of the list" if start >= 0
                            else "start index must not be negative", 1)
    if end < start or end > len(list_):
        raise FunctionError("end index must not be less than start index" if end < start
                            else "end index must not be greater than the length of the list", 2)
    return list_[start:end]


@function()
def _sort(list_: list[str]) -> list[str]:
    _no_null_elements(list_)
    return sorted(list_)


@function("sum")
def _sum(list_: list[Num]) -> Num:
    if not list_:
        raise FunctionError("cannot sum an empty list", 0)
    _no_null_elements(list_)
    return functools.reduce(lambda a, b: decimal_arithmetic(Decimal.__add__, a, b), list_)


@function()
def _transpose(values: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in sorted(values):
        items = _convert(values[key], "list(string)")
        for item in items:
            out.setdefault(item, []).append(key)
    return {k: sorted(v) for k, v in sorted(out.items())}


@function()
def _zipmap(keyslist: list[str], valueslist: list) -> dict:
    if len(keyslist) != len(valueslist):
        raise FunctionError(f"number of keys ({len(keyslist)}) does not match number of values "
                            f"({len(valueslist)})")
    return dict(zip(keyslist, valueslist, strict=True))


# --- encoding ----------------------------------------------------------------------------------


@function()
def _base64decode(str_: str) -> str:
    try:
        data = base64.b64decode(str_, validate=True)
    except ValueError:
        raise FunctionError("failed to decode base64 data", 0) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FunctionError("the result of decoding the provided string is not valid UTF-8", 0) from None


@function()
def _base64encode(str_: str) -> str:
    return base64.b64encode(str_.encode()).decode()


@function()
def _base64gzip(str_: str) -> str:
    data = bytearray(gzip.compress(str_.encode(), mtime=0))
    data[8:10] = b"\x00\xff"  # the header's flags and OS byte as Go writes them (the deflate body may differ)
    return base64.b64encode(bytes(data)).decode()


@function()
def _csvdecode(str_: str) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(str_)))
    if not rows:
        raise FunctionError("missing header line", 0)
    header, *body = rows
    for n, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise FunctionError(f"line {n}: wrong number of fields", 0)
    return [dict(zip(header, row, strict=True)) for row in body]


@function()
def _jsondecode(str_: str) -> Any:
    try:
        return json.loads(str_, parse_float=_json_number, parse_int=int)
    except json.JSONDecodeError as exc:
        raise FunctionError(f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", 0) from None


def _json_number(text: str) -> int | float:
    number = float(text)
    return int(number) if number.is_integer() and abs(number) < 2 ** 53 else number


@function(null_ok=True)
def _jsonencode(val: Any) -> str:
    return json.dumps(_plain_numbers(val), separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c") \
        .replace(">", "\\u003e").replace("&", "\\u0026")


def _plain_numbers(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        raise FunctionError("cannot serialize infinity as JSON")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in sorted(value.items())}
    return value


@function()
def _textencodebase64(string: str, encoding_name: str) -> str:
    return base64.b64encode(string.encode(_codec(encoding_name))).decode()


@function()
def _textdecodebase64(source: str, encoding_name: str) -> str:
    try:
        return base64.b64decode(source, validate=True).decode(_codec(encoding_name))
    except ValueError:
        raise FunctionError(f"the given value has an invalid base64 symbol or cannot be decoded as "
                            f"{encoding_name}", 0) from None


def _codec(name: str) -> str:
    try:
        return codecs.lookup(name).name
    except LookupError:
        raise FunctionError(f"{json.dumps(name)} is not a supported IANA encoding name or alias", 1) from None


@function()
def _urlencode(str_: str) -> str:
    return urllib.parse.quote_plus(str_, safe="-_.~")


@function()
def _yamldecode(src: str) -> Any:
    try:
        documents = list(yaml.safe_load_all(src))
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise FunctionError(f"on line {line}, {exc.problem or 'invalid YAML'}", 0) from None
    except yaml.YAMLError:
        raise FunctionError("invalid YAML", 0) from None
    if len(documents) > 1:
        raise FunctionError("the given YAML has more than one document", 0)
    return _yaml_plain(documents[0] if documents else None)


def _yaml_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {to_string(k) if not isinstance(k, str) else k: _yaml_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_yaml_plain(v) for v in value]
    if isinstance(value, (datetime,)):
        return value.isoformat().replace("+00:00", "Z")
    if value is not None and not isinstance(value, (str, int, float, bool)):
        return str(value)
    return value


@function(null_ok=True)
def _yamlencode(value: Any) -> str:
    text = "".join(line + "\n" for line in _yaml_lines(value, 0))
    if value is None or isinstance(value, bool) or is_number(value):
        text += "...\n"  # a plain scalar alone is a whole document: go-yaml marks its end
    return text


def _yaml_lines(value: Any, indent: int) -> Iterable[str]:
    """Block-style YAML lines, keys sorted and strings double-quoted (or `|` blocks), as Terraform writes them."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        for key, item in sorted(value.items()):  # Terraform's objects and maps are ordered by key
            head = f"{pad}{json.dumps(key, ensure_ascii=False)}:"
            if isinstance(item, (dict, list)) and item:
                yield head
                yield from _yaml_lines(item, indent + (2 if isinstance(item, dict) else 0))
            else:
                first, *rest = _yaml_inline(item, indent)
                yield f"{head} {first}"
                yield from rest
    elif isinstance(value, list) and value:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                first, *rest = _yaml_lines(item, 0)
                rest = [f"{pad}  {line}" if line else "" for line in rest]
            else:
                first, *rest = _yaml_inline(item, indent)  # a block's lines come indented already
            yield f"{pad}- {first}"
            yield from rest
    else:
        first, *rest = _yaml_inline(value, indent)
        yield pad + first
        yield from rest


def _yaml_inline(value: Any, indent: int) -> list[str]:
    """A scalar (or empty collection) as the lines it takes: one, or a `|` block's header and lines."""
    if isinstance(value, dict):
        return ["{}"]
    if isinstance(value, list):
        return ["[]"]
    if value is None:
        return ["null"]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if is_number(value):
        return [number_text(value)]
    lines = value.split("\n")
    if len(lines) == 1 or any(line != line.rstrip(" \t") for line in lines) or "\r" in value:
        return [json.dumps(value, ensure_ascii=False)]
    chomp = "-" if not value.endswith("\n") else ("+" if value.endswith("\n\n") else "")
    if value.endswith("\n"):
        lines = lines[:-1]
    header = "|" + ("2" if value.startswith(" ") else "") + chomp
    pad = " " * (indent + 2)
    return [header, *(pad + line if line else "" for line in lines)]


# --- filesystem --------------------------------------------------------------------------------


def _expand_home(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return VIRTUAL_HOME + path[1:]
    return path


def _files(context: CallContext) -> FileScope:
    if context.files is None:
        raise FunctionError("files cannot be read here (only in a stack's expressions)")
    return context.files


@function()
def _abspath(context: CallContext, path: str) -> str:
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    base = context.files.virtual_directory() if context.files else VIRTUAL_ROOT
    return posixpath.normpath(posixpath.join(base, path))


@function()
def _basename(path: str) -> str:
    stripped = path.rstrip("/")
    return posixpath.basename(stripped) if stripped else ("/" if path else ".")


@function()
def _dirname(path: str) -> str:
    if not path:
        return "."
    head = posixpath.dirname(path.rstrip("/") or "/")
    return posixpath.normpath(head) if head else "."


@function()
def _pathexpand(path: str) -> str:
    return _expand_home(path)


def _read_bytes(context: CallContext, path: str) -> bytes:
    target = _files(context).resolve(path)
    if not target.is_file():
        raise FunctionError(f"no file exists at {json.dumps(path)}; this function works only with files that are "
                            "distributed as part of the configuration source code", 0)
    return target.read_bytes()


def _read_text(context: CallContext, path: str) -> str:
    try:
        return _read_bytes(context, path).decode("utf-8")
    except UnicodeDecodeError:
        raise FunctionError(f"contents of {json.dumps(path)} are not valid UTF-8; use the filebase64 function to "
                            "obtain the Base64 encoded contents or the other file functions (e.g. filemd5, "
                            "filesha256) to obtain file hashing results instead", 0) from None


@function("file")
def _file(context: CallContext, path: str) -> str:
    return _read_text(context, path)


@function()
def _fileexists(context: CallContext, path: str) -> bool:
    target = _files(context).resolve(path)
    if target.exists() and not target.is_file():
        raise FunctionError(f"{json.dumps(path)} is not a regular file, but a directory", 0)
    return target.is_file()


@function()
def _filebase64(context: CallContext, path: str) -> str:
    return base64.b64encode(_read_bytes(context, path)).decode()


@function()
def _fileset(context: CallContext, path: str, pattern: str) -> list[str]:
    base = _files(context).resolve(path)
    regex = _glob_regex(pattern)
    if not base.is_dir():
        return []
    found = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(f for f in found if regex.fullmatch(f))


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """fileset()'s patterns: `*`, `**` (any depth), `?`, `[class]`, `{a,b}`."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise FunctionError("invalid pattern: unclosed [", 1)
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end
        elif c == "{":
            end = pattern.find("}", i)
            if end < 0:
                raise FunctionError("invalid pattern: unclosed {", 1)
            out.append("(?:" + "|".join(re.escape(a) for a in pattern[i + 1:end].split(",")) + ")")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


@function()
def _templatefile(context: CallContext, path: str, vars_: dict) -> Any:
    text = _read_text(context, path)
    return _render(context, text, path, vars_)


# --- date and time -----------------------------------------------------------------------------


def _parse_timestamp(text: str, param: int = 0) -> datetime:
    match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", text)
    if not match:
        raise FunctionError(f"not a valid RFC3339 timestamp: {json.dumps(text)}", param)
    zone = match.group(8).upper()
    try:
        return datetime.fromisoformat(text[:19].replace("t", "T") + (match.group(7) or "")[:7]
                                      + ("+00:00" if zone == "Z" else zone))
    except ValueError as exc:
        raise FunctionError(f"not a valid RFC3339 timestamp: {exc}", param) from None


def _rfc3339(moment: datetime) -> str:
    text = moment.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


_DATE_TOKEN = re.compile(r"'(?:[^']|'')*'|([A-Za-z])\1*|[^A-Za-z']+")


@function()
def _formatdate(spec: str, timestamp: str) -> str:
    moment = _parse_timestamp(timestamp, 1)
    out = []
    for match in _DATE_TOKEN.finditer(spec):
        token = match.group(0)
        if token.startswith("'"):
            out.append(token[1:-1].replace("''", "'") if token != "''" else "'")
        elif token[0].isalpha():
            out.append(_date_field(token, moment))
        else:
            out.append(token)
    if "".join(m.group(0) for m in _DATE_TOKEN.finditer(spec)) != spec:
        raise FunctionError("unterminated literal '", 0)
    return "".join(out)


def _date_field(token: str, moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    hh, mm = divmod(abs(minutes), 60)
    hour12 = moment.hour % 12 or 12
    fields = {
        "YYYY": f"{moment.year:04d}", "YY": f"{moment.year % 100:02d}",
        "MMMM": moment.strftime("%B"), "MMM": moment.strftime("%b"), "MM": f"{moment.month:02d}",
        "M": str(moment.month), "DD": f"{moment.day:02d}", "D": str(moment.day),
        "EEEE": moment.strftime("%A"), "EEE": moment.strftime("%a"),
        "hh": f"{moment.hour:02d}", "h": str(moment.hour), "HH": f"{hour12:02d}", "H": str(hour12),
        "AA": "AM" if moment.hour < 12 else "PM", "aa": "am" if moment.hour < 12 else "pm",
        "mm": f"{moment.minute:02d}", "m": str(moment.minute), "ss": f"{moment.second:02d}", "s": str(moment.second),
        "ZZZZZ": f"{sign}{hh:02d}:{mm:02d}", "ZZZZ": f"{sign}{hh:02d}{mm:02d}",
        "ZZZ": "UTC" if minutes == 0 else f"{sign}{hh:02d}{mm:02d}",
        "Z": "Z" if minutes == 0 else f"{sign}{hh:02d}:{mm:02d}",
    }
    if token not in fields:
        raise FunctionError(f"invalid date format verb {json.dumps(token)}", 0)
    return fields[token]


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _parse_duration(text: str) -> timedelta:
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    if body == "0":
        return timedelta(0)
    parts = list(_DURATION_PART.finditer(body))
    if not parts or "".join(p.group(0) for p in parts) != body:
        raise FunctionError(f"time: invalid duration {json.dumps(text)}", 1)
    return timedelta(seconds=sign * sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts))


@function()
def _timeadd(timestamp: str, duration: str) -> str:
    return _rfc3339(_parse_timestamp(timestamp) + _parse_duration(duration))


@function()
def _timecmp(timestamp_a: str, timestamp_b: str) -> int:
    a, b = _parse_timestamp(timestamp_a, 0), _parse_timestamp(timestamp_b, 1)
    return (a > b) - (a < b)


@function(until_apply=True)
def _timestamp(context: CallContext) -> str:
    return _rfc3339(context.now().astimezone(timezone.utc).replace(microsecond=0))


@function(until_apply=True)
def _plantimestamp(context: CallContext) -> str:
    # Terraform knows it while planning and applies with the plan's time; the sandbox's plan document carries
    # no time (a re-plan of one commit must give the same digest), so it is known after apply, as timestamp()
    return _rfc3339(context.now().astimezone(timezone.utc).replace(microsecond=0))


# --- hash and crypto ---------------------------------------------------------------------------


@function()
def _md5(str_: str) -> str:
    return hashlib.md5(str_.encode(), usedforsecurity=False).hexdigest()


@function()
def _sha1(str_: str) -> str:
    return hashlib.sha1(str_.encode(), usedforsecurity=False).hexdigest()


@function()
def _sha256(str_: str) -> str:
    return hashlib.sha256(str_.encode()).hexdigest()


@function()
def _sha512(str_: str) -> str:
    return hashlib.sha512(str_.encode()).hexdigest()


@function()
def _base64sha256(str_: str) -> str:
    return base64.b64encode(hashlib.sha256(str_.encode()).digest()).decode()


@function()
def _base64sha512(str_: str) -> str:
    return base64.b64encode(hashlib.sha512(str_.encode()).digest()).decode()


@function()
def _filemd5(context: CallContext, path: str) -> str:
    return hashlib.md5(_read_bytes(context, path), usedforsecurity=False).hexdigest()


@function()
def _filesha1(context: CallContext, path: str) -> str:
    return hashlib.sha1(_read_bytes(context, path), usedforsecurity=False).hexdigest()


@function()
def _filesha256(context: CallContext, path: str) -> str:
    return hashlib.sha256(_read_bytes(context, path)).hexdigest()


@function()
def _filesha512(context: CallContext, path: str) -> str:
    return hashlib.sha512(_read_bytes(context, path)).hexdigest()


@function()
def _filebase64sha256(context: CallContext, path: str) -> str:
    return base64.b64encode(hashlib.sha256(_read_bytes(context, path)).digest()).decode()


@function()
def _filebase64sha512(context: CallContext, path: str) -> str:
    return base64.b64encode(hashlib.sha512(_read_bytes(context, path)).digest()).decode()


@function(until_apply=True)
def _bcrypt(context: CallContext, str_: str, *cost: Num) -> str:
    # a new salt every run: Terraform's value changes on every plan; the sandbox shows it as known after apply
    # and writes a random placeholder of bcrypt's shape (nothing of the password: the simulated cloud checks none)
    rounds = _whole(cost[0]) if cost else 10
    if not 4 <= rounds <= 31:
        raise FunctionError("cost must be between 4 and 31", 1)
    return f"$2a${rounds:02d}${base64.b64encode(secrets.token_bytes(40)).decode()[:53]}"


@function()
def _rsadecrypt(ciphertext: str, privatekey: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(privatekey.encode(), password=None)
    except (ValueError, TypeError):
        raise FunctionError("invalid private key: not an unencrypted PEM RSA key", 1) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise FunctionError("invalid private key: not an RSA key", 1)
    try:
        data = base64.b64decode(ciphertext, validate=True)
    except ValueError:
        raise FunctionError("failed to decode input: not valid base64", 0) from None
    try:
        return key.decrypt(data, padding.PKCS1v15()).decode()
    except ValueError:
        raise FunctionError("failed to decrypt: the ciphertext does not match the key", 0) from None


@function(until_apply=True)
def _uuid(context: CallContext) -> str:
    return str(uuidlib.uuid4())


_UUID_NAMESPACES = {"dns": uuidlib.NAMESPACE_DNS, "url": uuidlib.NAMESPACE_URL, "oid": uuidlib.NAMESPACE_OID,
                    "x500": uuidlib.NAMESPACE_X500}


@function()
def _uuidv5(namespace: str, name: str) -> str:
    space = _UUID_NAMESPACES.get(namespace)
    if space is None:
        try:
            space = uuidlib.UUID(namespace)
        except ValueError:
            raise FunctionError(f"uuidv5() doesn't support namespace prefix {json.dumps(namespace)}", 0) from None
    return str(uuidlib.uuid5(space, name))


# --- ip network --------------------------------------------------------------------------------


def _network(prefix: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(prefix, strict=False)
    except ValueError:
        raise FunctionError(f"invalid CIDR expression: {prefix}", 0) from None


@function()
def _cidrhost(prefix: str, hostnum: Num) -> str:
    network = _network(prefix)
    host = _whole(hostnum)
    if not -network.num_addresses <= host < network.num_addresses:
        raise FunctionError(f"prefix of {network.prefixlen} does not accommodate a host numbered {host}", 1)
    return str(network[host])


@function()
def _cidrnetmask(prefix: str) -> str:
    network = _network(prefix)
    if network.version != 4:
        raise FunctionError("only IPv4 networks are supported", 0)
    return str(network.netmask)


@function()
def _cidrsubnet(prefix: str, newbits: Num, netnum: Num) -> str:
    network = _network(prefix)
    bits, num = _whole(newbits), _whole(netnum)
    length = network.prefixlen + bits
    if bits < 0 or length > network.max_prefixlen:
        raise FunctionError(f"insufficient address space to extend prefix of {network.prefixlen} by {bits}", 1)
    if not 0 <= num < 2 ** bits:
        raise FunctionError(f"prefix extension of {bits} does not accommodate a subnet numbered {num}", 2)
    return f"{network.network_address + (num << (network.max_prefixlen - length))}/{length}"


@function()
def _cidrsubnets(prefix: str, *newbits: Num) -> list[str]:
    network = _network(prefix)
    out: list[str] = []
    start = int(network.network_address)
    end = start + network.num_addresses
    for i, bits in enumerate(_whole(b) for b in newbits):
        length = network.prefixlen + bits
        if bits < 1 or length > network.max_prefixlen:
            raise FunctionError(f"would extend prefix to {length} bits, which is too long for an "
                                f"IPv{network.version} address", i + 1)
        size = 1 << (network.max_prefixlen - length)
        start = -(-start // size) * size  # the next boundary of this size
        if start + size > end:
            raise FunctionError(f"not enough remaining address space for a subnet with a prefix of {length} bits "
                                f"after {out[-1] if out else prefix}", i + 1)
        out.append(f"{ipaddress.ip_address(start) if network.version == 4 else ipaddress.IPv6Address(start)}/{length}")
        start += size
    return out


# --- type conversion ---------------------------------------------------------------------------


@function(null_ok=True)
def _tobool(v: Any) -> bool | None:
    return None if v is None else _as(to_bool, v)


@function(null_ok=True)
def _tonumber(v: Any) -> Num | None:
    return None if v is None else _as(to_number, v)


@function(null_ok=True)
def _tostring(v: Any) -> str | None:
    if isinstance(v, (list, dict)):
        raise FunctionError(f"cannot convert {type_name(v)} to string", 0)
    return None if v is None else to_string(v)


def _as(convert: Callable[[Any], Any], value: Any) -> Any:
    try:
        return convert(value)
    except FunctionError as exc:
        raise FunctionError(exc.message, 0) from None


@function(null_ok=True, shallow=True)
def _tolist(v: Any) -> list | None:
    if v is None or isinstance(v, list):
        return unify(v) if v else v
    raise FunctionError(f"cannot convert {type_name(v)} to list", 0)


def unify(items: list[Any]) -> list[Any]:
    """A tuple as a list of one element type: mixed strings, numbers and bools all become strings, as in Terraform."""
    kinds = {type_name(i) for i in items if i is not None and i is not UNKNOWN}
    if "string" in kinds and kinds <= {"string", "number", "bool"} and len(kinds) > 1:
        return [i if i is None or i is UNKNOWN else to_string(i) for i in items]
    return items


@function(null_ok=True, shallow=True)
def _toset(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, list):
        raise FunctionError(f"cannot convert {type_name(v)} to set", 0)
    if contains_unknown(v):
        return UNKNOWN  # which elements are equal is not known yet
    return set_of(unify(v))


@function(null_ok=True, shallow=True)
def _tomap(v: Any) -> dict | None:
    if v is None or isinstance(v, dict):
        return v
    raise FunctionError(f"cannot convert {type_name(v)} to map", 0)


@function(null_ok=True, shallow=True)
def _ephemeralasnull(value: Any) -> Any:
    return value  # the sandbox has no ephemeral values


# The special forms' entries: the evaluator calls them with marks intact (see hcl_eval.py).

def sensitive(value: Any) -> Any:
    """sensitive(): the value, marked sensitive (a secret stays a secret)."""
    return value if isinstance(value, Sensitive) and value.mark >= Mark.SENSITIVE else Sensitive(value)


def issensitive(value: Any) -> bool:
    """issensitive(): whether the value carries a mark (unknown values can be sensitive too)."""
    return bool(unmark(value)[1])


def documented_names() -> list[str]:
    """Every documented Terraform function, sorted."""
    return sorted(name for names in TERRAFORM_FUNCTIONS.values() for name in names)


def supported_names() -> list[str]:
    """Every Terraform function the sandbox evaluates, sorted."""
    return sorted(set(FUNCTIONS) | SPECIAL_FORMS)
