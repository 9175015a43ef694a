"""Structured logs (structlog) to stderr; the level comes from GATEWAY_LOG_LEVEL (default warning)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from gateway.domain.scrubbing import Scrubber

_scrubber = Scrubber()


def install_log_scrubber(scrubber: Scrubber) -> None:
    """Scrub the workspace's known secrets from every log line from now on (the last line of defence)."""
    global _scrubber
    _scrubber = scrubber


def _scrub_secrets(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    return _scrubber.scrub_data(event) if _scrubber else event


def _stderr_logger(*_: Any) -> structlog.PrintLogger:
    """Whatever sys.stderr is at the time of logging (the CLI wraps it in a scrubber after start-up)."""
    return structlog.PrintLogger(file=sys.stderr)


def configure_logging(level: str | None = None) -> None:
    name = (level or os.environ.get("GATEWAY_LOG_LEVEL", "warning")).upper()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _scrub_secrets,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, name, logging.WARNING)),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
