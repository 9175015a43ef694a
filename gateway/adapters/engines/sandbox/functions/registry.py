"""The registry of Terraform's built-in functions, and the null, unknown and type rules every call follows.

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

File functions read relative to the stack's directory, as Terraform reads relative to its working
directory (a module names its own files through `path.module`), and refuse any path that leaves the
checkout the engine was given. `timestamp()`, `uuid()` and `bcrypt()` are unknown
until apply, as in Terraform (and `plantimestamp()`, unlike Terraform: see its comment).
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gateway.adapters.engines.sandbox.values import (
    UNKNOWN,
    Mark,
    SetValue,
    contains_unknown,
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
# Terraform has no such limits; a gateway shared by many must not be made to build a gigabyte string or list
MAX_TEXT = 1_000_000  # characters that indent() and format()'s widths may add
MAX_ELEMENTS = 100_000  # elements setproduct() may build


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
        expanded = expand_home(path)
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
    in_template: bool = False  # inside a template, templatefile() is refused, as in Terraform (no recursion)
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
            converted.append(value if value is None else convert(value, param.kind))
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
    except OSError as exc:  # its message would show where the checkout is on this machine: say only what failed
        raise _call_error(fn, FunctionError(f"cannot read the file: {exc.strerror or type(exc).__name__}"),
                          marks) from None
    except RecursionError:
        raise _call_error(fn, FunctionError("the value is nested too deeply"), marks) from None
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


def convert(value: Any, kind: str) -> Any:
    """A value converted to a parameter's kind as Terraform converts, or the error Terraform gives."""
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
            out.append(item if item is None or item is UNKNOWN else convert(item, element))
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


def whole(value: int | float, what: str = "number") -> int:
    """A number that must be whole (an index, a count, a width)."""
    if isinstance(value, float) and not value.is_integer():
        raise FunctionError(f"{what} must be a whole number, got {number_text(value)}")
    return int(value)


def set_of(items: Iterable[Any]) -> list[Any]:
    """A set as the sandbox keeps one: distinct elements in Terraform's order (strings sorted, numbers ascending)."""
    unique = {json.dumps(item, sort_keys=True): item for item in items}
    return SetValue(sorted(unique.values(), key=_set_order))


def _set_order(item: Any) -> tuple:
    if is_number(item):
        return (0, item, "")
    if isinstance(item, str):
        return (1, 0, item)
    return (2, 0, json.dumps(item, sort_keys=True))


def render_template(context: CallContext, text: str, where: str, variables: dict) -> Any:
    """Template text rendered with only `variables` in scope (templatefile, templatestring)."""
    if context.render is None:
        raise FunctionError("templates cannot be rendered here")
    for name in variables:
        if not re.fullmatch(r"[A-Za-z_][\w-]*", name):
            raise FunctionError(f"invalid template variable name {json.dumps(name)}: must start with a letter, "
                                "followed by zero or more letters, digits, and underscores", 1)
    return context.render(text, where, variables)


def same_value(a: Any, b: Any) -> bool:
    """Terraform's equality: values of different types are never equal (`1` is not `true`, `"1"` is not `1`)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


def expand_home(path: str) -> str:
    """`~` as pathexpand() expands it: the sandbox's home, never the gateway's."""
    if path == "~" or path.startswith("~/"):
        return VIRTUAL_HOME + path[1:]
    return path


def file_scope(context: CallContext) -> FileScope:
    """Where files may be read, or an error where none may (a variable's default, say)."""
    if context.files is None:
        raise FunctionError("files cannot be read here (only in a stack's expressions)")
    return context.files


def read_bytes(context: CallContext, path: str) -> bytes:
    """A committed file's bytes; an error names a missing file or a path outside the checkout."""
    target = file_scope(context).resolve(path)
    if not target.is_file():
        raise FunctionError(f"no file exists at {json.dumps(path)}; this function works only with files that are "
                            "distributed as part of the configuration source code", 0)
    return target.read_bytes()


def read_text(context: CallContext, path: str) -> str:
    """A committed file as UTF-8 text, as file() and templatefile() read it."""
    try:
        return read_bytes(context, path).decode("utf-8")
    except UnicodeDecodeError:
        raise FunctionError(f"contents of {json.dumps(path)} are not valid UTF-8; use the filebase64 function to "
                            "obtain the Base64 encoded contents or the other file functions (e.g. filemd5, "
                            "filesha256) to obtain file hashing results instead", 0) from None


def unify(items: list[Any]) -> list[Any]:
    """A tuple as a list of one element type: mixed strings, numbers and bools all become strings, as in Terraform."""
    kinds = {type_name(i) for i in items if i is not None and i is not UNKNOWN}
    if "string" in kinds and kinds <= {"string", "number", "bool"} and len(kinds) > 1:
        return [i if i is None or i is UNKNOWN else to_string(i) for i in items]
    return items


def documented_names() -> list[str]:
    """Every documented Terraform function, sorted."""
    return sorted(name for names in TERRAFORM_FUNCTIONS.values() for name in names)


def supported_names() -> list[str]:
    """Every Terraform function the sandbox evaluates, sorted."""
    return sorted(set(FUNCTIONS) | SPECIAL_FORMS)
