"""Getting started: create a workspace, or walk the whole change path in a throwaway one."""

from __future__ import annotations

import click

from gateway.cli.context import Context, pass_ctx

group = click.Group("workspace")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.option("--if-missing", is_flag=True, help="do nothing when the workspace exists (for containers' start-up)")
@click.option("--sample", type=click.Choice(["sandbox", "terraform", "cloudformation"]), default="sandbox",
              show_default=True, help="sandbox: AWS-shaped stacks on the simulator; terraform: real Terraform (after "
              "`make terraform`); cloudformation: change sets (AWS credentials and AWS_ENDPOINT_URL from the "
              "environment, e.g. moto_server)")
@pass_ctx
def init(ctx: Context, if_missing: bool, sample: str) -> None:
    """Create the workspace in $GATEWAY_HOME with a sample declaration repo, main applied."""
    from gateway.composition import create_workspace
    from gateway.services.admin.bootstrap import bootstrap_simulator

    if if_missing and ctx.settings.repo_path.exists():
        click.echo(f"workspace already in {ctx.settings.home}")
        return
    ws = create_workspace(ctx.settings, sample=sample)
    applied = bootstrap_simulator(ws)
    click.echo(f"workspace created in {ctx.settings.home}")
    click.echo(f"declaration repo: {ctx.settings.repo_path} (clone it, push a branch, `gateway propose`)")
    where = {"sandbox": "the simulated cloud (a simulator, no real cloud)", "terraform": "Terraform's local state",
             "cloudformation": "CloudFormation (the account and endpoint of the environment's AWS credentials)"}[sample]
    click.echo(f"main's stacks applied to {where}: {applied} resources")
    click.echo("next: `gateway users add NAME --role admin` (the first user needs no token)")


@group.command()
@pass_ctx
def migrate(ctx: Context) -> None:
    """Bring the workspace's database up to this gateway's schema; a command that only reads never migrates."""
    from gateway.composition import migrate_workspace

    ran = migrate_workspace(ctx.settings)
    click.echo(f"ran migration(s) {', '.join(map(str, ran))}" if ran else "the database schema is current")


@group.command()
@click.option("--keep", is_flag=True, help="keep the temporary workspace and print where it is")
@click.option("--day-two", "day_two", is_flag=True, help="drift -> codify, and break-glass -> codify, instead")
def demo(keep: bool, day_two: bool) -> None:
    """Run the whole change path in a fresh temporary workspace, narrated."""
    from gateway.logs import configure_logging

    configure_logging()  # the one command that acts without a Context
    if day_two:
        from gateway.demo_day_two import run_day_two_demo

        run_day_two_demo(keep=keep)
        return
    from gateway.demo import run_demo

    run_demo(keep=keep)
