"""Agents: ask ours for a change (once, or in a chat), serve an external one over MCP, and the circuit
breaker that stops them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from gateway.cli.context import Context, echo_proposal, pass_ctx
from gateway.domain.errors import Refused
from gateway.domain.jobs import JobStatus

if TYPE_CHECKING:
    from gateway.domain.principals import Principal

group = click.Group("agents")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.argument("text")
@click.option("--conversation", default=None, help="continue this conversation (adds a commit to its proposal)")
@pass_ctx
def request(ctx: Context, text: str, conversation: str | None) -> None:
    """Ask the agent for a change in plain words; it opens a proposal you cannot approve yourself."""
    _run_request(ctx, ctx.actor(), text, conversation)


@group.command()
@pass_ctx
def chat(ctx: Context) -> None:
    """Talk to the agent; each message after the first refines the same proposal. Empty line or EOF quits."""
    from gateway.services.agents.agent_requests import model_from_settings

    actor = ctx.actor()
    model_from_settings(ctx.ws)  # fail now, not after the first message, when no model is configured
    conversation = None
    while True:
        try:
            text = click.prompt("you", default="", show_default=False, err=True)
        except (EOFError, click.exceptions.Abort):
            break
        if not text.strip():
            break
        conversation = _run_request(ctx, actor, text, conversation)


def _run_request(ctx: Context, actor: Principal, text: str, conversation: str | None) -> str:
    """Queue the turn, run it here (or follow the worker that took it), and print how it ended."""
    from gateway.services.agents.agent_runs import get_agent_run, start_agent_run, turn_result
    from gateway.services.change.jobs import run_now_or_follow
    from gateway.services.change.proposals import get_proposal
    from gateway.services.change.runner import runner_name

    run = start_agent_run(ctx.ws, actor, text, conversation)
    assert run.conversation_id is not None and run.job_id is not None  # a new run has both
    done = run_now_or_follow(ctx.ws, ctx.ws.store.queue.get(run.job_id), runner_name(),
                             lambda step: click.echo(f"  … {step}", err=True))
    if done.status == JobStatus.REFUSED:
        raise Refused(done.result.get("reasons") or [done.error or "refused"])
    outcome = turn_result(done)
    if outcome is None:  # failed or interrupted: the run says what happened and what to do
        ended = get_agent_run(ctx.ws, actor, run.id)
        click.echo(f"error: {ended.message or done.error or done.status.value}", err=True)
        sys.exit(1)
    click.echo(f"conversation {outcome.conversation_id}: {outcome.steps} model call(s), {outcome.tokens} tokens")
    if outcome.stopped:
        click.echo(f"stopped: {outcome.stopped}")
    elif outcome.question:
        click.echo(f"agent asks: {outcome.question}")
        click.echo(f"  (waiting for your answer: reply here in chat, or gateway request --conversation "
                   f"{outcome.conversation_id} \"your answer\")")
    elif outcome.proposal_id is None:
        click.echo(f"agent: {outcome.summary or 'no change made'}")
    else:
        p = get_proposal(ctx.ws, outcome.proposal_id)
        verb = "opened" if outcome.opened else "updated (new commit, re-planned)"
        click.echo(f"proposal {p.id} {verb} by {p.proposer.name} for {p.requester.name} on {p.branch}")
        click.echo(f"agent's claim: {outcome.summary}")
        for issue in outcome.claim_issues:
            click.echo(f"  ! claim does not match the plan: {issue}")
        echo_proposal(ctx.ws, p, "text")
    return outcome.conversation_id


@group.command("mcp")
@pass_ctx
def mcp(ctx: Context) -> None:
    """The MCP server over stdio, for an external agent whose token is GATEWAY_TOKEN (`--agent --for PERSON`)."""
    from gateway.mcp_server import build_server  # the MCP SDK only for this command

    principal = ctx.actor()
    sys.stdout = sys.__stdout__  # the protocol's own stream: every tool result is scrubbed where it is made
    build_server(ctx.ws, principal).run("stdio")


# --- the circuit breaker ---------------------------------------------------------------------


@group.group()
def breaker() -> None:
    """The circuit breaker on agent changes, and the kill switch."""


@breaker.command("status")
@pass_ctx
def breaker_show(ctx: Context) -> None:
    """Every breaker that was tripped, opened or reset, and where it stands."""
    from gateway.services.change.breaker import breaker_status

    ctx.actor()
    states = breaker_status(ctx.ws)
    for s in states:
        click.echo(f"{s['agent']:20} {'OPEN' if s['open'] else 'closed':6} since {s['changed_at']:%Y-%m-%d %H:%M} "
                   f"by {s['changed_by']}: {s['reason']}")
    if not states:
        click.echo("no breaker has tripped: every agent may propose")


@breaker.command("open")
@click.option("--agent", "agent_name", default=None, help="one agent (default: every agent, the kill switch)")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def breaker_open(ctx: Context, agent_name: str | None, reason: str) -> None:
    """Stop agents now: no agent proposes, running requests stop (admins only)."""
    from gateway.services.change.breaker import open_breaker

    open_breaker(ctx.ws, ctx.actor(), agent_name, reason)
    click.echo(f"breaker open for {agent_name or 'every agent'}")


@breaker.command("reset")
@click.option("--agent", "agent_name", default=None, help="one agent's breaker (default: the one for every agent)")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def breaker_reset(ctx: Context, agent_name: str | None, reason: str) -> None:
    """Close a tripped or opened breaker (people in a resetter group), with a reason."""
    from gateway.services.change.breaker import reset_breaker

    reset_breaker(ctx.ws, ctx.actor(), agent_name, reason)
    click.echo(f"breaker closed for {agent_name or 'every agent'}")
