"""Planning stacks at exact commits: the engine's truth, saved with its digest."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.adapters.checkov import run_checkov
from gateway.adapters.hcl_sensitivity import find_unmaskings
from gateway.domain.errors import NotFound
from gateway.domain.plan import Plan, canonical_json, load_plan, plan_digest
from gateway.domain.policy import Finding, PolicyContext, Severity, evaluate_plan
from gateway.domain.preview import Preview, build_preview
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.risk import Risk, RiskLevel, assess_risk
from gateway.services.ports import EnginePlan, StackInputs
from gateway.services.workspace import Workspace


@dataclass(frozen=True)
class StackPlanResult:
    stack: str
    sha: str
    engine_plan: EnginePlan
    plan: Plan
    digest: str
    findings: tuple[Finding, ...] = ()
    risk: Risk = Risk(RiskLevel.LOW, ())

    @property
    def document_text(self) -> str:
        return canonical_json(self.engine_plan.document).decode()

    def summary(self) -> dict[str, Any]:
        return {
            "counts": {k.value: n for k, n in self.plan.counts().items()},
            "destructive": [rc.address for rc in self.plan.destructive],
            "changed": [rc.address for rc in self.plan.changes],
            "drift": [rc.address for rc in self.plan.resource_drift],
            "risk": self.risk.to_json(),
            "findings": [f.to_json() for f in self.findings],
        }

    def preview(self) -> Preview:
        return build_preview(self.plan, findings=self.findings, risk=self.risk)


def plan_stack(ws: Workspace, stack: str, ref: str, proposed_by_agent: bool = False) -> StackPlanResult:
    """Plan one stack of the declaration repo as of `ref`, then judge it: policy findings and risk.

    The rules come from main's gateway.yaml, never from the branch being judged.
    """
    sha = ws.repo.resolve(ref)
    settings = ws.repo_settings()
    if stack not in settings.stacks:
        known = ", ".join(sorted(settings.stacks))
        raise NotFound(f"unknown stack {stack!r} (stacks: {known})")
    with tempfile.TemporaryDirectory(prefix=f"gw-{stack}-") as tmp:
        directory = ws.repo.export(sha, settings.stacks[stack].path, Path(tmp) / stack)
        return plan_directory(ws, settings, stack, directory, sha, proposed_by_agent)


def plan_directory(ws: Workspace, settings: RepoSettings, stack: str, directory: Path, sha: str,
                   proposed_by_agent: bool) -> StackPlanResult:
    """Plan one stack from files on disk (a commit's export or the agent's working copy) and judge it."""
    inputs = ws.stack_inputs(stack)
    engine_plan = ws.engine.plan(stack, directory, inputs)
    plan = load_plan(engine_plan.document)
    context = PolicyContext(stack, settings.policy, settings.stacks[stack].protected, proposed_by_agent)
    findings = (unmasking_findings(ws, stack, directory, inputs)
                + evaluate_plan(plan, context) + run_checkov(engine_plan.document, context))
    return StackPlanResult(stack, sha, engine_plan, plan, plan_digest(engine_plan.document, engine_plan.artifact),
                           tuple(findings), assess_risk(plan))


def unmasking_findings(ws: Workspace, stack: str, directory: Path, inputs: StackInputs) -> list[Finding]:
    """Deny findings for every place the stack's files try to show a secret in clear (by address, never value)."""
    files = {f"{directory.name}/{p.name}": p.read_text(encoding="utf-8")
             for p in sorted(directory.glob("*.tf")) if not p.is_symlink()}
    return [Finding("secret-unmasked", Severity.DENY, u.address, u.message, stack)
            for u in find_unmaskings(files, inputs.secret, inputs.sensitive_on_main, ws.engine.sensitive_attributes)]
