"""The CLI's standard streams, scrubbed of every known secret value before anything is written."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from gateway.domain.scrubbing import Scrubber


class ScrubbedStream:
    """A text stream that writes through `scrubber`; everything else is the wrapped stream's."""

    def __init__(self, inner: TextIO, scrubber: Scrubber):
        self._inner = inner
        self._scrubber = scrubber

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("a text stream takes str")  # click probes with bytes to find binary streams
        self._inner.write(self._scrubber.scrub(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":  # never hand out the unscrubbed bytes underneath
            raise AttributeError(name)
        return getattr(self._inner, name)


def scrub_standard_streams(scrubber: Scrubber) -> None:
    """From now on, stdout and stderr drop every known secret value (the last line of defence)."""
    if not scrubber:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, ScrubbedStream):
            setattr(sys, name, ScrubbedStream(stream, scrubber))
