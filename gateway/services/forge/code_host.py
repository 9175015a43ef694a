"""The code host behind the forge port: which one main's gateway.yaml names, its webhook secret, and who counts.

A person's GitHub decision counts only for the groups whose mapped team they are an active member
of now: asked of GitHub at the apply (and recorded), read from the last recorded check by views.
"""

from __future__ import annotations

from gateway.domain.apply_blockers import GITHUB_AUTH, TeamCheck
from gateway.domain.errors import ConfigError
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.ports import Forge
from gateway.services.workspace import Workspace


def forge_of(ws: Workspace) -> Forge | None:
    """The repo's GitHub, when main's gateway.yaml says `forge: github` (the composition root makes the client)."""
    github = ws.repo_settings().github
    return None if github is None else ws.open_forge(github)


def require_webhook_secret(ws: Workspace) -> str | None:
    """The webhook secret, or None without a forge; a forge without a secret stops the service from starting."""
    try:
        forge = ws.repo_settings().github
    except ConfigError:  # a broken gateway.yaml is reported where it is used; it does not stop the service
        return None
    if forge is None:
        return None
    secret = ws.settings.github_webhook_secret
    if secret is None or not secret.get_secret_value().strip():
        raise ConfigError("gateway.yaml says forge: github, but GATEWAY_GITHUB_WEBHOOK_SECRET is not set: the webhook "
                          "route will not accept unsigned deliveries; set the secret GitHub signs them with")
    return secret.get_secret_value()


def verified_groups(forge: Forge, principal: Principal, login: str) -> tuple[frozenset[str], dict]:
    """The person's groups that count for a decision made on GitHub: those whose mapped team they are in now."""
    teams = forge.settings.teams
    checked = {g: forge.is_team_member(teams[g], login) for g in sorted(principal.groups) if g in teams}
    return frozenset(g for g, member in checked.items() if member), checked


def github_team_checks(ws: Workspace, proposal: Proposal, ask_github: bool) -> dict[str, TeamCheck]:
    """The team membership of each person whose current approval was given on GitHub (principal id -> check).

    Asked of GitHub now when `ask_github` (the apply; each answer is recorded as `github.team_check`, so the
    views show what the apply found); otherwise the last check recorded for the person, because a read never
    writes nor waits on GitHub (a check of an account no longer linked to them counts for nothing).
    """
    if ws.repo_settings().github is None:  # no forge on main: GitHub approvals are not re-checked
        return {}
    forge = forge_of(ws) if ask_github else None
    checks: dict[str, TeamCheck] = {}
    for approval in proposal.current_approvals:
        if not approval.auth.startswith(GITHUB_AUTH):
            continue
        person = approval.principal
        with ws.store.session(readonly=True) as session:  # the linked account now, not the login of then
            login = session.principals.github_login_of(person.id)
            recorded = session.audit.events(actor=person.name, kind="github.team_check") if forge is None else []
        if forge is not None:
            groups, asked = verified_groups(forge, person, login) if login else (frozenset(), {})
            with ws.store.session() as session:
                session.audit.append(person, "github.team_check", {
                    "login": login, "teams": {g: forge.settings.teams[g] for g in asked}, "active": sorted(groups),
                    "not_member": sorted(g for g, ok in asked.items() if not ok), "head_sha": proposal.head_sha,
                    "at_apply": True}, proposal.id, proposal.stacks)
        else:
            last = recorded[-1].payload if recorded else {}
            groups = frozenset(last.get("active", ())) if login and last.get("login") == login else frozenset()
        checks[person.id] = TeamCheck(login, groups)
    return checks
