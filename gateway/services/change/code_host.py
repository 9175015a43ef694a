"""The code host behind the forge port: which one main's gateway.yaml names, its webhook secret, and who counts.

A person's GitHub decision counts only for the groups whose mapped team they are an active member
of now: asked of GitHub at the apply (and recorded), read from the last recorded check by views.
"""

from __future__ import annotations

from gateway.domain.apply_blockers import GITHUB_AUTH, GITLAB_AUTH, TeamCheck
from gateway.domain.errors import ConfigError
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.domain.repo_settings import GitLabSettings
from gateway.ports import Forge, UnitOfWork
from gateway.services.workspace import Workspace


def forge_of(ws: Workspace) -> Forge | None:
    """The repo's GitHub or GitLab, as main's gateway.yaml says `forge:` (the composition root makes the client)."""
    forge = ws.repo_settings().forge
    return None if forge is None else ws.open_forge(forge)


def refresh_from_github(ws: Workspace, proposal: Proposal) -> None:
    """Before an apply: main and the pull request's branch as GitHub has them now (no forge: nothing to do)."""
    forge = forge_of(ws)
    if forge is None:
        return
    with ws.store.session(readonly=True) as session:
        linked = session.github.pull_request_of(proposal.id) is not None
    forge.fetch_main(ws.main_branch())
    if linked:
        forge.sync_branch(proposal.branch)


def require_webhook_secret(ws: Workspace) -> str | None:
    """The webhook secret, or None without a forge; a forge without a secret stops the service from starting."""
    try:
        forge = ws.repo_settings().forge
    except ConfigError:  # a broken gateway.yaml is reported where it is used; it does not stop the service
        return None
    if forge is None:
        return None
    if isinstance(forge, GitLabSettings):
        secret = ws.settings.gitlab_webhook_secret
        if secret is None or not secret.get_secret_value().strip():
            raise ConfigError("gateway.yaml says forge: gitlab, but GATEWAY_GITLAB_WEBHOOK_SECRET is not set: the "
                              "webhook route will not accept deliveries without a token; set the secret token the "
                              "project's webhook sends (X-Gitlab-Token)")
        return secret.get_secret_value()
    secret = ws.settings.github_webhook_secret
    if secret is None or not secret.get_secret_value().strip():
        raise ConfigError("gateway.yaml says forge: github, but GATEWAY_GITHUB_WEBHOOK_SECRET is not set: the webhook "
                          "route will not accept unsigned deliveries; set the secret GitHub signs them with")
    return secret.get_secret_value()


def verified_groups(forge: Forge, principal: Principal, login: str,
                    account_id: int | None = None) -> tuple[frozenset[str], dict]:
    """The person's groups that count for a decision made on the forge: those whose mapped team (GitLab group)
    they are an active member of now (GitHub asks by login, GitLab by the numeric user id)."""
    teams = forge.settings.teams
    checked = {g: forge.is_team_member(teams[g], login, account_id) for g in sorted(principal.groups) if g in teams}
    return frozenset(g for g, member in checked.items() if member), checked


def github_team_checks(ws: Workspace, proposal: Proposal, ask_github: bool) -> dict[str, TeamCheck]:
    """The team membership of each person whose current approval was given on GitHub (principal id -> check).

    Asked of GitHub now when `ask_github` (the apply; each answer is recorded as `github.team_check`, so the
    views show what the apply found); otherwise the last check recorded for the person, because a read never
    writes nor waits on GitHub (a check of an account no longer linked to them counts for nothing).
    """
    settings = ws.repo_settings().forge
    if settings is None:  # no forge on main: forge approvals are not re-checked
        return {}
    on_gitlab = isinstance(settings, GitLabSettings)
    prefixes, kind = (GITLAB_AUTH, "gitlab.group_check") if on_gitlab else (GITHUB_AUTH, "github.team_check")
    forge = forge_of(ws) if ask_github else None
    checks: dict[str, TeamCheck] = {}
    for approval in proposal.current_approvals:
        if not approval.auth.startswith(prefixes):
            continue
        person = approval.principal
        with ws.store.session(readonly=True) as session:  # the linked account now, not the login of then
            account_id, login = _linked_account(session, person.id, on_gitlab)
            recorded = session.audit.events(actor=person.name, kind=kind) if forge is None else []
        if forge is not None:
            groups, asked = verified_groups(forge, person, login, account_id) if login else (frozenset(), {})
            with ws.store.session() as session:
                session.audit.append(person, kind, {
                    "login": login, "teams": {g: forge.settings.teams[g] for g in asked}, "active": sorted(groups),
                    "not_member": sorted(g for g, ok in asked.items() if not ok), "head_sha": proposal.head_sha,
                    "at_apply": True}, proposal.id, proposal.stacks)
        else:
            last = recorded[-1].payload if recorded else {}
            groups = frozenset(last.get("active", ())) if login and last.get("login") == login else frozenset()
        checks[person.id] = TeamCheck(login, groups)
    return checks


def _linked_account(session: UnitOfWork, principal_id: str, on_gitlab: bool) -> tuple[int | None, str | None]:
    """The person's linked account on the forge: (numeric id on GitLab, login or username); (None, None): none."""
    if on_gitlab:
        account = session.principals.gitlab_account_of(principal_id)
        return account if account else (None, None)
    return None, session.principals.github_login_of(principal_id)
