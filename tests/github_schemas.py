"""Check JSON bodies against the subsets of GitHub's REST and webhook descriptions in tests/fixtures/github.

The subsets are cut from octokit's packaging of GitHub's own descriptions by tools/extract_github_schemas.py and are
plain JSON Schema (draft 2020-12). Formats (date-time, uri, email, ...) are checked too.

    validate_rest_response("GET", "/repos/{owner}/{repo}/pulls/{pull_number}", 200, body)
    validate_rest_request("POST", "/repos/{owner}/{repo}/pulls", body)
    validate_webhook("pull_request_review", "submitted", payload)

Each raises AssertionError naming the operation or webhook and every mismatch (JSON path and reason).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs

FIXTURES = Path(__file__).parent / "fixtures" / "github"
REST_SUBSET = FIXTURES / "rest-subset.json"
WEBHOOKS_SUBSET = FIXTURES / "webhooks-subset.json"
SCHEMA_PREFIX = "#/components/schemas/"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_REPORTED_ERRORS = 10


@cache
def _subset(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def rest_operations() -> dict[str, Any]:
    """``"METHOD /path/{template}"`` -> ``{"operationId", "request", "responses": {status: schema | None}}``."""
    return _subset(REST_SUBSET)["operations"]


def webhook_keys() -> list[str]:
    """The webhooks the subset describes: ``"event.action"``, or ``"event"`` for events without actions."""
    return list(_subset(WEBHOOKS_SUBSET)["webhooks"])


@cache
def _validator(subset: Path, kind: str, key: str, part: str) -> jsonschema_rs.Validator:
    """A validator for one schema of a subset; its ``#/components/schemas/...`` references resolve in the subset."""
    document = _subset(subset)
    if kind == "component":
        schema: Any = {"$ref": SCHEMA_PREFIX + key}
    elif kind == "webhook":
        schema = document["webhooks"][key]
    elif part == "request":
        schema = document["operations"][key]["request"]
    else:
        schema = document["operations"][key]["responses"][part]
    root = {"$schema": DIALECT, "allOf": [schema], "components": document["components"]}
    return jsonschema_rs.validator_for(root, validate_formats=True)


def _check(validator: jsonschema_rs.Validator, instance: Any, what: str) -> None:
    errors = list(validator.iter_errors(instance))
    if not errors:
        return
    lines = [f"{what}: {len(errors)} schema mismatch(es)"]
    for error in errors[:MAX_REPORTED_ERRORS]:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.instance_path)
        lines.append(f"  at {where}: {_shorten(error.message)}  (schema {'/'.join(map(str, error.schema_path))})")
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"  ... and {len(errors) - MAX_REPORTED_ERRORS} more")
    raise AssertionError("\n".join(lines))


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _operation_key(method: str, path_template: str) -> str:
    key = f"{method.upper()} {path_template}"
    if key not in rest_operations():
        raise AssertionError(f"{key} is not in {REST_SUBSET.name}; add it to tools/extract_github_schemas.py")
    return key


def validate_rest_response(method: str, path_template: str, status: int, body: Any) -> None:
    """Check a response body against the REST description of ``method path_template`` for ``status``.

    A status the operation does not describe is checked as GitHub's generic error body when it is >= 400 and
    fails otherwise. A described status without content (e.g. 204) must have no body (``None``).
    """
    key = _operation_key(method, path_template)
    responses = rest_operations()[key]["responses"]
    what = f"{key} -> {status}"
    if str(status) not in responses:
        if status < 400:
            raise AssertionError(f"{what}: the description has no {status} response for this operation")
        error_schema = "validation-error" if status == 422 else "basic-error"
        _check(_validator(REST_SUBSET, "component", error_schema, ""), body, f"{what} ({error_schema})")
        return
    if responses[str(status)] is None:
        if status >= 400 and body is not None:
            # Described without content (e.g. "404: not a member"), yet GitHub sends its usual error body.
            _check(_validator(REST_SUBSET, "component", "basic-error", ""), body, f"{what} (basic-error)")
        elif body is not None:
            raise AssertionError(f"{what}: the description has no body for this status, got {_shorten(repr(body))}")
        return
    _check(_validator(REST_SUBSET, "operation", key, str(status)), body, what)


def validate_rest_request(method: str, path_template: str, body: Any) -> None:
    """Check a request body against the REST description of ``method path_template``."""
    key = _operation_key(method, path_template)
    if rest_operations()[key]["request"] is None:
        if body is not None:
            raise AssertionError(f"{key}: the description has no request body, got {_shorten(repr(body))}")
        return
    _check(_validator(REST_SUBSET, "operation", key, "request"), body, f"{key} request body")


def validate_webhook(event: str, action: str | None, payload: Any) -> None:
    """Check a webhook payload (X-GitHub-Event ``event``, body ``action``) against the webhook description."""
    key = event if action is None else f"{event}.{action}"
    if key not in _subset(WEBHOOKS_SUBSET)["webhooks"]:
        raise AssertionError(
            f"webhook {key} is not in {WEBHOOKS_SUBSET.name}; add it to tools/extract_github_schemas.py"
        )
    if isinstance(payload, dict) and action is not None and payload.get("action") != action:
        raise AssertionError(f"webhook {key}: payload action is {payload.get('action')!r}")
    _check(_validator(WEBHOOKS_SUBSET, "webhook", key, ""), payload, f"webhook {key}")
