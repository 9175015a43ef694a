"""The values the sandbox evaluator works with, and the marks Terraform puts on them.

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

from dataclasses import dataclass
from decimal import Decimal
from enum import IntEnum
from typing import Any


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


def unmark(value: Any) -> tuple[Any, Mark]:
    """Strip marks anywhere in a value; report the strongest there was (NONE, which is falsy, if none)."""
    if isinstance(value, Sensitive):
        inner, mark = unmark(value.value)
        return inner, max(mark, value.mark)
    if isinstance(value, dict):
        pairs = {k: unmark(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, max((m for _, m in pairs.values()), default=Mark.NONE)
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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_text(value: int | float) -> str:
    """A number as Terraform writes it: no exponent, no trailing `.0` (`1e-07` is `0.0000001`)."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer():
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def type_name(value: Any) -> str:
    """The Terraform type word for a value, as its error messages use it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "unknown"
