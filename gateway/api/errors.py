"""One place that maps the gateway's errors to HTTP: routes never decide statuses themselves."""

from __future__ import annotations

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
