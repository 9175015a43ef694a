"""What every command module shares: the workspace a command acts on, who is acting, and how proposals, jobs
and audit events are printed.

Only what is needed to declare a command is imported at the top; the settings, the workspace, the services
and the approval rules are imported when a command first needs them, so `gateway CMD --help` and
`gateway preview` stay cheap.
"""

from __future__ import annotations

import configparser
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gateway.domain.errors import Refused
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.preview import RENDERERS

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.domain.audit import AuditEvent
    from gateway.domain.principals import Principal
    from gateway.domain.proposal import Proposal
    from gateway.services.workspace import Workspace

FORMATS = click.Choice(sorted(RENDERERS))
R = TypeVar("R")


class Context:
    """The settings of this run, and the workspace they name, opened on first use; made when a command runs."""

    def __init__(self) -> None:
        # Both only once a command runs (pydantic, and structlog when it first logs), never for --help.
        from gateway.config import Settings
        from gateway.logs import configure_logging

        configure_logging()
        self.settings: Settings = Settings()
        chosen = click.get_current_context().find_root().params.get("repository")
        if chosen or self.settings.repository is None:
            found = chosen or repository_of_clone(self.settings.home, Path.cwd())
            if found:
                self.settings = self.settings.in_repository(found)
        self.reads_only = False  # set by `pass_reader`: the command changes nothing, not even the schema
        self._ws: Workspace | None = None

    @property
    def ws(self) -> Workspace:
        """The workspace, opened once; from then on stdout and stderr drop its known secrets."""
        if self._ws is None:
            from gateway.composition import open_workspace
            from gateway.output import scrub_standard_streams

            self._ws = open_workspace(self.settings, migrate=not self.reads_only)
            scrub_standard_streams(self._ws.scrubber)
        return self._ws

    def open_service(self) -> Workspace:
        """The workspace of a long-running process, opened without reaching the database (it may be down)."""
        from gateway.composition import open_service_workspace
        from gateway.output import scrub_standard_streams

        self._ws = open_service_workspace(self.settings)
        scrub_standard_streams(self._ws.scrubber)
        return self._ws

    def actor(self) -> Principal:
        """The principal whose GATEWAY_TOKEN this is (the first user of a new workspace needs none)."""
        from gateway.services.admin.users import authenticate

        token = self.settings.token.get_secret_value() if self.settings.token else None
        return authenticate(self.ws, token)


pass_ctx = click.make_pass_decorator(Context, ensure=True)


def repository_of_clone(home: Path, folder: Path) -> str | None:
    """The repository of the gateway in `home` whose clone `folder` is in (its `origin` is that repository's bare
    repository in `home/repos`), or None. Read from the clone's .git/config: no git process."""
    for at in (folder, *folder.parents):
        config = at / ".git" / "config"
        if config.is_file():
            break
    else:
        return None
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(config.read_text())
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None
    url = parser.get('remote "origin"', "url", fallback="")
    origin = Path(url.removeprefix("file://"))
    origin = (origin if origin.is_absolute() else at / origin).resolve()
    repos = (home / "repos").resolve()
    if origin.parent != repos or origin.suffix != ".git":
        return None
    return origin.stem


def pass_reader(command: Callable[..., R]) -> Callable[..., R]:
    """`pass_ctx` for a command that only reads: its workspace is opened without running migrations (reads never
    write, and a migration takes SQLite's write lock); a database behind this gateway is refused, saying what to run."""
    @pass_ctx
    @functools.wraps(command)
    def reader(ctx: Context, /, *args: Any, **kwargs: Any) -> R:
        global finished_read
        ctx.reads_only = True
        result = command(ctx, *args, **kwargs)
        finished_read = ctx
        return result

    return reader


finished_read: Context | None = None  # the read this process ran to its end, if it ran one


def exit_after_read(reader: Context) -> None:
    """End the process of a finished read now: its workspace closed, the atexit handlers run and the streams
    flushed, but without tearing the interpreter down, module by module (a tenth of a second and more of CPU
    after the output is out: SQLAlchemy, pydantic, libgit2). Only while no other thread runs (a read starts
    none); otherwise the process ends as any other."""
    import atexit
    import os
    import threading

    if threading.active_count() > 1:
        return
    if reader._ws is not None:
        reader._ws.close()  # the database's connections end properly (PostgreSQL sees a goodbye, not a reset)
    atexit._run_exitfuncs()  # what `atexit` promised (logging's flush among them) still happens
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # e.g. a closed pipe: the status Python itself exits with when it cannot flush stdout
        os._exit(120)
    os._exit(0)


# --- proposals -------------------------------------------------------------------------------


def echo_proposal(ws: Workspace, proposal: Proposal, fmt: str) -> None:
    """A proposal as `gateway show` prints it: who and why, every stack's preview, where approval stands."""
    from gateway.services.change.proposals import claim_issues, proposal_previews

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
    echo_approval_state(ws, proposal)


def echo_approval_state(ws: Workspace, proposal: Proposal) -> None:
    """Its decisions and overrides, then what it lacks (what the runner would refuse on) or where it ended."""
    from gateway.domain.apply_blockers import standing_blockers
    from gateway.domain.approvals import required_approvals
    from gateway.domain.lifecycle import DECIDABLE
    from gateway.services.change.apply_facts import gather_apply_facts

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
    shortfall = standing_blockers(gather_apply_facts(ws, proposal, hash_saved_plans=False))  # what the runner would refuse on
    rejection = proposal.current_rejection
    if rejection:
        click.echo(f"  status: rejected by {rejection.principal.name}; stopped until a new commit")
    elif shortfall:
        for line in shortfall:
            click.echo(f"  blocked: {line}")
    else:
        click.echo(f"  status: approved ({required_approvals(proposal, settings)} needed); ready to apply")


# --- jobs ------------------------------------------------------------------------------------


def queue_job(ctx: Context, kind: JobKind, proposal_id: int, no_wait: bool) -> None:
    """Queue a plan or apply of a proposal and see it to its end (`finish_job`); where workers run jobs and none is
    live, nothing is queued unless the person only queues it (--no-wait)."""
    from gateway.services.change.jobs import enqueue_job, require_a_worker

    actor = ctx.actor()
    if not no_wait:
        require_a_worker(ctx.ws)
    finish_job(ctx, enqueue_job(ctx.ws, actor, kind, proposal_id), no_wait)


def finish_job(ctx: Context, queued: Job, no_wait: bool) -> None:
    """Print the job id; unless told not to wait, see it to its end: on the embedded default by running it here (or
    following the worker that took it first), elsewhere by following the worker that runs it."""
    from gateway.services.change.jobs import follow_on_workers, run_now_or_follow, runs_jobs_here
    from gateway.services.change.runner import runner_name

    click.echo(f"job {queued.id} queued: {queued.kind.value} of proposal {queued.proposal_id}", err=True)
    if no_wait:
        click.echo(f"follow it with `gateway job {queued.id} --wait`")
        return
    def progress(line: str) -> None:
        click.echo(f"  {line}", err=True)

    if runs_jobs_here(ctx.ws):
        done = run_now_or_follow(ctx.ws, queued, runner_name(), progress)
    else:
        done = follow_on_workers(ctx.ws, queued, progress)
        if not done.finished:
            click.echo(f"error: job {queued.id} is still queued and no worker is live any more to take it: it runs "
                       f"when one starts (`gateway worker`); `gateway job {queued.id} --wait` follows it", err=True)
            sys.exit(1)
        if done.runner:
            click.echo(f"job {done.id} ran on worker {done.runner}", err=True)
    echo_job_result(done)


def echo_job_result(done: Job) -> None:
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


# --- the audit trail -------------------------------------------------------------------------


def echo_story(events: list[AuditEvent], full: bool = False) -> None:
    """Events one per line, each followed by its payload's non-empty fields: a long list as its count, the first few
    and how many more (every item with `full`), never cut silently."""
    from gateway.domain.story import hidden_count, summary_lines

    for e in events:
        click.echo(event_line(e))
        for line in summary_lines(e.payload, full):
            click.echo(f"        {line}")
    hidden = 0 if full else hidden_count([e.payload for e in events])
    if hidden:
        click.echo(f"({hidden} more items in long lists above: --full lists every one)")


def event_line(e: AuditEvent) -> str:
    """One audit event on one line: sequence, time, actor, kind, and what it concerns."""
    target = f" proposal {e.proposal_id}" if e.proposal_id else ""
    stacks = f" [{', '.join(e.stacks)}]" if e.stacks else ""
    return f"{e.seq:>5} {e.at[:19]} {e.actor:16} {e.kind:18}{target}{stacks}"
