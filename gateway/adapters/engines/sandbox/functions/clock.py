"""Terraform's date and time functions: formatdate, timeadd, timecmp, timestamp (known after apply)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from gateway.adapters.engines.sandbox.functions.registry import (
    CallContext,
    FunctionError,
    function,
)


def _parse_timestamp(text: str, param: int = 0) -> datetime:
    match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", text)
    if not match:
        raise FunctionError(f"not a valid RFC3339 timestamp: {json.dumps(text)}", param)
    zone = match.group(8).upper()
    try:
        return datetime.fromisoformat(text[:19].replace("t", "T") + (match.group(7) or "")[:7]
                                      + ("+00:00" if zone == "Z" else zone))
    except ValueError as exc:
        raise FunctionError(f"not a valid RFC3339 timestamp: {exc}", param) from None


def _rfc3339(moment: datetime) -> str:
    text = moment.replace(microsecond=0).isoformat()  # Go's time.RFC3339 drops fractions of a second
    return text[:-6] + "Z" if text.endswith("+00:00") else text


_DATE_TOKEN = re.compile(r"'(?:[^']|'')*'|([A-Za-z])\1*|[^A-Za-z']+")


@function()
def _formatdate(spec: str, timestamp: str) -> str:
    moment = _parse_timestamp(timestamp, 1)
    out = []
    for match in _DATE_TOKEN.finditer(spec):
        token = match.group(0)
        if token.startswith("'"):
            out.append(token[1:-1].replace("''", "'") if token != "''" else "'")
        elif token[0].isalpha():
            out.append(_date_field(token, moment))
        else:
            out.append(token)
    if "".join(m.group(0) for m in _DATE_TOKEN.finditer(spec)) != spec:
        raise FunctionError("unterminated literal '", 0)
    return "".join(out)


def _date_field(token: str, moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    hh, mm = divmod(abs(minutes), 60)
    hour12 = moment.hour % 12 or 12
    fields = {
        "YYYY": f"{moment.year:04d}", "YY": f"{moment.year % 100:02d}",
        "MMMM": moment.strftime("%B"), "MMM": moment.strftime("%b"), "MM": f"{moment.month:02d}",
        "M": str(moment.month), "DD": f"{moment.day:02d}", "D": str(moment.day),
        "EEEE": moment.strftime("%A"), "EEE": moment.strftime("%a"),
        "hh": f"{moment.hour:02d}", "h": str(moment.hour), "HH": f"{hour12:02d}", "H": str(hour12),
        "AA": "AM" if moment.hour < 12 else "PM", "aa": "am" if moment.hour < 12 else "pm",
        "mm": f"{moment.minute:02d}", "m": str(moment.minute), "ss": f"{moment.second:02d}", "s": str(moment.second),
        "ZZZZZ": f"{sign}{hh:02d}:{mm:02d}", "ZZZZ": f"{sign}{hh:02d}{mm:02d}",
        "ZZZ": "UTC" if minutes == 0 else f"{sign}{hh:02d}{mm:02d}",
        "Z": "Z" if minutes == 0 else f"{sign}{hh:02d}:{mm:02d}",
    }
    if token not in fields:
        raise FunctionError(f"invalid date format verb {json.dumps(token)}", 0)
    return fields[token]


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _parse_duration(text: str) -> timedelta:
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    if body == "0":
        return timedelta(0)
    parts = list(_DURATION_PART.finditer(body))
    if not parts or "".join(p.group(0) for p in parts) != body:
        raise FunctionError(f"time: invalid duration {json.dumps(text)}", 1)
    return timedelta(seconds=sign * sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts))


@function()
def _timeadd(timestamp: str, duration: str) -> str:
    return _rfc3339(_parse_timestamp(timestamp) + _parse_duration(duration))


@function()
def _timecmp(timestamp_a: str, timestamp_b: str) -> int:
    a, b = _parse_timestamp(timestamp_a, 0), _parse_timestamp(timestamp_b, 1)
    return (a > b) - (a < b)


@function(until_apply=True)
def _timestamp(context: CallContext) -> str:
    return _rfc3339(context.now().astimezone(timezone.utc).replace(microsecond=0))


@function(until_apply=True)
def _plantimestamp(context: CallContext) -> str:
    # Terraform knows it while planning and applies with the plan's time; the sandbox's plan document carries
    # no time (a re-plan of one commit must give the same digest), so it is known after apply, as timestamp()
    return _rfc3339(context.now().astimezone(timezone.utc).replace(microsecond=0))
