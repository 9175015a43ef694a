"""Terraform's collection functions: concat, element, flatten, lookup, merge, range, slice, the set functions..."""

from __future__ import annotations

import functools
import json
import math
from decimal import Decimal
from typing import Any

from gateway.adapters.engines.sandbox.functions.registry import (
    MAX_ELEMENTS,
    MAX_RANGE,
    FunctionError,
    Num,
    convert,
    function,
    same_value,
    set_of,
    unify,
    whole,
)
from gateway.adapters.engines.sandbox.values import (
    UNKNOWN,
    decimal_arithmetic,
    type_name,
)


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
    size = whole(size)
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
    if not seqs:
        raise FunctionError("at least one argument is required")
    return [item for seq in seqs for item in seq]


@function()
def _contains(list_: list, value: Any | None) -> bool:
    return any(same_value(item, value) for item in list_)


@function()
def _distinct(list_: list) -> list:
    first: dict[str, Any] = {}
    for item in unify(list_):
        first.setdefault(json.dumps(item, sort_keys=True), item)
    return list(first.values())


@function(shallow=True)
def _element(list_: list, index: Num) -> Any:
    index = whole(index, "index")
    if not list_:
        raise FunctionError("cannot use element function with an empty list")
    if index < 0:
        raise FunctionError("cannot use element function with a negative index")
    return list_[index % len(list_)]


@function(shallow=True)
def _flatten(list_: list) -> Any:
    # As Terraform's: unknown only where a nested list may be (an unknown element, whose type the sandbox does not
    # keep); an object with an unknown attribute is an element like any other, so a `for` over the result is known
    out: list = []
    for item in list_:
        flat = _flatten(item) if isinstance(item, list) else [item]
        if item is UNKNOWN or flat is UNKNOWN:
            return UNKNOWN
        out.extend(flat)
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
    if len(params) < 3 and limit < start:
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
    size = math.prod(len(s) for s in sets)
    if size > MAX_ELEMENTS:
        raise FunctionError(f"the product would have {size} elements, more than the sandbox builds ({MAX_ELEMENTS})")
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
    start, end = whole(start_index), whole(end_index)
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
        items = convert(values[key], "list(string)")
        for item in items:
            out.setdefault(item, []).append(key)
    return {k: sorted(v) for k, v in sorted(out.items())}


@function()
def _zipmap(keyslist: list[str], valueslist: list) -> dict:
    if len(keyslist) != len(valueslist):
        raise FunctionError(f"number of keys ({len(keyslist)}) does not match number of values "
                            f"({len(valueslist)})")
    return dict(zip(keyslist, valueslist, strict=True))
