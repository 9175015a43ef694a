"""The `gateway` command's table of commands tells the truth, and asking for help stays cheap.

The root group lists commands from gateway.cli.COMMANDS without importing them; these tests hold that
table to the commands themselves, and check what `--help` imports in a fresh interpreter.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import click
import pytest

import gateway.cli
from gateway.cli import COMMANDS

# What opening a workspace pulls in; none of it is needed to print help.
HEAVY = ("sqlalchemy", "git", "github", "pydantic_settings", "structlog", "gateway.services", "gateway.adapters")


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


def modules_after(*argvs: list[str]) -> tuple[list[str], str]:
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
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return result["modules"], result["output"]


def heavy_among(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


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
