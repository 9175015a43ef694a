"""Identities linked to principals, and the server-side page sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, insert, select, update

from gateway.adapters.sql_store import oidc_identities, web_sessions
from gateway.adapters.store.rows import Records, aware, now
from gateway.domain.principals import Principal
from gateway.domain.sign_in import WebSession


class SqlSignInRecords(Records):
    """`oidc_identities` (issuer, subject -> principal) and `web_sessions` (by the hash of their id)."""

    def link_identity(self, principal: Principal, issuer: str, subject: str, display: str) -> None:
        self.conn.execute(delete(oidc_identities).where(
            (oidc_identities.c.issuer == issuer) & (oidc_identities.c.subject == subject)))
        self.conn.execute(insert(oidc_identities).values(
            issuer=issuer, subject=subject, principal_id=principal.id, display=display[:200], linked_at=now()))

    def principal_of(self, issuer: str, subject: str) -> Principal | None:
        pid = self.conn.scalar(select(oidc_identities.c.principal_id).where(
            (oidc_identities.c.issuer == issuer) & (oidc_identities.c.subject == subject)))
        return self.uow.principals.get(pid) if pid else None

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
