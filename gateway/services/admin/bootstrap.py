"""Starting the simulated cloud from the main branch, so a new workspace has something to change."""

from __future__ import annotations

import tempfile
from pathlib import Path

from gateway.domain.errors import ApplyError
from gateway.domain.principals import GATEWAY
from gateway.services.workspace import Workspace


def bootstrap_simulator(ws: Workspace) -> int:
    """Apply every stack of main to the simulated cloud; recorded in the trail as a bootstrap."""
    settings = ws.repo_settings()
    sha = ws.repo.resolve(ws.main_branch())
    created = 0
    for stack, stack_settings in sorted(settings.stacks.items()):
        with tempfile.TemporaryDirectory(prefix=f"gw-boot-{stack.replace('/', '-')}-") as tmp:
            directory = ws.repo.export_stack(sha, stack_settings.path, Path(tmp) / "repo")
            inputs = ws.stack_inputs(stack)
            plan = ws.engine.plan(stack, directory, inputs)
            outcome = ws.engine.apply(stack, directory, plan.document, plan.state_serial, inputs, plan.artifact)
        if not outcome.succeeded:
            raise ApplyError(f"bootstrap of stack {stack} failed: {outcome.error}")
        created += len(outcome.applied)
        with ws.store.session() as session:
            session.audit.append(GATEWAY, "simulator.bootstrapped", {
                "commit": sha, "applied": list(outcome.applied), "state_serial": outcome.state_serial,
                "note": "the simulated cloud starts with main applied; no real infrastructure exists"}, None, [stack])
    return created
