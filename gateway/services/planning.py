"""Planning stacks at exact commits: the engine's truth, saved with its digest."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.domain.errors import NotFound
from gateway.domain.plan import Plan, canonical_json, load_plan, plan_digest
from gateway.domain.preview import Preview, build_preview
from gateway.services.ports import EnginePlan
from gateway.services.workspace import Workspace


@dataclass(frozen=True)
class StackPlanResult:
    stack: str
    sha: str
    engine_plan: EnginePlan
    plan: Plan
    digest: str

    @property
    def document_text(self) -> str:
        return canonical_json(self.engine_plan.document).decode()

    def summary(self) -> dict[str, Any]:
        return {
            "counts": {k.value: n for k, n in self.plan.counts().items()},
            "destructive": [rc.address for rc in self.plan.destructive],
            "drift": [rc.address for rc in self.plan.resource_drift],
        }

    def preview(self) -> Preview:
        return build_preview(self.plan)


def plan_stack(ws: Workspace, stack: str, ref: str) -> StackPlanResult:
    """Plan one stack of the declaration repo as of `ref`, with the workspace's engine."""
    sha = ws.repo.resolve(ref)
    settings = ws.repo_settings()
    if stack not in settings.stacks:
        known = ", ".join(sorted(settings.stacks))
        raise NotFound(f"unknown stack {stack!r} (stacks: {known})")
    with tempfile.TemporaryDirectory(prefix=f"gw-{stack}-") as tmp:
        directory = ws.repo.export(sha, settings.stacks[stack].path, Path(tmp) / stack)
        engine_plan = ws.engine.plan(stack, directory)
    plan = load_plan(engine_plan.document)
    return StackPlanResult(stack, sha, engine_plan, plan, plan_digest(engine_plan.document))
