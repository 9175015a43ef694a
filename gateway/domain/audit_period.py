"""The period an auditor asks about, as people name one: a year, a quarter, a month, a range of dates or times, or
the last 90 days. Times are UTC, written as the trail writes them, so a period holds an event by comparing text."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Period:
    """Events at or after `since` and before `until` (ISO 8601 in UTC, as the trail writes them); None: no bound."""

    since: str | None
    until: str | None
    label: str

    def holds(self, at: str) -> bool:
        return (self.since is None or at >= self.since) and (self.until is None or at < self.until)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "since": self.since, "until": self.until}


def _moment(d: date | datetime) -> str:
    moment = d if isinstance(d, datetime) else datetime(d.year, d.month, d.day, tzinfo=UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC).isoformat(timespec="microseconds")
    except OverflowError:  # the first or last hours of year 1 or 9999 in another zone: as far as time goes
        return moment.replace(tzinfo=UTC).isoformat(timespec="microseconds")


def parse_period(text: str) -> Period:
    """`2026`, `2026-Q3`, `2026-07`, or `FROM..TO` where each side is one of those, a date or a time (a named TO
    runs to its end: `2026-07..2026-09` is a quarter, `..2026-09-30` takes that whole day; either side may be left
    open). A clear ValueError otherwise."""
    text = text.strip()
    try:
        if ".." in text:
            start, end = (part.strip() for part in text.split("..", 1))
            since = (_named(start) or Period(_moment(_point(start)), None, "")).since if start else None
            until = (_named(end) or Period(None, _moment(_end_of(end)), "")).until if end else None
            if since and until and until <= since:
                raise ValueError("its end is not after its start")
            return Period(since, until, text)
        named = _named(text)
    except ValueError as exc:
        raise ValueError(f"period {text!r} is not one: {exc} ({_SAY})") from None
    if named is None:
        raise ValueError(f"period {text!r} is not one: {_SAY}")
    return named


_SAY = "say 2026, 2026-Q3, 2026-07, 2026-07-01..2026-09-30 or 2026-07.."


def _named(text: str) -> Period | None:
    """A year, a quarter or a month, by name (None: not one of those)."""
    if len(text) == 4 and text.isdigit():
        year = int(text)
        return Period(_moment(date(year, 1, 1)), _moment(date(year + 1, 1, 1)), text)
    if len(text) == 7 and text[:4].isdigit() and text[4:6] in ("-Q", "-q") and text[6] in "1234":
        year, quarter = int(text[:4]), int(text[6])
        after = date(year + 1, 1, 1) if quarter == 4 else date(year, 3 * quarter + 1, 1)
        return Period(_moment(date(year, 3 * quarter - 2, 1)), _moment(after), f"{year}-Q{quarter}")
    if len(text) == 7 and text[:4].isdigit() and text[4] == "-" and text[5:].isdigit():
        year, month = int(text[:4]), int(text[5:])
        after = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
        return Period(_moment(date(year, month, 1)), _moment(after), text)
    return None


def _point(text: str) -> date | datetime:
    return date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)


def _end_of(text: str) -> date | datetime:
    point = _point(text)
    if isinstance(point, datetime):
        return point
    return point + timedelta(days=1) if point < date.max else datetime.max.replace(tzinfo=UTC)


def recent_period(today: date, days: int = 90) -> Period:
    """The default: the last `days` days, from the start of that day on (no end: what happens now is in it)."""
    first = today - timedelta(days=days)
    return Period(_moment(first), None, f"since {first.isoformat()} (the last {days} days)")


def asked_again(period: Period) -> str:
    """How to name the period to `--period` again (the last 90 days are named by their first day, then on)."""
    return f"{period.since[:10]}.." if period.label.startswith("since ") and period.since else period.label


def period_of(period: str | None, since: str | None, until: str | None, today: date) -> Period:
    """The period asked for: by name (`--period`), by its ends (`--since`, `--until`: a date, a named period or a
    time; a date or a name as `until` runs to its end), or the last 90 days. A name and ends together ask for the
    part of the named period between the ends; ends the wrong way round ask for nothing."""
    named = parse_period(period) if period else None
    if not (since or until):
        return named or recent_period(today)
    try:
        start = (_named(since) or Period(_moment(_point(since)), None, "")).since if since else None
        stop = (_named(until) or Period(None, _moment(_end_of(until)), "")).until if until else None
    except ValueError as exc:
        raise ValueError(f"{since if since and not _valid(since) else until!r} is not a date or a time: {exc}") from None
    starts = [b for b in (named.since if named else None, start) if b]
    stops = [b for b in (named.until if named else None, stop) if b]
    label = f"{since or ''}..{until or ''}" if named is None else f"{named.label}, {since or ''}..{until or ''}"
    return Period(max(starts, default=None), min(stops, default=None), label)


def _valid(point: str) -> bool:
    try:
        _named(point) or _point(point)
    except ValueError:
        return False
    return True
