"""The workspace: settings, database, declaration repo and engine, wired once per process."""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gateway.adapters.engine_router import EngineByStack
from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.adapters.git_repo import GitDeclarationRepo
from gateway.adapters.hcl_sensitivity import declared_sensitive_variables
from gateway.adapters.records import SqlStore
from gateway.adapters.sandbox.engine import SandboxEngine
from gateway.adapters.sandbox.store import SqlSandboxStore
from gateway.adapters.sealing import Sealer
from gateway.adapters.sql_store import Database
from gateway.adapters.terraform import TerraformEngine, TerraformSetup
from gateway.config import Settings
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.scrubbing import Scrubber
from gateway.logs import install_log_scrubber
from gateway.ports import Engine, StackInputs

SAMPLES = {"sandbox": "sample_repo", "terraform": "sample_repo_terraform"}
SAMPLE_SECRETS = {  # None: generate a random value at init
    "sandbox": {"data": {"db_password": None}},
    "terraform": {"files": {"api_key": None}},
}


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


def open_workspace(settings: Settings) -> Workspace:
    """Connect to an initialised workspace; a missing one is a clear error, not a traceback."""
    if not settings.repo_path.exists():
        raise NotFound(f"no gateway workspace at {settings.home}: run `gateway init` first")
    db = Database(settings.db_url)
    db.migrate()
    return _wire(settings, db, GitDeclarationRepo(settings.repo_path))


def _wire(settings: Settings, db: Database, repo: GitDeclarationRepo) -> Workspace:
    sealer = Sealer.from_key_file(settings.data_key_path)
    sandbox = SqlSandboxStore(db, sealer)
    scrubber = Scrubber(known_secret_values(settings) if settings.scrub_known_secrets else ())
    install_log_scrubber(scrubber)
    simulator = SandboxEngine(sandbox)
    engines: dict[str, Engine] = {"sandbox": simulator, "terraform": TerraformEngine(terraform_setup(settings), sealer)}
    engine = EngineByStack(engines, lambda stack: _engine_name(settings.repo_path, stack))
    return Workspace(settings, db, SqlStore(db, scrubber, sealer), repo, engine, sandbox, scrubber, simulator)


def _engine_name(repo_path: Path, stack: str | None) -> str:
    """The engine main's gateway.yaml names for `stack` (the repo's default for None or an unknown stack).

    A git handle of its own: engines are shared across threads, GitPython handles are not.
    """
    settings = read_repo_settings(GitDeclarationRepo(repo_path))
    return settings.stacks[stack].engine if stack in settings.stacks else settings.engine


def read_repo_settings(repo: GitDeclarationRepo, ref: str | None = None) -> RepoSettings:
    """gateway.yaml as of `ref`, main by default (parsed once per content)."""
    return parse_repo_settings(repo.read_file(repo.resolve(ref or repo.main_branch()), "gateway.yaml"))


def terraform_setup(settings: Settings) -> TerraformSetup:
    """The binary and CLI config: from settings, else those `make terraform` installed, else `terraform` on PATH."""
    installed = Path(__file__).resolve().parents[2] / ".tools" / "terraform"
    binary = settings.terraform_bin or (installed / "bin" / "terraform" if (installed / "bin" / "terraform").exists()
                                        else Path(shutil.which("terraform") or "terraform"))
    config = settings.terraform_cli_config or (installed / "terraformrc" if (installed / "terraformrc").exists()
                                               else None)
    # where the Terraform sample's test provider keeps its objects, unless the environment says otherwise
    provider_env = {"SIM_PROVIDER_DIR": str(settings.home.resolve() / "sim-objects")}
    return TerraformSetup(binary, config, settings.terraform_dir, settings.terraform_timeout_seconds, provider_env)


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


def sample_repo_path(sample: str = "sandbox") -> Path:
    return Path(str(resources.files("gateway") / SAMPLES[sample]))


def create_workspace(settings: Settings, content: Path | None = None, sample: str = "sandbox") -> Workspace:
    """Create the workspace with a declaration repo (the sample one by default) and its secrets."""
    if settings.repo_path.exists():
        raise Conflict(f"a gateway workspace already exists at {settings.home}")
    source = content or sample_repo_path(sample)
    parse_repo_settings((source / "gateway.yaml").read_text())  # a bad gateway.yaml creates nothing
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.migrate()
    try:
        repo = GitDeclarationRepo.create(settings.repo_path, source)
    except Exception:
        shutil.rmtree(settings.repo_path, ignore_errors=True)
        raise
    settings.secrets_path.mkdir(mode=0o700, exist_ok=True)
    with SqlStore(db).session() as session:  # main as created: what later pushes to main are compared with
        session.set_marker("main_seen", repo.resolve(repo.main_branch()))
    for stack, values in SAMPLE_SECRETS[sample].items() if content is None else ():
        path = settings.secrets_path / f"{stack}.tfvars.json"
        resolved = {k: v or secrets.token_urlsafe(18) for k, v in values.items()}
        path.write_text(json.dumps(resolved))
        path.chmod(0o600)
    return _wire(settings, db, repo)
