"""The worker registry's values: which `gateway worker` processes run now, as their own beats tell.

A worker registers at start under its name (`host:pid`), beats while it runs (every `GATEWAY_WORKER_BEAT_SECONDS`,
default 5), and marks itself stopped on a clean stop. One that was killed stops beating: it is taken for dead once
`LIVE_BEATS` of its beats are missed, so one slow beat (a busy database) does not make it look gone, and a dead one
is counted out within a few beats. Each beat writes the moment it counts until, so a reader needs no setting of the
worker's to judge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

LIVE_BEATS = 3  # a worker is live while its last beat is younger than this many of its beat intervals
FORGET_AFTER = timedelta(days=7)  # a worker stopped or silent this long is dropped from the registry


def live_until(beat_at: datetime, beat_seconds: float) -> datetime:
    """Until when a beat at `beat_at` keeps its worker live."""
    return beat_at + timedelta(seconds=LIVE_BEATS * beat_seconds)


@dataclass(frozen=True)
class WorkerRecord:
    """One worker as the registry has it."""

    name: str  # host:pid
    started_at: datetime
    beat_at: datetime  # its last beat (the registration counts as one)
    live_until: datetime  # past this without a beat, it is taken for dead
    stopped_at: datetime | None = None  # a clean stop

    def live(self, moment: datetime) -> bool:
        return self.stopped_at is None and moment < self.live_until
