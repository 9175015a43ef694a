"""Notifications: what was told to whom, delivered or reported failed."""

from __future__ import annotations

import click

from gateway.cli.context import Context, pass_reader

group = click.Group("notifications")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.option("--status", type=click.Choice(["queued", "delivered", "failed", "skipped"]), help="only these")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@pass_reader
def notifications(ctx: Context, status: str | None, limit: int) -> None:
    """Notifications sent to Slack, e-mail and webhooks: delivered, waiting for a retry, failed, or skipped (newest first)."""
    from gateway.domain.notifications import NotificationStatus
    from gateway.services.notifications.delivery import list_notifications

    actor = ctx.actor()
    found = list_notifications(ctx.ws, actor, NotificationStatus(status) if status else None, limit)
    for n in found:
        when = f" at {n.delivered_at:%Y-%m-%d %H:%M:%S}" if n.delivered_at else ""
        proposal = f" proposal {n.notice.proposal_id}" if n.notice.proposal_id else ""
        click.echo(f"{n.id:>5} {n.status.value:<9} {n.event.value:<19} {n.channel.kind.value}:{n.channel.name}"
                   f"{proposal} attempts {n.attempts}{when} (job {n.job_id})")
        if n.error:
            click.echo(f"      {n.error}")
    if not found:
        click.echo("no notifications" + (f" {status}" if status else ""))
