"""Policy engines: an external plan scanner (checkov) and main's Rego policies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gateway.domain.policy import Finding, PolicyContext
from gateway.domain.rego import RegoPolicies
from gateway.ports.repository import DeclarationRepo


class PolicyScanner(Protocol):
    def scan(self, document: Mapping[str, Any], context: PolicyContext) -> list[Finding]:
        """Findings of the plan's checks; a scanner that cannot run fails closed when the settings say deny."""
        ...


class PolicyEvaluation(Protocol):
    results: Mapping[str, Any]  # query -> its value
    errors: Mapping[str, str]  # query -> why it could not be evaluated
    module_errors: Mapping[str, str]  # file -> why it does not load


class PolicyEvaluator(Protocol):
    def load(self, repo: DeclarationRepo, sha: str) -> RegoPolicies | None:
        """The Rego policies under `policies/` at `sha` (None: there are none)."""
        ...

    def evaluate(self, policies: RegoPolicies, input_document: Any, queries: Sequence[str]) -> PolicyEvaluation: ...
