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

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
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


class SetValue(list):  # type: ignore[type-arg]
    """A set as the sandbox keeps one: a list in Terraform's order that remembers it is a set, so that a `for`
    over it keys each element by the element itself (as `for_each` does), not by its position."""


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
        mark = max((m for _, m in pairs.values()), default=Mark.NONE)
        if not mark and type(value) is not dict:  # an object the engine made (open to any attribute) stays one
            return value, mark
        return {k: v for k, (v, _) in pairs.items()}, mark
    if isinstance(value, list):
        items = [unmark(v) for v in value]
        plain = [v for v, _ in items]
        return SetValue(plain) if isinstance(value, SetValue) else plain, max((m for _, m in items), default=Mark.NONE)
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
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
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


def plain_number(value: int | float) -> int | float:
    """Terraform has one number type: a whole number is an int here, so it is written without `.0`."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def decimal_arithmetic(op: Callable[[Decimal, Decimal], Decimal], a: int | float, b: int | float) -> int | float:
    """`a op b` in decimal, as Terraform computes (0.1 + 0.2 is 0.3, not 0.30000000000000004)."""
    if isinstance(a, int) and isinstance(b, int) and op is not Decimal.__truediv__:
        return int(op(Decimal(a), Decimal(b)))
    with localcontext() as context:
        context.prec = 40
        result = op(Decimal(repr(a)) if isinstance(a, float) else Decimal(a),
                    Decimal(repr(b)) if isinstance(b, float) else Decimal(b))
    return int(result) if result == result.to_integral_value() else float(result)
