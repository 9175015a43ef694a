"""The policy ports over their engines: checkov as a PolicyScanner, regopy as the PolicyEvaluator.

Each engine is imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.domain.policy import Finding, PolicyContext
from gateway.domain.rego import RegoPolicies
from gateway.ports import DeclarationRepo

if TYPE_CHECKING:
    from gateway.adapters.policy.rego import Evaluation


class CheckovScanner:
    def scan(self, document: Mapping[str, Any], context: PolicyContext) -> list[Finding]:
        from gateway.adapters.policy.checkov import run_checkov

        return run_checkov(document, context)


class RegoInterpreter:
    """Policies read once per git tree of `policies/`; each set evaluated by its own regopy process."""

    def load(self, repo: DeclarationRepo, sha: str) -> RegoPolicies | None:
        from gateway.adapters.policy.rego import load_policies

        return load_policies(repo, sha)  # type: ignore[arg-type]

    def evaluate(self, policies: RegoPolicies, input_document: Any, queries: Sequence[str]) -> Evaluation:
        from gateway.adapters.policy.rego import evaluator_for

        return evaluator_for(policies).evaluate(input_document, queries)
