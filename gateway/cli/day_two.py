"""Day two: what changed outside the gateway (pushes to main, drift, objects made by hand) and the
incident windows in which changing a stack by hand is allowed, in the open."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from gateway.cli.context import Context, echo_proposal, echo_story, pass_ctx
from gateway.domain.jobs import JobStatus

if TYPE_CHECKING:
    from gateway.services.day_two.drift import DriftOutcome

group = click.Group("day_two")  # this module's commands; gateway.cli registers each by name


# --- pushes to main --------------------------------------------------------------------------


@group.group("main")
def main_group() -> None:
    """Commits pushed to main outside the gateway."""


@main_group.command("status")
@pass_ctx
def main_status(ctx: Context) -> None:
    """Pushes to main the gateway did not make and nobody acknowledged yet."""
    from gateway.services.change.main_watch import unacknowledged, watch_main

    ctx.actor()
    watch_main(ctx.ws)
    pushes = unacknowledged(ctx.ws)
    for p in pushes:
        click.echo(f"{p.sha[:12]} by {p.author}: stacks {', '.join(sorted(p.stacks)) or '-'}")
    if not pushes:
        click.echo("main holds only what the gateway merged (or what was acknowledged)")


@main_group.command("acknowledge")
@click.argument("sha")
@click.option("-m", "--message", "reason", required=True, help="what was done about it")
@pass_ctx
def main_acknowledge(ctx: Context, sha: str, reason: str) -> None:
    """Acknowledge a push to main (reverted, or brought in through a proposal): applies on its stacks go on."""
    from gateway.services.change.main_watch import acknowledge_push

    push = acknowledge_push(ctx.ws, ctx.actor(), sha, reason)
    click.echo(f"acknowledged {push.sha[:12]} (stacks {', '.join(sorted(push.stacks)) or '-'})")


# --- drift -----------------------------------------------------------------------------------


@group.group("drift", invoke_without_command=True)
@click.option("--stack", "stacks", multiple=True, help="without a subcommand: as `gateway drift revert`")
@click.pass_context
def drift(click_ctx: click.Context, stacks: tuple[str, ...]) -> None:
    """Drift: check and record it (check, list), and the ways out (revert, codify)."""
    if click_ctx.invoked_subcommand is None:
        click_ctx.invoke(drift_revert, stacks=stacks)


@drift.command("revert")
@click.option("--stack", "stacks", multiple=True, help="stacks to check (default: every stack)")
@pass_ctx
def drift_revert(ctx: Context, stacks: tuple[str, ...]) -> None:
    """Look for drift; revert it alone where gateway.yaml allows, else open a revert that needs approval."""
    from gateway.services.day_two.drift import revert_drift

    actor = ctx.actor()
    failed = [stack for stack in stacks or sorted(ctx.ws.repo_settings().stacks)
              if not echo_drift_outcome(ctx, revert_drift(ctx.ws, actor, stack))]
    if failed:
        sys.exit(1)


def echo_drift_outcome(ctx: Context, outcome: DriftOutcome) -> bool:
    """What a look for drift did on one stack, as is true when it is printed: an automatic revert is run here on the
    embedded default (as `gateway apply` runs its job there), else said to be queued. False: its apply failed."""
    from gateway.domain.lifecycle import DECIDABLE
    from gateway.services.change.jobs import run_now_or_follow, runs_jobs_here
    from gateway.services.change.runner import runner_name

    p, stack = outcome.proposal, outcome.stack
    if p is None:
        click.echo(f"{stack}: {'; '.join(outcome.reasons)}")
        return True
    state = "" if p.status in DECIDABLE else f" ({p.status.value})"
    which = (f"proposal {p.id}{state} was planned before this drift; planned again, it" if outcome.replanned
             else f"proposal {p.id}{state} already" if outcome.already else f"proposal {p.id}")
    if not outcome.automatic:
        click.echo(f"{stack}: {which} reverts the drift and needs approval: {'; '.join(outcome.reasons)}")
        return True
    job = outcome.job
    if job is None:
        click.echo(f"{stack}: {which} reverts the drift without approval (gateway.yaml sets drift.auto_revert)")
        return True
    if not runs_jobs_here(ctx.ws):
        click.echo(f"{stack}: {which} reverts the drift without approval (gateway.yaml sets drift.auto_revert): "
                   f"its apply is queued as job {job.id} for a worker; `gateway job {job.id} --wait` follows it")
        return True
    click.echo(f"{stack}: {which} reverts the drift without approval (gateway.yaml sets drift.auto_revert); "
               f"applying it (job {job.id})", err=True)
    done = run_now_or_follow(ctx.ws, job, runner_name(), lambda line: click.echo(f"  {line}", err=True))
    if done.status == JobStatus.SUCCEEDED:
        click.echo(f"{stack}: drift reverted automatically by proposal {p.id} (job {job.id})")
        return True
    why = "; ".join(done.result.get("reasons") or []) or done.error or done.status.value
    click.echo(f"{stack}: the automatic revert by proposal {p.id} did not apply (job {job.id} {done.status.value}): "
               f"{why}", err=True)
    return False


@drift.command("check")
@click.option("--stack", "stacks", multiple=True, help="stacks to check (default: every stack)")
@pass_ctx
def drift_check(ctx: Context, stacks: tuple[str, ...]) -> None:
    """Refresh main's declaration against reality; record what drifted (a drift record per stack)."""
    from gateway.services.day_two.drift_records import check_drift

    actor = ctx.actor()
    for stack in stacks or sorted(ctx.ws.repo_settings().stacks):
        check = check_drift(ctx.ws, actor, stack)
        if check.record is None:
            click.echo(f"{stack}: no drift")
            continue
        r = check.record
        click.echo(f"{stack}: drift record {r.id} {check.outcome}" + (" (expected: break-glass window)" if r.expected else ""))
        for entry in check.found:
            click.echo(f"  ! {entry.address}: {entry.summary.split(';')[0]}")  # what main's apply would do is a proposal's
            for a in entry.attributes:
                click.echo(f"      {a.path}: {a.before or '(unset)'} (recorded) -> {a.after or '(unset)'} (now)")


@drift.command("list")
@click.option("--stack", default=None)
@click.option("--open", "only_open", is_flag=True, help="only open records")
@pass_ctx
def drift_list(ctx: Context, stack: str | None, only_open: bool) -> None:
    """Drift records, newest first: open ones need a revert or a codify."""
    from gateway.services.day_two.drift_records import list_drift_records

    records = list_drift_records(ctx.ws, ctx.actor(), stack, only_open)
    for r in records:
        state = "OPEN" if r.status.value == "open" else "closed"
        click.echo(f"{r.id:>4} {r.stack:14} {state:6} since {r.opened_at:%Y-%m-%d %H:%M}"
                   + (" expected (break-glass)" if r.expected else "") + f"  {r.describe()[:120]}")
        if r.closed_reason:
            click.echo(f"       closed {r.closed_at:%Y-%m-%d %H:%M} by {r.closed_by}: {r.closed_reason}")
    if not records:
        click.echo("no drift recorded")


@drift.command("codify")
@click.option("--stack", required=True)
@pass_ctx
def drift_codify(ctx: Context, stack: str) -> None:
    """Open a proposal that changes the declaration to match reality (a plan with no changes proves it)."""
    from gateway.services.day_two.codify import codify_drift

    proposal = codify_drift(ctx.ws, ctx.actor(), stack)
    click.echo(f"proposal {proposal.id} codifies the drift on {stack} (branch {proposal.branch}); "
               "its plan has no changes, and once applied the drift record closes")
    echo_proposal(ctx.ws, proposal, "text")


@group.command("import")
@click.option("--stack", required=True)
@click.argument("address")
@click.argument("resource_id")
@click.option("--set", "assignments", multiple=True, help="ATTR=JSON_OR_TEXT: declare this instead of what the object holds")
@pass_ctx
def import_command(ctx: Context, stack: str, address: str, resource_id: str, assignments: tuple[str, ...]) -> None:
    """Bring an existing object under management: an import block plus its configuration, proven zero-diff (sandbox)."""
    from gateway.services.day_two.imports import import_resource, parse_overrides

    proposal = import_resource(ctx.ws, ctx.actor(), stack, address, resource_id, parse_overrides(assignments))
    click.echo(f"proposal {proposal.id} imports {address} (id {resource_id}) on branch {proposal.branch}: "
               "the plan shows the import and no other change for it")
    echo_proposal(ctx.ws, proposal, "text")


# --- break-glass -----------------------------------------------------------------------------


@group.group("break-glass")
def break_glass() -> None:
    """Incident windows: change a stack outside the gateway, in the open, then codify within the deadline."""


@break_glass.command("open")
@click.option("--stack", required=True)
@click.option("-m", "--message", "reason", required=True, help="the incident, e.g. 'incident 4711: db CPU'")
@click.option("--for", "duration", required=True, help="how long, e.g. 2h or 30m")
@pass_ctx
def break_glass_open(ctx: Context, stack: str, reason: str, duration: str) -> None:
    """Open a window (a break-glass group member; on a protected stack a second person confirms)."""
    from gateway.domain.drift import parse_interval
    from gateway.services.day_two.break_glass import open_break_glass

    window = open_break_glass(ctx.ws, ctx.actor(), stack, reason, parse_interval(duration, "--for"))
    if window.opened_at is None:
        click.echo(f"break-glass window {window.id} on {stack} waits for a second person of the break-glass group: "
                   f"`gateway break-glass confirm {window.id}`")
    else:
        click.echo(f"break-glass window {window.id} on {stack} is open until {window.ends_at:%Y-%m-%d %H:%M} UTC; "
                   "drift made meanwhile is expected, and must be codified after it")


@break_glass.command("confirm")
@click.argument("window_id", type=int)
@pass_ctx
def break_glass_confirm(ctx: Context, window_id: int) -> None:
    """Confirm a window asked for on a protected stack (a second person of the break-glass group)."""
    from gateway.services.day_two.break_glass import confirm_break_glass

    window = confirm_break_glass(ctx.ws, ctx.actor(), window_id)
    click.echo(f"break-glass window {window.id} on {window.stack} is open until {window.ends_at:%Y-%m-%d %H:%M} UTC")


@break_glass.command("close")
@click.argument("window_id", type=int)
@click.option("-m", "--message", "note", default="", help="how the incident ended")
@pass_ctx
def break_glass_close(ctx: Context, window_id: int, note: str) -> None:
    """End a window early; its drift is recorded and the codify deadline starts."""
    from gateway.services.day_two.break_glass import close_break_glass

    window = close_break_glass(ctx.ws, ctx.actor(), window_id, note)
    deadline = window.codify_by(ctx.ws.repo_settings().break_glass)
    click.echo(f"break-glass window {window.id} on {window.stack} closed; codify its drift by "
               f"{deadline:%Y-%m-%d %H:%M} UTC (`gateway drift codify --stack {window.stack}`)" if deadline else
               f"break-glass window {window.id} cancelled before it opened")


@break_glass.command("acknowledge")
@click.argument("window_id", type=int)
@click.option("-m", "--message", "note", required=True, help="what is being done about the uncodified drift")
@pass_ctx
def break_glass_acknowledge(ctx: Context, window_id: int, note: str) -> None:
    """Acknowledge an overdue window (the break-glass group): applies on its stack go on."""
    from gateway.services.day_two.break_glass import acknowledge_break_glass

    window = acknowledge_break_glass(ctx.ws, ctx.actor(), window_id, note)
    click.echo(f"break-glass window {window.id} on {window.stack} acknowledged; applies there go on")


@break_glass.command("list")
@pass_ctx
def break_glass_list(ctx: Context) -> None:
    """Break-glass windows, newest first, with where each stands."""
    from gateway.services.day_two.break_glass import windows_of

    ctx.actor()  # a read: each window's state is computed from the clock; workers record what time did
    settings = ctx.ws.repo_settings().break_glass
    windows = windows_of(ctx.ws)
    for w in windows:
        deadline = w.codify_by(settings)
        click.echo(f"{w.id:>4} {w.stack:14} {w.state(datetime.now(UTC), settings).value:22} by {w.opened_by}"
                   + (f" (confirmed by {w.confirmed_by})" if w.confirmed_by else "")
                   + (f", codify by {deadline:%Y-%m-%d %H:%M}" if deadline else "") + f": {w.reason}")
    if not windows:
        click.echo("no break-glass window was ever opened")


@break_glass.command("show")
@click.argument("window_id", type=int)
@pass_ctx
def break_glass_show(ctx: Context, window_id: int) -> None:
    """The whole episode as one story (as `gateway audit show --break-glass N`)."""
    from gateway.services.day_two.break_glass import break_glass_story

    echo_story(break_glass_story(ctx.ws, ctx.actor(), window_id))
