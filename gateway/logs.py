"""Structured logs (structlog) to stderr; the level comes from GATEWAY_LOG_LEVEL (default warning).

Modules take their logger from `get_logger`: structlog (a tenth of a second of imports) is imported, and
configured, when a logger is first used, so a command that logs nothing, such as a read, never loads it; and
without rich, which structlog's console renderer would import (another tenth of a second) to draw tracebacks
these JSON lines never show.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gateway.domain.scrubbing import Scrubber

if TYPE_CHECKING:
    import structlog
    from structlog.typing import FilteringBoundLogger

_scrubber = Scrubber()
_level: str | None = None  # what configure_logging asked for (None: GATEWAY_LOG_LEVEL, when first used)
_applied = False  # whether structlog has been configured with it


def install_log_scrubber(scrubber: Scrubber) -> None:
    """Scrub the workspace's known secrets from every log line from now on (the last line of defence)."""
    global _scrubber
    _scrubber = scrubber


def _scrub_secrets(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    return _scrubber.scrub_data(event) if _scrubber else event


def _structlog() -> ModuleType:
    """structlog, imported the first time without rich unless something else loaded rich already: structlog
    takes rich only if it is there (`import rich` raises ImportError while sys.modules holds None for it)."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        import structlog
    else:
        sys.modules["rich"] = None  # type: ignore[assignment]
        try:
            import structlog
        finally:
            if sys.modules.get("rich", ...) is None:
                del sys.modules["rich"]  # whoever imports rich from now on gets it
    return structlog


def _stderr_logger(*_: Any) -> structlog.PrintLogger:
    """Whatever sys.stderr is at the time of logging (the CLI wraps it in a scrubber after start-up)."""
    return _structlog().PrintLogger(file=sys.stderr)


def configure_logging(level: str | None = None) -> None:
    """Log at `level` (default GATEWAY_LOG_LEVEL, else warning) from now on; structlog is set up now if it is
    already loaded, else when a logger is first used."""
    global _level, _applied
    _level = (level or os.environ.get("GATEWAY_LOG_LEVEL", "warning")).upper()
    _applied = False
    if "structlog" in sys.modules:
        _apply()


def configure_service_logging(default_level: str = "info") -> None:
    """A long-running process (the API, a worker): our lines at GATEWAY_LOG_LEVEL (else `default_level`), and every
    library's lines through the standard library's logging (uvicorn, the MCP session manager, SQLAlchemy...) as the
    same JSON, scrubbed the same way, on stderr. Installed before any library configures logging of its own: the
    root logger then has its handler, and a library's `basicConfig` (MCP's would draw with rich) changes nothing."""
    configure_logging(os.environ.get("GATEWAY_LOG_LEVEL", default_level))
    _apply()
    structlog = _structlog()
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *_stamps(structlog)],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_rendering(structlog)])
    handler = logging.StreamHandler(_StderrNow())
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, _level or "INFO", logging.INFO))
    logging.getLogger("uvicorn.access").disabled = True  # the gateway writes its own line per request


class _StderrNow:
    """Whatever sys.stderr is at the time of writing (the CLI wraps it in a scrubber after start-up)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _stamps(structlog: ModuleType) -> list[Any]:
    return [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info]


def _rendering(structlog: ModuleType) -> list[Any]:
    return [_scrub_secrets, structlog.processors.JSONRenderer(sort_keys=True)]


def _apply() -> None:
    global _applied
    structlog = _structlog()
    name = _level or os.environ.get("GATEWAY_LOG_LEVEL", "warning").upper()
    structlog.configure(
        processors=[*_stamps(structlog), *_rendering(structlog)],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, name, logging.WARNING)),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    _applied = True


class _Logger:
    """A module's logger: structlog's, made (and structlog configured) on its first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if not _applied:
            _apply()
        if self._logger is None:
            self._logger = _structlog().get_logger(self._name)
        return getattr(self._logger, method)


def get_logger(name: str) -> FilteringBoundLogger:
    """The logger of module `name` (`log = get_logger(__name__)`), which loads structlog only when it logs."""
    return _Logger(name)  # type: ignore[return-value]
