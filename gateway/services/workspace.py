"""The workspace: settings, database, declaration repo and engine, wired once per process."""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.adapters.git_repo import GitDeclarationRepo
from gateway.adapters.hcl_sensitivity import declared_sensitive_variables
from gateway.adapters.records import SqlStore
from gateway.adapters.sandbox.engine import SandboxEngine
from gateway.adapters.sandbox.store import SqlSandboxStore
from gateway.adapters.sql_store import Database
from gateway.config import Settings
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.scrubbing import Scrubber
from gateway.logs import install_log_scrubber
from gateway.services.ports import Engine, StackInputs

SAMPLE_SECRETS = {"data": {"db_password": None}}  # None: generate a random value at init


@dataclass
class Workspace:
    settings: Settings
    db: Database
    store: SqlStore
    repo: GitDeclarationRepo
    engine: Engine
    sandbox: SqlSandboxStore
    scrubber: Scrubber

    def repo_settings(self, ref: str | None = None) -> RepoSettings:
        """gateway.yaml as of `ref` (default: the main branch, whose rules bind every proposal)."""
        main = ref or self.main_branch()
        return parse_repo_settings(self.repo.read_file(self.repo.resolve(main), "gateway.yaml"))

    def main_branch(self) -> str:
        return str(self.repo.repo.head.reference.name) if not self.repo.repo.head.is_detached else "main"

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


def open_workspace(settings: Settings) -> Workspace:
    """Connect to an initialised workspace; a missing one is a clear error, not a traceback."""
    if not settings.repo_path.exists():
        raise NotFound(f"no gateway workspace at {settings.home}: run `gateway init` first")
    db = Database(settings.db_url)
    db.migrate()
    return _wire(settings, db, GitDeclarationRepo(settings.repo_path))


def _wire(settings: Settings, db: Database, repo: GitDeclarationRepo) -> Workspace:
    sandbox = SqlSandboxStore(db)
    scrubber = Scrubber(known_secret_values(settings) if settings.scrub_known_secrets else ())
    install_log_scrubber(scrubber)
    return Workspace(settings, db, SqlStore(db, scrubber), repo, SandboxEngine(sandbox), sandbox, scrubber)


def stack_secrets(settings: Settings, stack: str) -> dict[str, Any]:
    """Variable values kept outside the repo (e.g. passwords), by stack."""
    path = settings.secrets_path / f"{stack}.tfvars.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()))


def known_secret_values(settings: Settings) -> list[Any]:
    """Every value in the workspace's secrets, of every stack: what the last line of defence scrubs."""
    if not settings.secrets_path.is_dir():
        return []
    return [value for path in sorted(settings.secrets_path.glob("*.tfvars.json"))
            for value in json.loads(path.read_text()).values()]


def sample_repo_path() -> Path:
    return Path(str(resources.files("gateway") / "sample_repo"))


def create_workspace(settings: Settings, content: Path | None = None) -> Workspace:
    """Create the workspace with a declaration repo (the sample one by default) and its secrets."""
    if settings.repo_path.exists():
        raise Conflict(f"a gateway workspace already exists at {settings.home}")
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.migrate()
    try:
        repo = GitDeclarationRepo.create(settings.repo_path, content or sample_repo_path())
    except Exception:
        shutil.rmtree(settings.repo_path, ignore_errors=True)
        raise
    settings.secrets_path.mkdir(mode=0o700, exist_ok=True)
    for stack, values in SAMPLE_SECRETS.items():
        path = settings.secrets_path / f"{stack}.tfvars.json"
        resolved = {k: v or secrets.token_urlsafe(18) for k, v in values.items()}
        path.write_text(json.dumps(resolved))
        path.chmod(0o600)
    return _wire(settings, db, repo)
