"""Parses `gateway.yaml` (raw, pydantic) into RepoSettings (valid, domain)."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.domain.breaker import BreakerSettings
from gateway.domain.drift import parse_interval
from gateway.domain.errors import ConfigError
from gateway.domain.notifications import Channel, ChannelKind, NotificationEvent, NotificationSettings, Route
from gateway.domain.policy import PolicySettings
from gateway.domain.repo_settings import (
    BreakGlassSettings,
    CloudFormationSettings,
    GitHubSettings,
    GitLabSettings,
    RepoSettings,
    StackSettings,
)

EngineName = Literal["sandbox", "terraform", "cloudformation"]


class _RawDrift(BaseModel):
    model_config = ConfigDict(extra="forbid")
    auto_revert: bool = Field(default=False, description="revert drift without a person's approval, when every "
                              "change is an in-place update of an unprotected resource")
    interval: str | None = Field(default=None, description="how often workers check the stack for drift, e.g. 6h")


class _RawCloudFormation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stack_name: str = Field(pattern=r"^[A-Za-z][-A-Za-z0-9]{0,127}$", description="the CloudFormation stack")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="its AWS region, e.g. eu-west-1")


class _RawStack(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    engine: EngineName | None = Field(default=None, description="this stack's engine; the repo's when unset")
    approvers: list[str] = Field(min_length=1)
    protected: list[str] = []
    policies: list[str] | None = Field(default=None, description="Rego packages for this stack; all when unset")
    drift: _RawDrift = _RawDrift()
    cloudformation: _RawCloudFormation | None = Field(default=None, description="engine: cloudformation: where "
                                                      "the stack lives in AWS")
    environment: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,40}$",
                                    description="an environment tag (production, staging...): auditors filter by it")
    after: list[str] = Field(default=[], description="stacks of this repository an apply that changes both applies "
                             "first (e.g. the network before the apps that read its outputs); a stack is also "
                             "applied after those whose state it reads (`data \"terraform_remote_state\"`)")


class _RawApprovals(BaseModel):
    model_config = ConfigDict(extra="forbid")
    required: int = Field(default=1, ge=1)
    protected_required: int = Field(default=2, ge=1)
    auto_apply: bool = False
    config_approvers: list[str] = []
    by_risk: dict[Literal["low", "medium", "high", "critical"], int] = {}


class _RawPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    owners: list[str] = []
    required_tags: list[str] = ["owner", "cost-centre"]
    approved_instance_types: list[str] = []
    max_deletes: int = Field(default=10, ge=0)
    agent_capacity_growth_percent: int = Field(default=50, ge=0)
    checkov: Literal["off", "warn", "deny"] = "warn"


class _RawGitHub(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repository: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", description="owner/name on GitHub")
    api_url: str = Field(default="https://api.github.com", pattern=r"^https?://",
                         description="GitHub Enterprise: https://HOST/api/v3")
    git_url: str | None = Field(default=None, description="where branches are pushed and fetched")
    teams: dict[str, str] = Field(default={}, description="approver group -> GitHub team slug")
    merge_method: Literal["merge", "squash", "rebase"] = "merge"


class _RawGitLab(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repository: str = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$",
                            description="the project's path on GitLab: group[/subgroup]/project")
    api_url: str = Field(default="https://gitlab.com", pattern=r"^https?://",
                         description="the GitLab instance (self-managed: https://HOST)")
    git_url: str | None = Field(default=None, description="where branches are pushed and fetched")
    groups: dict[str, str] = Field(default={}, description="approver group -> GitLab group path")


class _RawBreaker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    window_minutes: float = Field(default=5, gt=0, description="the sliding window agent changes are summed over")
    max_growth_percent: float = Field(default=100, gt=0, description="capacity agents may add in one window")
    max_destroy_count: int = Field(default=10, ge=0, description="resources agents may delete in one window")
    resetters: list[str] = Field(default=[], description="groups whose people may reset a tripped breaker")


class _RawBreakGlass(BaseModel):
    model_config = ConfigDict(extra="forbid")
    groups: list[str] = Field(default=[], description="people in these groups may open a break-glass window")
    codify_within: str = Field(default="24h", description="after a window closes, its drift is codified within this")
    max_window: str = Field(default="24h", description="the longest window one may open")


class _RawSlack(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: str | None = Field(default=None, description="post with chat.postMessage to this Slack channel (the "
                                "bot token is the gateway's setting); unset: the channel's incoming webhook")


class _RawEmail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: list[str] = Field(min_length=1, description="recipients; the SMTP server is the gateway's setting")


class _RawWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the URL and the HMAC key are the gateway's settings


class _RawChannel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    slack: _RawSlack | None = None
    email: _RawEmail | None = None
    webhook: _RawWebhook | None = None


class _RawRoute(BaseModel):
    model_config = ConfigDict(extra="forbid")
    groups: list[str] = Field(default=[], description="events concerning any of these groups; every event when unset")
    events: list[NotificationEvent] = Field(default=[], description="these events; all when unset")
    channels: list[str] = Field(min_length=1)


class _RawNotifications(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channels: dict[str, _RawChannel] = {}
    routes: list[_RawRoute] = []


class _RawSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engine: EngineName = Field(default="sandbox", description="sandbox (the simulator), terraform (the CLI) or "
                               "cloudformation (change sets)")
    approvals: _RawApprovals = _RawApprovals()
    stacks: dict[str, _RawStack] = Field(min_length=1)
    protected_paths: list[str] = ["gateway.yaml", "policies/", ".github/", "CODEOWNERS"]
    policy: _RawPolicy = _RawPolicy()
    forge: Literal["github", "gitlab"] | None = Field(default=None, description="where proposals become pull "
                                                      "requests (GitHub) or merge requests (GitLab)")
    propose_on_push: bool = Field(default=False, description="a push to the gateway's git endpoint opens or updates "
                                  "the proposal of the branch pushed")
    breaker: _RawBreaker = _RawBreaker()
    break_glass: _RawBreakGlass = _RawBreakGlass()
    github: _RawGitHub | None = None
    gitlab: _RawGitLab | None = None
    notifications: _RawNotifications = _RawNotifications()


# libyaml's parser where PyYAML was built with it (a tenth of the pure-Python parser's time; the same safe
# constructor and resolver, so the same document), else PyYAML's own.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def parse_repo_settings(text: str) -> RepoSettings:
    """Validate gateway.yaml; every problem is reported with the field it concerns.

    Cached by content: every request reads main's gateway.yaml, which rarely changes (the result is frozen).
    """
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise ConfigError(f"gateway.yaml is not valid YAML: {exc}") from None
    try:
        raw = _RawSettings.model_validate(data or {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"gateway.yaml: {problems}") from None
    if raw.forge == "github" and raw.github is None:
        raise ConfigError("gateway.yaml: forge: github needs a github: section with at least the repository")
    github = None
    if raw.forge == "github" and raw.github is not None:
        g = raw.github
        github = GitHubSettings(g.repository, g.api_url.rstrip("/"), g.git_url, dict(g.teams), g.merge_method)
    if raw.forge == "gitlab" and raw.gitlab is None:
        raise ConfigError("gateway.yaml: forge: gitlab needs a gitlab: section with at least the repository")
    gitlab = None
    if raw.forge == "gitlab" and raw.gitlab is not None:
        gl = raw.gitlab
        gitlab = GitLabSettings(gl.repository, gl.api_url.rstrip("/"), gl.git_url, dict(gl.groups))
    for name, s in raw.stacks.items():
        engine = s.engine or raw.engine
        if engine == "cloudformation" and s.cloudformation is None:
            raise ConfigError(f"gateway.yaml: stacks.{name}: engine cloudformation needs a cloudformation: section "
                              "with the stack_name and region")
        if engine != "cloudformation" and s.cloudformation is not None:
            raise ConfigError(f"gateway.yaml: stacks.{name}: a cloudformation: section is for engine cloudformation")
    _check_order({name: s.after for name, s in raw.stacks.items()})
    stacks = {
        name: StackSettings(name, s.path.rstrip("/"), frozenset(s.approvers), frozenset(s.protected),
                            s.engine or raw.engine, tuple(s.policies) if s.policies is not None else None,
                            s.drift.auto_revert,
                            parse_interval(s.drift.interval, f"gateway.yaml: stacks.{name}.drift.interval")
                            if s.drift.interval is not None else None,
                            CloudFormationSettings(s.cloudformation.stack_name, s.cloudformation.region)
                            if s.cloudformation is not None else None, s.environment, tuple(s.after))
        for name, s in raw.stacks.items()
    }
    break_glass = BreakGlassSettings(
        frozenset(raw.break_glass.groups),
        parse_interval(raw.break_glass.codify_within, "gateway.yaml: break_glass.codify_within"),
        parse_interval(raw.break_glass.max_window, "gateway.yaml: break_glass.max_window"))
    return RepoSettings(
        stacks=stacks,
        engine=raw.engine,
        required_approvals=raw.approvals.required,
        protected_required_approvals=max(raw.approvals.protected_required, raw.approvals.required),
        auto_apply=raw.approvals.auto_apply,
        protected_paths=tuple(raw.protected_paths),
        config_approver_groups=frozenset(raw.approvals.config_approvers),
        risk_approvals=dict(raw.approvals.by_risk),
        policy=PolicySettings(
            required_tags=tuple(raw.policy.required_tags),
            approved_instance_types=frozenset(raw.policy.approved_instance_types),
            max_deletes=raw.policy.max_deletes,
            agent_capacity_growth_percent=raw.policy.agent_capacity_growth_percent,
            owner_groups=frozenset(raw.policy.owners),
            checkov=raw.policy.checkov,
        ),
        github=github,
        gitlab=gitlab,
        propose_on_push=raw.propose_on_push,
        breaker=BreakerSettings(timedelta(minutes=raw.breaker.window_minutes), raw.breaker.max_growth_percent,
                                raw.breaker.max_destroy_count, frozenset(raw.breaker.resetters)),
        break_glass=break_glass,
        notifications=_notifications(raw.notifications),
    )


def _notifications(raw: _RawNotifications) -> NotificationSettings:
    """Named channels (exactly one kind each) and routes that name only channels defined here."""
    channels = {}
    for name, c in raw.channels.items():
        kinds = [kind for kind in ChannelKind if getattr(c, kind.value) is not None]
        if len(kinds) != 1:
            raise ConfigError(f"gateway.yaml: notifications.channels.{name}: say one of slack, email or webhook")
        channels[name] = Channel(name, kinds[0], tuple(c.email.to) if c.email else (),
                                 c.slack.channel if c.slack else None)
    for i, route in enumerate(raw.routes):
        unknown = sorted(set(route.channels) - set(channels))
        if unknown:
            raise ConfigError(f"gateway.yaml: notifications.routes.{i}.channels: no channel {', '.join(unknown)} "
                              f"(channels: {', '.join(sorted(channels)) or 'none'})")
    routes = tuple(Route(tuple(r.channels), frozenset(r.groups), frozenset(r.events)) for r in raw.routes)
    return NotificationSettings(channels, routes)


def _check_order(after: dict[str, list[str]]) -> None:
    """Each `after:` names a stack of the file, and the order has no cycle (one would leave no stack to go first)."""
    for name, before in after.items():
        for other in before:
            if other not in after or other == name:
                raise ConfigError(f"gateway.yaml: stacks.{name}.after: {other!r} is not another stack of this file "
                                  f"(stacks: {', '.join(sorted(after))})")
    placed: set[str] = set()
    while len(placed) < len(after):
        ready = [name for name, before in after.items() if name not in placed and set(before) <= placed]
        if not ready:
            cycle = sorted(set(after) - placed)
            raise ConfigError(f"gateway.yaml: the stacks' `after:` orders go round in a circle among {', '.join(cycle)}")
        placed.update(ready)
