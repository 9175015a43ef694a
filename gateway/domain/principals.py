"""Who acts: people and agents, with roles and approver groups."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gateway.domain.errors import InputError

TOKEN_PREFIX = "gw_"


class Role(StrEnum):
    REQUESTER = "requester"
    APPROVER = "approver"
    AUDITOR = "auditor"
    ADMIN = "admin"


class PrincipalKind(StrEnum):
    PERSON = "person"
    AGENT = "agent"
    SYSTEM = "system"  # the gateway itself, for what a setting lets it do alone (an automatic drift revert)


AGENT_FORBIDDEN_ROLES = frozenset({Role.APPROVER, Role.ADMIN})
SYSTEM_NAME = "gateway"  # the gateway's own principal; nobody else may be called so
BUILTIN_AGENT_NAME = "gateway-agent"  # the built-in agent (its requests are the only agent runs the gateway holds)


@dataclass(frozen=True)
class Principal:
    id: str
    name: str
    kind: PrincipalKind
    roles: frozenset[Role]
    groups: frozenset[str] = frozenset()
    acting_for: str | None = None  # an agent's person (its id): whom every call of the agent is made for
    disabled: bool = False  # a disabled principal signs in nowhere and its approvals stop counting

    @property
    def is_agent(self) -> bool:
        return self.kind == PrincipalKind.AGENT

    def has_role(self, role: Role) -> bool:
        return role in self.roles


@dataclass(frozen=True)
class Credentials:
    """A principal's credential record: when disabled, when its token expires, when it was last used."""

    disabled_at: datetime | None = None
    token_expires_at: datetime | None = None
    last_used_at: datetime | None = None


@dataclass(frozen=True)
class SystemActor:
    """Who acts where no principal does: the gateway itself, GitHub or one of its accounts, a commit's author.

    It is named in the trail and on jobs; it holds no role, so it can never approve or apply.
    """

    name: str
    kind: PrincipalKind = PrincipalKind.SYSTEM


GATEWAY = SystemActor(SYSTEM_NAME)
GITHUB = SystemActor("github")
Actor = Principal | SystemActor  # whoever an event, a job or a transition is recorded as done by


def check_principal(name: str, kind: PrincipalKind, roles: frozenset[Role]) -> None:
    """Refuse a principal the rules forbid: an agent can never approve or administer."""
    if not name or len(name) > 100 or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise InputError(f"invalid name {name!r}: use letters, digits, '-', '_' or '.' (at most 100)")
    if name == SYSTEM_NAME and kind != PrincipalKind.SYSTEM:
        raise InputError(f"{SYSTEM_NAME!r} is the gateway's own name; choose another")
    if kind == PrincipalKind.AGENT and roles & AGENT_FORBIDDEN_ROLES:
        forbidden = ", ".join(sorted(roles & AGENT_FORBIDDEN_ROLES))
        raise InputError(f"an agent cannot hold the {forbidden} role")
    if not roles:
        raise InputError("a principal needs at least one role")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Tokens are 256-bit random strings, so one SHA-256 is enough to store them safely."""
    return hashlib.sha256(token.encode()).hexdigest()


def not_linked(host: str, login: str) -> str:
    """Why a code host's account counts for nothing: nobody linked it to a gateway person (`host`: GitHub, GitLab)."""
    return (f"{host} user {login} is not linked to a gateway person "
            f"(an admin runs `gateway users link NAME --{host.lower()} {login}`)")
