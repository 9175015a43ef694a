"""Terraform's encoding functions: base64, CSV, JSON and YAML (written as Terraform writes them), URL, text encodings."""

from __future__ import annotations

import base64
import codecs
import csv
import gzip
import io
import json
import math
import urllib.parse
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

import yaml

from gateway.adapters.engines.sandbox.functions.registry import (
    FunctionError,
    function,
    to_string,
)
from gateway.adapters.engines.sandbox.values import (
    is_number,
    number_text,
)


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
    return _json_text(val)


_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _json_text(value: Any) -> str:
    """JSON as Terraform writes it: keys sorted, numbers in full (`0.0000001`), `<>&` and line separators escaped."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_text(k)}:{_json_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, str):
        return "".join(_JSON_ESCAPES.get(c, c) for c in json.dumps(value, ensure_ascii=False))
    if is_number(value):
        if isinstance(value, float) and not math.isfinite(value):
            raise FunctionError("cannot serialize infinity as JSON")
        return number_text(value)
    return json.dumps(value)  # true, false, null


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
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):  # YAML's timestamps are RFC 3339 strings in Terraform
        return f"{value.isoformat()}T00:00:00Z"
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
