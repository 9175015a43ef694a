"""The composition root: the one place that names both the services and the adapters, and wires them.

`open_workspace` connects to an initialised workspace, `create_workspace` makes one; both hand the
services a `Workspace` of ports (the store, the declaration repo, the engines) and the job handlers
the workers dispatch to, so no service imports an adapter and `services/change/jobs.py` imports no handler.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import json
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import fault_points
from gateway.adapters.clock import SystemClock
from gateway.adapters.declarations import HclDeclarations
from gateway.adapters.engines.router import EngineByStack
from gateway.adapters.engines.sandbox.cloud import SandboxCloud
from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.sandbox.store import SqlSandboxStore
from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.adapters.git.repo import GitDeclarationRepo
from gateway.adapters.git.working_copy import GitWorkingCopies
from gateway.adapters.hcl.parsed_trees import keep_parsed_trees_in
from gateway.adapters.keyfiles import private_key_file
from gateway.adapters.modules.access import ModuleAccess
from gateway.adapters.modules.fetch import ModuleFetcher
from gateway.adapters.modules.installer import ModuleInstaller
from gateway.adapters.notifiers import ChannelSenders
from gateway.adapters.policy.engines import CheckovScanner, RegoInterpreter
from gateway.adapters.sealing import Sealer
from gateway.adapters.signing import FileSigner
from gateway.adapters.store.schema import Database
from gateway.adapters.store.unit_of_work import SqlStore
from gateway.config import Settings
from gateway.domain.errors import ConfigError, Conflict, NotConfigured, NotFound
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.principals import Actor
from gateway.domain.proposal import Proposal
from gateway.domain.repo_settings import (
    CloudFormationSettings,
    ForgeSettings,
    GitLabSettings,
    require_names_github,
)
from gateway.domain.repositories import DEFAULT_REPOSITORY, Repository, check_name, stack_prefix
from gateway.domain.scrubbing import Scrubber
from gateway.domain.sign_in import insecure_url
from gateway.logs import install_log_scrubber
from gateway.ports import Engine, Forge, IdentityProvider
from gateway.services.workspace import JobHandler, Reactions, Workspace, read_repo_settings

if TYPE_CHECKING:
    from gateway.adapters.engines.cloudformation.engine import CloudFormationEngine
    from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup
    from gateway.adapters.forges.github import GitHubCredentials
    from gateway.adapters.git.http_backend import GitHttpBackend
    from gateway.adapters.metrics import PrometheusMetrics

SAMPLES = {"sandbox": "sample_repo", "terraform": "sample_repo_terraform", "cloudformation": "sample_repo_cloudformation"}
SAMPLE_SECRETS = {  # None: generate a random value at init
    "sandbox": {"data": {"db_password": None}},
    "terraform": {"files": {"api_key": None}},
    "cloudformation": {"web": {"ApiKey": None}},
}




def github_credentials(settings: Settings) -> GitHubCredentials:
    """The GitHub App's or the token's credentials, from the settings (never from the declaration repo)."""
    from gateway.adapters.forges.github import GitHubCredentials

    s = settings
    key = s.github_app_private_key.get_secret_value() if s.github_app_private_key else None
    if key is None and s.github_app_private_key_file is not None:
        try:
            key = s.github_app_private_key_file.read_text()
        except OSError as exc:
            raise ConfigError(f"GATEWAY_GITHUB_APP_PRIVATE_KEY_FILE: {exc}") from exc
    return GitHubCredentials(s.github_token.get_secret_value() if s.github_token else None, s.github_app_id, key,
                             s.github_installation_id, s.github_write_interval_seconds)


_forges = threading.local()  # PyGithub clients are not shared between threads


def forge_opener(settings: Settings) -> Callable[[ForgeSettings], Forge]:
    """Opens the GitHub or GitLab client for main's `github:`/`gitlab:` settings: one per thread and repository."""
    def open_forge(forge_settings: ForgeSettings) -> Forge:
        key = (forge_settings.name, forge_settings.repository, forge_settings.api_url, forge_settings.clone_url(),
               str(settings.repo_path))
        cache: dict[tuple[str, ...], Any] = _forges.__dict__.setdefault("by_key", {})
        if key not in cache:
            cache[key] = _new_forge(settings, forge_settings)
        forge = cache[key]
        forge.settings = forge_settings  # team (group) mappings may have changed on main
        return forge  # type: ignore[no-any-return]

    return open_forge


def git_http_backend(settings: Settings) -> GitHttpBackend:
    """The declaration repo's git endpoint: `git http-backend` with the gateway's hooks (kept in its home)."""
    from gateway.adapters.git.http_backend import GitHttpBackend

    return GitHttpBackend(settings.repo_path, settings.home / "git-hooks")


def _new_forge(settings: Settings, forge_settings: ForgeSettings) -> Forge:
    """The client of one forge (PyGithub or python-gitlab imported only where that forge is configured)."""
    if isinstance(forge_settings, GitLabSettings):
        from gateway.adapters.forges.gitlab import GitLabForge

        if settings.gitlab_token is None:
            raise NotConfigured("GitLab has no credentials: set GATEWAY_GITLAB_TOKEN (an access token with the api "
                                "scope, of a bot or service account with the Developer role or more)")
        return GitLabForge(forge_settings, settings.gitlab_token.get_secret_value(), settings.repo_path)
    from gateway.adapters.forges.github import GitHubForge

    return GitHubForge(forge_settings, github_credentials(settings), settings.repo_path)


def job_handlers() -> dict[JobKind, JobHandler]:
    """What each kind of job runs; a handler's services are imported when a job first runs (a read runs none)."""
    return {kind: _on_first_job(kind) for kind in JobKind}


def reactions() -> Reactions:
    """What the day-two and agent rooms do when the change room applies or recovers (imported when first needed)."""

    def applied(ws: Workspace, proposal: Proposal) -> None:
        from gateway.services.day_two.drift_records import settle_drift_after_apply

        settle_drift_after_apply(ws, proposal)

    def recovering(ws: Workspace) -> list[str]:
        from gateway.services.agents.agent_runs import interrupt_abandoned_turns

        return interrupt_abandoned_turns(ws)

    return Reactions(applied=applied, recovering=recovering)


def _on_first_job(kind: JobKind) -> JobHandler:
    def run(ws: Workspace, job: Job, runner: str, progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], str | None]:
        return _handler_table()[kind](ws, job, runner, progress)

    return run


@functools.cache
def _handler_table() -> dict[JobKind, JobHandler]:
    """The handlers (imported here, not by the queue: handlers queue jobs themselves)."""
    from gateway.services.agents.agent_runs import run_agent_turn_job
    from gateway.services.change.jobs import run_apply_job, run_plan_job
    from gateway.services.change.plan_rounds import run_plan_stack_job
    from gateway.services.forge.deliveries import run_webhook_job
    from gateway.services.forge.github import run_publish_job
    from gateway.services.notifications.delivery import run_notify_job

    return {JobKind.PLAN: run_plan_job, JobKind.APPLY: run_apply_job, JobKind.PUBLISH: run_publish_job,
            JobKind.WEBHOOK: run_webhook_job, JobKind.AGENT_TURN: run_agent_turn_job, JobKind.NOTIFY: run_notify_job,
            JobKind.PLAN_STACK: run_plan_stack_job}


def open_workspace(settings: Settings, migrate: bool = True) -> Workspace:
    """Connect to an initialised workspace; a missing one is a clear error, not a traceback.

    Without `migrate` (a command that only reads) no migration runs: one read-only query finds the schema's
    version, and a database behind this gateway is refused with what to run, never upgraded by a read."""
    require_workspace(settings)
    db = Database(settings.db_url)
    if migrate:
        db.migrate()
    elif pending := db.pending_migrations():
        raise ConfigError(f"the database is behind this gateway: migration(s) {', '.join(map(str, pending))} not run, "
                          "and a read changes nothing; run `gateway migrate` (or any command that changes something)")
    return _wire(settings, db, GitDeclarationRepo(settings.repo_path, settings.repository_name))


def open_service_workspace(settings: Settings) -> Workspace:
    """The workspace of a long-running process (the API, `gateway worker`), opened without reaching the database:
    it starts whatever the database is doing, and brings it up (`services.admin.startup`) when it answers."""
    require_workspace(settings)
    return _wire(settings, Database(settings.db_url), GitDeclarationRepo(settings.repo_path, settings.repository_name))


def require_workspace(settings: Settings) -> None:
    """An initialised workspace this process may write; a clear error naming the path and the user otherwise."""
    if settings.home.is_dir():
        _require_writable(settings.home)
    if not settings.in_repository(DEFAULT_REPOSITORY).repo_path.exists():
        raise NotFound(f"no gateway workspace at {settings.home}: run `gateway init` first")
    if not settings.repo_path.exists():
        raise NotFound(f"no repository {settings.repository_name} in the gateway workspace at {settings.home} "
                       "(`gateway repos list`; `gateway repos add NAME` adds one)")


def _writable(folder: Path) -> bool:
    return os.access(folder, os.R_OK | os.W_OK | os.X_OK)


def _require_writable(folder: Path) -> None:
    """The workspace holds the declaration repo, the engines' state and caches (and SQLite's files): a process that
    cannot write it fails later with an unrelated-looking error, so it is refused here, saying what to change."""
    if _writable(folder):
        return
    where, uid, owner = folder.resolve(), os.getuid(), folder.stat().st_uid
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise ConfigError(f"the workspace {where} is not writable by this process (uid {uid}): it is on a read-only "
                          "filesystem; mount it read-write")
    raise ConfigError(f"the workspace {where} is not writable by this process (uid {uid}; the folder belongs to uid "
                      f"{owner}, mode {folder.stat().st_mode & 0o777:o}): give it to uid {uid} (chown -R {uid} "
                      f"{where}) or run the gateway as uid {owner}")


def migrate_workspace(settings: Settings) -> list[int]:
    """Run the migrations the workspace's database has not run; the versions it ran (none when it was current)."""
    require_workspace(settings)
    db = Database(settings.db_url)
    try:
        pending = db.pending_migrations()
        db.migrate()
    finally:
        db.dispose()
    return pending


def _wire(settings: Settings, db: Database, repo: GitDeclarationRepo) -> Workspace:
    keep_parsed_trees_in(settings.home / "parsed-hcl")  # content-addressed: shared by every process of this home
    sealer = Sealer.from_key_file(settings.data_key_path)
    sandbox = SqlSandboxStore(db, sealer)
    scrubber = Scrubber(known_secret_values(settings) if settings.scrub_known_secrets else ())
    install_log_scrubber(scrubber)
    simulator = SandboxEngine(sandbox)
    shared: dict[str, Callable[[], Engine]] = {  # each made, and imported, when a stack first needs it
        "sandbox": lambda: simulator, "terraform": functools.cache(lambda: terraform_engine(settings, sealer))}
    modules = module_installer(settings)
    ws = Workspace(
        settings=settings, store=SqlStore(db, scrubber, sealer, repo.repository), repo=repo,
        engine=_engines(shared, repo, modules), scrubber=scrubber,
        simulator=SandboxCloud(simulator, sandbox), clock=SystemClock(), open_forge=forge_opener(settings),
        declarations=HclDeclarations(), scanner=CheckovScanner(), rego=RegoInterpreter(),
        working_copies=GitWorkingCopies(settings.repo_path),
        open_checkpointer=lambda: _open_checkpointer(settings.db_url), job_handlers=job_handlers(),
        reactions=reactions(),
        signer=FileSigner(settings.signing_key_path), identity_providers=identity_providers(settings),
        notifier=ChannelSenders(settings), modules=modules)
    ws.open_repository = _repository_opener(ws, shared, modules)
    ws.add_repository = lambda actor, name, content, github: add_repository(ws, actor, name, content, github=github)
    return ws


def _engines(shared: dict[str, Callable[[], Engine]], repo: GitDeclarationRepo,
             modules: ModuleInstaller) -> EngineByStack:
    """The engines of one repository's stacks, as its main's gateway.yaml names them (the sandbox and Terraform
    shared by every repository: their state is kept by stack, and stacks are named by repository)."""
    main_settings = repo.reopen()  # reads only, from any thread (a libgit2 handle per thread)
    engines = {**shared, "cloudformation": lambda: cloudformation_engine(repo.reopen())}
    return EngineByStack(engines, lambda stack: _engine_name(main_settings, stack), modules)


def _repository_opener(base: Workspace, shared: dict[str, Callable[[], Engine]],
                       modules: ModuleInstaller) -> Callable[[str], Workspace]:
    """Opens the workspace of another repository of the gateway: the base's database, engines, module installer
    (the gateway's settings reach module sources, never a repository's) and keys, that repository's git, settings
    and records. Each one opened once per process; each call a git handle of its own."""
    opened: dict[str, Workspace] = {}
    lock = threading.Lock()

    def open_repository(name: str) -> Workspace:
        with lock:
            if name not in opened:
                settings = base.settings.in_repository(name)
                with base.store.session(readonly=True) as session:
                    known = session.repositories.get(name)
                if known is None or not settings.repo_path.exists():
                    names = ", ".join(sorted(r.name for r in _repositories(base) if r.active))
                    raise NotFound(f"no repository {name} in this gateway (repositories: {names})")
                repo = GitDeclarationRepo(settings.repo_path, name)
                opened[name] = replace(
                    base, settings=settings, store=base.store.for_repository(name), repo=repo,
                    engine=_engines(shared, repo, modules),
                    open_forge=forge_opener(settings), working_copies=GitWorkingCopies(settings.repo_path))
                opened[name].open_repository = open_repository
        return opened[name].for_request()

    base_name = base.repository
    opened[base_name] = base
    return open_repository


def _repositories(ws: Workspace) -> list[Repository]:
    with ws.store.session(readonly=True) as session:
        return session.repositories.list()


def identity_providers(settings: Settings) -> dict[str, IdentityProvider]:
    """The sign-in providers the settings configure (Authlib is imported only when one is)."""
    found: dict[str, IdentityProvider] = {}
    verify: Path | bool = settings.sign_in_ca_bundle or True
    if settings.oidc_issuer:
        if not settings.oidc_client_id or settings.oidc_client_secret is None:
            raise ConfigError("GATEWAY_OIDC_ISSUER is set but GATEWAY_OIDC_CLIENT_ID or GATEWAY_OIDC_CLIENT_SECRET "
                              "is not: set both (the secret from the environment, never the repo)")
        if "openid" not in settings.oidc_scopes.split():
            raise ConfigError(f"GATEWAY_OIDC_SCOPES {settings.oidc_scopes!r} lacks openid")
        _secure_url("GATEWAY_OIDC_ISSUER", settings.oidc_issuer)
        from gateway.adapters.identity_providers import OidcProvider

        found["oidc"] = OidcProvider(settings.oidc_issuer, settings.oidc_client_id,
                                     settings.oidc_client_secret.get_secret_value(), settings.oidc_label,
                                     settings.oidc_scopes, settings.oidc_groups_claim, verify)
    if settings.github_oauth_client_id:
        if settings.github_oauth_client_secret is None:
            raise ConfigError("GATEWAY_GITHUB_OAUTH_CLIENT_ID is set but GATEWAY_GITHUB_OAUTH_CLIENT_SECRET is not")
        _secure_url("GATEWAY_GITHUB_OAUTH_URL", settings.github_oauth_url)
        _secure_url("GATEWAY_GITHUB_OAUTH_API_URL", settings.github_oauth_api_url)
        from gateway.adapters.identity_providers import GitHubOAuthProvider

        found["github"] = GitHubOAuthProvider(settings.github_oauth_client_id,
                                              settings.github_oauth_client_secret.get_secret_value(),
                                              settings.github_oauth_url, settings.github_oauth_api_url, verify)
    return found


def _secure_url(setting: str, url: str) -> None:
    """A provider's address the client secret and tokens are sent to: https, or plain http on this machine only."""
    if insecure_url(url):
        raise ConfigError(f"{setting} {url!r} must be an https URL (plain http only to this machine: 127.0.0.1, ::1, "
                          f"localhost): the client secret and the tokens would cross the network in clear")


def install_prometheus(ws: Workspace) -> PrometheusMetrics:
    """Count this process's work in Prometheus' terms (the API, `gateway worker --metrics-port`); every other
    command keeps the no-op default and never imports prometheus_client. Before the job loops copy `ws`."""
    from gateway.adapters.metrics import PrometheusMetrics
    from gateway.services.admin.operations import read_gauges

    metrics = PrometheusMetrics(lambda: read_gauges(ws))
    ws.metrics = metrics
    if isinstance(ws.store, SqlStore):
        ws.store.metrics = metrics  # the trail's appends are counted where they commit
    return metrics


def _open_checkpointer(database_url: str) -> AbstractContextManager[Any]:
    from gateway.adapters.checkpoints import open_checkpointer  # LangGraph only where an agent runs

    return open_checkpointer(database_url)


def _engine_name(repo: GitDeclarationRepo, stack: str | None) -> str:
    """The engine main's gateway.yaml names for `stack` (the repo's default for None or an unknown stack)."""
    settings = read_repo_settings(repo)
    return settings.stacks[stack].engine if stack in settings.stacks else settings.engine


def module_installer(settings: Settings) -> ModuleInstaller:
    """Remote module sources, reached with the settings' credentials (never the declaration repo's)."""
    tokens = settings.module_registry_tokens.get_secret_value() if settings.module_registry_tokens else None
    access = ModuleAccess.from_settings(tokens, settings.module_registry_hosts, settings.module_ca_bundle,
                                        settings.module_file_sources, settings.module_fetch_timeout_seconds,
                                        settings.module_allowed_hosts)
    return ModuleInstaller(settings.module_cache, ModuleFetcher(access))


def terraform_engine(settings: Settings, sealer: Sealer) -> TerraformEngine:
    """The terraform engine (imported only when a stack first needs it)."""
    from gateway.adapters.engines.terraform.engine import TerraformEngine

    return TerraformEngine(terraform_setup(settings), sealer)


def cloudformation_engine(repo: GitDeclarationRepo) -> CloudFormationEngine:
    """The cloudformation engine (imported only when a stack first needs it), from the `cloudformation` extra."""
    missing = [name for name in ("boto3", "cfnlint") if importlib.util.find_spec(name) is None]
    if missing:
        raise NotConfigured("the cloudformation engine is not installed here (no " + ", ".join(missing) + "): "
                            "pip install 'change-gateway[cloudformation]', or build the image with "
                            "--build-arg ENGINE=cloudformation")
    from gateway.adapters.engines.cloudformation.engine import CloudFormationEngine

    return CloudFormationEngine(lambda stack: _cloudformation_settings(repo, stack))


def _cloudformation_settings(repo: GitDeclarationRepo, stack: str) -> CloudFormationSettings:
    """Where main's gateway.yaml says the stack lives in AWS (a branch cannot point the gateway elsewhere)."""
    settings = read_repo_settings(repo)
    stack_settings = settings.stacks.get(stack)
    if stack_settings is None or stack_settings.cloudformation is None:
        raise ConfigError(f"stack {stack} has no cloudformation settings on main (stack_name, region)")
    return stack_settings.cloudformation


def terraform_setup(settings: Settings) -> TerraformSetup:
    """The binary and CLI config: from settings, else those `make terraform` installed, else `terraform` on PATH."""
    installed = Path(__file__).resolve().parents[1] / ".tools" / "terraform"
    binary = settings.terraform_bin or (installed / "bin" / "terraform" if (installed / "bin" / "terraform").exists()
                                        else Path(shutil.which("terraform") or "terraform"))
    config = settings.terraform_cli_config or (installed / "terraformrc" if (installed / "terraformrc").exists()
                                               else None)
    from gateway.adapters.engines.terraform.engine import TerraformSetup

    # where the Terraform sample's test provider keeps its objects, unless the environment says otherwise
    provider_env = {"SIM_PROVIDER_DIR": str(settings.home.resolve() / "sim-objects")}
    return TerraformSetup(binary, config, settings.terraform_dir, settings.terraform_timeout_seconds, provider_env)


def known_secret_values(settings: Settings) -> list[Any]:
    """Every value in the workspace's secrets, of every stack, the notification channels' secrets, the sign-in
    client secrets and the module registries' tokens: what the last line of defence scrubs."""
    channels = [value for secret in settings.notification_channels.values() for value in secret.values()]
    if settings.smtp_password is not None:
        channels.append(settings.smtp_password.get_secret_value())
    channels += [s.get_secret_value() for s in (settings.oidc_client_secret, settings.github_oauth_client_secret,
                                                settings.gitlab_token, settings.gitlab_webhook_secret) if s]
    tokens = settings.module_registry_tokens.get_secret_value() if settings.module_registry_tokens else ""
    channels += ModuleAccess.from_settings(tokens, None, None, False).tokens.values()
    if not settings.secrets_path.is_dir():
        return channels
    return [value for path in sorted(settings.secrets_path.rglob("*.tfvars.json"))
            for value in json.loads(path.read_text()).values()] + channels


def session_secret(settings: Settings) -> str:
    """The key that signs the pages' cookies: from the environment, or made once and kept with the other keys."""
    if settings.session_secret:
        return settings.session_secret.get_secret_value()
    return private_key_file(settings.session_key_path, lambda: secrets.token_urlsafe(48).encode(),
                            "session key").decode()


def make_keys(settings: Settings) -> None:
    """Every key kept in a file, made with the workspace, so processes that only read them (the API and workers of
    an image, with the keys' volume mounted read-only) find them there."""
    Sealer.from_key_file(settings.data_key_path)
    FileSigner(settings.signing_key_path).public_key()
    session_secret(settings)


def sample_repo_path(sample: str = "sandbox") -> Path:
    return Path(str(resources.files("gateway") / SAMPLES[sample]))


def add_repository(ws: Workspace, actor: Actor, name: str, content: Path | None = None,
                   sample: str = "sandbox", *, github: str | None = None) -> Repository:
    """Add declaration repository `name` to the gateway: a bare repository in the workspace's `repos/` whose main is
    `content` (a folder's files as its first commit, a git checkout's HEAD with its history; the sample by default),
    registered and recorded; nothing is left of it if a step fails. `github`: the GitHub repository it is added for,
    which its gateway.yaml must name as its forge.

    A process killed between making the bare repository and registering it leaves it behind, marked as the gateway's
    own unfinished work (`GitDeclarationRepo.left_unfinished`): adding the name again begins it anew. A folder
    without that mark is someone else's, refused and left alone."""
    from gateway.services.admin.repositories import add_repository as register

    check_name(name)
    settings = ws.settings.in_repository(name)
    source = content or sample_repo_path(sample)
    if not (source / "gateway.yaml").is_file():
        raise NotFound(f"{source} holds no gateway.yaml: a declaration repository starts with one")
    rules = parse_repo_settings((source / "gateway.yaml").read_text())  # a bad gateway.yaml creates nothing
    if github is not None:  # added for a GitHub repository: its deliveries are routed by what gateway.yaml names
        require_names_github(rules, github)
    made = False  # only what this call made is taken away when a later step fails

    def create() -> str:
        nonlocal made
        if settings.repo_path.exists():
            if not GitDeclarationRepo.left_unfinished(settings.repo_path, name):
                raise Conflict(f"{settings.repo_path} exists but is not a registered repository: move it away first")
            shutil.rmtree(settings.repo_path)  # an earlier add of this name, killed before it registered it
        made = True
        repo = GitDeclarationRepo.create(settings.repo_path, source, repository=name, adding=True)
        if content is None:
            _sample_secrets(settings, sample, stack_prefix(name))
        fault_points.reach("add_repository.after_create")
        return repo.resolve(repo.main_branch())

    settings.repo_path.parent.mkdir(parents=True, exist_ok=True)
    with _adding_repositories(settings.repo_path.parent):
        try:
            added = register(ws, actor, name, create)
        except BaseException:
            if made and not _registered(ws, name):
                shutil.rmtree(settings.repo_path, ignore_errors=True)
            raise
    GitDeclarationRepo(settings.repo_path, name).finish_adding()
    return added


@contextmanager
def _adding_repositories(folder: Path) -> Iterator[None]:
    """One `gateway repos add` at a time on this machine: another's unfinished repository is its work in progress,
    not a leftover to begin again."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # and the lock with it


def _registered(ws: Workspace, name: str) -> bool:
    with ws.store.session(readonly=True) as session:
        return session.repositories.get(name) is not None


def _sample_secrets(settings: Settings, sample: str, prefix: str = "") -> None:
    """The sample's secrets (random values) in the workspace's secrets, never in the repository."""
    settings.secrets_path.mkdir(mode=0o700, exist_ok=True)
    for stack, values in SAMPLE_SECRETS[sample].items():
        path = settings.secrets_path / f"{prefix}{stack}.tfvars.json"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        resolved = {k: v or secrets.token_urlsafe(18) for k, v in values.items()}
        path.write_text(json.dumps(resolved))
        path.chmod(0o600)


def create_workspace(settings: Settings, content: Path | None = None, sample: str = "sandbox") -> Workspace:
    """Create the workspace with a declaration repo (the sample one by default) and its secrets."""
    settings = settings.in_repository(DEFAULT_REPOSITORY)
    if settings.home.is_dir():
        _require_writable(settings.home)
    if settings.repo_path.exists():
        raise Conflict(f"a gateway workspace already exists at {settings.home}")
    source = content or sample_repo_path(sample)
    parse_repo_settings((source / "gateway.yaml").read_text())  # a bad gateway.yaml creates nothing
    settings.home.mkdir(parents=True, exist_ok=True)
    make_keys(settings)
    db = Database(settings.db_url)
    db.migrate()
    try:
        repo = GitDeclarationRepo.create(settings.repo_path, source)
    except Exception:
        shutil.rmtree(settings.repo_path, ignore_errors=True)
        raise
    settings.secrets_path.mkdir(mode=0o700, exist_ok=True)
    with SqlStore(db).session() as session:  # main as created: what later pushes to main are compared with
        session.main.set_marker("main_seen", repo.resolve(repo.main_branch()))
    if content is None:
        _sample_secrets(settings, sample)
    return _wire(settings, db, repo)
