"""Identities: adding people and agents, and authenticating a token."""

from __future__ import annotations

from gateway.domain.errors import AuthError, InputError, NotFound, Refused
from gateway.domain.principals import Principal, PrincipalKind, Role, check_principal, hash_token, new_token
from gateway.services.workspace import Workspace


def add_principal(ws: Workspace, actor: Principal | None, name: str, roles: frozenset[Role],
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
        if session.count_principals() > 0:
            if actor is None:
                raise AuthError("set GATEWAY_TOKEN to an admin's token to add users")
            if not actor.has_role(Role.ADMIN):
                raise Refused([f"{actor.name} is not an admin; only admins add users"])
        person = session.principal_by_name(acting_for) if acting_for else None
        if acting_for is not None and (person is None or person.kind != PrincipalKind.PERSON):
            raise NotFound(f"no person {acting_for} for the agent to act for")
        if person is not None and not person.roles & {Role.REQUESTER, Role.APPROVER, Role.ADMIN}:
            raise Refused([f"{person.name} may not request changes, so no agent may act for them"])
        principal = session.add_principal(name, kind, roles, groups, hash_token(token), person.id if person else None)
        session.append_event(actor or name, "principal.added", {
            "name": name, "kind": kind.value, "roles": sorted(roles), "groups": sorted(groups),
            "acting_for": acting_for})
    return principal, token


def authenticate(ws: Workspace, token: str | None) -> Principal:
    if not token:
        raise AuthError("no token: set GATEWAY_TOKEN (or send `Authorization: Bearer TOKEN`) to the token "
                        "`gateway users add` printed")
    with ws.store.session(readonly=True) as session:
        principal = session.principal_by_token_hash(hash_token(token.strip()))
    if principal is None:
        raise AuthError("the token is not valid")
    return principal


def authenticate_person(ws: Workspace, token: str | None) -> Principal:
    """Sign-in to the review pages: people only; an agent's token opens no session."""
    principal = authenticate(ws, token)
    if principal.is_agent:
        raise Refused([f"{principal.name} is an agent; agents cannot sign in to the review pages"])
    return principal
