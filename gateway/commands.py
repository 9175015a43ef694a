"""The `gateway` commands (all but `preview`): thin commands over the same services the API uses.

gateway/cli.py loads this module only when one of these commands runs, so `gateway preview` starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from gateway.adapters.store.rows import now
from gateway.composition import create_workspace, open_workspace
from gateway.config import Settings
from gateway.domain.apply_blockers import standing_blockers
from gateway.domain.approvals import required_approvals
from gateway.domain.audit import Checkpoint
from gateway.domain.errors import Refused
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.plan import decode_plan_bytes
from gateway.domain.preview import RENDERERS
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, Proposal
from gateway.output import scrub_standard_streams
from gateway.services.admin import audit as audit_service
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import (
    add_principal,
    authenticate,
    disable_principal,
    enable_principal,
    revoke_token,
    rotate_token,
    set_access,
)
from gateway.services.agents.breaker import breaker_status, open_breaker, reset_breaker
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.jobs import approve_proposal, enqueue_job, follow_job, run_now_or_follow
from gateway.services.change.main_watch import acknowledge_push, unacknowledged, watch_main
from gateway.services.change.planning import plan_stack
from gateway.services.change.policies import evaluate_plan_document, run_policy_tests
from gateway.services.change.proposals import (
    abandon_proposal,
    claim_issues,
    decide,
    get_proposal,
    open_proposal,
    override_finding,
    pending_changes,
    proposal_previews,
)
from gateway.services.change.runner import merge_unmerged, runner_name
from gateway.services.change.views import list_proposal_rows, view_proposal
from gateway.services.day_two.drift import revert_drift
from gateway.services.day_two.simulator import edit_live_object, inject_delay, inject_fault
from gateway.services.forge.github import link_account
from gateway.services.workspace import Workspace

FORMATS = click.Choice(sorted(RENDERERS))


class Context:
    def __init__(self) -> None:
        self.settings = Settings()
        self._ws: Workspace | None = None

    @property
    def ws(self) -> Workspace:
        if self._ws is None:
            self._ws = open_workspace(self.settings)
            scrub_standard_streams(self._ws.scrubber)
        return self._ws

    def actor(self) -> Principal:
        token = self.settings.token.get_secret_value() if self.settings.token else None
        return authenticate(self.ws, token)


pass_ctx = click.make_pass_decorator(Context, ensure=True)


@click.group()
def cli() -> None:
    """The commands behind `gateway` (imported on first use; see gateway/cli.py)."""


# --- workspace and identities ----------------------------------------------------------------


@cli.command()
@click.option("--if-missing", is_flag=True, help="do nothing when the workspace exists (for containers' start-up)")
@click.option("--sample", type=click.Choice(["sandbox", "terraform"]), default="sandbox", show_default=True,
              help="sandbox: AWS-shaped stacks on the simulator; terraform: real Terraform (after `make terraform`)")
@pass_ctx
def init(ctx: Context, if_missing: bool, sample: str) -> None:
    """Create the workspace in $GATEWAY_HOME with a sample declaration repo, main applied."""
    if if_missing and ctx.settings.repo_path.exists():
        click.echo(f"workspace already in {ctx.settings.home}")
        return
    ws = create_workspace(ctx.settings, sample=sample)
    applied = bootstrap_simulator(ws)
    click.echo(f"workspace created in {ctx.settings.home}")
    click.echo(f"declaration repo: {ctx.settings.repo_path} (clone it, push a branch, `gateway propose`)")
    where = "the simulated cloud (a simulator, no real cloud)" if sample == "sandbox" else "Terraform's local state"
    click.echo(f"main's stacks applied to {where}: {applied} resources")
    click.echo("next: `gateway users add NAME --role admin` (the first user needs no token)")


@cli.group()
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
    actor = ctx.actor() if ctx.settings.token else None
    principal, token = add_principal(
        ctx.ws, actor, name, frozenset(Role(r) for r in roles), frozenset(groups),
        PrincipalKind.AGENT if agent else PrincipalKind.PERSON, acting_for)
    click.echo(f"added {principal.kind.value} {principal.name} ({', '.join(sorted(roles))})", err=True)
    click.echo(token)


@users.command("list")
@pass_ctx
def users_list(ctx: Context) -> None:
    """List principals: kind, roles, groups, state, token expiry and last use (never tokens)."""
    ctx.actor()
    with ctx.ws.store.session(readonly=True) as session:
        for p in session.principals.list():
            record = session.principals.credentials(p.id)
            used = f"{record['last_used_at']:%Y-%m-%d %H:%M}" if record["last_used_at"] else "never"
            expires = f"{record['token_expires_at']:%Y-%m-%d}" if record["token_expires_at"] else "-"
            click.echo(f"{p.name:20} {p.kind.value:7} {','.join(sorted(p.roles)):25} {','.join(sorted(p.groups)):18} "
                       f"{'DISABLED' if p.disabled else 'enabled':9} token expires {expires:10} last used {used}")


@users.command("disable")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_disable(ctx: Context, name: str, reason: str) -> None:
    """Disable a principal: no sign-in, no API, and their approvals stop counting."""
    disable_principal(ctx.ws, ctx.actor(), name, reason)
    click.echo(f"{name} disabled")


@users.command("enable")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_enable(ctx: Context, name: str, reason: str) -> None:
    enable_principal(ctx.ws, ctx.actor(), name, reason)
    click.echo(f"{name} enabled")


@users.command("rotate-token")
@click.argument("name")
@pass_ctx
def users_rotate(ctx: Context, name: str) -> None:
    """Print a new token for NAME (shown once); the old one stops working at once."""
    click.echo(rotate_token(ctx.ws, ctx.actor(), name))


@users.command("revoke-token")
@click.argument("name")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def users_revoke(ctx: Context, name: str, reason: str) -> None:
    """No token works for NAME until one is rotated."""
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
    new_groups = frozenset() if no_groups else (frozenset(groups) if groups else None)
    p = set_access(ctx.ws, ctx.actor(), name, frozenset(Role(r) for r in roles) if roles else None, new_groups)
    click.echo(f"{p.name}: roles {','.join(sorted(p.roles))}; groups {','.join(sorted(p.groups)) or '-'}")


@users.command("link")
@click.argument("name")
@click.option("--github", "login", required=True, help="their GitHub login (its numeric id is what is stored)")
@click.option("--github-id", type=click.IntRange(1), default=None,
              help="the numeric id, when GitHub cannot be asked (otherwise looked up)")
@pass_ctx
def users_link(ctx: Context, name: str, login: str, github_id: int | None) -> None:
    """Link a person (or the agent, whose reviews then never count) to a GitHub account."""
    github_id, login = link_account(ctx.ws, ctx.actor(), name, login, github_id)
    click.echo(f"linked {name} to GitHub user {login} (id {github_id})")


# --- plans and previews ----------------------------------------------------------------------


@cli.command()
@click.option("--stack", required=True)
@click.option("--ref", default=None, help="git ref of the declaration repo (default: main)")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@pass_ctx
def plan(ctx: Context, stack: str, ref: str | None, fmt: str) -> None:
    """Plan one stack of the declaration repo with its engine and print the preview."""
    ctx.actor()
    result = plan_stack(ctx.ws, stack, ref or ctx.ws.main_branch())
    if fmt == "text":
        click.echo(f"stack {stack} at {result.sha[:12]}, plan {result.digest[:19]}…, state serial {result.engine_plan.state_serial}")
    click.echo(RENDERERS[fmt](result.preview()), nl=False)


@cli.group()
def policy() -> None:
    """Rego policies under policies/ on main: run their tests, try them on a plan."""


@policy.command("test")
@click.option("--stack", default=None, help="only the packages this stack is judged by")
@pass_ctx
def policy_test(ctx: Context, stack: str | None) -> None:
    """Run the policies' `test_` rules (as `opa test` does); exits non-zero if one fails."""
    ctx.actor()
    outcomes = run_policy_tests(ctx.ws, stack)
    for outcome in outcomes:
        click.echo(f"{'PASS' if outcome.passed else 'FAIL'} {outcome.name}" + (f": {outcome.error}" if outcome.error else ""))
    failed = [o for o in outcomes if not o.passed]
    click.echo(f"{len(outcomes) - len(failed)}/{len(outcomes)} passed" if outcomes else "no Rego tests on main")
    if failed:
        raise SystemExit(1)


@policy.command("eval")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--stack", required=True, help="judge it as a plan of this stack (its packages, its secrets)")
@click.option("--agent", is_flag=True, help="as if an agent proposed it")
@pass_ctx
def policy_eval(ctx: Context, plan_file: Path, stack: str, agent: bool) -> None:
    """What main's Rego policies say of any `show -json` plan."""
    ctx.actor()
    try:
        document = decode_plan_bytes(plan_file.read_bytes())
    except OSError as exc:
        raise click.ClickException(f"cannot read {plan_file}: {exc.strerror}") from None
    findings = evaluate_plan_document(ctx.ws, document, stack, agent)
    for f in findings:
        click.echo(f"{f.severity.value.upper():4} {f.rule} {f.address}: {f.message}")
    click.echo(f"{len(findings)} finding(s)")


@cli.group()
def breaker() -> None:
    """The circuit breaker on agent changes, and the kill switch."""


@breaker.command("status")
@pass_ctx
def breaker_show(ctx: Context) -> None:
    """Every breaker that was tripped, opened or reset, and where it stands."""
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
    open_breaker(ctx.ws, ctx.actor(), agent_name, reason)
    click.echo(f"breaker open for {agent_name or 'every agent'}")


@breaker.command("reset")
@click.option("--agent", "agent_name", default=None, help="one agent's breaker (default: the one for every agent)")
@click.option("-m", "--message", "reason", required=True)
@pass_ctx
def breaker_reset(ctx: Context, agent_name: str | None, reason: str) -> None:
    """Close a tripped or opened breaker (people in a resetter group), with a reason."""
    reset_breaker(ctx.ws, ctx.actor(), agent_name, reason)
    click.echo(f"breaker closed for {agent_name or 'every agent'}")


@cli.command("mcp")
@pass_ctx
def mcp(ctx: Context) -> None:
    """The MCP server over stdio, for an external agent whose token is GATEWAY_TOKEN (`--agent --for PERSON`)."""
    from gateway.mcp_server import build_server  # the MCP SDK only for this command

    principal = ctx.actor()
    sys.stdout = sys.__stdout__  # the protocol's own stream: every tool result is scrubbed where it is made
    build_server(ctx.ws, principal).run("stdio")


@cli.group("main")
def main_group() -> None:
    """Commits pushed to main outside the gateway."""


@main_group.command("status")
@pass_ctx
def main_status(ctx: Context) -> None:
    """Pushes to main the gateway did not make and nobody acknowledged yet."""
    ctx.actor()
    watch_main(ctx.ws)
    pushes = unacknowledged(ctx.ws)
    for p in pushes:
        click.echo(f"{p['sha'][:12]} by {p['author']}: stacks {', '.join(p['stacks']) or '-'}")
    if not pushes:
        click.echo("main holds only what the gateway merged (or what was acknowledged)")


@main_group.command("acknowledge")
@click.argument("sha")
@click.option("-m", "--message", "reason", required=True, help="what was done about it")
@pass_ctx
def main_acknowledge(ctx: Context, sha: str, reason: str) -> None:
    """Acknowledge a push to main (reverted, or brought in through a proposal): applies on its stacks go on."""
    push = acknowledge_push(ctx.ws, ctx.actor(), sha, reason)
    click.echo(f"acknowledged {push['sha'][:12]} (stacks {', '.join(push['stacks']) or '-'})")


@cli.group("drift", invoke_without_command=True)
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
    actor = ctx.actor()
    for stack in stacks or sorted(ctx.ws.repo_settings().stacks):
        outcome = revert_drift(ctx.ws, actor, stack)
        if outcome.proposal is None:
            click.echo(f"{stack}: {'; '.join(outcome.reasons)}")
        elif outcome.automatic:
            click.echo(f"{stack}: drift reverted automatically by proposal {outcome.proposal.id} (job {outcome.job.id if outcome.job else '?'})")
        else:
            click.echo(f"{stack}: proposal {outcome.proposal.id} reverts the drift and needs approval: "
                       f"{'; '.join(outcome.reasons)}")


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
    _echo_proposal(ctx.ws, proposal, "text")


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "reason", required=True, help="why it is rolled back")
@pass_ctx
def rollback(ctx: Context, proposal_id: int, reason: str) -> None:
    """Open a proposal that reverts the merge of an applied change, planned and approved like any other."""
    from gateway.services.day_two.rollback import rollback_proposal

    proposal = rollback_proposal(ctx.ws, ctx.actor(), proposal_id, reason)
    click.echo(f"proposal {proposal.id} rolls back proposal {proposal_id} on branch {proposal.branch}: "
               f"stacks {', '.join(proposal.stacks) or '(none)'}")
    _echo_proposal(ctx.ws, proposal, "text")


@cli.command("import")
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
    _echo_proposal(ctx.ws, proposal, "text")


@cli.group("break-glass")
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
        click.echo(f"{w.id:>4} {w.stack:14} {w.state(now(), settings).value:22} by {w.opened_by}"
                   + (f" (confirmed by {w.confirmed_by})" if w.confirmed_by else "")
                   + (f", codify by {deadline:%Y-%m-%d %H:%M}" if deadline else "") + f": {w.reason}")
    if not windows:
        click.echo("no break-glass window was ever opened")


@break_glass.command("show")
@click.argument("window_id", type=int)
@pass_ctx
def break_glass_show(ctx: Context, window_id: int) -> None:
    """The whole episode as one story (as `gateway audit show --break-glass N`)."""
    _echo_story(audit_service_story(ctx, window_id))


def audit_service_story(ctx: Context, window_id: int) -> list[Any]:
    from gateway.services.day_two.break_glass import break_glass_story

    return break_glass_story(ctx.ws, ctx.actor(), window_id)


# --- the change path -------------------------------------------------------------------------


@cli.command()
@click.option("--branch", required=True)
@click.option("-m", "--message", "reason", required=True, help="why this change")
@pass_ctx
def propose(ctx: Context, branch: str, reason: str) -> None:
    """Open a proposal from a branch of the declaration repo: plan every stack it touches."""
    proposal = open_proposal(ctx.ws, ctx.actor(), branch, reason)
    click.echo(f"proposal {proposal.id} opened for {branch} at {proposal.head_sha[:12]}: stacks {', '.join(proposal.stacks) or '(none)'}")
    _echo_proposal(ctx.ws, proposal, "text")


@cli.command()
@click.argument("text")
@click.option("--conversation", default=None, help="continue this conversation (adds a commit to its proposal)")
@pass_ctx
def request(ctx: Context, text: str, conversation: str | None) -> None:
    """Ask the agent for a change in plain words; it opens a proposal you cannot approve yourself."""
    _run_request(ctx, ctx.actor(), text, conversation)


@cli.command()
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
        _echo_proposal(ctx.ws, p, "text")
    return outcome.conversation_id


@cli.command("list")
@click.option("--status", default=None)
@pass_ctx
def list_proposals(ctx: Context, status: str | None) -> None:
    """List proposals: those waiting for your approval first (marked *), then newest first."""
    for r in list_proposal_rows(ctx.ws, ctx.actor(), status):
        mark = "*" if r.waiting_for_you else " "
        click.echo(f"{mark}{r.id:>4}  {r.status:9} {r.risk:8} {_age(now() - r.created_at):>5} {r.branch:30} "
                   f"{','.join(r.stacks)}  "
                   f"{r.reason.splitlines()[0][:50]}")
        for blocker in r.blocked_by[:2]:
            click.echo(f"        blocked: {blocker}")


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@click.option("--diff", "show_diff", is_flag=True, help="also print the text diff of the branch")
@pass_ctx
def show(ctx: Context, proposal_id: int, fmt: str, show_diff: bool) -> None:
    """Show a proposal: status, approvals (current or stale), and the preview of every stack."""
    actor = ctx.actor()
    if fmt == "json":  # the same document the API serves
        click.echo(json.dumps(view_proposal(ctx.ws, actor, proposal_id).to_public(), indent=2, default=str))
        return
    proposal = get_proposal(ctx.ws, proposal_id)
    for change in pending_changes(ctx.ws, proposal):
        click.echo(f"note: {change}; the plans below predate it (`gateway sync {proposal_id}` re-plans; approve and apply re-plan first)")
    _echo_proposal(ctx.ws, proposal, fmt)
    if show_diff:
        click.echo(ctx.ws.repo.diff(proposal.base_sha, proposal.head_sha))


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "comment", default="", help="comment")
@click.option("--sha", "seen_sha", default=None, help="the commit you reviewed; refused if the branch moved")
@pass_ctx
def approve(ctx: Context, proposal_id: int, comment: str, seen_sha: str | None) -> None:
    """Approve the proposal's current commit and plans."""
    proposal, queued = approve_proposal(ctx.ws, ctx.actor(), proposal_id, comment, seen_sha)
    click.echo(f"approved proposal {proposal.id} at {proposal.head_sha[:12]}")
    if queued is None:
        _echo_approval_state(ctx.ws, proposal)
        return
    click.echo("the last approval needed: applying now (gateway.yaml approvals.auto_apply)")
    _finish_job(ctx, queued, no_wait=False)


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "comment", required=True, help="why it is rejected")
@pass_ctx
def reject(ctx: Context, proposal_id: int, comment: str) -> None:
    """Reject the proposal; it stays stopped until a new commit."""
    proposal = decide(ctx.ws, ctx.actor(), proposal_id, Decision.REJECT, comment)
    click.echo(f"rejected proposal {proposal.id} at {proposal.head_sha[:12]}: {comment}")


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("--finding", "finding_key", required=True, help="STACK:RULE:ADDRESS, as `gateway show` lists it")
@click.option("-m", "--reason", required=True)
@click.option("--expires", required=True, type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M"]),
              help="when the override stops counting (UTC)")
@pass_ctx
def override(ctx: Context, proposal_id: int, finding_key: str, reason: str, expires: datetime) -> None:
    """Override one deny finding as a policy owner (recorded, attributable, expiring)."""
    proposal = override_finding(ctx.ws, ctx.actor(), proposal_id, finding_key, reason, expires.replace(tzinfo=UTC))
    click.echo(f"overrode {finding_key} on proposal {proposal.id} until {expires:%Y-%m-%d %H:%M} UTC")
    _echo_approval_state(ctx.ws, proposal)


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("--no-wait", is_flag=True, help="queue the apply for a worker and print its job id")
@pass_ctx
def apply(ctx: Context, proposal_id: int, no_wait: bool) -> None:
    """Apply exactly the approved plans, one stack at a time, then merge the branch (a job)."""
    job = enqueue_job(ctx.ws, ctx.actor(), JobKind.APPLY, proposal_id)
    _finish_job(ctx, job, no_wait)


@cli.command()
@click.argument("job_id", type=int)
@click.option("--wait", is_flag=True, help="follow the job to its end, printing its progress")
@pass_ctx
def job(ctx: Context, job_id: int, wait: bool) -> None:
    """Show a job: kind, status, progress, and its result once finished."""
    ctx.actor()
    found = ctx.ws.store.queue.get(job_id)
    subject = (f"request {found.args.get('run')}" if found.kind == JobKind.AGENT_TURN
               else f"proposal {found.proposal_id}")
    click.echo(f"job {found.id}: {found.kind.value} of {subject} [{found.status.value}]"
               + (f" on {found.runner}" if found.runner else ""))
    if wait and not found.finished:
        found = follow_job(ctx.ws, job_id, lambda line: click.echo(f"  {line}", err=True))
    else:
        for line in found.progress:
            click.echo(f"  {line}")
    if found.finished:
        _echo_job_result(found)


@cli.command()
@click.option("--loops", default=2, show_default=True, type=click.IntRange(1, 64), help="jobs run at once")
@click.option("--poll", "poll_seconds", default=0.5, show_default=True, type=float, help="seconds between claims")
@pass_ctx
def worker(ctx: Context, loops: int, poll_seconds: float) -> None:
    """Run plan and apply jobs from the database until stopped (SIGTERM or Ctrl-C finish the jobs in hand)."""
    from gateway.worker import Worker

    running = Worker(ctx.ws, loops, poll_seconds).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=running.stop, daemon=True).start())
    click.echo(f"worker {running.name}: {loops} loop(s) on {ctx.ws.db.engine.dialect.name}", err=True)
    try:
        running.wait()
    except KeyboardInterrupt:
        running.stop()


def _finish_job(ctx: Context, queued: Job, no_wait: bool) -> None:
    """Print the job id; unless told not to wait, run it here (or follow the worker that took it)."""
    click.echo(f"job {queued.id} queued: {queued.kind.value} of proposal {queued.proposal_id}", err=True)
    if no_wait:
        click.echo(f"follow it with `gateway job {queued.id} --wait`")
        return
    done = run_now_or_follow(ctx.ws, queued, runner_name(), lambda line: click.echo(f"  {line}", err=True))
    _echo_job_result(done)


def _echo_job_result(done: Job) -> None:
    """The end of a job, as a person reads it; a non-zero exit unless it succeeded."""
    if done.status == JobStatus.REFUSED:
        raise Refused(done.result.get("reasons") or [done.error or "refused"])
    for outcome in done.result.get("outcomes", []):
        state = "applied" if outcome["succeeded"] else "FAILED"
        click.echo(f"stack {outcome['stack']}: {state} ({len(outcome['applied'])} change(s) done)")
        if outcome["error"]:
            click.echo(f"  error: {outcome['error']}")
    for change in done.result.get("changes", []):
        click.echo(change)
    if done.result.get("unmerged"):
        click.echo(done.result["unmerged"], err=True)
        sys.exit(1)
    if done.status != JobStatus.SUCCEEDED:
        if done.kind == JobKind.APPLY and done.result.get("outcomes"):
            click.echo("the apply did not finish; what was done is recorded, and the next plan shows the rest "
                       f"(`gateway sync {done.proposal_id}` re-plans it, `gateway abandon {done.proposal_id}` "
                       "withdraws it)", err=True)
        else:
            click.echo(f"error: {done.error or done.status.value}", err=True)
        sys.exit(1)
    if done.result.get("merge_sha"):
        click.echo(f"merged into main as {done.result['merge_sha'][:12]}")


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("--no-wait", is_flag=True, help="queue the plan for a worker and print its job id")
@pass_ctx
def sync(ctx: Context, proposal_id: int, no_wait: bool) -> None:
    """Re-plan a proposal whose branch, main or stack state moved since its plans (a job)."""
    _finish_job(ctx, enqueue_job(ctx.ws, ctx.actor(), JobKind.PLAN, proposal_id), no_wait)


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("-m", "--message", "reason", required=True, help="why it is withdrawn")
@pass_ctx
def abandon(ctx: Context, proposal_id: int, reason: str) -> None:
    """Withdraw a proposal (open or failed); its branch may be proposed again."""
    proposal = abandon_proposal(ctx.ws, ctx.actor(), proposal_id, reason)
    click.echo(f"proposal {proposal.id} is {proposal.status.value}")


@cli.command()
@click.argument("proposal_id", type=int)
@click.option("--acknowledge", is_flag=True, help="main was made to describe what runs by hand; record that")
@click.option("-m", "--message", "note", default=None, help="with --acknowledge: how main was made right")
@pass_ctx
def merge(ctx: Context, proposal_id: int, acknowledge: bool, note: str | None) -> None:
    """Leave `unmerged`: merge an applied proposal into main again, or acknowledge a merge made by hand."""
    proposal = merge_unmerged(ctx.ws, ctx.actor(), proposal_id, (note or "") if acknowledge else None)
    click.echo(f"proposal {proposal.id} is {proposal.status.value}; its stacks are unlocked")


def _age(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes < 120 else (f"{minutes // 60}h" if minutes < 48 * 60 else f"{minutes // 1440}d")


def _echo_proposal(ws: Workspace, proposal: Proposal, fmt: str) -> None:
    previews = proposal_previews(ws, proposal)
    click.echo(f"proposal {proposal.id} [{proposal.status.value}] {proposal.branch} @ {proposal.head_sha[:12]}")
    click.echo(f"  requested by {proposal.requester.name}, proposed by {proposal.proposer.name}: {proposal.reason}")
    if proposal.agent_claim:
        click.echo(f"  the agent claims: {proposal.agent_claim}")
        for issue in claim_issues(ws, proposal):
            click.echo(f"  ! the plan disagrees: {issue}")
    for stack, p in proposal.plans.items():
        click.echo(f"\n== stack {stack}: plan {p.digest[:19]}… (state serial {p.state_serial})")
        click.echo(RENDERERS[fmt](previews[stack]), nl=False)
    click.echo("")
    _echo_approval_state(ws, proposal)


def _echo_approval_state(ws: Workspace, proposal: Proposal) -> None:
    settings = ws.repo_settings()
    for d in proposal.decisions:
        mark = "current" if proposal.is_current(d) else "STALE"
        done = {"approve": "approved", "reject": "rejected", "withdraw": "withdrawn"}[d.decision.value]
        click.echo(f"  {done} by {d.principal.name} at {d.head_sha[:12]} [{mark}] {d.comment}")
    for o in proposal.overrides:
        click.echo(f"  override of {o.finding_key} by {o.by} until {o.expires_at:%Y-%m-%d %H:%M} UTC: {o.reason}")
    if proposal.status not in DECIDABLE:  # it takes no more decisions: say where it ended, not what it lacks
        merged = f", merged as {proposal.merge_sha[:12]}" if proposal.merge_sha else ""
        click.echo(f"  status: {proposal.status.value}{merged}")
        return
    shortfall = standing_blockers(gather_apply_facts(ws, proposal))  # what the runner would refuse on
    rejection = proposal.current_rejection
    if rejection:
        click.echo(f"  status: rejected by {rejection.principal.name}; stopped until a new commit")
    elif shortfall:
        for line in shortfall:
            click.echo(f"  blocked: {line}")
    else:
        click.echo(f"  status: approved ({required_approvals(proposal, settings)} needed); ready to apply")


# --- audit -----------------------------------------------------------------------------------


@cli.group()
def audit() -> None:
    """Query, export and verify the append-only, hash-chained audit trail."""


@audit.command("list")
@click.option("--proposal", "proposal_id", type=int, default=None)
@click.option("--actor", "actor_name", default=None)
@click.option("--stack", default=None)
@click.option("--since", default=None, help="ISO 8601 time")
@pass_ctx
def audit_list(ctx: Context, proposal_id: int | None, actor_name: str | None, stack: str | None, since: str | None) -> None:
    """List events, oldest first."""
    for e in audit_service.list_events(ctx.ws, ctx.actor(), proposal_id, actor_name, stack, since):
        click.echo(_event_line(e))


@audit.command("show")
@click.argument("proposal_id", type=int, required=False)
@click.option("--break-glass", "window_id", type=int, default=None, help="a break-glass episode instead of a change")
@pass_ctx
def audit_show(ctx: Context, proposal_id: int | None, window_id: int | None) -> None:
    """The whole story of one change, from request to merge (or of one break-glass episode)."""
    if (proposal_id is None) == (window_id is None):
        raise click.UsageError("name a proposal, or a break-glass window with --break-glass N")
    if window_id is not None:
        _echo_story(audit_service_story(ctx, window_id))
        return
    _echo_story(audit_service.proposal_story(ctx.ws, ctx.actor(), proposal_id or 0))


def _echo_story(events: list[Any]) -> None:
    for e in events:
        click.echo(_event_line(e))
        details = {k: v for k, v in e.payload.items() if v not in (None, [], {}, "")}
        for key, value in details.items():
            click.echo(f"        {key}: {json.dumps(value) if not isinstance(value, str) else value}")


@audit.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.option("--proposal", "proposal_id", type=int, default=None)
@pass_ctx
def audit_export(ctx: Context, fmt: str, proposal_id: int | None) -> None:
    """Export events with their hashes, for an auditor's own tools."""
    events = audit_service.list_events(ctx.ws, ctx.actor(), proposal_id)
    with ctx.ws.store.session(readonly=True) as session:
        checkpoints = session.audit.checkpoints() if proposal_id is None else []
    click.echo(audit_service.export_events(events, fmt, checkpoints), nl=False)


@audit.command("verify")
@click.option("--against", "checkpoint_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a checkpoint kept from `gateway audit checkpoint`: prove the trail up to it is unchanged")
@click.option("--resume", is_flag=True, help="only what follows the newest checkpoint this gateway signed")
@pass_ctx
def audit_verify(ctx: Context, checkpoint_file: Path | None, resume: bool) -> None:
    """Check the hash chain (and, with --against, that it is the one a kept checkpoint signed); exit 1 if not."""
    if resume:
        count, broken, since = audit_service.verify_from_checkpoint(ctx.ws, ctx.actor())
        if broken is None:
            where = f"after the checkpoint of event {since.seq}" if since else "from the start (no checkpoint yet)"
            click.echo(f"audit trail intact: {count} events verified {where}")
            return
    elif checkpoint_file is None:
        count, broken = audit_service.verify_trail(ctx.ws, ctx.actor())
    else:
        try:
            checkpoint = Checkpoint.from_json(json.loads(checkpoint_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"{checkpoint_file} is not a checkpoint: {exc}") from None
        count, broken = audit_service.verify_checkpoint(ctx.ws, ctx.actor(), checkpoint)
    if broken is not None:
        click.echo(f"audit trail BROKEN at event {broken.seq}: {broken.reason}", err=True)
        sys.exit(1)
    what = f"up to the checkpoint of event {count}, as signed" if checkpoint_file else "chain verified"
    click.echo(f"audit trail intact: {count} events, {what}")


@audit.command("checkpoint")
@pass_ctx
def audit_checkpoint(ctx: Context) -> None:
    """Sign the chain's head now and print the checkpoint: keep it somewhere the database's owner cannot write."""
    click.echo(json.dumps(audit_service.sign_checkpoint(ctx.ws, ctx.actor()).to_json(), indent=2))


def _event_line(e: Any) -> str:
    target = f" proposal {e.proposal_id}" if e.proposal_id else ""
    stacks = f" [{', '.join(e.stacks)}]" if e.stacks else ""
    return f"{e.seq:>5} {e.at[:19]} {e.actor:16} {e.kind:18}{target}{stacks}"


# --- the simulated cloud ---------------------------------------------------------------------


@cli.group()
def sandbox() -> None:
    """Act on the simulated cloud behind the gateway's back (drift, faults). A simulator only."""


@sandbox.command("edit")
@click.option("--stack", required=True)
@click.argument("address")
@click.argument("assignments", nargs=-1, required=True)
@pass_ctx
def sandbox_edit(ctx: Context, stack: str, address: str, assignments: tuple[str, ...]) -> None:
    """Change a live object as a console user would: ATTR=JSON_OR_TEXT ..."""
    actor = ctx.actor()
    changes = {}
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
    inject_fault(ctx.ws, ctx.actor(), stack, address, message)
    click.echo(f"the next apply of {address} in stack {stack} will fail: {message}")


@sandbox.command("slow")
@click.option("--stack", required=True)
@click.argument("address")
@click.option("--seconds", type=float, required=True, help="how much longer the next apply of ADDRESS takes")
@pass_ctx
def sandbox_slow(ctx: Context, stack: str, address: str, seconds: float) -> None:
    """Make the next apply of ADDRESS slow, as a slow provider would (to watch locks and workers)."""
    inject_delay(ctx.ws, ctx.actor(), stack, address, seconds)
    click.echo(f"the next apply of {address} in stack {stack} will take {seconds:g} s longer")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(0, 64),
              help="job loops in this process (0 when separate `gateway worker` processes run the jobs)")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64),
              help="API processes (uvicorn workers); each is stateless")
@pass_ctx
def serve(ctx: Context, host: str, port: int, workers: int, processes: int) -> None:
    """Run the HTTP API and the review pages."""
    import uvicorn

    if processes > 1:  # uvicorn imports the app in each process: the settings come from the environment
        os.environ["GATEWAY_SERVE_WORKERS"] = str(workers)
        uvicorn.run("gateway.api.app:app_from_environment", factory=True, host=host, port=port,
                    workers=processes, log_level="warning")
        return
    from gateway.api.app import create_app

    uvicorn.run(create_app(ctx.settings, workers), host=host, port=port, log_level="warning")


@cli.command()
@click.option("--keep", is_flag=True, help="keep the temporary workspace and print where it is")
@click.option("--day-two", "day_two", is_flag=True, help="drift -> codify, and break-glass -> codify, instead")
def demo(keep: bool, day_two: bool) -> None:
    """Run the whole change path in a fresh temporary workspace, narrated."""
    if day_two:
        from gateway.demo_day_two import run_day_two_demo

        run_day_two_demo(keep=keep)
        return
    from gateway.demo import run_demo

    run_demo(keep=keep)
