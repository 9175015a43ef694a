"""Terraform's string functions: format and formatlist (Go's verbs), regex, replace, split, substr, title, trim..."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.adapters.engines.sandbox.functions.registry import (
    MAX_TEXT,
    CallContext,
    FunctionError,
    Num,
    function,
    render_template,
    to_bool,
    to_number,
    to_string,
    whole,
)
from gateway.adapters.engines.sandbox.values import (
    is_number,
    number_text,
    plain_number,
)


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
        text = _format_verb(verb, args[position], precision, match)
        if "+" in flags and verb in "dfeEgGv" and is_number(args[position]) and not text.startswith("-"):
            text = "+" + text
        out.append(_pad(text, flags, width))
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
            integer = whole(number)
            return {"d": str(integer), "b": format(integer, "b"), "o": format(integer, "o"),
                    "x": format(integer, "x"), "X": format(integer, "X")}[verb]
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
    if int(width) > MAX_TEXT:
        raise FunctionError(f"a width of {width} is more than the sandbox pads ({MAX_TEXT})")
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
    count = whole(spaces)
    if count * str_.count("\n") > MAX_TEXT:
        raise FunctionError(f"indenting by {count} would add more than the sandbox builds ({MAX_TEXT} characters)", 0)
    return str_.replace("\n", "\n" + " " * count)


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
    offset, length = whole(offset), whole(length)
    if offset < 0:
        offset = max(len(str_) + offset, 0)
    if offset > len(str_):
        return ""
    return str_[offset:] if length < 0 else str_[offset:offset + length]


@function()
def _templatestring(context: CallContext, template: str, vars_: dict) -> Any:
    return render_template(context, template, "templatestring", vars_)


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
