"""The `gateway` command's table of commands tells the truth, and asking for help or reading stays cheap.

The root group lists commands from gateway.cli.COMMANDS without importing them; these tests hold that
table to the commands themselves, and check what `--help` and `gateway show` import in a fresh interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import click
import pytest

import gateway.cli
from gateway.cli import COMMANDS
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace
from tests.conftest import Clone, People

# What opening a workspace pulls in; none of it is needed to print help.
HEAVY = ("sqlalchemy", "git", "github", "pydantic_settings", "structlog", "gateway.services", "gateway.adapters",
         "prometheus_client")
# What a read of a proposal does not need: the HCL parser and the engines' machinery (the simulator's evaluator,
# planner and applier, Terraform), the policy interpreters, the logger (a read logs nothing), the forge, the
# agent, the web app and the job handlers; GitPython (a read uses libgit2), HTTP clients (and the rich console
# httpx brings), the cipher (previews are stored masked, not sealed), on SQLite, the PostgreSQL dialect, and
# pydantic-settings (the settings read the environment themselves).
NOT_FOR_A_READ = ("prometheus_client", "gateway.adapters.metrics", "lark", "hcl2", "gateway.adapters.hcl.reading",
                  "pydantic_settings", "dotenv",
                  "gateway.adapters.engines.terraform.engine", "regopy", "checkov",
                  "structlog", "github", "openai", "langgraph", "fastapi", "gateway.api",
                  "git", "httpx", "rich", "cryptography", "sqlalchemy.dialects.postgresql",
                  "gateway.adapters.engines.sandbox.planner", "gateway.adapters.engines.sandbox.applier",
                  "gateway.adapters.engines.sandbox.hcl_eval", "gateway.adapters.forges.github",
                  "gateway.services.change.jobs",
                  "gateway.services.change.runner", "gateway.services.forge.github_webhooks",
                  "gateway.services.agents.agent_runs")


def command_modules() -> dict[str, click.Group]:
    """Every module of gateway.cli that holds commands, with the group its commands are registered on."""
    found: dict[str, click.Group] = {}
    for info in pkgutil.iter_modules(gateway.cli.__path__):
        if info.name == "__main__":  # importing it runs the command
            continue
        module = importlib.import_module(f"gateway.cli.{info.name}")
        if isinstance(getattr(module, "group", None), click.Group):
            found[info.name] = module.group
    return found


def test_every_command_of_every_module_is_in_the_table_and_nothing_else() -> None:
    defined = {name: module for module, group in command_modules().items() for name in group.commands}
    assert defined == {name: module for name, (module, _) in COMMANDS.items()}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_tables_help_is_the_commands_own_first_line(name: str) -> None:
    command = gateway.cli.cli.get_command(click.Context(gateway.cli.cli), name)
    assert command is not None and command.help is not None
    # The whole first paragraph is that one line, so `gateway --help` shortens it exactly as click would.
    assert command.help.partition("\n\n")[0] == COMMANDS[name][1]


def modules_after(*argvs: list[str], env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Run `gateway ARGV` for each ARGV in one fresh interpreter: the modules it then holds, and what it printed."""
    script = (
        "import contextlib, io, json, sys\n"
        "from gateway.cli import main\n"
        "out = io.StringIO()\n"
        f"for argv in {argvs!r}:\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        main(argv)\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'output': out.getvalue()}))\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | (env or {})
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return result["modules"], result["output"]


def heavy_among(modules: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


def test_gateway_help_lists_every_command_and_imports_none_of_them() -> None:
    modules, output = modules_after(["--help"])
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name} " in output and summary.split()[0] in output
    assert heavy_among(modules) == []
    assert [m for m in modules if m.startswith("gateway.cli.")] == []  # not even the command modules


def test_help_of_each_command_imports_no_service_database_or_git() -> None:
    modules, output = modules_after(*([name, "--help"] for name in sorted(COMMANDS)))
    assert output.count("Usage: ") == len(COMMANDS)
    assert heavy_among(modules) == []


def test_gateway_show_reads_a_proposal_without_the_engines_logger_forge_agent_or_job_handlers(
        workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "bigger staging instance")
    env = {"GATEWAY_HOME": str(workspace.settings.home), "GATEWAY_TOKEN": people.tokens["dana"]}
    modules, output = modules_after(["show", str(proposal.id)], env=env)
    assert f"proposal {proposal.id} [open] bigger" in output
    assert '"t3.small" -> "t3.medium"' in output and "blocked: needs 1 approval(s)" in output
    assert heavy_among(modules, NOT_FOR_A_READ) == []


def test_a_logger_loads_structlog_when_it_first_logs_and_logs_as_configured() -> None:
    script = (
        "import sys\n"
        "from gateway.logs import configure_logging, get_logger\n"
        "log = get_logger('gateway.example')\n"
        "configure_logging('info')\n"
        "print('structlog' in sys.modules)\n"
        "log.debug('hidden')\n"
        "log.info('shown', stack='app')\n"
        "print('structlog' in sys.modules, 'rich' in sys.modules)\n"
        "import rich.console\n"  # what structlog was kept from is still there for whoever needs it
        "print(rich.console.Console is not None)\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError:\n"
        "    log.exception('failed')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False", "True"]  # structlog, without rich (its console renderer's)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["event"], line["level"], line.get("stack")) for line in lines] == [
        ("shown", "info", "app"), ("failed", "error", None)]
    assert "ValueError: boom" in lines[1]["exception"] and "Traceback" in lines[1]["exception"]


def test_a_finished_read_exits_at_once_with_its_output_and_atexit_handlers_but_no_teardown(
        workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "bigger staging instance")
    script = (  # as the `gateway` script runs it; the interpreter's teardown would delete `marker` and print
        "import atexit, sys\n"
        "class Marker:\n"
        "    def __del__(self): print('torn down', file=sys.stderr)\n"
        "marker = Marker()\n"
        "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
        f"sys.argv = ['gateway', 'show', '{proposal.id}']\n"
        "from gateway.cli import main\n"
        "main()\n"
        "print('not reached', file=sys.stderr)\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | {
        "GATEWAY_HOME": str(workspace.settings.home), "GATEWAY_TOKEN": people.tokens["dana"]}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"proposal {proposal.id} [open] bigger") and "blocked: needs 1 approval(s)" in done.stdout
    assert done.stderr.split("\n") == ["atexit ran", ""]  # neither the teardown (a tenth of a second) nor the rest
