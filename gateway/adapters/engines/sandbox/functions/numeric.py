"""Terraform's numeric functions: abs, ceil, floor, log, max, min, parseint, pow, signum."""

from __future__ import annotations

import functools
import json
import math

from gateway.adapters.engines.sandbox.functions.registry import (
    FunctionError,
    Num,
    function,
    whole,
)


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
    base = whole(base, "base")
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
    try:
        return math.pow(num, power)  # floating point, as Terraform's: pow(10, 400) is +Inf, not a 401-digit number
    except OverflowError:
        return math.inf


@function()
def _signum(num: Num) -> int:
    integer = whole(num)
    return (integer > 0) - (integer < 0)
