"""Commits on main that the gateway did not make: found, recorded, and in the way of applies on the stacks they
touch until a person acknowledges them (main then describes something nobody applied through the gateway)."""

from __future__ import annotations

from typing import Any

from gateway.domain.apply_blockers import MainPush
from gateway.domain.errors import InputError, NotFound
from gateway.domain.permissions import Action, require
from gateway.domain.principals import GATEWAY, Principal
from gateway.services.workspace import MainRules, Records

SEEN = "main_seen"  # the last main commit the gateway looked at


def own_commit(sha: str) -> str:
    return f"gateway_commit:{sha}"


def record_own_commit(ws: Records, sha: str) -> None:
    """Before main moves to a commit the gateway made (a merge), so that it is never taken for a push."""
    with ws.store.session() as session:
        session.main.set_marker(own_commit(sha), "merge")


def watch_main(ws: MainRules) -> list[dict[str, Any]]:
    """Record each commit on main's first-parent line since the gateway last looked that it did not make."""
    main_sha = ws.repo.resolve(ws.main_branch())
    with ws.store.session(readonly=True) as session:
        seen = session.main.marker(SEEN)
    if seen == main_sha:
        return []
    found: list[dict[str, Any]] = []
    commits = ws.repo.first_parent_commits(seen, main_sha) if seen and _known(ws, seen) else []
    settings = ws.repo_settings()
    with ws.store.session() as session:
        for sha, parent, author in commits:
            if session.main.marker(own_commit(sha)) or session.proposals.merged_as(sha) or parent is None:
                continue
            paths = ws.repo.changed_paths(parent, sha)
            stacks = settings.stacks_touched(paths, lambda path, sha=sha: ws.repo.module_directories(sha, path))
            if session.main.add_push(sha, stacks, paths, author):
                session.audit.append(GATEWAY, "main.pushed_outside", {
                    "sha": sha, "author": author, "stacks": stacks, "changed_paths": paths[:200]}, None, stacks)
                found.append({"sha": sha, "stacks": stacks, "author": author})
        session.main.set_marker(SEEN, main_sha)
    return found


def _known(ws: MainRules, sha: str) -> bool:
    try:
        ws.repo.resolve(sha)
    except NotFound:
        return False
    return True


def unacknowledged_pushes(ws: Records) -> tuple[MainPush, ...]:
    """Every push to main outside the gateway that no person has acknowledged yet (the apply rule picks stacks)."""
    return tuple(unacknowledged(ws))


def unacknowledged(ws: Records) -> list[MainPush]:
    with ws.store.session(readonly=True) as session:
        return session.main.unacknowledged_pushes()


def acknowledge_push(ws: Records, actor: Principal, sha: str, reason: str) -> MainPush:
    """An approver or admin has looked at a push to main (reverted it, or applied it through a proposal)."""
    require(actor, Action.ACKNOWLEDGE_PUSH)
    reason = reason.strip()
    if not reason:
        raise InputError("say what was done about it (-m)")
    if len(sha) < 7:
        raise InputError("name the commit with at least 7 characters of its sha")
    with ws.store.session() as session:
        push = session.main.acknowledge_push(sha, actor.name, reason)
        if push is None:
            raise NotFound(f"no unacknowledged push to main matches {sha}")
        stacks = sorted(push.stacks)
        session.audit.append(actor, "main.push_acknowledged", {"sha": push.sha, "stacks": stacks, "reason": reason},
                             None, stacks)
    return push
