"""Identities linked to principals, the server-side page sessions, sign-ins in progress and the refusal tallies."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update

from gateway.adapters.store.rows import Records, as_principal, aware, now
from gateway.adapters.store.schema import (
    oidc_identities,
    principals,
    sign_in_flows,
    sign_in_refusal_tallies,
    web_sessions,
)
from gateway.domain.errors import NotFound
from gateway.domain.principals import Principal
from gateway.domain.sign_in import PendingSignIn, RefusalTally, WebSession


class SqlSignInRecords(Records):
    """`oidc_identities` (issuer, subject -> principal), `web_sessions` (by the hash of their id), `sign_in_flows`
    (by the hash of their state) and `sign_in_refusal_tallies` (by provider and check)."""

    def link_identity(self, principal: Principal, issuer: str, subject: str, display: str) -> None:
        self.conn.execute(delete(oidc_identities).where(
            (oidc_identities.c.issuer == issuer) & (oidc_identities.c.subject == subject)))
        self.conn.execute(insert(oidc_identities).values(
            issuer=issuer, subject=subject, principal_id=principal.id, display=display[:200], linked_at=now()))

    def principal_of(self, issuer: str, subject: str) -> Principal | None:
        """The principal the identity is linked to, read with the link (a join, not a sibling repository's get)."""
        row = self.conn.execute(
            select(oidc_identities.c.principal_id, principals)
            .outerjoin(principals, principals.c.id == oidc_identities.c.principal_id)
            .where((oidc_identities.c.issuer == issuer) & (oidc_identities.c.subject == subject))).mappings().first()
        if row is None:
            return None
        if row["id"] is None:
            raise NotFound(f"unknown principal {row['principal_id']}")
        return as_principal(row)

    def identities_of(self, principal_id: str) -> list[tuple[str, str]]:
        rows = self.conn.execute(select(oidc_identities.c.issuer, oidc_identities.c.subject).where(
            oidc_identities.c.principal_id == principal_id).order_by(oidc_identities.c.issuer))
        return [(r.issuer, r.subject) for r in rows]

    def open_session(self, id_hash: str, session: WebSession) -> None:
        groups = None if session.claimed_groups is None else sorted(session.claimed_groups)
        self.conn.execute(insert(web_sessions).values(
            id_hash=id_hash, principal_id=session.principal_id, auth_method=session.auth_method,
            claimed_groups=groups, created_at=session.created_at, expires_at=session.expires_at))

    def get_session(self, id_hash: str) -> WebSession | None:
        row = self.conn.execute(select(web_sessions).where(web_sessions.c.id_hash == id_hash)).mappings().first()
        if row is None:
            return None
        groups = row["claimed_groups"]
        return WebSession(row["principal_id"], row["auth_method"], None if groups is None else frozenset(groups),
                          aware(row["created_at"]), aware(row["expires_at"]),
                          aware(row["ended_at"]) if row["ended_at"] else None)

    def end_session(self, id_hash: str, at: datetime) -> None:
        self.conn.execute(update(web_sessions).where(
            (web_sessions.c.id_hash == id_hash) & web_sessions.c.ended_at.is_(None)).values(ended_at=at))

    def end_sessions_of(self, principal_id: str, at: datetime) -> int:
        result = self.conn.execute(update(web_sessions).where(
            (web_sessions.c.principal_id == principal_id) & web_sessions.c.ended_at.is_(None)).values(ended_at=at))
        return int(result.rowcount or 0)

    def add_flow(self, state_hash: str, flow: PendingSignIn) -> None:
        self.conn.execute(insert(sign_in_flows).values(
            state_hash=state_hash, provider=flow.provider, browser_hash=flow.browser, secrets=dict(flow.secrets),
            started_at=flow.started_at, expires_at=flow.expires_at))

    def get_flow(self, state_hash: str) -> PendingSignIn | None:
        row = self.conn.execute(select(sign_in_flows).where(sign_in_flows.c.state_hash == state_hash)
                                .with_for_update()).mappings().first()
        if row is None:
            return None
        return PendingSignIn(row["provider"], row["browser_hash"], dict(row["secrets"] or {}),
                             aware(row["started_at"]), aware(row["expires_at"]),
                             aware(row["used_at"]) if row["used_at"] else None)

    def use_flow(self, state_hash: str, at: datetime) -> bool:
        done = self.conn.execute(update(sign_in_flows).where(
            (sign_in_flows.c.state_hash == state_hash) & sign_in_flows.c.used_at.is_(None)).values(
            used_at=at, secrets=None))
        return done.rowcount == 1

    def forget_flows(self, expired_by: datetime) -> int:
        done = self.conn.execute(delete(sign_in_flows).where(sign_in_flows.c.expires_at <= expired_by))
        return int(done.rowcount or 0)

    def refusal_tally(self, kind: str) -> RefusalTally | None:
        # the row first (one writer creates it, the others find it), then locked: concurrent refusals count in turn
        self.conn.execute(self._insert_tally(kind).on_conflict_do_nothing(index_elements=["kind"]))
        row = self.conn.execute(select(sign_in_refusal_tallies).where(sign_in_refusal_tallies.c.kind == kind)
                                .with_for_update()).mappings().one()
        if row["recorded"] == 0 and row["unrecorded"] == 0:
            return None  # made just now: no refusal of this kind counted yet
        return RefusalTally(aware(row["window_started_at"]), row["recorded"], row["unrecorded"],
                            aware(row["unrecorded_since"]) if row["unrecorded_since"] else None)

    def save_refusal_tally(self, kind: str, tally: RefusalTally) -> None:
        self.conn.execute(update(sign_in_refusal_tallies).where(sign_in_refusal_tallies.c.kind == kind).values(
            window_started_at=tally.window_started_at, recorded=tally.recorded, unrecorded=tally.unrecorded,
            unrecorded_since=tally.unrecorded_since))

    def _insert_tally(self, kind: str) -> Any:
        """The dialect's INSERT of an empty tally, which can do nothing on a conflict (imported when used)."""
        if self.conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment]
        return dialect_insert(sign_in_refusal_tallies).values(kind=kind, window_started_at=now(), recorded=0,
                                                              unrecorded=0)
