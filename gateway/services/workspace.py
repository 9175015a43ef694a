"""The workspace: what every use case works through, wired once per process by gateway/composition.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gateway.config import Settings
from gateway.domain.errors import NotConfigured, NotFound
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.principals import Actor
from gateway.domain.proposal import Proposal
from gateway.domain.repo_settings import ForgeSettings, RepoSettings
from gateway.domain.repositories import NAME as REPOSITORY_NAME
from gateway.domain.repositories import Repository
from gateway.domain.scrubbing import Scrubber
from gateway.ports import (
    NO_METRICS,
    Clock,
    DeclarationReader,
    DeclarationRepo,
    Engine,
    Forge,
    IdentityProvider,
    Metrics,
    NotificationSender,
    PolicyEvaluator,
    PolicyScanner,
    RemoteModules,
    Signer,
    SimulatedCloud,
    StackInputs,
    Store,
    WorkingCopies,
)

# A job's work: (workspace, job, runner, progress) -> (status, result, error)
JobHandler = Callable[["Workspace", Job, str, Callable[[str], None]], tuple[JobStatus, dict[str, Any], str | None]]



def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True)
class Reactions:
    """What other rooms do when the change room acts, wired by the composition root: the change room calls them and
    names none of the rooms that answer, so rooms depend one way (day_two, agents and forge on change, never back)."""

    applied: Callable[[Workspace, Proposal], object] = _nothing  # every stack applied: settle the drift it reverted
    recovering: Callable[[Workspace], list[str]] = lambda ws: []  # dead workers' work recovered: and their agent turns


class Records(Protocol):
    """What a use case on records alone takes: the store and the time. A use case takes the narrowest of these
    that holds what it touches (cosmicpython's handlers take their dependencies, not the bootstrap's bag); a
    `Workspace` is each of them, and a test may hand one a smaller thing."""

    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...


class Configured(Records, Protocol):
    """... and the gateway's own settings (never the declaration repo's)."""

    @property
    def settings(self) -> Settings: ...


class MainRules(Records, Protocol):
    """... and the declaration repo, whose main's gateway.yaml binds every proposal."""

    @property
    def repo(self) -> DeclarationRepo: ...
    def repo_settings(self, ref: str | None = None) -> RepoSettings: ...
    def main_branch(self) -> str: ...


class Signed(Configured, Protocol):
    """... and the audit checkpoints' key."""

    @property
    def signer(self) -> Signer | None: ...


class Identified(Configured, Protocol):
    """... and the identity providers people sign in with."""

    @property
    def identity_providers(self) -> Mapping[str, IdentityProvider]: ...


class Delivering(Configured, Protocol):
    """... and what sends notifications and counts them."""

    @property
    def notifier(self) -> NotificationSender | None: ...
    @property
    def metrics(self) -> Metrics: ...


@dataclass
class Workspace:
    settings: Settings
    store: Store
    repo: DeclarationRepo
    engine: Engine
    scrubber: Scrubber
    simulator: SimulatedCloud  # the sandbox's cloud, acted on behind the gateway's back
    clock: Clock
    open_forge: Callable[[ForgeSettings], Forge]  # the code host main's gateway.yaml names
    declarations: DeclarationReader  # what HCL declares, read without planning
    scanner: PolicyScanner  # checkov, beside the built-in rules
    rego: PolicyEvaluator  # main's Rego policies
    working_copies: WorkingCopies  # clones where agents edit
    open_checkpointer: Callable[[], AbstractContextManager[Any]]  # the agent graph's saved conversations
    job_handlers: Mapping[JobKind, JobHandler] = field(default_factory=dict)  # filled by the composition root
    reactions: Reactions = field(default_factory=Reactions)  # filled by the composition root
    signer: Signer | None = None  # the audit checkpoints' key (wired by the composition root)
    metrics: Metrics = NO_METRICS  # what operators count; the API and `gateway worker --metrics-port` wire Prometheus
    identity_providers: Mapping[str, IdentityProvider] = field(default_factory=dict)  # sign-in: oidc, github
    notifier: NotificationSender | None = None  # Slack, e-mail, webhooks (wired by the composition root)
    modules: RemoteModules | None = None  # remote module sources, resolved as `terraform init` resolves them
    # the workspace of another declaration repository of this gateway, sharing this one's database and engines
    # (wired by the composition root; None: this process serves one repository)
    open_repository: Callable[[str], Workspace] | None = None
    # add a declaration repository to the gateway: (who, its name, a folder of its files or a git checkout, the
    # GitHub repository its gateway.yaml must name or None) -> the one registered (wired by the composition root)
    add_repository: Callable[[Actor, str, Path, str | None], Repository] | None = None
    # what each repository's main gateway.yaml names on the forges, by (repository, main commit): shared by the
    # workspaces of every repository of the process, so routing a webhook delivery parses no gateway.yaml twice
    forge_names: dict[tuple[str, str], Any] = field(default_factory=dict)

    @property
    def repository(self) -> str:
        """The declaration repository this workspace works in."""
        return self.repo.repository

    def in_repository(self, name: str) -> Workspace:
        """The workspace of repository `name` (this one when it is this one's); a repository the gateway does not
        serve is a NotFound naming those it does."""
        if name == self.repository:
            return self
        if not REPOSITORY_NAME.match(name):  # a name, never a path: no repository is called that
            raise NotFound(f"no repository {name!r} in this gateway (a repository's name is lower case letters, "
                           "digits, '.', '_' or '-')")
        if self.open_repository is None:
            raise NotConfigured(f"this process serves repository {self.repository} only, not {name}")
        return self.open_repository(name)

    def for_proposal(self, proposal_id: int) -> Workspace:
        """The workspace of the repository proposal `proposal_id` changes (this one when there is no such proposal:
        reading it then says so)."""
        with self.store.session(readonly=True) as session:
            name = session.proposals.repository_of(proposal_id)
        return self if name is None else self.in_repository(name)

    def for_job(self, job: Job) -> Workspace:
        """The workspace of the repository the job works in (named in its arguments when not the default one)."""
        name = (job.args or {}).get("repository")
        return self.in_repository(str(name)) if name else self

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
        return self.declarations.sensitive_variables(self.repo.read_files(self.repo.resolve(self.main_branch()), path, ".tf"))

    def stack_inputs(self, stack: str) -> StackInputs:
        """The secrets the gateway supplies to `stack`; they and main's sensitive variables stay masked."""
        return StackInputs(stack_secrets(self.settings, stack), self.main_sensitive_variables(stack))

    def for_read(self) -> Workspace:
        """The same, for one read: git refs resolved once each, so the read shows one moment of them."""
        return replace(self, repo=self.repo.pinned())

    def for_request(self) -> Workspace:
        """The same database and engine with its own git handle (GitPython's are not thread-safe)."""
        return replace(self, repo=self.repo.reopen())

    def close(self) -> None:
        self.store.close()


def read_repo_settings(repo: DeclarationRepo, ref: str | None = None) -> RepoSettings:
    """gateway.yaml as of `ref`, main by default."""
    return repo.repo_settings(repo.resolve(ref or repo.main_branch()))


def stack_secrets(settings: Settings, stack: str) -> dict[str, Any]:
    """Variable values kept outside the repo (e.g. passwords), by stack."""
    path = settings.secrets_path / f"{stack}.tfvars.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()))


