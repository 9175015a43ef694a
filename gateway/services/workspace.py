"""The workspace: what every use case works through, wired once per process by gateway/composition.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.adapters.git_repo import GitDeclarationRepo
from gateway.adapters.hcl_sensitivity import declared_sensitive_variables
from gateway.adapters.sandbox.engine import SandboxEngine
from gateway.adapters.sandbox.store import SqlSandboxStore
from gateway.adapters.sql_store import Database
from gateway.adapters.store.unit_of_work import SqlStore
from gateway.config import Settings
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.repo_settings import GitHubSettings, RepoSettings
from gateway.domain.scrubbing import Scrubber
from gateway.ports import Clock, Engine, Forge, Signer, StackInputs

# A job's work: (workspace, job, runner, progress) -> (status, result, error)
JobHandler = Callable[["Workspace", Job, str, Callable[[str], None]], tuple[JobStatus, dict[str, Any], str | None]]

@dataclass
class Workspace:
    settings: Settings
    db: Database
    store: SqlStore
    repo: GitDeclarationRepo
    engine: Engine
    sandbox: SqlSandboxStore
    scrubber: Scrubber
    simulator: SandboxEngine  # the sandbox engine itself, for acting on the simulated cloud behind its back
    clock: Clock
    open_forge: Callable[[GitHubSettings], Forge]  # the code host main's gateway.yaml names
    job_handlers: Mapping[JobKind, JobHandler] = field(default_factory=dict)  # filled by the composition root
    signer: Signer | None = None  # the audit checkpoints' key (wired by the composition root)

    def repo_settings(self, ref: str | None = None) -> RepoSettings:
        """gateway.yaml as of `ref` (default: the main branch, whose rules bind every proposal)."""
        return read_repo_settings(self.repo, ref)

    def main_branch(self) -> str:
        return self.repo.main_branch()

    def main_sensitive_variables(self, stack: str) -> frozenset[str]:
        """The variables main declares sensitive in `stack`: a branch may add to them, never remove."""
        settings = self.repo_settings()
        path = settings.stacks[stack].path if stack in settings.stacks else None
        if path is None:
            return frozenset()
        return declared_sensitive_variables(self.repo.read_files(self.repo.resolve(self.main_branch()), path, ".tf"))

    def stack_inputs(self, stack: str) -> StackInputs:
        """The secrets the gateway supplies to `stack`; they and main's sensitive variables stay masked."""
        return StackInputs(stack_secrets(self.settings, stack), self.main_sensitive_variables(stack))

    def for_request(self) -> Workspace:
        """The same database and engine with its own git handle (GitPython's are not thread-safe)."""
        return replace(self, repo=GitDeclarationRepo(self.repo.path))

    def close(self) -> None:
        self.db.dispose()


def read_repo_settings(repo: GitDeclarationRepo, ref: str | None = None) -> RepoSettings:
    """gateway.yaml as of `ref`, main by default (parsed once per content)."""
    return parse_repo_settings(repo.read_file(repo.resolve(ref or repo.main_branch()), "gateway.yaml"))


def stack_secrets(settings: Settings, stack: str) -> dict[str, Any]:
    """Variable values kept outside the repo (e.g. passwords), by stack."""
    path = settings.secrets_path / f"{stack}.tfvars.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()))


