"""The simulated cloud, acted on behind the gateway's back: edit a live object, make an apply fail or slow."""

from __future__ import annotations

import json
from typing import Any

import click

from gateway.cli.context import Context, pass_ctx

group = click.Group("sandbox")  # this module's commands; gateway.cli registers each by name


@group.group()
def sandbox() -> None:
    """Act on the simulated cloud behind the gateway's back (drift, faults). A simulator only."""


@sandbox.command("edit")
@click.option("--stack", required=True)
@click.argument("address")
@click.argument("assignments", nargs=-1, required=True)
@pass_ctx
def sandbox_edit(ctx: Context, stack: str, address: str, assignments: tuple[str, ...]) -> None:
    """Change a live object as a console user would: ATTR=JSON_OR_TEXT ..."""
    from gateway.services.day_two.simulator import edit_live_object

    actor = ctx.actor()
    changes: dict[str, Any] = {}
    for item in assignments:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"expected ATTR=VALUE, got {item!r}")
        try:
            changes[name] = json.loads(raw)
        except json.JSONDecodeError:
            changes[name] = raw
    edit_live_object(ctx.ws, actor, stack, address, changes)
    click.echo(f"edited {address} in the simulated cloud: {', '.join(changes)}")


@sandbox.command("fail")
@click.option("--stack", required=True)
@click.argument("address")
@click.option("-m", "--message", default="simulated provider error", show_default=True)
@pass_ctx
def sandbox_fail(ctx: Context, stack: str, address: str, message: str) -> None:
    """Make the next apply of ADDRESS fail, leaving that apply half done."""
    from gateway.services.day_two.simulator import inject_fault

    inject_fault(ctx.ws, ctx.actor(), stack, address, message)
    click.echo(f"the next apply of {address} in stack {stack} will fail: {message}")


@sandbox.command("slow")
@click.option("--stack", required=True)
@click.argument("address")
@click.option("--seconds", type=float, required=True, help="how much longer the next apply of ADDRESS takes")
@pass_ctx
def sandbox_slow(ctx: Context, stack: str, address: str, seconds: float) -> None:
    """Make the next apply of ADDRESS slow, as a slow provider would (to watch locks and workers)."""
    from gateway.services.day_two.simulator import inject_delay

    inject_delay(ctx.ws, ctx.actor(), stack, address, seconds)
    click.echo(f"the next apply of {address} in stack {stack} will take {seconds:g} s longer")
