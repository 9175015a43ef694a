"""The `gateway` command: the root group, which knows every command by name and imports the module
holding one only when that command runs.

`gateway --help` is printed from the table below, so it imports no command module, no service, no
database or git library (tests/test_cli_layout.py holds the table to the commands' own docstrings).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

from gateway.domain.errors import GatewayError, Refused

# name: (module under gateway.cli, the command's one-line help: the first line of its docstring)
COMMANDS: dict[str, tuple[str, str]] = {
    "abandon": ("proposals", "Withdraw a proposal (open or failed); its branch may be proposed again."),
    "apply": ("proposals", "Apply exactly the approved plans, one stack at a time, then merge the branch (a job)."),
    "approve": ("proposals", "Approve the proposal's current commit and plans."),
    "audit": ("audit", "Query, export and verify the append-only, hash-chained audit trail."),
    "break-glass": ("day_two", "Incident windows: change a stack outside the gateway, in the open, then codify "
                               "within the deadline."),
    "breaker": ("agents", "The circuit breaker on agent changes, and the kill switch."),
    "chat": ("agents", "Talk to the agent; each message after the first refines the same proposal. Empty line "
                       "or EOF quits."),
    "demo": ("workspace", "Run the whole change path in a fresh temporary workspace, narrated."),
    "drift": ("day_two", "Drift: check and record it (check, list), and the ways out (revert, codify)."),
    "import": ("day_two", "Bring an existing object under management: an import block plus its configuration, "
                          "proven zero-diff (sandbox)."),
    "inbox": ("proposals", "Waiting for you: what you can approve or reject now, and why each needs you."),
    "init": ("workspace", "Create the workspace in $GATEWAY_HOME with a sample declaration repo, main applied."),
    "job": ("jobs", "Show a job: kind, status, progress, and its result once finished."),
    "list": ("proposals", "List proposals: those waiting for your approval first (marked *), then newest first."),
    "main": ("day_two", "Commits pushed to main outside the gateway."),
    "mcp": ("agents", "The MCP server over stdio, for an external agent whose token is GATEWAY_TOKEN "
                      "(`--agent --for PERSON`)."),
    "merge": ("proposals", "Leave `unmerged`: merge an applied proposal into main again, or acknowledge a merge "
                           "made by hand."),
    "migrate": ("workspace", "Bring the workspace's database up to this gateway's schema; a command that only reads "
                             "never migrates."),
    "notifications": ("notifications", "Notifications sent to Slack, e-mail and webhooks: delivered, waiting for a "
                                       "retry, failed, or skipped (newest first)."),
    "override": ("proposals", "Override one deny finding as a policy owner (recorded, attributable, expiring)."),
    "plan": ("plans", "Plan one stack of the declaration repo with its engine and print the preview."),
    "policy": ("policy", "Rego policies under policies/ on main: run their tests, try them on a plan."),
    "preview": ("plans", "Render any Terraform/OpenTofu plan (`show -json` output) for a person."),
    "propose": ("proposals", "Open a proposal from a branch of the declaration repo: plan every stack it touches."),
    "reject": ("proposals", "Reject the proposal; it stays stopped until a new commit."),
    "repos": ("repos", "The declaration repositories the gateway serves (`gateway --repo NAME ...` works in one)."),
    "request": ("agents", "Ask the agent for a change in plain words; it opens a proposal you cannot approve "
                          "yourself."),
    "rollback": ("proposals", "Open a proposal that reverts the merge of an applied change, planned and approved "
                              "like any other."),
    "sandbox": ("sandbox", "Act on the simulated cloud behind the gateway's back (drift, faults). A simulator only."),
    "serve": ("jobs", "Run the HTTP API and the review pages."),
    "show": ("proposals", "Show a proposal: status, approvals (current or stale), and the preview of every stack."),
    "sync": ("proposals", "Re-plan a proposal whose branch, main or stack state moved since its plans (a job)."),
    "users": ("users", "People and agents, and their tokens."),
    "worker": ("jobs", "Run plan and apply jobs from the database until stopped (SIGTERM or Ctrl-C finish the "
                       "jobs in hand)."),
}


def command_module(name: str) -> str:
    """The dotted name of the module that holds command NAME."""
    return f"{__name__}.{COMMANDS[name][0]}"


class LazyGroup(click.Group):
    """Commands found by name in COMMANDS; a command's module is imported only when that command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        room: click.Group = importlib.import_module(command_module(name)).group
        return room.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the table alone, shortened exactly as click shortens a command's own help."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=summary).get_short_help_str(limit))
                for name, (_, summary) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="change-gateway")
@click.option("--repo", "repository", default=None, metavar="NAME",
              help="the declaration repository to work in (default: GATEWAY_REPOSITORY, else the repository the "
                   "current directory is a clone of, else the workspace's own)")
def cli(repository: str | None) -> None:
    """The change gateway: the one path by which agents and people change infrastructure."""
    # Logging is configured by the commands that act (gateway.cli.context.Context), not here: this runs
    # before a command's own --help is parsed, and structlog alone costs more than that help.


def main(args: Sequence[str] | None = None) -> None:
    """Entry point: a GatewayError is one clear line on stderr and a non-zero exit."""
    try:
        cli.main(args, standalone_mode=False)
        context = sys.modules.get("gateway.cli.context")  # loaded only if a command ran
        if args is None and context is not None and context.finished_read is not None:
            context.exit_after_read(context.finished_read)  # the process is this command: a read ends here
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Refused as exc:
        for reason in exc.reasons:
            click.echo(f"refused: {reason}", err=True)
        sys.exit(1)
    except GatewayError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
