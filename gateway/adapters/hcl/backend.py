"""Where a stack's state lives, as its HCL declares it: the `backend` (or `cloud`) block, read without planning."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.domain.errors import ConfigError

CLOUD = "cloud"  # declared_backend's key for a `cloud` block (no backend type has that name)


def declared_backend(files: Mapping[str, str]) -> dict[str, Any] | None:
    """The `terraform { backend "TYPE" { ... } }` these files declare, as `{TYPE: {setting: value}}` (None: none).

    Backend settings are literals in Terraform (no variables), so they read as plain values. A `cloud` block
    (HCP Terraform, Terraform Cloud) reads as `{"cloud": {setting: value}}`: where the state lives, like a
    backend, so a branch that adds or drops one moves the state. Which engine can plan it is the engine's to say
    (this one refuses it, `refuse_cloud`; the sandbox plans it against its own state and says so).
    """
    from gateway.adapters.hcl.reading import documents_mentioning

    found: list[dict[str, Any]] = []
    for _, document in documents_mentioning(files, "backend", "cloud"):
        for block in document.get("terraform", []):
            for cloud in block.get("cloud", []):
                found.append({CLOUD: _literal(cloud)})
            for backend in block.get("backend", []):
                found.append({_literal(kind): _literal(settings) for kind, settings in backend.items()})
    if len(found) > 1:
        raise ConfigError("the stack declares more than one backend")
    return found[0] if found else None


def _literal(value: Any) -> Any:
    """python-hcl2's rendering of a literal (quoted strings, block markers) as the plain value."""
    if isinstance(value, str) and len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        return json.loads(value)
    if isinstance(value, dict):
        return {_literal(k): _literal(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value
