"""The declaration repositories the gateway serves: list them, add one, stop serving one."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.context import Context, pass_ctx

group = click.Group("repos")  # this module's commands; gateway.cli registers each by name


@group.group()
def repos() -> None:
    """The declaration repositories the gateway serves (`gateway --repo NAME ...` works in one)."""


@repos.command("list")
@pass_ctx
def repos_list(ctx: Context) -> None:
    """Each repository: its name, where its bare git repository is, who added it and when, removed or not."""
    from gateway.services.admin.repositories import list_repositories

    for repository in list_repositories(ctx.ws):
        state = f"removed {repository.removed_at:%Y-%m-%d} by {repository.removed_by}" if repository.removed_at \
            else "active"
        path = ctx.settings.in_repository(repository.name).repo_path
        click.echo(f"{repository.name:24} {state:32} added {repository.added_at:%Y-%m-%d} by "
                   f"{repository.added_by:12} {path}")


@repos.command("add")
@click.argument("name")
@click.option("--from", "content", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="a folder whose files are the first commit on main (it holds the gateway.yaml)")
@click.option("--sample", type=click.Choice(["sandbox", "terraform", "cloudformation"]), default="sandbox",
              show_default=True, help="without --from: the sample repository to start from")
@pass_ctx
def repos_add(ctx: Context, name: str, content: Path | None, sample: str) -> None:
    """Add a declaration repository (admins): a bare git repository in the workspace, its rules its own."""
    from gateway.composition import add_repository

    repository = add_repository(ctx.ws, ctx.actor(), name, content, sample)
    path = ctx.settings.in_repository(repository.name).repo_path
    click.echo(f"added repository {repository.name}: {path} (clone it; `gateway --repo {repository.name} ...`, or "
               "any command from inside the clone, works in it; its stacks read as "
               f"{repository.name}/STACK)")


@repos.command("remove")
@click.argument("name")
@pass_ctx
def repos_remove(ctx: Context, name: str) -> None:
    """Stop serving a repository (admins): nothing new is proposed or applied there; its records and trail stay."""
    from gateway.services.admin.repositories import remove_repository

    remove_repository(ctx.ws, ctx.actor(), name)
    click.echo(f"removed repository {name}: its proposals and trail stay readable")
