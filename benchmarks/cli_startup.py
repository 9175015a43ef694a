"""What a person waits for at the `gateway` command: `--help`, a read (`show N`), `preview FILE` and `plan` of a stack.

Each command is run N times as its own process (`python -m gateway.cli ...`, as the tests run it), on a
small workspace this script makes in a temporary directory with `gateway init` and one proposal. For
each it prints the median wall time and the median CPU time (user + system, from getrusage of the
children), beside the floors measured in the same run: `python -c pass` (the interpreter), `python -c
'import sqlalchemy'` (the one library every read of the database needs) and `git --version`; and each
command's CPU as a multiple of the SQLAlchemy floor, which a loaded machine inflates alike.

The tree whose code runs is the current directory's unless `--tree` names another (a git worktree of an
older commit, for a before/after); the script itself imports nothing of the gateway, so it measures any.
`--imports` also prints, per command, the packages whose import took longest (from `-X importtime`).

Goals (issue 25): `--help` <= 0.3 s of CPU, a read <= 0.6 s, `preview` <= 0.5 s; `plan --stack app-staging` (the
sample's small stack on the simulator, with policies) has no goal of its own and is printed beside the same floors.
Usage: python benchmarks/cli_startup.py [--runs N] [--tree PATH] [--imports]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PLAN = Path("tests/fixtures/tfplan/tf-plan-format_sensitive.tfplan.json")
GOALS = {"gateway --help": 0.3, "gateway show 1": 0.6, "gateway preview FILE": 0.5}
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
                "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds, median over the runs
    cpu: float  # seconds of user + system CPU of the process (and its children), median


def run_once(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run; a failed run stops the benchmark (a timing of an error is no figure)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(argv: Sequence[str], cwd: Path, env: dict[str, str], runs: int) -> Timing:
    run_once(argv, cwd, env)  # a first run writes the bytecode caches, as an installed gateway has them
    samples = [run_once(argv, cwd, env) for _ in range(runs)]
    return Timing(statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples))


def gateway(tree: Path, env: dict[str, str], *args: str, token: str | None = None) -> str:
    """Run `gateway ARGS` from TREE and return what it printed (for setting up the workspace)."""
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=tree, capture_output=True, text=True,
                          env={**env, **({"GATEWAY_TOKEN": token} if token else {})})
    if done.returncode != 0:
        sys.exit(f"gateway {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def make_workspace(tree: Path, root: Path, env: dict[str, str]) -> str:
    """`gateway init`, two people, and proposal 1 (a bigger instance on app-staging); returns alice's token."""
    gateway(tree, env, "init")
    admin = gateway(tree, env, "users", "add", "root", "--role", "admin").strip()
    alice = gateway(tree, env, "users", "add", "alice", "--role", "requester", token=admin).strip()
    clone = root / "clone"
    git_env = {**env, **GIT_IDENTITY}
    subprocess.run(["git", "clone", "-q", env["GATEWAY_HOME"] + "/declarations.git", str(clone)], check=True, env=git_env)
    subprocess.run(["git", "checkout", "-q", "-b", "bigger"], cwd=clone, check=True, env=git_env)
    stack = clone / "stacks/app-staging/main.tf"
    stack.write_text(stack.read_text().replace('"t3.small"', '"t3.medium"'))
    subprocess.run(["git", "commit", "-qam", "bigger staging instance"], cwd=clone, check=True, env=git_env)
    subprocess.run(["git", "push", "-q", "origin", "bigger"], cwd=clone, check=True, env=git_env)
    gateway(tree, env, "propose", "--branch", "bigger", "-m", "bigger staging instance", token=alice)
    return alice


def heaviest_imports(argv: Sequence[str], cwd: Path, env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The packages whose modules' own import time adds up the most (ms): what a start-up is spent on."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True)
    totals: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            parts = found.group(2).split(".")
            package = ".".join(parts[:2]) if parts[0] == "gateway" else parts[0]
            totals[package] += int(found.group(1)) / 1000
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the source tree whose gateway runs")
    parser.add_argument("--imports", action="store_true", help="also print what each command's imports cost")
    options = parser.parse_args()
    tree = options.tree.resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Without bytecode caches every run compiles the gateway's modules again (0.3 s and more of CPU):
        # an installed gateway has them, so the runs here may write them (PYTHONDONTWRITEBYTECODE is dropped).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GATEWAY_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["GATEWAY_HOME"] = str(root / "home")
        token = make_workspace(tree, root, env)
        python = [sys.executable]
        cases = {
            "python -c pass (floor)": (python + ["-c", "pass"], env),
            "import sqlalchemy (floor)": (python + ["-c", "import sqlalchemy"], env),
            "git --version (floor)": (["git", "--version"], env),
            "gateway --help": (python + ["-m", "gateway.cli", "--help"], env),
            "gateway show 1": (python + ["-m", "gateway.cli", "show", "1"], {**env, "GATEWAY_TOKEN": token}),
            "gateway preview FILE": (python + ["-m", "gateway.cli", "preview", str(tree / PLAN)], env),
            "gateway plan (a stack)": (python + ["-m", "gateway.cli", "plan", "--stack", "app-staging"],
                                       {**env, "GATEWAY_TOKEN": token}),
        }
        print(f"tree {tree} at {commit.stdout.strip() or '?'}; {options.runs} runs each (medians); "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        print(f"{'command':26} {'wall s':>8} {'CPU s':>8} {'÷ sqlalchemy':>12} {'goal CPU s':>11}")
        floor = None
        for name, (argv, case_env) in cases.items():
            timing = measure(argv, tree, case_env, options.runs)
            floor = timing.cpu if name.startswith("import sqlalchemy") else floor
            ratio = f"{timing.cpu / floor:12.2f}" if floor and name.startswith("gateway") else " " * 12
            goal = GOALS.get(name)
            verdict = "" if goal is None else f"{goal:>11.1f} {'met' if timing.cpu <= goal else 'NOT MET'}"
            print(f"{name:26} {timing.wall:8.3f} {timing.cpu:8.3f} {ratio} {verdict}")
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if options.imports:
            for name, (argv, case_env) in cases.items():
                if name.startswith("gateway"):
                    costs = ", ".join(f"{package} {ms:.0f}" for package, ms in heaviest_imports(argv, tree, case_env))
                    print(f"imports of {name} (ms, own time per package): {costs}")


if __name__ == "__main__":
    main()
