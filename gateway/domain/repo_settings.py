"""The validated settings of a declaration repo (from its `gateway.yaml`), as the core sees them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from gateway.domain.breaker import BreakerSettings
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.notifications import NotificationSettings
from gateway.domain.policy import PolicySettings
from gateway.domain.stack_order import order_stacks


@dataclass(frozen=True)
class CloudFormationSettings:
    """Where a `cloudformation` stack lives in AWS: main's settings, never a branch's."""

    stack_name: str
    region: str


@dataclass(frozen=True)
class StackSettings:
    name: str
    path: str  # directory in the repo, e.g. stacks/network
    approver_groups: frozenset[str]
    protected: frozenset[str] = frozenset()  # resource addresses whose destruction needs more approvers
    engine: str = "sandbox"  # sandbox | terraform | cloudformation
    policies: tuple[str, ...] | None = None  # the Rego packages judging this stack; None: every package
    auto_revert_drift: bool = False  # the gateway may revert drift here alone (in-place updates only)
    drift_interval: timedelta | None = None  # workers check this stack for drift this often (None: never alone)
    cloudformation: CloudFormationSettings | None = None  # engine: cloudformation only
    environment: str | None = None  # an environment tag (production, staging...) auditors filter the population by
    after: tuple[str, ...] = ()  # stacks an apply that changes both applies before this one


@dataclass(frozen=True)
class GitHubSettings:
    """The repo's pull requests live on GitHub (or GitHub Enterprise); credentials come from the gateway's settings."""

    repository: str  # owner/name
    api_url: str = "https://api.github.com"  # GitHub Enterprise: https://HOST/api/v3
    git_url: str | None = None  # where branches are pushed and fetched; derived from api_url when unset
    teams: Mapping[str, str] = field(default_factory=dict)  # approver group -> team slug in the repo's organisation
    merge_method: str = "merge"
    name = "GitHub"  # as people read it: "an approval on GitHub"
    team_word = "team"

    @property
    def owner(self) -> str:
        return self.repository.split("/", 1)[0]

    def clone_url(self) -> str:
        if self.git_url:
            return self.git_url
        api = self.api_url.rstrip("/")
        host = "https://github.com" if api == "https://api.github.com" else api.removesuffix("/api/v3")
        return f"{host}/{self.repository}.git"


@dataclass(frozen=True)
class GitLabSettings:
    """The repo's merge requests live on GitLab (GitLab.com or self-managed); credentials come from the settings."""

    repository: str  # the project's path with its namespace: group/subgroup/project
    api_url: str = "https://gitlab.com"  # the instance; python-gitlab adds /api/v4
    git_url: str | None = None  # where branches are pushed and fetched; derived from api_url when unset
    teams: Mapping[str, str] = field(default_factory=dict)  # approver group -> GitLab group path (`groups:`)
    name = "GitLab"
    team_word = "group"

    def clone_url(self) -> str:
        return self.git_url or f"{self.api_url.rstrip('/')}/{self.repository}.git"


ForgeSettings = GitHubSettings | GitLabSettings


@dataclass(frozen=True)
class BreakGlassSettings:
    """Who may open a break-glass window on a stack, and how soon after it the drift must be codified."""

    groups: frozenset[str] = frozenset()
    codify_within: timedelta = timedelta(hours=24)
    max_window: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class RepoSettings:
    stacks: Mapping[str, StackSettings]
    engine: str = "sandbox"
    required_approvals: int = 1
    protected_required_approvals: int = 2
    auto_apply: bool = False
    protected_paths: tuple[str, ...] = ("gateway.yaml", "policies/", ".github/", "CODEOWNERS")
    config_approver_groups: frozenset[str] = field(default_factory=frozenset)
    risk_approvals: Mapping[str, int] = field(default_factory=dict)  # risk level -> approvers needed
    policy: PolicySettings = field(default_factory=PolicySettings)
    github: GitHubSettings | None = None  # `forge: github`: proposals are pull requests there
    gitlab: GitLabSettings | None = None  # `forge: gitlab`: proposals are merge requests there
    propose_on_push: bool = False  # a push to the gateway's git endpoint opens or updates its branch's proposal
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    break_glass: BreakGlassSettings = field(default_factory=BreakGlassSettings)
    notifications: NotificationSettings = field(default_factory=NotificationSettings)  # who is told what
    repository: str | None = None  # a repository added to the gateway: its stacks are named `repository/stack`

    @property
    def forge(self) -> ForgeSettings | None:
        """The code host main names (`forge:`), whichever it is; None: the gateway's own review page."""
        return self.github or self.gitlab

    def require_stack(self, name: str) -> StackSettings:
        """The stack called `name` (in an added repository, `repo/stack`); an unknown name is refused, listing the
        stacks there are."""
        if name not in self.stacks:
            raise NotFound(f"unknown stack {name!r} (stacks: {', '.join(sorted(self.stacks))})")
        return self.stacks[name]

    def apply_order(self, stacks: Iterable[str], reads: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
        """`stacks` in the order an apply takes them: each after the stacks its `after:` names among them and (given
        `reads`, a stack -> the stacks whose state it reads, with why) the stacks whose state it reads, otherwise by
        name. Orders that go round in a circle are refused (gateway.yaml's own were refused when it was read)."""
        before: dict[str, dict[str, str]] = {
            name: {other: "`after:` in gateway.yaml" for other in stack.after} for name, stack in self.stacks.items()}
        for name, read in (reads or {}).items():
            before.setdefault(name, {}).update({o: why for o, why in read.items() if o not in before[name]})
        return order_stacks(stacks, before)

    def stack_for_path(self, path: str) -> StackSettings | None:
        for stack in self.stacks.values():
            if path == stack.path or path.startswith(stack.path.rstrip("/") + "/"):
                return stack
        return None

    def stacks_touched(self, paths: Iterable[str],
                       modules_of: Callable[[str], Iterable[str]] | None = None) -> list[str]:
        """The stacks a change to `paths` changes: their own files, or (given `modules_of`, a stack's path -> the
        local module directories it calls) the files of a module they call."""
        paths = list(paths)
        touched = {s.name for p in paths if (s := self.stack_for_path(p)) is not None}
        if modules_of is not None:
            for stack in self.stacks.values():
                if stack.name not in touched and any(
                        p.startswith(module.rstrip("/") + "/") for module in modules_of(stack.path) for p in paths):
                    touched.add(stack.name)
        return sorted(touched)

    def is_protected_path(self, path: str) -> bool:
        return any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.protected_paths)


def require_names_github(settings: RepoSettings, full_name: str) -> None:
    """Refuse a gateway.yaml that does not name GitHub repository `full_name` as its forge: a repository added for it
    would receive none of its deliveries (they are routed by what each main's gateway.yaml names)."""
    if settings.github is None or settings.github.repository.casefold() != full_name.casefold():
        raise Conflict(f"{full_name}'s main gateway.yaml does not name it as its forge (`forge: github` and "
                       f"`github: {{repository: {full_name}}}`): its deliveries would reach no repository")
