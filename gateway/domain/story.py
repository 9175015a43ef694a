"""A change's story for people, readable at any size: each event's details with every long list summarised (how
many, the first few, "and 290 more") and the rest kept for whoever asks for it. Nothing is cut silently: what is not
shown is counted, and is there on demand (`gateway audit show --full`, the page's "show all")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIRST = 5  # the items of a long list shown before "and N more"


@dataclass(frozen=True)
class Detail:
    """One field of an event: its name, the items shown, and the ones "and N more" stands for."""

    key: str
    shown: tuple[str, ...]
    rest: tuple[str, ...] = ()
    listed: bool = False  # a list (counted), not a single value

    @property
    def count(self) -> int:
        return len(self.shown) + len(self.rest)

    def summary(self) -> str:
        """`changed: 300: a, b, c, d, e, and 295 more` (a single value as it is)."""
        if not self.listed:
            return self.shown[0] if self.shown else ""
        more = f", and {len(self.rest)} more" if self.rest else ""
        return f"{self.count}: {', '.join(self.shown)}{more}"

    def full(self) -> list[str]:
        return [*self.shown, *self.rest]


def event_details(payload: Mapping[str, Any], first: int = FIRST) -> list[Detail]:
    """The payload's non-empty fields, a nested object's fields named `outer.inner`, each list summarised."""
    found: list[Detail] = []
    for key, value in payload.items():
        if _empty(value):
            continue
        if isinstance(value, Mapping) and any(isinstance(v, (Mapping, list)) for v in value.values()):
            for inner, v in value.items():
                if not _empty(v):
                    found.append(_detail(f"{key}.{inner}", v, first))
        else:
            found.append(_detail(str(key), value, first))
    return found


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict, tuple)) and not value)


def _detail(key: str, value: Any, first: int) -> Detail:
    if isinstance(value, Mapping):
        items = [f"{k}: {_text(v)}" for k, v in value.items()]
        if len(items) <= first:
            return Detail(key, ("; ".join(items),))
        return Detail(key, tuple(items[:first]), tuple(items[first:]), True)
    if isinstance(value, (list, tuple)):
        items = [_text(v) for v in value]
        return Detail(key, tuple(items[:first]), tuple(items[first:]), True)
    if isinstance(value, str) and "\n" in value.strip():
        lines = value.strip().splitlines()
        return Detail(key, (lines[0],), tuple(lines[1:]), False) if len(lines) > 1 else Detail(key, (lines[0],))
    return Detail(key, (_text(value),))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def summary_lines(payload: Mapping[str, Any], full: bool = False, first: int = FIRST) -> list[str]:
    """The details as the CLI prints them under an event: one line each, or every item on its own line (`full`)."""
    lines = []
    for d in event_details(payload, first):
        if full and d.listed:
            lines.append(f"{d.key}: {d.count}")
            lines += [f"  {item}" for item in d.full()]
        elif full and d.rest:
            lines.append(f"{d.key}: {d.shown[0]}")
            lines += [f"  {line}" for line in d.rest]
        elif d.rest and not d.listed:
            lines.append(f"{d.key}: {d.shown[0]} (and {len(d.rest)} more line(s))")
        else:
            lines.append(f"{d.key}: {d.summary()}")
    return lines


def hidden_count(payloads: Sequence[Mapping[str, Any]], first: int = FIRST) -> int:
    """How many items the summaries of these payloads leave for "show all"."""
    return sum(len(d.rest) for p in payloads for d in event_details(p, first))
