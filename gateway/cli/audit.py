"""The audit trail for auditors: list and tell events, export them, verify the chain, sign checkpoints; the change
population of a period, its exceptions, samples and their evidence."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gateway.cli.context import Context, echo_story, event_line, pass_ctx, pass_reader
from gateway.domain.audit import Checkpoint
from gateway.domain.audit_period import asked_again
from gateway.domain.change_population import CSV_FIELDS, EXCEPTION_CSV_FIELDS, to_csv, to_json_text

if TYPE_CHECKING:
    from gateway.domain.change_population import ChangeRow, Population

R = TypeVar("R")

group = click.Group("audit")  # this module's commands; gateway.cli registers each by name


@group.group()
def audit() -> None:
    """Query, export and verify the append-only, hash-chained audit trail."""


REPO_HELP = "one declaration repository's events (gateway --repo NAME audit ... too); by default every repository's"


def _repository_asked(option: str | None) -> str | None:
    """The repository whose events are asked for: this command's --repo, else the gateway's own --repo. Not the
    repository the command otherwise works in (GATEWAY_REPOSITORY, the clone the current folder is in): the trail is
    every repository's, and an auditor sees it whole unless they name one."""
    return option or click.get_current_context().find_root().params.get("repository") or None


@audit.command("list")
@click.option("--proposal", "proposal_id", type=int, default=None)
@click.option("--person", "--actor", "person", default=None, help="events this person (or agent) made")
@click.option("--stack", default=None)
@click.option("--since", default=None, help="ISO 8601 time")
@click.option("--until", default=None, help="ISO 8601 time")
@click.option("--address", default=None, help="a resource address, exact or a prefix ending in *")
@click.option("--action", default=None, help="a kind or a kind's prefix: apply matches apply.started, apply.failed...")
@click.option("--outcome", default=None, help="refused, failed, succeeded, interrupted, withdrawn, tripped")
@click.option("--after", type=click.IntRange(min=0), default=0, help="only events after this one (the next page)")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most this many events")
@click.option("--repo", "repository", default=None, metavar="NAME", help=REPO_HELP)
@pass_reader
def audit_list(ctx: Context, proposal_id: int | None, person: str | None, stack: str | None, since: str | None,
               until: str | None, address: str | None, action: str | None, outcome: str | None, after: int,
               limit: int | None, repository: str | None) -> None:
    """List events, oldest first (the API's filters: proposal, person, stack, since, until, address, action,
    outcome, after, limit, repo)."""
    from gateway.services.admin.audit import list_events

    events = list_events(ctx.ws, ctx.actor(), proposal_id, person, stack, since, until, address, action, outcome,
                         after, limit, _repository_asked(repository))
    for e in events:
        click.echo(event_line(e))
    if limit is not None and len(events) == limit:  # a full page: never end silently where more follow
        click.echo(f"{limit} events shown; more may follow: --after {events[-1].seq}", err=True)


@audit.command("show")
@click.argument("proposal_id", type=int, required=False)
@click.option("--break-glass", "window_id", type=int, default=None, help="a break-glass episode instead of a change")
@click.option("--full", is_flag=True, help="every item of every list (by default a long list shows its count, the "
                                           "first few and how many more)")
@pass_reader
def audit_show(ctx: Context, proposal_id: int | None, window_id: int | None, full: bool) -> None:
    """The whole story of one change, from request to merge (or of one break-glass episode)."""
    if (proposal_id is None) == (window_id is None):
        raise click.UsageError("name a proposal, or a break-glass window with --break-glass N")
    if window_id is not None:
        from gateway.services.day_two.break_glass import break_glass_story

        echo_story(break_glass_story(ctx.ws, ctx.actor(), window_id), full)
        return
    from gateway.services.admin.audit import proposal_story

    echo_story(proposal_story(ctx.ws, ctx.actor(), proposal_id or 0), full)


@audit.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.option("--proposal", "proposal_id", type=int, default=None)
@click.option("--repo", "repository", default=None, metavar="NAME", help=REPO_HELP)
@pass_reader
def audit_export(ctx: Context, fmt: str, proposal_id: int | None, repository: str | None) -> None:
    """Export events with their hashes, for an auditor's own tools (the whole trail ends with its signed
    checkpoints)."""
    from gateway.services.admin.audit import export_events, list_events

    repository = _repository_asked(repository)
    events = list_events(ctx.ws, ctx.actor(), proposal_id, repository=repository)
    with ctx.ws.store.session(readonly=True) as session:  # the checkpoints sign the whole trail: with it whole only
        checkpoints = session.audit.checkpoints() if proposal_id is None and not repository else []
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


# --- evidence: the change population, exceptions, samples, bundles ---------------------------------------------------


def period_options(command: Callable[..., R]) -> Callable[..., R]:
    """--period (or --since/--until) and the scope: --repository, --stack, --environment, --person."""
    for option in reversed((
            click.option("--period", default=None, help="2026, 2026-Q3, 2026-07 or 2026-07-01..2026-09-30 (default: "
                                                        "the last 90 days)"),
            click.option("--since", default=None, help="the period's start (a date or an ISO 8601 time)"),
            click.option("--until", default=None, help="its end (a date: that whole day)"),
            click.option("--repository", default=None), click.option("--stack", default=None),
            click.option("--environment", default=None, help="a stack's environment tag in gateway.yaml"),
            click.option("--person", default=None, help="changes this person requested, proposed, approved, "
                                                        "applied or overrode"))):
        command = option(command)
    return command


def _population(ctx: Context, period: str | None, since: str | None, until: str | None, repository: str | None,
                stack: str | None, environment: str | None, person: str | None) -> Population:
    from gateway.domain.change_population import Scope
    from gateway.services.admin.evidence import change_population, resolve_period

    return change_population(ctx.ws, ctx.actor(), resolve_period(ctx.ws, period, since, until),
                             Scope(repository, stack, environment, person))


@audit.command("population")
@period_options
@click.option("--format", "fmt", type=click.Choice(["text", "csv", "json"]), default="text", show_default=True)
@pass_reader
def audit_population(ctx: Context, fmt: str, **asked: str | None) -> None:
    """Every change applied (or attempted) in a period: who asked, who approved what, what ran; checks and
    exceptions first."""
    population = _population(ctx, **asked)
    if fmt == "json":
        click.echo(to_json_text(population.to_json()))
    elif fmt == "csv":
        click.echo(to_csv([r.csv_row() for r in population.rows], CSV_FIELDS), nl=False)
    else:
        echo_checks_and_exceptions(population)
        click.echo(f"\nChanges ({len(population.rows)})")
        for row in population.rows:
            click.echo(change_line(row))


@audit.command("exceptions")
@period_options
@click.option("--format", "fmt", type=click.Choice(["text", "csv", "json"]), default="text", show_default=True)
@pass_reader
def audit_exceptions(ctx: Context, fmt: str, **asked: str | None) -> None:
    """What to sample first in a period: overrides, break-glass, pushes to main outside the gateway, drift reverts,
    rollbacks, failed applies; and the checks that must find nothing."""
    population = _population(ctx, **asked)
    if fmt == "json":
        click.echo(to_json_text({"period": population.period.to_json(), "scope": population.scope.to_json(),
                                 "counts": population.counts(), "checks": [c.to_json() for c in population.checks],
                                 "exceptions": [e.to_json() for e in population.exceptions]}))
    elif fmt == "csv":
        click.echo(to_csv([e.csv_row() for e in population.exceptions], EXCEPTION_CSV_FIELDS), nl=False)
    else:
        echo_checks_and_exceptions(population)


@audit.command("sample")
@period_options
@click.option("--size", type=int, required=True, help="how many changes")
@click.option("--seed", default=None, help="the seed that makes the selection reproducible (made up and printed "
                                           "when not given)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write each sampled change's evidence here (evidence-N.json for tools, evidence-N.html for people)")
@pass_ctx
def audit_sample(ctx: Context, size: int, seed: str | None, out: Path | None, **asked: str | None) -> None:
    """Draw a reproducible sample of the population (recorded in the trail, seed and all), and its evidence."""
    from gateway.domain.change_population import Scope
    from gateway.services.admin.evidence import resolve_period, sample_changes

    scope = Scope(asked.pop("repository"), asked.pop("stack"), asked.pop("environment"), asked.pop("person"))
    sample = sample_changes(ctx.ws, ctx.actor(), resolve_period(ctx.ws, **asked), scope, size, seed)
    click.echo(f"sample of {len(sample.selected)} of {sample.population} changes ({sample.period.label}), seed "
               f"{sample.seed!r}: {', '.join(str(p) for p in sample.selected) or 'none'}")
    click.echo(f"  population {sample.population_digest}; redo it with --period {asked_again(sample.period)} "
               f"--size {sample.size} --seed {sample.seed!r}")
    if out is not None:
        write_evidence(ctx, sample.selected, out, sample.to_json())


@audit.command("evidence")
@click.argument("proposal_id", type=int)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write evidence-N.json and evidence-N.html here instead of printing the JSON")
@pass_reader
def audit_evidence(ctx: Context, proposal_id: int, out: Path | None) -> None:
    """One change's evidence bundle, signed, for `python3 verify_evidence.py` (`gateway audit verifier`)."""
    if out is not None:
        write_evidence(ctx, (proposal_id,), out, None)
        return
    from gateway.domain.evidence import bundle_bytes
    from gateway.services.admin.evidence import evidence_bundle

    sys.stdout.buffer.write(bundle_bytes(evidence_bundle(ctx.ws, ctx.actor(), proposal_id)))


def write_evidence(ctx: Context, proposal_ids: Sequence[int], out: Path,
                   sample: Mapping[str, Any] | None) -> None:
    from gateway.api.evidence_html import evidence_html
    from gateway.domain.evidence import bundle_bytes
    from gateway.services.admin.evidence import evidence_bundle

    out.mkdir(parents=True, exist_ok=True)
    for pid in proposal_ids:
        bundle = evidence_bundle(ctx.ws, ctx.actor(), pid, sample)
        (out / f"evidence-{pid}.json").write_bytes(bundle_bytes(bundle))
        (out / f"evidence-{pid}.html").write_text(evidence_html(bundle))
        click.echo(f"  {out / f'evidence-{pid}.json'} (and .html)")


@audit.command("public-key")
@click.option("--pem", is_flag=True, help="as a PEM public key (default: the base64 checkpoints name)")
@pass_reader
def audit_public_key(ctx: Context, pem: bool) -> None:
    """The audit key's public half, for a third party to verify checkpoints and evidence with."""
    from gateway.services.admin.evidence import public_key

    raw, as_pem = public_key(ctx.ws)
    click.echo(as_pem if pem else raw, nl=not pem)


@audit.command("verifier")
def audit_verifier() -> None:
    """Print the standalone evidence verifier (one Python file, no dependency): save it as verify_evidence.py."""
    from importlib.resources import files

    click.echo(files("gateway").joinpath("evidence_verifier.py").read_text(), nl=False)


def echo_checks_and_exceptions(population: Population) -> None:
    counts = population.counts()
    scope = ", ".join(f"{k} {v}" for k, v in population.scope.to_json().items())
    click.echo(f"Change population {population.period.label}{f' ({scope})' if scope else ''}: "
               f"{counts['changes']} change(s): {counts['applied']} applied, {counts['failed']} failed, "
               f"{counts['partial']} partly applied, {counts['unmerged']} unmerged, {counts['applying']} applying")
    click.echo("\nChecks (each must find nothing)")
    for check in population.checks:
        click.echo(f"  {'PASS' if check.passed else 'FAIL'} {check.name}: {check.checked} {check.what} checked, "
                   f"{len(check.violations)} found: {check.rule}")
    click.echo(f"\nExceptions ({len(population.exceptions)}): sample these first")
    for item in population.exceptions:
        click.echo(f"  {item.kind:16} {item.at[:19]} {item.summary}")


def change_line(row: ChangeRow) -> str:
    approvers = ", ".join(dict.fromkeys(a.by for a in row.approvals if a.withdrawn_at is None)) or "-"
    flags = f" [{', '.join(row.flags)}]" if row.flags else ""
    return (f"  {row.proposal_id:>6} {(row.applied_at or '-')[:19]:19} {row.outcome:9} {row.risk:8} "
            f"{','.join(row.stacks):16} requested by {row.requester}, approved by {approvers}{flags}")
