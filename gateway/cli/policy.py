"""Rego policies on main: run their own tests, or ask what they say of a plan file."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.context import Context, pass_ctx
from gateway.domain.plan import decode_plan_bytes

group = click.Group("policy")  # this module's commands; gateway.cli registers each by name


@group.group()
def policy() -> None:
    """Rego policies under policies/ on main: run their tests, try them on a plan."""


@policy.command("test")
@click.option("--stack", default=None, help="only the packages this stack is judged by")
@pass_ctx
def policy_test(ctx: Context, stack: str | None) -> None:
    """Run the policies' `test_` rules (as `opa test` does); exits non-zero if one fails."""
    from gateway.services.change.policies import run_policy_tests

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
    from gateway.services.change.policies import evaluate_plan_document

    ctx.actor()
    try:
        document = decode_plan_bytes(plan_file.read_bytes())
    except OSError as exc:
        raise click.ClickException(f"cannot read {plan_file}: {exc.strerror}") from None
    findings = evaluate_plan_document(ctx.ws, document, stack, agent)
    for f in findings:
        click.echo(f"{f.severity.value.upper():4} {f.rule} {f.address}: {f.message}")
    click.echo(f"{len(findings)} finding(s)")
