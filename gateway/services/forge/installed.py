"""Repositories the GitHub App is installed on, added to the gateway by the installation itself.

When the App is installed on a repository (GitHub's `installation` created, or `installation_repositories` added),
each one GATEWAY_GITHUB_REPOSITORIES admits and no repository of the gateway serves yet is added, named as on GitHub
(`acme/network` is `network`), from GitHub's main as it is then. Its main's gateway.yaml must name it as its forge
(`forge: github`, `github.repository: acme/network`): that is what routes its deliveries, and a repository that says
nothing of itself is not taken on trust. Without the allow-list nothing is added (an App installed by mistake serves
nothing), and a repository that cannot be added is recorded with why (`github.repository_not_added`), never half added.
Uninstalling is recorded and removes nothing: `gateway repos remove` does, keeping the repository's trail.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.domain.errors import GatewayError, NotConfigured, NotFound, Unavailable
from gateway.domain.github import Delivery, repository_allowed
from gateway.domain.principals import GITHUB
from gateway.domain.repo_settings import GitHubSettings
from gateway.domain.repositories import check_name
from gateway.services.forge.routing import forge_names
from gateway.services.workspace import Workspace

EVENTS = frozenset({"installation", "installation_repositories"})  # about the App, not one repository


def added_and_removed(event: str, action: str | None, payload: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The GitHub repositories an installation delivery gave the App, and those it took away (`owner/name`)."""
    if event == "installation_repositories":
        return _full_names(payload.get("repositories_added")), _full_names(payload.get("repositories_removed"))
    listed = _full_names(payload.get("repositories"))
    return (listed if action == "created" else []), (listed if action == "deleted" else [])


def to_add(ws: Workspace, added: list[str]) -> list[str]:
    """Those of `added` the gateway takes on: admitted by GATEWAY_GITHUB_REPOSITORIES (none without it), and named by
    no repository of the gateway yet."""
    allowed = ws.settings.github_repositories
    if allowed is None:
        return []
    served = forge_names(ws)
    return [full_name for full_name in added if repository_allowed(allowed, full_name)
            and not any(named.names("github", full_name) for _, named in served)]


def add_installed(ws: Workspace, delivery: Delivery) -> dict[str, Any]:
    """The worker's side of an installation delivery: add each repository `to_add` names now (a redelivery, or one
    whose repositories were added since, adds nothing twice). Returns what was added, and why the others were not."""
    payload = json.loads(delivery.payload)
    added, not_added = {}, {}
    for full_name in to_add(ws, added_and_removed(delivery.event, delivery.action, payload)[0]):
        try:
            added[full_name] = _add(ws, full_name)
        except Unavailable:
            raise  # GitHub for a moment: the job is tried again, and adds what is still to add
        except GatewayError as exc:
            not_added[full_name] = str(exc)
            with ws.store.session() as session:
                session.audit.append(GITHUB, "github.repository_not_added", {
                    "delivery": delivery.id, "github_repository": full_name, "reason": str(exc)})
    return {"added": added, "not_added": not_added}


def _add(ws: Workspace, full_name: str) -> str:
    """Add GitHub repository `full_name` from its main; returns the name the gateway gave it."""
    if ws.add_repository is None:
        raise NotConfigured("this process cannot add repositories")
    name = check_name(full_name.split("/", 1)[1].lower())
    template = ws.settings.github_git_url
    forge = ws.open_forge(GitHubSettings(repository=full_name, api_url=ws.settings.github_api_url,
                                         git_url=template.format(repository=full_name) if template else None))
    with tempfile.TemporaryDirectory() as folder:
        main = Path(folder) / "main"
        forge.clone_main(main)  # its history becomes the gateway's main: GitHub's main and the gateway's are one
        if not (main / "gateway.yaml").is_file():
            raise NotFound(f"{full_name}'s main holds no gateway.yaml: a declaration repository starts with one")
        ws.add_repository(GITHUB, name, main, full_name)
    return name


def _full_names(repositories: Any) -> list[str]:
    """The `full_name`s of a payload's list of repositories (what is not one is left out)."""
    items = repositories if isinstance(repositories, list) else []
    return [str(r["full_name"])[:200] for r in items if isinstance(r, dict) and isinstance(r.get("full_name"), str)]
