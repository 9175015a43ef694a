"""Administration of principals: people and agents, their roles and groups, tokens, and GitHub accounts."""

from __future__ import annotations

import click

from gateway.cli.context import Context, pass_ctx
from gateway.domain.principals import PrincipalKind, Role

group = click.Group("users")  # this module's commands; gateway.cli registers each by name


@group.group()
def users() -> None:
    """People and agents, and their tokens."""


@users.command("add")
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice([r.value for r in Role]))
@click.option("--group", "groups", multiple=True, help="approver group, e.g. platform")
@click.option("--agent", is_flag=True, help="an AI agent principal (never approver or admin)")
@click.option("--for", "acting_for", default=None, help="with --agent: the person every call of the agent is for")
@pass_ctx
def users_add(ctx: Context, name: str, roles: tuple[str, ...], groups: tuple[str, ...], agent: bool,
              acting_for: str | None) -> None:
    """Create a principal and print its API token (shown once, stored hashed)."""
    from gateway.services.admin.users import add_principal

    actor = ctx.actor() if ctx.settings.token else None
    principal, token = add_principal(
        ctx.ws, actor, name, frozenset(Role(r) for r in roles), frozenset(groups),
        PrincipalKind.AGENT if agent else PrincipalKind.PERSON, acting_for)
    click.echo(f"added {principal.kind.value} {principal.name} ({', '.join(sorted(roles))})", err=True)
    click.echo(token)


@users.command("list")
@pass_ctx
def users_list(ctx: Context) -> None:
    """List principals: kind, roles, groups, state, token expiry and last use (never tokens), linked identities.

    Auditors and admins only: it is what the audit trail records of every user.
    """
    from gateway.services.admin.users import list_users

    for user in list_users(ctx.ws, ctx.actor()):
        p = user.principal
        used = f"{user.last_used_at:%Y-%m-%d %H:%M}" if user.last_used_at else "never"
        expires = f"{user.token_expires_at:%Y-%m-%d}" if user.token_expires_at else "-"
        click.echo(f"{p.name:20} {p.kind.value:7} {','.join(sorted(p.roles)):25} {','.join(sorted(p.groups)):18} "
                   f"{'DISABLED' if p.disabled else 'enabled':9} token expires {expires:10} last used {used}")
        for issuer, subject in user.identities:
            click.echo(f"{'':20} signs in as {subject} at {issuer}")


@users.command("disable")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_disable(ctx: Context, name: str, reason: str) -> None:
    """Disable a principal: no sign-in, no API, and their approvals stop counting."""
    from gateway.services.admin.users import disable_principal

    disable_principal(ctx.ws, ctx.actor(), name, reason)
    click.echo(f"{name} disabled")


@users.command("enable")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_enable(ctx: Context, name: str, reason: str) -> None:
    """Enable a disabled principal again: sign-in and the API work for them once more."""
    from gateway.services.admin.users import enable_principal

    enable_principal(ctx.ws, ctx.actor(), name, reason)
    click.echo(f"{name} enabled")


@users.command("rotate-token")
@click.argument("name")
@pass_ctx
def users_rotate(ctx: Context, name: str) -> None:
    """Print a new token for NAME (shown once); the old one stops working at once."""
    from gateway.services.admin.users import rotate_token

    click.echo(rotate_token(ctx.ws, ctx.actor(), name))


@users.command("revoke-token")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_revoke(ctx: Context, name: str, reason: str) -> None:
    """No token works for NAME until one is rotated."""
    from gateway.services.admin.users import revoke_token

    revoke_token(ctx.ws, ctx.actor(), name, reason)
    click.echo(f"{name}'s token revoked")


@users.command("set")
@click.argument("name")
@click.option("--role", "roles", multiple=True, type=click.Choice([r.value for r in Role]), help="replaces the roles")
@click.option("--group", "groups", multiple=True, help="replaces the approver groups")
@click.option("--no-groups", is_flag=True, help="remove every approver group")
@pass_ctx
def users_set(ctx: Context, name: str, roles: tuple[str, ...], groups: tuple[str, ...], no_groups: bool) -> None:
    """Change a principal's roles and/or approver groups."""
    from gateway.services.admin.users import set_access

    new_groups = frozenset() if no_groups else (frozenset(groups) if groups else None)
    p = set_access(ctx.ws, ctx.actor(), name, frozenset(Role(r) for r in roles) if roles else None, new_groups)
    click.echo(f"{p.name}: roles {','.join(sorted(p.roles))}; groups {','.join(sorted(p.groups)) or '-'}")


@users.command("link")
@click.argument("name")
@click.option("--github", "login", default=None, help="their GitHub login (its numeric id is what is stored)")
@click.option("--github-id", type=click.IntRange(1), default=None,
              help="the numeric id, when GitHub cannot be asked (otherwise looked up)")
@click.option("--gitlab", "username", default=None, help="their GitLab username (its numeric id is what is stored)")
@click.option("--gitlab-id", type=click.IntRange(1), default=None,
              help="the numeric user id, when GitLab cannot be asked (otherwise looked up)")
@pass_ctx
def users_link(ctx: Context, name: str, login: str | None, github_id: int | None, username: str | None,
               gitlab_id: int | None) -> None:
    """Link a person (or the agent, whose approvals then never count) to a GitHub or GitLab account."""
    if (login is None) == (username is None):
        raise click.UsageError("name one account: --github LOGIN or --gitlab USERNAME")
    if username is not None:
        from gateway.services.forge.gitlab_webhooks import link_account as link_gitlab

        gitlab_id, username = link_gitlab(ctx.ws, ctx.actor(), name, username, gitlab_id)
        click.echo(f"linked {name} to GitLab user {username} (id {gitlab_id})")
        return
    from gateway.services.forge.github import link_account

    assert login is not None
    github_id, login = link_account(ctx.ws, ctx.actor(), name, login, github_id)
    click.echo(f"linked {name} to GitHub user {login} (id {github_id})")


@users.command("link-identity")
@click.argument("name")
@click.option("--issuer", required=True, help="the OpenID Connect issuer URL (the ID token's iss)")
@click.option("--subject", required=True, help="the identity's subject there (the ID token's sub; never an e-mail)")
@pass_ctx
def users_link_identity(ctx: Context, name: str, issuer: str, subject: str) -> None:
    """Link a person to an OpenID Connect identity, so they can sign in to the pages with it."""
    from gateway.services.admin.sign_in import link_identity

    link_identity(ctx.ws, ctx.actor(), name, issuer, subject)
    click.echo(f"linked {name} to {subject} at {issuer}")
