"""The audit trail for auditors: list and tell events, export them, verify the chain, sign checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gateway.cli.context import Context, echo_story, event_line, pass_ctx, pass_reader
from gateway.domain.audit import Checkpoint

group = click.Group("audit")  # this module's commands; gateway.cli registers each by name


@group.group()
def audit() -> None:
    """Query, export and verify the append-only, hash-chained audit trail."""


@audit.command("list")
@click.option("--proposal", "proposal_id", type=int, default=None)
@click.option("--actor", "actor_name", default=None)
@click.option("--stack", default=None)
@click.option("--since", default=None, help="ISO 8601 time")
@pass_reader
def audit_list(ctx: Context, proposal_id: int | None, actor_name: str | None, stack: str | None, since: str | None) -> None:
    """List events, oldest first."""
    from gateway.services.admin.audit import list_events

    for e in list_events(ctx.ws, ctx.actor(), proposal_id, actor_name, stack, since):
        click.echo(event_line(e))


@audit.command("show")
@click.argument("proposal_id", type=int, required=False)
@click.option("--break-glass", "window_id", type=int, default=None, help="a break-glass episode instead of a change")
@pass_reader
def audit_show(ctx: Context, proposal_id: int | None, window_id: int | None) -> None:
    """The whole story of one change, from request to merge (or of one break-glass episode)."""
    if (proposal_id is None) == (window_id is None):
        raise click.UsageError("name a proposal, or a break-glass window with --break-glass N")
    if window_id is not None:
        from gateway.services.day_two.break_glass import break_glass_story

        echo_story(break_glass_story(ctx.ws, ctx.actor(), window_id))
        return
    from gateway.services.admin.audit import proposal_story

    echo_story(proposal_story(ctx.ws, ctx.actor(), proposal_id or 0))


@audit.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.option("--proposal", "proposal_id", type=int, default=None)
@pass_reader
def audit_export(ctx: Context, fmt: str, proposal_id: int | None) -> None:
    """Export events with their hashes, for an auditor's own tools."""
    from gateway.services.admin.audit import export_events, list_events

    events = list_events(ctx.ws, ctx.actor(), proposal_id)
    with ctx.ws.store.session(readonly=True) as session:
        checkpoints = session.audit.checkpoints() if proposal_id is None else []
    click.echo(export_events(events, fmt, checkpoints), nl=False)


@audit.command("verify")
@click.option("--against", "checkpoint_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a checkpoint kept from `gateway audit checkpoint`: prove the trail up to it is unchanged")
@click.option("--resume", is_flag=True, help="only what follows the newest checkpoint this gateway signed")
@pass_reader
def audit_verify(ctx: Context, checkpoint_file: Path | None, resume: bool) -> None:
    """Check the hash chain (and, with --against, that it is the one a kept checkpoint signed); exit 1 if not."""
    from gateway.services.admin.audit import verify_checkpoint, verify_from_checkpoint, verify_trail

    if resume:
        count, broken, since = verify_from_checkpoint(ctx.ws, ctx.actor())
        if broken is None:
            where = f"after the checkpoint of event {since.seq}" if since else "from the start (no checkpoint yet)"
            click.echo(f"audit trail intact: {count} events verified {where}")
            return
    elif checkpoint_file is None:
        count, broken = verify_trail(ctx.ws, ctx.actor())
    else:
        try:
            checkpoint = Checkpoint.from_json(json.loads(checkpoint_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"{checkpoint_file} is not a checkpoint: {exc}") from None
        count, broken = verify_checkpoint(ctx.ws, ctx.actor(), checkpoint)
    if broken is not None:
        click.echo(f"audit trail BROKEN at event {broken.seq}: {broken.reason}", err=True)
        sys.exit(1)
    what = f"up to the checkpoint of event {count}, as signed" if checkpoint_file else "chain verified"
    click.echo(f"audit trail intact: {count} events, {what}")


@audit.command("checkpoint")
@pass_ctx
def audit_checkpoint(ctx: Context) -> None:
    """Sign the chain's head now and print the checkpoint: keep it somewhere the database's owner cannot write."""
    from gateway.services.admin.audit import sign_checkpoint

    click.echo(json.dumps(sign_checkpoint(ctx.ws, ctx.actor()).to_json(), indent=2))
