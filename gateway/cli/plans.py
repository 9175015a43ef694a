"""Plans and previews: render any Terraform plan file, or plan one stack of the declaration repo."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.context import FORMATS, Context, pass_ctx
from gateway.domain.plan import decode_plan_bytes, load_plan
from gateway.domain.preview import RENDERERS, build_preview

group = click.Group("plans")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def preview(plan_file: Path, fmt: str) -> None:
    """Render any Terraform/OpenTofu plan (`show -json` output) for a person."""
    try:
        content = plan_file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {plan_file}: {exc.strerror}") from None
    click.echo(RENDERERS[fmt](build_preview(load_plan(decode_plan_bytes(content)))), nl=False)


@group.command()
@click.option("--stack", required=True)
@click.option("--ref", default=None, help="git ref of the declaration repo (default: main)")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@pass_ctx
def plan(ctx: Context, stack: str, ref: str | None, fmt: str) -> None:
    """Plan one stack of the declaration repo with its engine and print the preview."""
    from gateway.services.change.planning import plan_stack

    ctx.actor()
    result = plan_stack(ctx.ws, stack, ref or ctx.ws.main_branch())
    if fmt == "text":
        click.echo(f"stack {stack} at {result.sha[:12]}, plan {result.digest[:19]}…, state serial {result.engine_plan.state_serial}")
    click.echo(RENDERERS[fmt](result.preview()), nl=False)
