"""People, agents and their linked GitHub and GitLab accounts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update

from gateway.adapters.store.rows import (
    Records,
    as_principal,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    github_accounts,
    gitlab_accounts,
    principals,
)
from gateway.domain.errors import Conflict, NotFound
from gateway.domain.principals import Credentials, Principal, PrincipalKind, Role

_BY_ID = select(principals).where(principals.c.id == bindparam("id"))
_BY_TOKEN_HASH = select(principals).where(principals.c.token_hash == bindparam("token_hash"))
_CREDENTIALS = select(principals.c.disabled_at, principals.c.token_expires_at, principals.c.last_used_at).where(
    principals.c.id == bindparam("id")
)


class SqlPrincipals(Records):
    """People and agents, their credentials, and the GitHub accounts linked to them."""

    def add(
        self,
        name: str,
        kind: PrincipalKind,
        roles: frozenset[Role],
        groups: frozenset[str],
        token_hash: str,
        acting_for: str | None = None,
    ) -> Principal:
        if self.by_name(name) is not None:
            raise Conflict(f"a principal named {name!r} already exists")
        pid = str(uuid.uuid4())
        self.conn.execute(
            insert(principals).values(
                id=pid,
                name=name,
                kind=kind.value,
                roles=sorted(roles),
                groups=sorted(groups),
                token_hash=token_hash,
                acting_for=acting_for,
                created_at=now(),
            )
        )
        return Principal(pid, name, kind, roles, groups, acting_for)

    def count(self) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(principals)) or 0)

    def token_holder(self, token_hash: str) -> tuple[Principal, Credentials] | None:
        """The principal whose token has this hash, with its credential record (as `credentials`), from one row."""
        row = self.conn.execute(_BY_TOKEN_HASH, {"token_hash": token_hash}).mappings().first()
        return (as_principal(row), _credentials(row)) if row else None

    def by_name(self, name: str) -> Principal | None:
        row = self.conn.execute(select(principals).where(principals.c.name == name)).mappings().first()
        return as_principal(row) if row else None

    def get(self, pid: str) -> Principal:
        row = self.conn.execute(_BY_ID, {"id": pid}).mappings().first()
        if row is None:
            raise NotFound(f"unknown principal {pid}")
        return as_principal(row)

    def credentials(self, pid: str) -> Credentials:
        """A principal's credential record: when disabled, when its token expires, when it was last used."""
        row = self.conn.execute(_CREDENTIALS, {"id": pid}).mappings().first()
        if row is None:
            raise NotFound(f"unknown principal {pid}")
        return _credentials(row)

    def set_token(self, pid: str, token_hash: str, expires_at: datetime | None) -> None:
        """A new token (only its hash is kept); the old one stops working at once."""
        self._set(pid, token_hash=token_hash, token_expires_at=expires_at)

    def set_token_expiry(self, pid: str, expires_at: datetime | None) -> None:
        self._set(pid, token_expires_at=expires_at)

    def set_disabled(self, pid: str, at: datetime | None) -> None:
        """Disabled from `at` (None: enabled again)."""
        self._set(pid, disabled_at=at)

    def set_access(self, pid: str, roles: frozenset[Role], groups: frozenset[str]) -> None:
        self._set(pid, roles=sorted(roles), groups=sorted(groups))

    def touch(self, pid: str, at: datetime) -> None:
        """The token was used at `at`."""
        self._set(pid, last_used_at=at)

    def _set(self, pid: str, **values: Any) -> None:
        self.conn.execute(update(principals).where(principals.c.id == pid).values(**values))

    def enabled_admins(self) -> list[str]:
        rows = self.conn.execute(select(principals.c.id, principals.c.roles).where(principals.c.disabled_at.is_(None)))
        return [r.id for r in rows if Role.ADMIN.value in r.roles]

    def list(self) -> list[Principal]:
        rows = self.conn.execute(select(principals).order_by(principals.c.name)).mappings()
        return [as_principal(r) for r in rows]

    def link_github(self, principal: Principal, github_id: int, login: str) -> None:
        """Link a person to a GitHub account (by its numeric id: logins can be renamed and reused)."""
        self.conn.execute(
            delete(github_accounts).where(
                (github_accounts.c.principal_id == principal.id) | (github_accounts.c.github_id == github_id)
            )
        )
        self.conn.execute(
            insert(github_accounts).values(github_id=github_id, login=login, principal_id=principal.id, linked_at=now())
        )

    def by_github_id(self, github_id: int) -> Principal | None:
        pid = self.conn.scalar(select(github_accounts.c.principal_id).where(github_accounts.c.github_id == github_id))
        return self.get(pid) if pid else None

    def github_login_of(self, principal_id: str) -> str | None:
        return self.conn.scalar(select(github_accounts.c.login).where(github_accounts.c.principal_id == principal_id))


    def link_gitlab(self, principal: Principal, gitlab_id: int, username: str) -> None:
        """Link a person to a GitLab account (by its numeric user id: usernames can be changed and reused)."""
        self.conn.execute(delete(gitlab_accounts).where(
            (gitlab_accounts.c.principal_id == principal.id) | (gitlab_accounts.c.gitlab_id == gitlab_id)))
        self.conn.execute(insert(gitlab_accounts).values(gitlab_id=gitlab_id, username=username,
                                                         principal_id=principal.id, linked_at=now()))

    def by_gitlab_id(self, gitlab_id: int) -> Principal | None:
        pid = self.conn.scalar(select(gitlab_accounts.c.principal_id).where(gitlab_accounts.c.gitlab_id == gitlab_id))
        return self.get(pid) if pid else None

    def gitlab_account_of(self, principal_id: str) -> tuple[int, str] | None:
        row = self.conn.execute(select(gitlab_accounts.c.gitlab_id, gitlab_accounts.c.username).where(
            gitlab_accounts.c.principal_id == principal_id)).first()
        return (int(row[0]), str(row[1])) if row else None


def _credentials(row: Mapping[str, Any]) -> Credentials:
    return Credentials(*(aware(row[k]) if row[k] else None for k in ("disabled_at", "token_expires_at", "last_used_at")))
