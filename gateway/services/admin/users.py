"""Identities: adding people and agents, and authenticating a token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.domain.errors import AuthError, InputError, NotFound, Refused
from gateway.domain.permissions import Action, refusals, require
from gateway.domain.principals import (
    Credentials,
    Principal,
    PrincipalKind,
    Role,
    check_principal,
    hash_token,
    new_token,
)
from gateway.ports import UnitOfWork
from gateway.services.workspace import Configured, Records

LAST_USE_GRANULARITY = timedelta(minutes=1)  # a token's last use is written at most once a minute


def add_principal(ws: Configured, actor: Principal | None, name: str, roles: frozenset[Role],
                  groups: frozenset[str] = frozenset(), kind: PrincipalKind = PrincipalKind.PERSON,
                  acting_for: str | None = None) -> tuple[Principal, str]:
    """Create a principal and return it with its token, which is shown this once and stored hashed.

    The very first principal may be created without a token (bootstrap); after that only an admin can.
    An agent may be bound to the person it acts for (by name): an external agent's every call is then
    made for that person, and it cannot choose another.
    """
    check_principal(name, kind, roles)
    if acting_for is not None and kind != PrincipalKind.AGENT:
        raise InputError("only an agent acts for a person (--agent --for PERSON)")
    token = new_token()
    with ws.store.session() as session:
        if session.principals.count() > 0:
            if actor is None:
                raise AuthError("set GATEWAY_TOKEN to an admin's token to add users")
            require(actor, Action.ADD_USERS)
        person = session.principals.by_name(acting_for) if acting_for else None
        if acting_for is not None and (person is None or person.kind != PrincipalKind.PERSON):
            raise NotFound(f"no person {acting_for} for the agent to act for")
        if person is not None and refusals(person, Action.REQUEST):
            raise Refused([f"{person.name} may not request changes, so no agent may act for them"])
        principal = session.principals.add(name, kind, roles, groups, hash_token(token), person.id if person else None)
        session.principals.set_token_expiry(principal.id, _expiry(ws))
        session.audit.append(actor or principal, "principal.added", {
            "name": name, "kind": kind.value, "roles": sorted(roles), "groups": sorted(groups),
            "acting_for": acting_for})
    return principal, token


@dataclass(frozen=True)
class UserRecord:
    """What `gateway users list` shows of one principal: never a token, only when it expires and was last used."""

    principal: Principal
    token_expires_at: datetime | None
    last_used_at: datetime | None
    identities: tuple[tuple[str, str], ...]  # (issuer, subject) it signs in as


def list_users(ws: Records, actor: Principal) -> list[UserRecord]:
    """Every principal with its roles, groups, token expiry and sign-in identities, by name.

    What the trail records of every user, so it needs what reading the trail needs (auditors and admins): the
    same facts are in `principal.*` and `identity.*` events, which the API gives only to them.
    """
    require(actor, Action.READ_TRAIL)
    with ws.store.session(readonly=True) as session:
        records = []
        for principal in session.principals.list():
            credentials = session.principals.credentials(principal.id)
            records.append(UserRecord(principal, credentials.token_expires_at, credentials.last_used_at,
                                      tuple(session.sign_in.identities_of(principal.id))))
        return records


def authenticate(ws: Records, token: str | None) -> Principal:
    """The principal a token belongs to: not disabled, the token not expired; its last use is kept (to the minute),
    after the read has ended: a write never waits on a read its own thread holds open."""
    with token_read(ws, token) as (principal, used):
        pass
    if used is not None:
        record_use(ws, used)
    return principal


LastUse = tuple[str, datetime]  # a principal's id, and the moment its token was used


@contextmanager
def token_read(ws: Records, token: str | None) -> Iterator[tuple[Principal, LastUse | None]]:
    """`authenticate` without the write: the token's principal inside one read unit of work (which the caller's reads
    join), and its last use when that is to be recorded (`record_use`, once the read has ended; None: recorded
    within the minute)."""
    if not token:
        raise AuthError("no token: set GATEWAY_TOKEN (or send `Authorization: Bearer TOKEN`) to the token "
                        "`gateway users add` printed")
    with ws.store.session(readonly=True) as session:
        yield _checked(ws, session.principals.token_holder(hash_token(token.strip())))


def record_use(ws: Records, used: LastUse) -> None:
    """Keep a token's last use (a write: it may wait for the database's write lock)."""
    with ws.store.session() as session:
        session.principals.touch(*used)


def _checked(ws: Records, found: tuple[Principal, Credentials] | None
             ) -> tuple[Principal, LastUse | None]:
    """The token's holder if it may act, and (id, now) when its last use is to be recorded."""
    if found is None:
        raise AuthError("the token is not valid")
    principal, record = found
    if principal.disabled:
        raise AuthError(f"{principal.name} is disabled")
    moment = ws.clock.now()
    if record.token_expires_at is not None and record.token_expires_at <= moment:
        raise AuthError(f"the token of {principal.name} expired at {record.token_expires_at:%Y-%m-%d %H:%M} UTC; "
                        f"an admin runs `gateway users rotate-token {principal.name}`")
    if record.last_used_at is None or moment - record.last_used_at > LAST_USE_GRANULARITY:
        return principal, (principal.id, moment)
    return principal, None


# --- credentials with a lifecycle: every change by an admin, in the trail -------------------------


def disable_principal(ws: Records, actor: Principal, name: str, reason: str) -> Principal:
    """Nobody signs in as them any more, and their page sessions end; their approvals stop counting (an apply
    checks again)."""
    def disable(session: UnitOfWork, pid: str) -> None:
        session.principals.set_disabled(pid, ws.clock.now())
        if ended := session.sign_in.end_sessions_of(pid, ws.clock.now()):
            session.audit.append(actor, "sign_in.sessions_ended", {"name": name, "sessions": ended,
                                                                   "reason": "the principal was disabled"})

    return _change(ws, actor, name, "principal.disabled", {"reason": _why(reason)}, disable)


def enable_principal(ws: Records, actor: Principal, name: str, reason: str) -> Principal:
    return _change(ws, actor, name, "principal.enabled", {"reason": _why(reason)},
                   lambda session, pid: session.principals.set_disabled(pid, None))


def rotate_token(ws: Configured, actor: Principal, name: str) -> str:
    """A new token (shown this once); the old one stops working at once."""
    token = new_token()
    _change(ws, actor, name, "principal.token_rotated", {},
            lambda session, pid: session.principals.set_token(pid, hash_token(token), _expiry(ws)))
    return token


def revoke_token(ws: Records, actor: Principal, name: str, reason: str) -> Principal:
    """No token works for them until an admin rotates one."""
    return _change(ws, actor, name, "principal.token_revoked", {"reason": _why(reason)},
                   lambda session, pid: session.principals.set_token(pid, hash_token(new_token()), None))


def set_access(ws: Records, actor: Principal, name: str, roles: frozenset[Role] | None,
               groups: frozenset[str] | None) -> Principal:
    """Change someone's roles and/or approver groups."""
    with ws.store.session(readonly=True) as session:
        target = session.principals.by_name(name)
    if target is None:
        raise NotFound(f"no user {name}")
    new_roles = roles if roles is not None else target.roles
    check_principal(target.name, target.kind, new_roles)
    new_groups = groups if groups is not None else target.groups
    return _change(ws, actor, name, "principal.access_changed", {
        "roles": sorted(new_roles), "groups": sorted(new_groups),
        "was": {"roles": sorted(target.roles), "groups": sorted(target.groups)}},
        lambda session, pid: session.principals.set_access(pid, new_roles, new_groups))


def _change(ws: Records, actor: Principal, name: str, kind: str, payload: dict,
            write: Callable[[UnitOfWork, str], None]) -> Principal:
    """One admin's change to a user, with its event; never the last enabled admin away."""
    require(actor, Action.CHANGE_USERS)
    with ws.store.session() as session:
        target = session.principals.by_name(name)
        if target is None:
            raise NotFound(f"no user {name}")
        write(session, target.id)
        admins = session.principals.enabled_admins()
        if not admins:
            raise Refused([f"{name} is the last enabled admin: add another admin first"])
        session.audit.append(actor, kind, {"name": name, **payload})
        return session.principals.get(target.id)


def _why(reason: str) -> str:
    if not reason.strip():
        raise InputError("say why (-m)")
    return reason.strip()[:1000]


def _expiry(ws: Configured) -> datetime | None:
    days = ws.settings.token_ttl_days
    return ws.clock.now() + timedelta(days=days) if days else None


def authenticate_person(ws: Records, token: str | None) -> Principal:
    """Sign-in to the review pages: people only; an agent's token opens no session."""
    principal = authenticate(ws, token)
    require(principal, Action.SIGN_IN)
    return principal
