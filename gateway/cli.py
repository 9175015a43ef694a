"""The `gateway` command. `preview` is defined here and starts fast; every other command lives in
gateway/commands.py, imported only when one of them runs (it pulls in the database, git and the engines)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gateway.domain.errors import GatewayError, Refused
from gateway.domain.plan import decode_plan_bytes, load_plan
from gateway.domain.preview import RENDERERS, build_preview


class _LazyGroup(click.Group):
    """Its own commands, plus those of gateway.commands, loaded on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_commands().commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or _commands().commands.get(name)


def _commands() -> click.Group:
    from gateway.commands import cli as commands

    return commands


@click.group(cls=_LazyGroup)
@click.version_option(package_name="change-gateway")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """The change gateway: the one path by which agents and people change infrastructure."""
    if ctx.invoked_subcommand != "preview":
        from gateway.logs import configure_logging

        configure_logging()


@cli.command()
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(sorted(RENDERERS)), default="text", show_default=True)
def preview(plan_file: Path, fmt: str) -> None:
    """Render any Terraform/OpenTofu plan (`show -json` output) for a person."""
    try:
        content = plan_file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {plan_file}: {exc.strerror}") from None
    click.echo(RENDERERS[fmt](build_preview(load_plan(decode_plan_bytes(content)))), nl=False)


def main(args: Any = None) -> None:
    """Entry point: a GatewayError is one clear line on stderr and a non-zero exit."""
    try:
        cli.main(args, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Refused as exc:
        for reason in exc.reasons:
            click.echo(f"refused: {reason}", err=True)
        sys.exit(1)
    except GatewayError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
