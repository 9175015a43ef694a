"""`gateway plan` of terraform-aws-modules trees (and of a flat 2,001-resource stack) with the sandbox engine.

The trees are tests/fixtures/module_trees (EKS managed node groups, RDS complete-postgres, VPC complete:
examples with every module they call, laid out as `terraform init` leaves them; see its SOURCES.md). This
script makes a workspace in a temporary directory (`gateway init`), commits each tree to main as a stack,
and runs `python -m gateway.cli plan --stack NAME` N times as its own process, start-up included. For each
it prints the median wall and CPU time (user + system, from getrusage of the children) beside its floor,
measured in the same run: a process that starts Python, loads python-hcl2's grammar and parses each of the
stack's .tf files once (what no plan of it can avoid), and the CPU as a multiple of that floor.

Goals (issue 25): each tree <= 3 s of CPU including start-up; the flat stack's plan <= 2 s (its apply is
measured by benchmarks/plan_large_stack.py). The tree whose code runs is the current directory's unless
`--tree` names another (a git worktree of an older commit, for a before/after).
Usage: python benchmarks/sandbox_module_trees.py [--runs N] [--tree PATH] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

TREES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "module_trees"
# stack name -> (the folder copied, the stack's root inside it, CPU goal in seconds)
STACKS = {
    "eks-managed-node-group": ("eks-managed-node-group", ".", 3.0),
    "rds-complete-postgres": ("rds-complete-postgres", "examples/complete-postgres", 3.0),
    "vpc-complete": ("vpc-complete", "examples/complete", 3.0),
    "flat-2001": (None, ".", 2.0),
}
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
                "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}
FLOOR = """
import hashlib, sys
from pathlib import Path
from gateway.adapters.hcl import _parser
texts = {}
for path in sorted(Path(sys.argv[1]).rglob("*.tf")):
    text = path.read_text(encoding="utf-8")
    texts[hashlib.sha256(text.encode()).hexdigest()] = text
for text in texts.values():
    _parser().parse(text if text.endswith("\\n") else text + "\\n")
"""


def run_once(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run; a failed run stops the benchmark (a timing of an error is no figure)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(argv: Sequence[str], cwd: Path, env: dict[str, str], runs: int) -> tuple[float, float]:
    samples = [run_once(argv, cwd, env) for _ in range(runs)]
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def gateway(tree: Path, env: dict[str, str], *args: str, token: str | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=tree, capture_output=True, text=True,
                          env={**env, **({"GATEWAY_TOKEN": token} if token else {})})
    if done.returncode != 0:
        sys.exit(f"gateway {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def flat_stack(directory: Path, count: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plan_large_stack import generate_stack

    directory.mkdir(parents=True)
    generate_stack(directory, count)


def make_workspace(tree: Path, root: Path, env: dict[str, str], names: Sequence[str]) -> tuple[str, dict[str, Path]]:
    """`gateway init`, an admin, and each stack committed to main; returns the token and each stack's root."""
    gateway(tree, env, "init")
    token = gateway(tree, env, "users", "add", "root", "--role", "admin").strip()
    clone = root / "clone"
    git_env = {**env, **GIT_IDENTITY}
    subprocess.run(["git", "clone", "-q", env["GATEWAY_HOME"] + "/declarations.git", str(clone)], check=True, env=git_env)
    roots: dict[str, Path] = {}
    entries = []
    for name in names:
        folder, inside, _ = STACKS[name]
        target = clone / "trees" / name
        if folder is None:
            flat_stack(target, 2001)
        else:
            shutil.copytree(TREES / folder, target)
        path = (Path("trees") / name / inside).as_posix()
        roots[name] = clone / path
        entries.append(f"  {name}:\n    path: {path}\n    approvers: [platform]\n")
    settings = clone / "gateway.yaml"
    text = settings.read_text()
    settings.write_text(text.replace("stacks:\n", "stacks:\n" + "".join(entries), 1))
    subprocess.run(["git", "add", "-A", "-f", "."], cwd=clone, check=True, env=git_env)  # .terraform/ too
    subprocess.run(["git", "commit", "-qm", "module trees"], cwd=clone, check=True, env=git_env)
    subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=clone, check=True, env=git_env)
    return token, {name: clone / "trees" / name for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the source tree whose gateway runs")
    parser.add_argument("--only", action="append", choices=sorted(STACKS), help="measure only these stacks")
    options = parser.parse_args()
    tree = options.tree.resolve()
    names = options.only or list(STACKS)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GATEWAY_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["GATEWAY_HOME"] = str(root / "home")
        env["PYTHONPATH"] = str(tree)
        token, folders = make_workspace(tree, root, env, names)
        print(f"tree {tree} at {commit.stdout.strip() or '?'}; {options.runs} runs each (medians); "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        print(f"{'stack':24} {'changes':>8} {'wall s':>8} {'CPU s':>8} {'floor CPU':>10} {'÷ floor':>8} {'goal CPU':>9}")
        for name in names:
            argv = [sys.executable, "-m", "gateway.cli", "plan", "--stack", name, "--format", "json"]
            out = subprocess.run(argv, cwd=tree, env={**env, "GATEWAY_TOKEN": token}, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"gateway plan --stack {name} failed: {out.stderr.strip()[-2000:]}")
            changes = out.stdout.count('"address"')  # rough: the preview's entries, to show it planned
            wall, cpu = measure(argv, tree, {**env, "GATEWAY_TOKEN": token}, options.runs)
            _, floor = measure([sys.executable, "-c", FLOOR, str(folders[name])], tree, env, options.runs)
            goal = STACKS[name][2]
            print(f"{name:24} {changes:8} {wall:8.2f} {cpu:8.2f} {floor:10.2f} {cpu / floor:8.2f} "
                  f"{goal:9.1f} {'met' if cpu <= goal else 'NOT MET'}")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
