"""Waiting out a dependency that does not answer (the database at start-up, or gone for a while): capped
exponential delays with jitter, so processes that lost it together do not all come back in the same instant."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Backoff:
    """The delay after each consecutive failure: `first`, doubling up to `cap`, each drawn between half and all of
    that (jitter). `succeeded` starts it over."""

    first: float = 0.5
    cap: float = 30.0
    failures: int = 0

    def next_delay(self, draw: Callable[[], float] = random.random) -> float:
        """Count one more failure; the seconds to wait before the next attempt."""
        self.failures += 1
        ceiling = min(self.cap, self.first * 2 ** min(self.failures - 1, 30))
        return ceiling * (0.5 + draw() / 2)

    def succeeded(self) -> int:
        """Start over; how many failures there had been (more than none: a recovery worth saying)."""
        failures, self.failures = self.failures, 0
        return failures
