"""Main's Rego policies: judging a plan with them, running their unit tests, trying them on any plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.domain.plan import load_plan
from gateway.domain.policy import Finding, PolicyContext
from gateway.domain.rego import RegoPolicies, findings_from, masked_input, policy_error
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.repositories import unqualified
from gateway.domain.risk import Risk, assess_risk
from gateway.ports import StackInputs
from gateway.services.workspace import Workspace


def main_policies(ws: Workspace) -> RegoPolicies | None:
    """The policies in force: main's, never a branch's (a change to them is a proposal of its own)."""
    return ws.rego.load(ws.repo, ws.repo.resolve(ws.main_branch()))


def rego_findings(ws: Workspace, settings: RepoSettings, document: Mapping[str, Any], context: PolicyContext,
                  inputs: StackInputs, risk: Risk) -> list[Finding]:
    """What main's Rego policies say of the plan (its sensitive values masked); a policy that fails denies."""
    policies = main_policies(ws)
    if policies is None:
        return []
    stack = context.stack
    chosen = settings.stacks[stack].policies if stack in settings.stacks else None
    queries = policies.queries(chosen)
    unknown = sorted(set(chosen or ()) - set(policies.packages))
    # the repository's policies name its stacks as its gateway.yaml does (`network`, never `repo/network`)
    gateway_input = {"stack": unqualified(stack, ws.repository), "repository": ws.repository, "proposer_kind": "agent" if context.proposed_by_agent else "person",
                     "requester": context.requester, "changed_paths": list(context.changed_paths),
                     "risk": risk.to_json()}
    document_input = {**masked_input(document, inputs.secret), "gateway": gateway_input}
    evaluation = ws.rego.evaluate(policies, document_input, queries)
    findings = [policy_error(stack, path, error) for path, error in sorted(evaluation.module_errors.items())]
    findings += [policy_error(stack, f"gateway.yaml stacks.{stack}.policies",
                              f"no Rego package {package} on main: a policy the stack names is missing")
                 for package in unknown]
    for query in queries:
        if query in evaluation.errors:
            findings.append(policy_error(stack, query.removeprefix("data."), evaluation.errors[query]))
        else:
            findings += findings_from(stack, query, evaluation.results.get(query))
    return findings


@dataclass(frozen=True)
class TestOutcome:
    name: str  # PKG.test_RULE
    passed: bool
    error: str | None = None


def run_policy_tests(ws: Workspace, stack: str | None = None) -> list[TestOutcome]:
    """The `test_` rules of main's policies (of the stack's packages, with --stack), as `opa test` runs them."""
    policies = main_policies(ws)
    if policies is None:
        return []
    packages = None
    if stack is not None:
        settings = ws.repo_settings()
        settings.require_stack(stack)
        packages = settings.stacks[stack].policies
    tests = policies.tests(packages)
    evaluation = ws.rego.evaluate(policies, {}, tests)
    outcomes = [TestOutcome(path, False, f"does not load: {error}") for path, error in evaluation.module_errors.items()]
    for test in tests:
        name = test.removeprefix("data.")
        error = evaluation.errors.get(test)
        outcomes.append(TestOutcome(name, error is None and evaluation.results.get(test) is True, error))
    return outcomes


def evaluate_plan_document(ws: Workspace, document: Mapping[str, Any], stack: str, by_agent: bool = False) -> list[Finding]:
    """What main's Rego policies say of any plan, judged as a plan of `stack` (for people writing policies)."""
    settings = ws.repo_settings()
    settings.require_stack(stack)
    context = PolicyContext(stack, settings.policy, settings.stacks[stack].protected, by_agent)
    return rego_findings(ws, settings, document, context, ws.stack_inputs(stack), assess_risk(load_plan(document)))
