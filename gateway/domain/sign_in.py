"""Signing in to the pages: who an identity provider says someone is, and the session that follows.

An identity is named by a stable subject: an OpenID Connect issuer and its `sub`, or GitHub's numeric user id.
Never an e-mail address or a login alone: those are reassigned. An identity maps to a gateway principal only
through a link an admin made (or one an admission rule made, as a requester); the principal's roles and groups
stay the gateway's. When the provider sends groups (a configured claim), a decision counts only for the
principal's groups that the provider also names, the way a GitHub decision counts only for the teams the person
is in now.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

GITHUB_ISSUER = "github"  # the issuer of GitHub identities (their subject is GitHub's numeric user id)
TOKEN_AUTH = "web-session"  # a page session opened with an API token (the name decisions had before sign-in)


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
