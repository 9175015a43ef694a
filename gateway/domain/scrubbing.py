"""The last line of defence: every known secret value is cut out of what the gateway shows or sends.

Masking happens where values are born (the engines mark secrets by origin); this scrubber only
catches what got past that by mistake. It replaces each known value, and its JSON- and
HTML-escaped spellings, with `(redacted)`. Values shorter than MIN_LENGTH are not scrubbed: a
two-letter secret would cut words out of every message and is no secret anyway.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

REDACTED = "(redacted)"
MIN_LENGTH = 6


class Scrubber:
    """Replaces known secret values in text and in JSON-shaped data."""

    def __init__(self, values: Iterable[Any] = ()):
        spellings: set[str] = set()
        for value in values:
            text = value if isinstance(value, str) else json.dumps(value)
            if len(text) < MIN_LENGTH:
                continue
            for spelling in (text, json.dumps(text)[1:-1]):
                # html.escape's entities and Jinja's (&#34; &#39;) differ for quotes: both are removed
                spellings |= {spelling, html.escape(spelling),
                              html.escape(spelling, quote=False).replace('"', "&#34;").replace("'", "&#39;")}
        self._spellings = sorted(spellings, key=len, reverse=True)  # longest first: no partial leftovers
        self._in_json = [json.dumps(s)[1:-1] for s in self._spellings]

    def __bool__(self) -> bool:
        return bool(self._spellings)

    @property
    def splices_safely(self) -> bool:
        """Whether scrubbing pieces one by one equals scrubbing them joined, when each seam is a brace of a JSON
        object spliced in: no spelling holds a brace, so none can span a seam (and "(redacted)" holds none either)."""
        return not any("{" in s or "}" in s for s in self._spellings)

    def scrub(self, text: str) -> str:
        for spelling in self._spellings:
            if spelling in text:
                text = text.replace(spelling, REDACTED)
        return text

    def scrub_bytes(self, data: bytes) -> bytes:
        if not self._spellings:
            return data
        try:
            return self.scrub(data.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            return data

    def finds_in_json(self, encoded: str) -> bool:
        """Whether `scrub_data` would change the value `encoded` (`json.dumps` of it, ASCII-escaped) decodes to. JSON
        escapes a string one character at a time, so a spelling inside any key or value shows here escaped."""
        return any(spelling in encoded for spelling in self._in_json)

    def scrub_data(self, value: Any) -> Any:
        """The same value with every string (keys included) scrubbed."""
        if not self._spellings:
            return value
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub_data(k): self.scrub_data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.scrub_data(v) for v in value]
        return value
