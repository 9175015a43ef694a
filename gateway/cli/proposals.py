"""The change path: open a proposal, read it, decide on it, apply and merge it, withdraw or roll it back.

Each command imports its services when it runs, so `gateway show --help` imports none of them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import click

from gateway.cli.context import (
    FORMATS,
    Context,
    echo_approval_state,
    echo_proposal,
    finish_job,
    pass_ctx,
    pass_reader,
    queue_job,
)
from gateway.domain.jobs import JobKind
from gateway.domain.proposal import Decision

group = click.Group("proposals")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.option("--branch", required=True)
@click.option("-m", "--message", "reason", required=True, help="why this change")
@pass_ctx
def propose(ctx: Context, branch: str, reason: str) -> None:
    """Open a proposal from a branch of the declaration repo: plan every stack it touches."""
    from gateway.services.change.proposals import open_proposal

    proposal = open_proposal(ctx.ws, ctx.actor(), branch, reason)
    click.echo(f"proposal {proposal.id} opened for {branch} at {proposal.head_sha[:12]}: stacks {', '.join(proposal.stacks) or '(none)'}")
    echo_proposal(ctx.ws, proposal, "text")


@group.command("list")
@click.option("--status", default=None)
@pass_reader
def list_proposals(ctx: Context, status: str | None) -> None:
    """List proposals: those waiting for your approval first (marked *), then newest first."""
    from gateway.services.change.views import list_proposal_rows

    for r in list_proposal_rows(ctx.ws, ctx.actor(), status):
        mark = "*" if r.waiting_for_you else " "
        click.echo(f"{mark}{r.id:>4}  {r.status:9} {r.risk:8} {_age(datetime.now(UTC) - r.created_at):>5} {r.branch:30} "
                   f"{','.join(r.stacks)}  "
                   f"{r.reason.splitlines()[0][:50]}")
        for blocker in r.blocked_by[:2]:
            click.echo(f"        blocked: {blocker}")


@group.command("inbox")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all-repositories", "everywhere", is_flag=True, help="what waits in every active repository")
@pass_reader
def show_inbox(ctx: Context, fmt: str, everywhere: bool) -> None:
    """Waiting for you: what you can approve or reject now, and why each needs you."""
    from gateway.services.change.inbox_all import RepositoryInboxItem, inbox_everywhere
    from gateway.services.change.views import inbox

    found = (inbox_everywhere(ctx.ws, ctx.actor()) if everywhere
             else [RepositoryInboxItem(ctx.ws.repository, i) for i in inbox(ctx.ws, ctx.actor())])
    if fmt == "json":  # the same document the API serves
        click.echo(json.dumps([i.to_public() for i in found], indent=2))
        return
    if not found:
        click.echo("nothing waits for you")
    for r in found:
        i, where = r.item, f"{r.repository}: " if everywhere else ""
        click.echo(f"{i.id:>4}  {i.risk:8} {where}{i.branch:30} {','.join(i.stacks)}  requested by {i.requester}: "
                   f"{i.reason.splitlines()[0][:50] if i.reason else ''}")
        for why in i.why:
            click.echo(f"        {why}")


def _age(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes < 120 else (f"{minutes // 60}h" if minutes < 48 * 60 else f"{minutes // 1440}d")


@group.command()
@click.argument("proposal_id", type=int)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@click.option("--diff", "show_diff", is_flag=True, help="also print the text diff of the branch")
@pass_reader
def show(ctx: Context, proposal_id: int, fmt: str, show_diff: bool) -> None:
    """Show a proposal: status, approvals (current or stale), and the preview of every stack."""
    actor = ctx.actor()
    if fmt == "json":  # the same document the API serves
        from gateway.services.change.views import view_proposal

        click.echo(json.dumps(view_proposal(ctx.ws, actor, proposal_id).to_public(), indent=2, default=str))
        return
    from gateway.services.change.plan_failures import standing_plan_failure
    from gateway.services.change.proposals import get_proposal, pending_changes
    from gateway.services.change.views import planning_of

    proposal = get_proposal(ctx.ws, proposal_id)
    with ctx.ws.store.session(readonly=True) as session:
        planning = planning_of(session, proposal_id)
    if planning is not None:
        click.echo(f"plans: {planning.summary()}")
        for reason in planning.reasons() if planning.finished else []:
            click.echo(f"  {reason}")
    for change in pending_changes(ctx.ws, proposal):
        click.echo(f"note: {change}; the plans below predate it (`gateway sync {proposal_id}` re-plans; approve and apply re-plan first)")
    failure = standing_plan_failure(ctx.ws, proposal, ctx.ws.store.queue.of_proposal(proposal_id))
    if failure is not None:
        click.echo(f"note: proposal {proposal_id} {failure.describe(proposal_id)}")
    echo_proposal(ctx.ws, proposal, fmt)
    if show_diff:
        click.echo(ctx.ws.repo.diff(proposal.base_sha, proposal.head_sha))


@group.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "comment", default="", help="comment")
@click.option("--sha", "seen_sha", default=None, help="the commit you reviewed; refused if the branch moved")
@pass_ctx
def approve(ctx: Context, proposal_id: int, comment: str, seen_sha: str | None) -> None:
    """Approve the proposal's current commit and plans."""
    from gateway.services.change.jobs import approve_proposal

    proposal, queued = approve_proposal(ctx.ws, ctx.actor(), proposal_id, comment, seen_sha)
    click.echo(f"approved proposal {proposal.id} at {proposal.head_sha[:12]}")
    if queued is None:
        echo_approval_state(ctx.ws, proposal)
        return
    click.echo("the last approval needed: applying now (gateway.yaml approvals.auto_apply)")
    finish_job(ctx, queued, no_wait=False)


@group.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "comment", required=True, help="why it is rejected")
@pass_ctx
def reject(ctx: Context, proposal_id: int, comment: str) -> None:
    """Reject the proposal; it stays stopped until a new commit."""
    from gateway.services.change.proposals import decide

    proposal = decide(ctx.ws, ctx.actor(), proposal_id, Decision.REJECT, comment)
    click.echo(f"rejected proposal {proposal.id} at {proposal.head_sha[:12]}: {comment}")


@group.command()
@click.argument("proposal_id", type=int)
@click.option("--finding", "finding_key", required=True, help="STACK:RULE:ADDRESS, as `gateway show` lists it")
@click.option("-m", "--reason", required=True)
@click.option("--expires", required=True, type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M"]),
              help="when the override stops counting (UTC)")
@pass_ctx
def override(ctx: Context, proposal_id: int, finding_key: str, reason: str, expires: datetime) -> None:
    """Override one deny finding as a policy owner (recorded, attributable, expiring)."""
    from gateway.services.change.proposals import override_finding

    proposal = override_finding(ctx.ws, ctx.actor(), proposal_id, finding_key, reason, expires.replace(tzinfo=UTC))
    click.echo(f"overrode {finding_key} on proposal {proposal.id} until {expires:%Y-%m-%d %H:%M} UTC")
    echo_approval_state(ctx.ws, proposal)


@group.command()
@click.argument("proposal_id", type=int)
@click.option("--no-wait", is_flag=True, help="queue the apply for a worker and print its job id")
@pass_ctx
def apply(ctx: Context, proposal_id: int, no_wait: bool) -> None:
    """Apply exactly the approved plans, one stack at a time, then merge the branch (a job)."""
    queue_job(ctx, JobKind.APPLY, proposal_id, no_wait)


@group.command()
@click.argument("proposal_id", type=int)
@click.option("--no-wait", is_flag=True, help="queue the plan for a worker and print its job id")
@pass_ctx
def sync(ctx: Context, proposal_id: int, no_wait: bool) -> None:
    """Re-plan a proposal whose branch, main or stack state moved since its plans (a job)."""
    queue_job(ctx, JobKind.PLAN, proposal_id, no_wait)


@group.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "reason", required=True, help="why it is withdrawn")
@pass_ctx
def abandon(ctx: Context, proposal_id: int, reason: str) -> None:
    """Withdraw a proposal (open or failed); its branch may be proposed again."""
    from gateway.services.change.proposals import abandon_proposal

    proposal = abandon_proposal(ctx.ws, ctx.actor(), proposal_id, reason)
    click.echo(f"proposal {proposal.id} is {proposal.status.value}")


@group.command()
@click.argument("proposal_id", type=int)
@click.option("--acknowledge", is_flag=True, help="main was made to describe what runs by hand; record that")
@click.option("-m", "--message", "note", default=None, help="with --acknowledge: how main was made right")
@pass_ctx
def merge(ctx: Context, proposal_id: int, acknowledge: bool, note: str | None) -> None:
    """Leave `unmerged`: merge an applied proposal into main again, or acknowledge a merge made by hand."""
    from gateway.services.change.runner import merge_unmerged

    proposal = merge_unmerged(ctx.ws, ctx.actor(), proposal_id, (note or "") if acknowledge else None)
    click.echo(f"proposal {proposal.id} is {proposal.status.value}; its stacks are unlocked")


@group.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "reason", required=True, help="why it is rolled back")
@pass_ctx
def rollback(ctx: Context, proposal_id: int, reason: str) -> None:
    """Open a proposal that reverts the merge of an applied change, planned and approved like any other."""
    from gateway.services.day_two.rollback import rollback_proposal

    proposal = rollback_proposal(ctx.ws, ctx.actor(), proposal_id, reason)
    click.echo(f"proposal {proposal.id} rolls back proposal {proposal_id} on branch {proposal.branch}: "
               f"stacks {', '.join(proposal.stacks) or '(none)'}")
    echo_proposal(ctx.ws, proposal, "text")
