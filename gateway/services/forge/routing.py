"""Which of the gateway's repositories a webhook delivery is for: the one whose main gateway.yaml names the forge
repository the delivery is about (GitHub's `repository.full_name`, GitLab's `project.path_with_namespace`).

What a repository's main names is read once per main commit, so routing a delivery costs a list of the repositories
and a ref read for each, not a parse of every gateway.yaml. A repository whose gateway.yaml does not parse names
nothing until it does; routing to the others goes on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from gateway.domain.errors import GatewayError
from gateway.domain.github import repository_allowed
from gateway.services.workspace import Workspace

ForgeKind = Literal["github", "gitlab"]
KEPT = 1024  # main commits remembered (a few per repository are plenty)


@dataclass(frozen=True)
class ForgeNames:
    """What one repository's main gateway.yaml names on the forges; `broken` says why it names nothing."""

    github: str | None = None
    gitlab: str | None = None
    broken: str | None = None

    def names(self, forge: ForgeKind, full_name: str) -> bool:
        named = self.github if forge == "github" else self.gitlab
        return named is not None and named.casefold() == full_name.casefold()  # forges ignore the case of names


@dataclass(frozen=True)
class Route:
    """Where a delivery goes: the gateway repository `repository`, or none, with the `refusal` a person reads."""

    repository: str | None
    refusal: str = ""


_LOCK = threading.Lock()  # over each process's ws.forge_names


def route_delivery(ws: Workspace, forge: ForgeKind, full_name: str) -> Route:
    """The repository of this gateway whose main gateway.yaml names `full_name` on `forge`, if exactly one does and
    (for GitHub) GATEWAY_GITHUB_REPOSITORIES admits it."""
    allowed = ws.settings.github_repositories
    if forge == "github" and allowed is not None and not repository_allowed(allowed, full_name):
        return Route(None, f"GitHub repository {full_name} is not in GATEWAY_GITHUB_REPOSITORIES "
                           f"({', '.join(allowed) or 'empty'})")
    homes = [name for name, named in forge_names(ws) if named.names(forge, full_name)]
    if len(homes) == 1:
        return Route(homes[0])
    home = "GitHub repository" if forge == "github" else "GitLab project"
    if homes:
        return Route(None, f"{home} {full_name} is named by the gateway.yaml of more than one repository "
                           f"({', '.join(homes)}): name it in one")
    return Route(None, f"no repository of this gateway names {home} {full_name} in its main gateway.yaml")


def forge_names(ws: Workspace) -> list[tuple[str, ForgeNames]]:
    """What each active repository's main gateway.yaml names on the forges, by repository."""
    with ws.store.session(readonly=True) as session:
        active = [r.name for r in session.repositories.list() if r.active]
    found = []
    for name in active:
        try:
            found.append((name, _names_of(ws.in_repository(name))))
        except GatewayError as exc:  # its git is gone, or main has no commit: it names nothing
            found.append((name, ForgeNames(broken=str(exc))))
    return found


def _names_of(ws: Workspace) -> ForgeNames:
    sha = ws.repo.resolve(ws.main_branch())
    key, kept = (ws.repository, sha), ws.forge_names
    with _LOCK:
        if key in kept:
            return kept[key]  # type: ignore[no-any-return]
    try:
        settings = ws.repo.repo_settings(sha)
        github, gitlab = settings.github, settings.gitlab
        named = ForgeNames(github.repository if github else None, gitlab.repository if gitlab else None)
    except GatewayError as exc:  # a gateway.yaml that does not parse (or is not there)
        named = ForgeNames(broken=str(exc))
    with _LOCK:
        if len(kept) >= KEPT:  # main moved many times: forget the oldest half (dicts keep their order)
            for old in list(kept)[:KEPT // 2]:
                del kept[old]
        kept[key] = named
    return named
