"""The gateway's settings: one object, read from the environment once and passed down.

The environment is read here rather than by pydantic-settings, whose import (its sources, dotenv, typing machinery)
costs every command ~0.02 s of CPU: the same rules, in `environment_values`.
"""

from __future__ import annotations

import functools
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from gateway.domain.errors import ConfigError
from gateway.domain.repositories import DEFAULT_REPOSITORY
from gateway.domain.repositories import NAME as REPOSITORY_NAME

ENV_PREFIX = "GATEWAY_"


class ChannelSecret(BaseModel):
    """What a notification channel needs that the declaration repo must never hold, by the channel's name."""

    model_config = ConfigDict(extra="forbid")
    url: SecretStr | None = Field(default=None, description="a Slack incoming webhook's URL, or a webhook's receiver")
    key: SecretStr | None = Field(default=None, description="a webhook's HMAC-SHA256 key (X-Gateway-Signature-256)")
    token: SecretStr | None = Field(default=None, description="a Slack bot token, for chat.postMessage")

    def values(self) -> list[str]:
        return [s.get_secret_value() for s in (self.url, self.key, self.token) if s is not None]


class Settings(BaseModel):
    """`GATEWAY_*` environment variables; everything has a working default."""

    # As pydantic-settings had it: defaults validated too, a field also given by name when it has an alias.
    model_config = ConfigDict(extra="ignore", validate_default=True, populate_by_name=True)

    def __init__(self, **values: Any) -> None:
        """The settings the environment holds, under the ones given here (tables merged key by key). A value that
        does not validate is one ConfigError naming each setting and what is wrong, never the value (it may be a
        secret: a channel's URL under a misspelt key, a token in the wrong field)."""
        try:
            super().__init__(**merged(environment_values(type(self)), values))
        except ValidationError as exc:
            raise ConfigError("invalid settings: " + "; ".join(_refusal(type(self), e) for e in exc.errors())) from None

    home: Path = Field(default=Path(".gateway"), description="workspace: database, repo, secrets")
    repository: str | None = Field(default=None, description="the declaration repository a command works in "
                                   "(`gateway repos list`); unset: the one the workspace was made with")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in home when unset")
    token: SecretStr | None = Field(default=None, description="API token of the principal acting")
    lock_wait_seconds: float = Field(default=30.0, description="how long an apply waits for a stack lock")
    lock_ttl_seconds: float = Field(default=900.0, description="a lock older than this is presumed abandoned")
    worker_beat_seconds: float = Field(default=5.0, gt=0, description="how often a worker tells the registry it "
                                       "is alive; three beats missed and it is counted dead")
    model: str | None = Field(default=None, description="model name at the OpenAI-compatible endpoint (GATEWAY_MODEL)")
    openai_base_url: str | None = Field(default=None, validation_alias="OPENAI_BASE_URL")
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    session_secret: SecretStr | None = Field(default=None, description="key that signs session cookies")
    secure_cookies: bool = Field(default=False, description="send the session cookie over HTTPS only (also when "
                                 "public_url is https)")
    web_session_hours: float = Field(default=8.0, gt=0, description="a page session ends this long after sign-in")
    oidc_issuer: str | None = Field(default=None, description="OpenID Connect issuer URL (its discovery document "
                                    "is at ISSUER/.well-known/openid-configuration); unset: no OIDC sign-in")
    oidc_client_id: str | None = Field(default=None, description="the gateway's client id at the OIDC provider")
    oidc_client_secret: SecretStr | None = Field(default=None, description="its client secret (from the "
                                                 "environment or a secret store, never the repo)")
    oidc_label: str = Field(default="OpenID Connect", description="the provider's name on the sign-in page")
    oidc_scopes: str = Field(default="openid email profile", description="scopes asked for (openid is required)")
    oidc_groups_claim: str | None = Field(default=None, description="claim (ID token or userinfo) listing the groups: "
                                          "then a decision counts only for the gateway groups it names too")
    github_oauth_client_id: str | None = Field(default=None, description="GitHub OAuth app client id; unset: no "
                                               "GitHub sign-in")
    github_oauth_client_secret: SecretStr | None = Field(default=None, description="the OAuth app's client secret")
    github_oauth_url: str = Field(default="https://github.com", description="GitHub's web address (OAuth pages)")
    github_oauth_api_url: str = Field(default="https://api.github.com", description="GitHub's API (for /user)")
    sign_in_ca_bundle: Path | None = Field(default=None, description="CA bundle for the identity providers' TLS "
                                           "(default: the system's)")
    admit_domains: str = Field(default="", description="comma-separated e-mail domains whose verified, unlinked "
                               "identities are admitted as requesters")
    admit_groups: str = Field(default="", description="comma-separated provider groups whose unlinked members are "
                              "admitted as requesters")
    scrub_known_secrets: bool = Field(
        default=True, description="last line of defence: cut every known secret value out of all output; "
        "turn off only to prove that masking holds without it")
    terraform_bin: Path | None = Field(
        default=None, description="the terraform (or tofu) binary; default: `make terraform`'s, else on PATH")
    terraform_cli_config: Path | None = Field(
        default=None, description="Terraform CLI config (provider mirror); default: `make terraform`'s")
    terraform_timeout_seconds: float = Field(default=1800.0, gt=0, description="longest one terraform run may take")
    public_url: str = Field(default="http://127.0.0.1:8000", description="where people reach the review pages")
    github_token: SecretStr | None = Field(default=None, description="GitHub token (then commit statuses, not checks)")
    github_app_id: int | None = Field(default=None, description="GitHub App id (preferred: only an App writes checks)")
    github_app_private_key: SecretStr | None = Field(default=None, description="the App's PEM private key")
    github_app_private_key_file: Path | None = Field(default=None, description="... or a file holding it")
    github_installation_id: int | None = Field(
        default=None, description="the App's installation (unset: each repository's own, asked of GitHub)")
    github_api_url: str = Field(
        default="https://api.github.com", description="the GitHub whose App installation events add repositories "
        "(GitHub Enterprise: https://HOST/api/v3)")
    github_git_url: str | None = Field(
        default=None, description="where such a repository is cloned from, `{repository}` standing for owner/name "
        "(unset: GitHub's own address for it)")
    github_webhook_secret: SecretStr | None = Field(
        default=None, description="verifies X-Hub-Signature-256; the webhook route refuses to start without it")
    github_repositories: list[str] | None = Field(
        default=None, description='the GitHub repositories whose deliveries the webhook may admit, as a JSON list of '
        'owner/name patterns (`["acme/*"]`); others are refused and recorded (unset: any a gateway.yaml names)')
    github_write_interval_seconds: float = Field(
        default=1.0, ge=0, description="pause between writes to GitHub (its secondary rate limits)")
    gitlab_token: SecretStr | None = Field(default=None, description="GitLab access token (a project or group access "
                                           "token's bot, or a service account): scope api, role Developer or more")
    gitlab_webhook_secret: SecretStr | None = Field(
        default=None, description="the secret token GitLab sends as X-Gitlab-Token; the webhook route refuses to "
        "start without it")
    git_max_push_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description="the largest push the gateway's "
                                    "git endpoint accepts")
    token_ttl_days: float | None = Field(default=90.0, description="new tokens expire after this many days (unset: never)")
    mcp_calls_per_minute: int = Field(default=60, ge=1, description="calls one external agent may make a minute")
    read_threads: int | None = Field(
        default=None, ge=1, description="proposal reads one API process serves at once (unset: 1 on SQLite, "
        "2 on PostgreSQL, whose round trips wait); more threads than that only pass the GIL between them")
    agent_max_steps: int = Field(default=20, ge=1)
    agent_max_tokens: int = Field(default=200_000, ge=1000)
    agent_prompt_budget: int = Field(default=60_000, ge=2000, description="tokens one model request may carry; older "
                                     "file reads and previews are cut to short stubs to fit (GATEWAY_AGENT_PROMPT_BUDGET)")
    agent_turn_hold_seconds: float = Field(default=600, gt=0, description="how long a turn holds its conversation past "
                                           "its last model or tool call (a crashed turn lets go after this)")
    model_timeout: float = Field(default=120, gt=0, description="seconds one model call may take, its retries "
                                 "included: one deadline, never per attempt (GATEWAY_MODEL_TIMEOUT)")
    model_retries: int = Field(default=3, ge=0, le=10, description="retries of a failed model call, with "
                               "exponential backoff, within its timeout (GATEWAY_MODEL_RETRIES)")
    model_max_tokens: int = Field(default=4096, ge=16, description="the longest reply one model call may generate, "
                                  "sent as max_tokens; a reply cut off there stops the turn (GATEWAY_MODEL_MAX_TOKENS)")

    notification_channels: dict[str, ChannelSecret] = Field(
        default={}, description="each notification channel's secret by the name gateway.yaml gives it, as JSON: "
        '{"ops-slack": {"url": "https://hooks.slack.com/..."}, "hook": {"url": "https://...", "key": "..."}}')
    smtp_host: str | None = Field(default=None, description="the SMTP server e-mail notifications go through")
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_username: str | None = Field(default=None)
    smtp_password: SecretStr | None = Field(default=None)
    smtp_from: str = Field(default="change-gateway@localhost", description="the From: of e-mail notifications")
    smtp_ca_file: Path | None = Field(default=None, description="CA certificates the SMTP server's certificate is "
                                      "checked against (default: the system's)")
    smtp_starttls: bool = Field(default=True, description="refuse an SMTP server that does not offer STARTTLS")
    slack_api_url: str = Field(default="https://slack.com/api", description="where chat.postMessage is")
    notify_timeout_seconds: float = Field(default=10.0, gt=0, description="longest one delivery attempt may take")
    notify_retry_seconds: float = Field(default=5.0, gt=0, description="first wait after a failed delivery; doubles")
    notify_retry_max_seconds: float = Field(default=300.0, gt=0, description="longest wait between two attempts")
    notify_attempts: int = Field(default=10, ge=1, description="attempts before a delivery is reported failed")
    notify_max_age_seconds: float = Field(default=86400.0, gt=0, description="a delivery is given up after this long")

    module_registry_tokens: SecretStr | None = Field(
        default=None, description="tokens for private module registries, `host=token,host2=token2` (sent as a bearer "
        "token to that host only)")
    module_registry_hosts: str | None = Field(
        default=None, description="where a registry host's service discovery is served instead, "
        "`registry.terraform.io=https://mirror.internal` (a mirror, or the tests' loopback registry)")
    module_ca_bundle: Path | None = Field(
        default=None, description="PEM bundle trusted for registries, HTTP archives and git over HTTPS "
        "(default: the system's)")
    module_file_sources: bool = Field(
        default=False, description="allow `git::file://` module sources (off: a branch could read any repository "
        "on the gateway's host)")
    module_allowed_hosts: str | None = Field(
        default=None, description="hosts module sources may reach, comma-separated names, addresses or networks, "
        "each at one port: `host:port`, `[ipv6]:port`, 443 when none is named (default: registry.terraform.io and "
        "github.com at 443, github.com at 22; the configured registry hosts always, at their ports); a loopback, "
        "link-local or private address, or a name resolving to one, only when listed here with the port "
        "(`10.1.2.0/24`, `git.internal`, `127.0.0.1:8443`)")
    module_fetch_timeout_seconds: float = Field(
        default=120.0, gt=0, description="longest one module's fetch may take, start to end (the registry's answers "
        "and the package, or the git clone), however slowly a server sends")

    data_key_file: Path | None = Field(
        default=None, description="Fernet key sealing saved plans and the simulated cloud at rest (default: made in "
        "the workspace, 0600)")
    audit_signing_key_file: Path | None = Field(
        default=None, description="Ed25519 key that signs audit checkpoints (default: made in the workspace, 0600)")
    audit_checkpoint_minutes: float = Field(default=60.0, gt=0, description="how often workers sign a checkpoint")
    keys_dir: Path | None = Field(
        default=None, description="where the keys are kept (data.key, audit-signing.key, session.key) unless a "
        "setting names a file: apart from the workspace and the database they protect (default: the workspace)")
    tls_cert_file: Path | None = Field(default=None, description="`gateway serve` answers HTTPS with this "
                                       "certificate (PEM, chain included) and GATEWAY_TLS_KEY_FILE")
    tls_key_file: Path | None = Field(default=None, description="the private key of GATEWAY_TLS_CERT_FILE (PEM)")

    @field_validator("repository")
    @classmethod
    def _a_repository_name(cls, value: str | None) -> str | None:
        """A name as `gateway repos add` takes it: never a path (`../x` would reach outside the workspace)."""
        if value is not None and not REPOSITORY_NAME.match(value):
            raise ValueError(f"{value!r} is not a repository name (`gateway repos list` names them)")
        return value

    @field_validator("github_repositories")
    @classmethod
    def _owner_name_patterns(cls, value: list[str] | None) -> list[str] | None:
        """Each an `owner/name` pattern (`*` and `?` match within a name): a bare word would admit nothing."""
        for pattern in value or ():
            if pattern.count("/") != 1 or not all(pattern.split("/")):
                raise ValueError(f"{pattern!r} is not an owner/name pattern (e.g. acme/* or acme/infra)")
        return value

    @field_validator("github_git_url")
    @classmethod
    def _names_the_repository(cls, value: str | None) -> str | None:
        """A template every repository is cloned by: without `{repository}` all would be cloned from one place."""
        if value is not None and "{repository}" not in value:
            raise ValueError("must hold {repository} (owner/name), e.g. https://github.example.com/{repository}.git")
        return value

    @field_validator("public_url")
    @classmethod
    def _an_http_url(cls, value: str) -> str:
        """Links in comments and notifications, the MCP server's issuer: an http(s) URL with a host, else no start."""
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host, as people reach the gateway")
        return value.rstrip("/")

    @property
    def cookies_secure(self) -> bool:
        """Whether the session cookie carries the Secure flag: when configured, or when people reach us over TLS."""
        return (self.secure_cookies or self.public_url.lower().startswith("https://")
                or self.tls_cert_file is not None)

    @property
    def data_key_path(self) -> Path:
        return self.data_key_file or (self.keys_dir or self.home) / "data.key"

    @property
    def signing_key_path(self) -> Path:
        return self.audit_signing_key_file or (self.keys_dir or self.home) / "audit-signing.key"

    @property
    def session_key_path(self) -> Path:
        return (self.keys_dir or self.home) / "session.key"

    @property
    def db_url(self) -> str:
        return self.database_url or _sqlite_url(self.home.absolute())

    @property
    def read_lane_threads(self) -> int:
        """How many proposal reads one API process runs at once (see `read_threads`)."""
        return self.read_threads or (1 if self.db_url.startswith("sqlite") else 2)

    @property
    def repository_name(self) -> str:
        """The declaration repository this process works in (`repository`, else the one made with the workspace)."""
        return self.repository or DEFAULT_REPOSITORY

    @property
    def repo_path(self) -> Path:
        """The declaration repo (bare): people clone it, push branches and propose them. The workspace's first one
        is `declarations.git` in its home; each repository added later is in `repos/`."""
        name = self.repository_name
        return self.home / "declarations.git" if name == DEFAULT_REPOSITORY else self.home / "repos" / f"{name}.git"

    def in_repository(self, name: str) -> Settings:
        """The same settings, working in repository `name` (a ConfigError for what cannot be a repository's name)."""
        if not REPOSITORY_NAME.match(name):
            raise ConfigError(f"{name!r} is not a repository name (`gateway repos list` names them)")
        return self.model_copy(update={"repository": name})

    @property
    def module_cache(self) -> Path:
        """Remote module packages, one folder per (source, version), shared by every stack and engine."""
        return self.home / "modules"

    @property
    def terraform_dir(self) -> Path:
        """Per-stack local backend state and saved plan files of the terraform engine."""
        return self.home / "terraform"

    @property
    def secrets_path(self) -> Path:
        """Per-stack variable values that must never be committed (e.g. database passwords)."""
        return self.home / "secrets"


def environment_values(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's `GATEWAY_<NAME>` variable (or its alias), in any case, by field name: a string for pydantic to
    validate, or decoded from JSON for a table or a list (as pydantic-settings reads an environment)."""
    environment = {name.lower(): value for name, value in os.environ.items()}
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        variable = alias if isinstance(alias, str) else ENV_PREFIX + name
        value = environment.get(variable.lower())
        if value is None:
            continue
        if not _is_structured(field.annotation):
            found[name] = value
            continue
        try:
            found[name] = json.loads(value)
        except ValueError as exc:  # the message says where, never what: the value may hold secrets
            raise ConfigError(f"{variable.upper()} (the setting {name}) is not JSON: {exc}") from None
    return found


def _refusal(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """One validation error as `GATEWAY_X (the setting x) at key.sub: what is wrong`, without the input."""
    name, *inside = [str(part) for part in error["loc"]] or ["?"]
    field = model.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    variable = (alias if isinstance(alias, str) else ENV_PREFIX + name).upper()
    where = f" at {'.'.join(inside)}" if inside else ""
    return f"{variable} (the setting {name}){where}: {error['msg']}"


def _is_structured(annotation: Any) -> bool:
    """Whether a field's value is spelled as JSON in the environment: a dict, list, set, tuple or model, or an
    optional one."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_structured(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and (issubclass(origin, (dict, list, set, frozenset, tuple, BaseModel)))


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """BASE with OVER's values over it; where both hold a dict, the two merged the same way."""
    result = dict(base)
    for key, value in over.items():
        below = result.get(key)
        result[key] = merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return result


@functools.lru_cache(maxsize=64)
def _sqlite_url(home: Path) -> str:
    """The default database's URL, symlinks resolved once per home (every read of a proposal keys its caches by the
    URL, and resolving costs a system call per part of the path)."""
    return f"sqlite:///{home.resolve() / 'gateway.db'}"
