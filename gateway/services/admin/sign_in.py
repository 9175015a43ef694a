"""Signing in to the pages: with an identity provider (OIDC, GitHub) or an API token, into a server-side session.

A sign-in in progress waits server-side under the hash of its state, bound to the browser that started it (by a
random key in its cookie), and is used once, whatever the outcome; a person may have several at once (tabs).
Refusals are recorded (`sign_in.refused`, naming the failed check), the first few of each kind per minute: anyone
can send a callback, and the rest are counted into the next one recorded. Every session's end is recorded; a
decision made in a session records how it was authenticated (`oidc:<issuer>`, `github`, `web-session`) and, when
the provider names groups, which of the person's groups it counted for (`sign_in.group_check`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta

from gateway.domain.errors import AuthError, InputError, NotFound, SignInRefused
from gateway.domain.permissions import Action, refusals, require
from gateway.domain.principals import GATEWAY, Principal, PrincipalKind, Role, hash_token, new_token
from gateway.domain.proposal import Decision
from gateway.domain.sign_in import (
    GITHUB_ISSUER,
    SIGN_IN_FLOW_TIME,
    TOKEN_AUTH,
    AdmissionRule,
    Identity,
    PendingSignIn,
    WebSession,
    counted_groups,
    state_refusal,
    tally_refusal,
)
from gateway.domain.sign_in import suggested_name as _suggested_name
from gateway.ports import IdentityProvider, UnitOfWork
from gateway.services.admin.users import authenticate_person
from gateway.services.workspace import Configured, Identified, Records, Workspace


@dataclass(frozen=True)
class SignedIn:
    """The person of a page request: their principal (groups as their session counts them) and how they signed in."""

    principal: Principal
    auth_method: str
    claimed_groups: frozenset[str] | None  # what the provider named at sign-in (None: it names no groups)


def provider_choices(ws: Identified) -> list[tuple[str, str]]:
    """(name, label) of each configured provider, for the sign-in page."""
    return [(p.name, p.label) for p in ws.identity_providers.values()]


def start_sign_in(ws: Identified, provider: str, redirect_uri: str, browser_key: str) -> str:
    """Where to send the person to sign in with `provider`; what its callback must match waits here, under the
    sign-in's state, for the browser whose cookie holds `browser_key`."""
    chosen = _provider(ws, provider)
    try:
        started = chosen.start(redirect_uri)
    except SignInRefused as exc:
        _record_refusal(ws, provider, exc, None)
        raise
    pending = dict(started.pending)
    state, moment = pending.pop("state"), ws.clock.now()
    with ws.store.session() as session:
        session.sign_in.forget_flows(moment)
        session.sign_in.add_flow(_hash(state), PendingSignIn(provider, _hash(browser_key), pending, moment,
                                                             moment + SIGN_IN_FLOW_TIME))
    return started.url


def finish_sign_in(ws: Identified, provider: str, browser_key: str | None,
                   callback: Mapping[str, str]) -> tuple[str, SignedIn]:
    """Verify the provider's answer and open a session for the linked principal: (session id, who)."""
    chosen = _provider(ws, provider)
    identity = None
    try:
        pending = _use_pending(ws, provider, browser_key, callback.get("state") or "")
        identity = chosen.finish(pending, callback)
        principal = _principal_for(ws, identity)
    except SignInRefused as exc:
        _record_refusal(ws, provider, exc, identity)
        raise
    details: dict[str, object] = {"subject": identity.subject}
    if identity.claims_from:
        details["claims_from"] = dict(identity.claims_from)
    return _open_session(ws, principal, identity.auth_method, identity.groups, details)


def sign_in_with_token(ws: Configured, token: str) -> tuple[str, SignedIn]:
    """A page session from an API token (people only)."""
    return _open_session(ws, authenticate_person(ws, token), TOKEN_AUTH, None, {})


def signed_in(ws: Records, session_id: str | None) -> SignedIn:
    """Who a session cookie signs in; an ended, expired or disabled person's session is refused (and recorded)."""
    if not session_id:
        raise AuthError("sign in first")
    id_hash = _hash(session_id)
    with ws.store.session(readonly=True) as session:
        record = session.sign_in.get_session(id_hash)
        principal = _principal_or_none(session, record.principal_id) if record else None
    if record is None or principal is None:
        raise AuthError("your session is no longer valid; sign in again")
    reason = record.refusal(ws.clock.now(), principal.disabled)
    if reason is not None:
        if record.ended_at is None:  # recorded once: the session ends here
            with ws.store.session() as session:
                session.sign_in.end_session(id_hash, ws.clock.now())
                session.audit.append(principal, "sign_in.session_ended", {
                    "auth_method": record.auth_method, "reason": reason})
        raise AuthError(reason)
    narrowed = replace(principal, groups=counted_groups(principal.groups, record.claimed_groups))
    return SignedIn(narrowed, record.auth_method, record.claimed_groups)


def sign_out(ws: Records, session_id: str | None) -> None:
    """End the session at once (a copy of the cookie signs no one in afterwards)."""
    if not session_id:
        return
    id_hash = _hash(session_id)
    with ws.store.session() as session:
        record = session.sign_in.get_session(id_hash)
        if record is None or record.ended_at is not None:
            return
        session.sign_in.end_session(id_hash, ws.clock.now())
        session.audit.append(session.principals.get(record.principal_id), "sign_out",
                             {"auth_method": record.auth_method})


def decide_signed_in(ws: Workspace, who: SignedIn, proposal_id: int, decision: Decision, comment: str,
                     seen_sha: str, seen_digests: Mapping[str, str] | None) -> None:
    """Approve or reject from a page, recording how the person signed in and which groups counted."""
    from gateway.services.change.jobs import approve_proposal  # imported here: jobs imports the change services
    from gateway.services.change.proposals import decide, get_proposal

    if who.claimed_groups is not None:
        proposal = get_proposal(ws, proposal_id)
        with ws.store.session() as session:
            full = session.principals.get(who.principal.id)
            session.audit.append(full, "sign_in.group_check", {
                "auth_method": who.auth_method, "claimed": sorted(who.claimed_groups),
                "active": sorted(who.principal.groups), "not_member": sorted(full.groups - who.principal.groups),
                "head_sha": proposal.head_sha}, proposal.id, proposal.stacks)
    if decision == Decision.APPROVE:
        approve_proposal(ws, who.principal, proposal_id, comment, seen_sha=seen_sha, auth=who.auth_method,
                         seen_digests=seen_digests)
    else:
        decide(ws, who.principal, proposal_id, decision, comment, seen_sha=seen_sha, auth=who.auth_method,
               seen_digests=seen_digests)


def link_identity(ws: Records, actor: Principal, name: str, issuer: str, subject: str) -> Principal:
    """An admin links an OIDC identity (issuer and subject, never an e-mail) to a person."""
    require(actor, Action.LINK_ACCOUNTS)
    issuer, subject = issuer.strip(), subject.strip()  # the issuer exactly as its ID tokens name it
    if not issuer or not subject or len(issuer) > 500 or len(subject) > 255:
        raise InputError("an identity needs its issuer URL (at most 500 characters) and subject (at most 255)")
    if issuer == GITHUB_ISSUER:
        raise InputError("GitHub accounts are linked with `gateway users link NAME LOGIN`")
    with ws.store.session() as session:
        person = session.principals.by_name(name)
        if person is None or person.kind != PrincipalKind.PERSON:
            raise NotFound(f"no person {name}")
        session.sign_in.link_identity(person, issuer, subject, subject)
        session.audit.append(actor, "identity.linked", {"name": name, "issuer": issuer, "subject": subject})
    return person


# -----------------------------------------------------------------------------------------------------


def _provider(ws: Identified, name: str) -> IdentityProvider:
    provider = ws.identity_providers.get(name)
    if provider is None:
        raise NotFound(f"no sign-in provider {name!r} is configured "
                       f"(configured: {', '.join(ws.identity_providers) or 'none'})")
    return provider


def _principal_for(ws: Configured, identity: Identity) -> Principal:
    """The principal an identity is linked to (or one an admission rule makes now); refused otherwise."""
    with ws.store.session() as session:
        if identity.issuer == GITHUB_ISSUER:
            principal = session.principals.by_github_id(int(identity.subject))
        else:
            principal = session.sign_in.principal_of(identity.issuer, identity.subject)
        if principal is None:
            principal = _admit(ws, session, identity)
    if principal is None:
        how = ("`gateway users link NAME LOGIN --github-id ID`" if identity.issuer == GITHUB_ISSUER else
               f"`gateway users link-identity NAME --issuer {identity.issuer} --subject {identity.subject}`")
        raise SignInRefused("unlinked", f"{identity.display} (subject {identity.subject} at {identity.issuer}) is "
                                        f"not linked to a gateway user: no access until an admin runs {how}")
    if principal.disabled:
        raise SignInRefused("disabled", f"{principal.name} is disabled; an admin can enable them")
    if refusals(principal, Action.SIGN_IN):
        raise SignInRefused("not_a_person", "; ".join(refusals(principal, Action.SIGN_IN)))
    return principal


def _admit(ws: Configured, session: UnitOfWork, identity: Identity) -> Principal | None:
    """A requester for an unlinked identity that a configured rule admits (None: no rule does)."""
    rule = AdmissionRule(_listed(ws.settings.admit_domains.lower()), _listed(ws.settings.admit_groups))
    why = rule.admits(identity)
    if why is None or identity.issuer == GITHUB_ISSUER:
        return None
    base = _suggested_name(identity)
    name = next(n for n in [base, *(f"{base}-{i}" for i in range(2, 1000))] if session.principals.by_name(n) is None)
    principal = session.principals.add(name, PrincipalKind.PERSON, frozenset({Role.REQUESTER}), frozenset(),
                                       hash_token(new_token()))  # a token nobody knows: the person signs in
    session.sign_in.link_identity(principal, identity.issuer, identity.subject, identity.display)
    session.audit.append(GATEWAY, "principal.admitted", {
        "name": name, "roles": [Role.REQUESTER.value], "issuer": identity.issuer, "subject": identity.subject,
        "because": why})
    return principal


def _use_pending(ws: Records, provider: str, browser_key: str | None, state: str) -> Mapping[str, str]:
    """What the sign-in named by the callback's state kept, used now: it was started here, with this provider, in
    this browser, not long ago, and never used. Checked before anything else in the answer is believed."""
    if not state:
        raise SignInRefused("state", "the answer sent back here carries no state; start again from the sign-in page")
    moment, state_hash = ws.clock.now(), _hash(state)
    with ws.store.session() as session:
        flow = session.sign_in.get_flow(state_hash)
        reason = state_refusal(flow, provider, _hash(browser_key) if browser_key else None, moment)
        if reason is None and not session.sign_in.use_flow(state_hash, moment):
            reason = "this sign-in was already used (its state is spent); start again from the sign-in page"
    if reason is not None or flow is None:
        raise SignInRefused("state", reason or "no pending sign-in")
    return flow.secrets


def _open_session(ws: Configured, principal: Principal, auth_method: str, claimed: frozenset[str] | None,
                  details: dict[str, object]) -> tuple[str, SignedIn]:
    session_id = secrets.token_urlsafe(32)
    moment = ws.clock.now()
    record = WebSession(principal.id, auth_method, claimed, moment,
                        moment + timedelta(hours=ws.settings.web_session_hours))
    counted = counted_groups(principal.groups, claimed)
    with ws.store.session() as session:
        session.sign_in.open_session(_hash(session_id), record)
        session.audit.append(principal, "sign_in", {
            "auth_method": auth_method, **details, "expires_at": record.expires_at.isoformat(),
            **({"claimed_groups": sorted(claimed), "counted_groups": sorted(counted)} if claimed is not None else {})})
    return session_id, SignedIn(replace(principal, groups=counted), auth_method, claimed)


def _record_refusal(ws: Records, provider: str, exc: SignInRefused, identity: Identity | None) -> None:
    """In the trail, the first few of each kind (provider and check) a minute; the rest are counted there later."""
    payload: dict[str, object] = {"provider": provider, "check": exc.check, "reason": str(exc)}
    if identity is not None:
        payload |= {"issuer": identity.issuer, "subject": identity.subject}
        if identity.claims_from:
            payload["claims_from"] = dict(identity.claims_from)
    kind = f"{provider}:{exc.check}"
    with ws.store.session() as session:
        tally, recorded = tally_refusal(session.sign_in.refusal_tally(kind), ws.clock.now())
        session.sign_in.save_refusal_tally(kind, tally)
        if recorded is not None:
            session.audit.append(GATEWAY, "sign_in.refused", payload | recorded)


def _principal_or_none(session: UnitOfWork, pid: str) -> Principal | None:
    try:
        return session.principals.get(pid)
    except NotFound:
        return None


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _listed(text: str) -> frozenset[str]:
    return frozenset(p.strip() for p in text.split(",") if p.strip())

