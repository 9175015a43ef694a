"""The declaration repositories the gateway serves: listed by anyone who may read, added and removed by admins.

A repository is added empty of records: its proposals, pushes, breakers and trail events are its own, its rules
come from its own main (gateway.yaml, policies/), and its stacks are named `repo/stack`. Removing one stops new
work there (nothing is proposed, planned or applied in it) and keeps everything it recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.domain.errors import Conflict, NotFound
from gateway.domain.permissions import Action, require
from gateway.domain.principals import Actor, Principal
from gateway.domain.repositories import DEFAULT_REPOSITORY, Repository, check_name
from gateway.services.change.main_watch import SEEN
from gateway.services.workspace import Records


def list_repositories(ws: Records) -> list[Repository]:
    """Every repository of the gateway, removed ones too, by name."""
    with ws.store.session(readonly=True) as session:
        return session.repositories.list()


def add_repository(ws: Records, actor: Actor, name: str, create: Callable[[], str]) -> Repository:
    """Register repository `name`, whose bare git repository `create` makes (returning main's first commit); the
    trail records who added it. Nothing is registered if `create` fails; a name once used stays taken.

    A person adds one as an admin; the gateway itself (a system actor: the GitHub App's installation on a repository
    GATEWAY_GITHUB_REPOSITORIES admits) on the authority of that setting, which an operator gave."""
    if isinstance(actor, Principal):
        require(actor, Action.MANAGE_REPOSITORIES)
    check_name(name)
    with ws.store.session(readonly=True) as session:
        if session.repositories.get(name) is not None:
            raise Conflict(f"repository {name} is already registered (`gateway repos list`); a removed repository's "
                           "name stays taken, so its trail never reads as another's")
    main_sha = create()
    with ws.store.for_repository(name).session() as session:
        added = session.repositories.add(name, actor.name)
        session.main.set_marker(SEEN, main_sha)  # main as added: what later pushes to it are compared with
        session.audit.append(actor, "repository.added", {"repository": name, "main": main_sha})
    return added


def remove_repository(ws: Records, actor: Principal, name: str) -> None:
    """Stop serving repository `name` (the default one stays); what it recorded stays, readable and in the trail."""
    require(actor, Action.MANAGE_REPOSITORIES)
    if name == DEFAULT_REPOSITORY:
        raise Conflict(f"{DEFAULT_REPOSITORY} is the workspace's own repository and cannot be removed")
    with ws.store.session() as session:
        known = session.repositories.get(name)
        if known is None or not known.active:
            raise NotFound(f"no repository {name} to remove (`gateway repos list`)")
        session.repositories.remove(name, actor.name)
        session.audit.append(actor, "repository.removed", {"repository": name})
