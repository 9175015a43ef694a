"""What waits for a person across every active repository of the gateway: each repository's own inbox (its proposals
decided by its own rules), put together oldest first, each entry naming its repository."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.domain.principals import Principal
from gateway.services.change.views import InboxItem, inbox
from gateway.services.workspace import Records, Workspace


@dataclass(frozen=True)
class RepositoryInboxItem:
    """An inbox item and the repository its proposal is in."""

    repository: str
    item: InboxItem

    def to_public(self) -> dict[str, Any]:
        return {**self.item.to_public(), "repository": self.repository}


def active_repositories(ws: Records) -> list[str]:
    """The names of the repositories the gateway serves now (removed ones left out), by name."""
    with ws.store.session(readonly=True) as session:
        return [r.name for r in session.repositories.list() if r.active]


def inbox_everywhere(ws: Workspace, viewer: Principal) -> list[RepositoryInboxItem]:
    """What the viewer can decide now in any active repository, oldest first (proposal numbers are the gateway's)."""
    names = active_repositories(ws) or [ws.repository]  # a store made before repositories were registered
    items = [RepositoryInboxItem(name, item) for name in names for item in inbox(ws.in_repository(name), viewer)]
    return sorted(items, key=lambda i: i.item.id)
