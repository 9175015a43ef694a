"""The webhook job: a recorded delivery is handled by the module of the forge that sent it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.domain.jobs import Job, JobStatus
from gateway.services.workspace import Workspace


def run_webhook_job(ws: Workspace, job: Job, runner: str,
                    progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], None]:
    """The job handler of webhook deliveries (see gateway/composition.py): GitLab's, or GitHub's."""
    if job.args.get("forge") == "gitlab":
        from gateway.services.forge.gitlab_webhooks import handle_delivery as handle_gitlab

        return JobStatus.SUCCEEDED, handle_gitlab(ws, job), None
    from gateway.services.forge.github_webhooks import handle_delivery

    return JobStatus.SUCCEEDED, handle_delivery(ws, job), None
