"""What the review page shows first, and the rest a page at a time.

A proposal of 2,000 resources written out whole is 800 KB of HTML that takes seconds to render and to read.
The first screen holds what an approver must see before anything else (what blocks, destroys and
replacements, drift, policy findings with denies first), each list bounded and saying how many more there
are; the changes and the diff follow in pages (`?page=N`), every one of them reachable.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.domain.errors import InputError
from gateway.domain.policy import Finding, Severity
from gateway.domain.preview import DriftEntry, Preview, ResourceEntry, preview_from_data

CHANGES_PER_PAGE = 50
DIFF_LINES_PER_PAGE = 400
FIRST_SCREEN_ITEMS = 100  # of each list in a stack's summary; the rest are on the pages of changes
FIRST_SCREEN_LINES = 20  # of what blocks the proposal (each policy deny is one; the findings table lists them too)

T = TypeVar("T")


@dataclass(frozen=True)
class Bounded(Generic[T]):
    """The first items of a list, and how many more it has."""

    items: tuple[T, ...]
    more: int

    @classmethod
    def of(cls, items: Sequence[T], limit: int = FIRST_SCREEN_ITEMS) -> Bounded[T]:
        return cls(tuple(items[:limit]), max(0, len(items) - limit))


@dataclass(frozen=True)
class StackSummary:
    """A stack's part of the first screen: its plan's counts, then what must be read first, bounded."""

    stack: str
    preview: Preview  # with only the bounded lists' first items and this page's changes
    danger: Bounded[ResourceEntry]
    drift: Bounded[DriftEntry]
    findings: Bounded[Finding]


@dataclass(frozen=True)
class Page(Generic[T]):
    number: int  # 1-based
    count: int  # how many pages there are (at least one, if empty)
    first: int  # the 1-based position of the page's first item in the whole list
    total: int  # items in the whole list
    items: tuple[T, ...]

    @property
    def last(self) -> int:
        return self.first + len(self.items) - 1


@dataclass(frozen=True)
class ReviewPage:
    summaries: list[StackSummary]
    changes: Page[tuple[str, ResourceEntry]]  # (stack, change), stack by stack in plan order


def paged(items: Sequence[T], number: int, size: int, what: str) -> Page[T]:
    """Page `number` of `items`; a page past the end is a clear error naming how many there are."""
    count = _page_count(len(items), size)
    _check_page(number, count, what)
    start = (number - 1) * size
    return Page(number, count, start + 1, len(items), tuple(items[start:start + size]))


def review_page(preview_json: Mapping[str, str], number: int, size: int = CHANGES_PER_PAGE) -> ReviewPage:
    """The first screen of each stack's stored preview (public JSON) and page `number` of all their changes.

    Only what the page shows is built: a stack's bounded lists and the page's slice of its changes. A pure function
    of the previews' text: built once per text and page (every read of an unchanged proposal asks the same).
    """
    return _review_page(tuple(preview_json.items()), number, size)


@functools.lru_cache(maxsize=32)
def _review_page(previews: tuple[tuple[str, str], ...], number: int, size: int) -> ReviewPage:
    decoded = {stack: _decoded(text) for stack, text in previews}
    total = sum(len(data["changes"]) for data in decoded.values())
    count = _page_count(total, size)
    _check_page(number, count, "the proposal's changes")
    start, end = (number - 1) * size, number * size
    summaries, shown = [], []
    offset = 0  # of the stack's first change among all the stacks' changes
    for stack, data in decoded.items():
        n = len(data["changes"])
        window = slice(max(0, start - offset), max(0, min(n, end - offset)))
        offset += n
        data = {**data, "findings": sorted(data.get("findings", []), key=lambda f: f["severity"] != Severity.DENY)}
        preview = preview_from_data(data, changes=window, first=FIRST_SCREEN_ITEMS)
        summaries.append(StackSummary(stack, preview, _bounded(preview.danger, data["danger"]),
                                      _bounded(preview.drift, data["drift"]),
                                      _bounded(preview.findings, data["findings"])))
        shown += [(stack, entry) for entry in preview.changes]
    return ReviewPage(summaries, Page(number, count, start + 1, total, tuple(shown)))


def diff_page(diff: str, number: int, size: int = DIFF_LINES_PER_PAGE) -> Page[str]:
    """Page `number` of the diff's lines."""
    return paged(_lines(diff), number, size, "the proposal's diff")


@functools.lru_cache(maxsize=8)
def _lines(diff: str) -> tuple[str, ...]:
    """A diff's lines, split once per text (a big proposal's diff is some 10,000 lines; its page shows 400)."""
    return tuple(diff.splitlines())


@functools.lru_cache(maxsize=4)
def _decoded(text: str) -> dict[str, Any]:
    """A stored preview decoded, remembered by its text (a big plan's is a megabyte: decoding it is most of a
    page's cost, and each of its pages decodes the same text); never mutated."""
    return dict(json.loads(text))


def _bounded(shown: tuple[T, ...], every: Sized) -> Bounded[T]:
    return Bounded(shown, len(every) - len(shown))


def _page_count(items: int, size: int) -> int:
    return max(1, -(-items // size))


def _check_page(number: int, count: int, what: str) -> None:
    if number < 1 or number > count:
        raise InputError(f"there is no page {number} of {what}: there {'is' if count == 1 else 'are'} {count}")
