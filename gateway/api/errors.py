"""One place that maps the gateway's errors to HTTP: routes never decide statuses themselves."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError

from gateway.domain.errors import (
    AuthError,
    BackendError,
    ConfigError,
    Conflict,
    GatewayError,
    InputError,
    LockTimeout,
    NotConfigured,
    NotFound,
    PlanError,
    PlanFormatError,
    Refused,
)

STATUS: list[tuple[type[GatewayError], int]] = [
    (NotFound, 404),
    (Conflict, 409),
    (PlanFormatError, 422),
    (ConfigError, 422),
    (InputError, 422),
    (AuthError, 401),
    (Refused, 403),
    (PlanError, 409),
    (LockTimeout, 409),
    (NotConfigured, 503),
    (BackendError, 503),
]


def status_for(exc: GatewayError) -> int:
    return next((status for cls, status in STATUS if isinstance(exc, cls)), 500)


def error_body(exc: GatewayError) -> dict[str, object]:
    body: dict[str, object] = {"error": type(exc).__name__, "detail": str(exc)}
    if isinstance(exc, Refused):
        body["reasons"] = exc.reasons
    return body


def invalid_request(exc: RequestValidationError) -> InputError:
    """FastAPI's validation errors as one InputError, so they take the one mapping (422, the documented body).

    Each error is named by where it is and what was wrong, never by the value sent: FastAPI's own handler
    echoes the input, and an input it cannot encode (NaN, Infinity, which Python's json reads although JSON
    allows neither) turned a bad request into a 500; a request body may also carry what is not ours to echo.
    """
    problems = [_problem(error) for error in exc.errors()]
    return InputError("the request is not valid: " + "; ".join(problems[:20])
                      + (f"; and {len(problems) - 20} more" if len(problems) > 20 else ""))


def _problem(error: Mapping[str, Any]) -> str:
    if error.get("type") == "json_invalid":  # its loc is ("body", character offset)
        position = error.get("loc", ("body", "?"))[-1]
        return f"the body is not JSON (at character {position}: {error.get('ctx', {}).get('error', 'malformed')})"
    where = ".".join(str(part) for part in error.get("loc", ())) or "the request"
    problem = f"{where}: {error.get('msg', 'not valid')}"
    if _holds_non_finite(error.get("input")):
        problem += " (NaN and Infinity, or a number too large for a float, are not numbers JSON allows)"
    return problem


def _holds_non_finite(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_holds_non_finite(v) for v in value.values())
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return any(_holds_non_finite(v) for v in value)
    return False
