"""Signing in to the pages: who an identity provider says someone is, and the session that follows.

An identity is named by a stable subject: an OpenID Connect issuer and its `sub`, or GitHub's numeric user id.
Never an e-mail address or a login alone: those are reassigned. An identity maps to a gateway principal only
through a link an admin made (or one an admission rule made, as a requester); the principal's roles and groups
stay the gateway's. When the provider sends groups (a configured claim), a decision counts only for the
principal's groups that the provider also names, the way a GitHub decision counts only for the teams the person
is in now.

A sign-in in progress waits server-side under its state, bound to the browser that started it, and is used once
(the cookie holds only a random key naming the browser). Anyone can send a callback, so the refusals they cause
are recorded a few at a time per kind and window, and the rest counted.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

GITHUB_ISSUER = "github"  # the issuer of GitHub identities (their subject is GitHub's numeric user id)
TOKEN_AUTH = "web-session"  # a page session opened with an API token (the name decisions had before sign-in)
SIGN_IN_FLOW_TIME = timedelta(minutes=10)  # from pressing "sign in" to the provider sending the person back
REFUSAL_WINDOW = timedelta(minutes=1)
REFUSALS_PER_WINDOW = 5  # of one kind (provider and check) recorded in the trail per window; the rest are counted


@dataclass(frozen=True)
class Identity:
    """Who a provider vouched for, after its answer was verified."""

    provider: str  # the configured provider's name: oidc, github
    issuer: str  # the OIDC `iss`, or GITHUB_ISSUER
    subject: str  # the OIDC `sub`, or GitHub's numeric id as text
    display: str  # a name to show (preferred_username, e-mail, login): never what the identity maps by
    email: str | None = None
    email_verified: bool = False
    groups: frozenset[str] | None = None  # the configured groups claim; None: the provider sends none
    claims_from: Mapping[str, str] = field(default_factory=dict)  # claim -> id_token | userinfo

    @property
    def auth_method(self) -> str:
        """How a decision made in this session was authenticated, as the trail records it."""
        return GITHUB_ISSUER if self.issuer == GITHUB_ISSUER else f"oidc:{self.issuer}"


@dataclass(frozen=True)
class AdmissionRule:
    """Who may come in without a link, as a requester: a verified e-mail domain, or a group the provider names."""

    domains: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def admits(self, identity: Identity) -> str | None:
        """Why the rule admits `identity` (None: it does not)."""
        if identity.email and identity.email_verified:
            domain = identity.email.rpartition("@")[2].lower()
            if domain in self.domains:
                return f"verified e-mail domain {domain}"
        named = sorted((identity.groups or frozenset()) & self.groups)
        if named:
            return f"group {named[0]}"
        return None


def counted_groups(principal_groups: Collection[str], claimed: Collection[str] | None) -> frozenset[str]:
    """The groups a session's decisions count for: the principal's, narrowed to those the provider names."""
    mine = frozenset(principal_groups)
    return mine if claimed is None else mine & frozenset(claimed)


@dataclass(frozen=True)
class WebSession:
    """A signed-in page session, kept server-side (the cookie holds only its random id)."""

    principal_id: str
    auth_method: str  # web-session (an API token), github, oidc:<issuer>
    claimed_groups: frozenset[str] | None  # what the provider said at sign-in (None: it says nothing of groups)
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None

    def refusal(self, now: datetime, principal_disabled: bool) -> str | None:
        """Why this session no longer signs anyone in (None: it does)."""
        if principal_disabled:  # first: a disabled person's sessions were ended too, and this is why
            return "your account is disabled; your session has ended"
        if self.ended_at is not None:
            return "your session has ended (signed out); sign in again"
        if now >= self.expires_at:
            return "your session expired; sign in again"
        return None


def suggested_name(identity: Identity) -> str:
    """A principal name for an admitted identity (letters, digits, '-', '_', '.'), before making it unique."""
    base = identity.display.partition("@")[0] if identity.display else ""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in base).strip("-.") or "person"
    return cleaned[:80]


def insecure_url(url: str) -> str | None:
    """Why secrets may not be sent to `url` (None: it is https, or plain http to this machine's loopback)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and _loopback(host):
        return None
    return f"{url} is not https (plain http only to this machine: 127.0.0.1, ::1, localhost)"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def combined_claims(id_token: Mapping[str, Any], userinfo: Mapping[str, Any] | None,
                    wanted: Sequence[Sequence[str]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The claims a sign-in reads, each group (e-mail with its verification) whole from the signed ID token when it
    has them, else from userinfo (a conformant provider puts them there when it issues an access token); and where
    each came from."""
    claims: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for group in wanted:
        for source, found in (("id_token", id_token), ("userinfo", userinfo or {})):
            if group[0] in found:
                for name in (n for n in group if n in found):
                    claims[name], sources[name] = found[name], source
                break
    return claims, sources


@dataclass(frozen=True)
class PendingSignIn:
    """A sign-in started here and not finished: kept server-side under the hash of its state, used once."""

    provider: str
    browser: str  # SHA-256 of the random key in the cookie of the browser that started it
    secrets: Mapping[str, str]  # nonce, code_verifier, redirect_uri: what the provider's answer is checked with
    started_at: datetime
    expires_at: datetime
    used_at: datetime | None = None


def state_refusal(flow: PendingSignIn | None, provider: str, browser: str | None, now: datetime) -> str | None:
    """Why a callback naming `flow` by its state may not finish it (None: it may, once)."""
    again = "; start again from the sign-in page"
    if flow is None:
        return f"this sign-in was not started here, or ended long ago (its state is unknown){again}"
    if browser is None or not secrets.compare_digest(browser, flow.browser):
        return f"this sign-in was not started in this browser (its state belongs to another){again}"
    if flow.provider != provider:
        return f"this sign-in was started with {flow.provider}, not {provider}{again}"
    if flow.used_at is not None:
        return f"this sign-in was already used (its state is spent){again}"
    if now >= flow.expires_at:
        minutes = int(SIGN_IN_FLOW_TIME.total_seconds() // 60)
        return f"this sign-in took longer than {minutes} minutes at the identity provider{again}"
    return None


@dataclass(frozen=True)
class RefusalTally:
    """The refusals of one kind (provider and check) in the current window, and those not recorded yet."""

    window_started_at: datetime
    recorded: int = 0
    unrecorded: int = 0  # refused since `unrecorded_since`, past the window's limit, not in the trail yet
    unrecorded_since: datetime | None = None


def tally_refusal(tally: RefusalTally | None, now: datetime) -> tuple[RefusalTally, dict[str, Any] | None]:
    """Count one more refusal: the tally after it, and what its trail event adds (None: it is only counted). The
    first refusal of a window records how many before it went unrecorded."""
    if tally is None or now >= tally.window_started_at + REFUSAL_WINDOW:
        missed = {} if tally is None or not tally.unrecorded else {
            "unrecorded_before": tally.unrecorded,
            "unrecorded_since": (tally.unrecorded_since or tally.window_started_at).isoformat()}
        return RefusalTally(now, 1), missed
    if tally.recorded < REFUSALS_PER_WINDOW:
        return replace(tally, recorded=tally.recorded + 1), {}
    return replace(tally, unrecorded=tally.unrecorded + 1, unrecorded_since=tally.unrecorded_since or now), None
