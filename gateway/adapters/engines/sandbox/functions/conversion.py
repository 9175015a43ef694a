"""Terraform's type conversion functions (to*), and the entries of the special forms the evaluator runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.adapters.engines.sandbox.functions.registry import (
    FunctionError,
    Num,
    function,
    set_of,
    to_bool,
    to_number,
    to_string,
    unify,
)
from gateway.adapters.engines.sandbox.values import (
    UNKNOWN,
    Mark,
    Sensitive,
    contains_unknown,
    type_name,
    unmark,
)


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


def sensitive(value: Any) -> Any:
    """sensitive(): the value, marked sensitive (a secret stays a secret)."""
    return value if isinstance(value, Sensitive) and value.mark >= Mark.SENSITIVE else Sensitive(value)


def issensitive(value: Any) -> bool:
    """issensitive(): whether the value carries a mark (unknown values can be sensitive too)."""
    return bool(unmark(value)[1])
