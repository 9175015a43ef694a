"""`gateway plan` of terraform-aws-modules trees (and of a flat 2,001-resource stack) with the sandbox engine.

The trees are tests/fixtures/module_trees (EKS managed node groups, RDS complete-postgres, VPC complete:
examples with every module they call, laid out as `terraform init` leaves them; see its SOURCES.md). This
script makes a workspace in a temporary directory (`gateway init`), commits each tree to main as a stack,
and runs `python -m gateway.cli plan --stack NAME` N times as its own process, start-up included.

The gateway ignores a committed `.terraform/` and installs registry modules itself, so the packages the trees
hold (the versions their modules.json names) are served by the tests' module registry on loopback over HTTPS
(tests/module_registry.py), trusted through the same settings the tests use; nothing reaches the network.
The first plan of a stack fetches its packages into the module cache ($GATEWAY_HOME/modules) and is shown
on its own line ("first"); the runs measured after it find the cache warm ("warm", the figure the goal is
for). Each plan's pins must name the versions the tree's modules.json names, or the benchmark stops.

For each it prints the median wall and CPU time (user + system, from getrusage of the children) beside its floor,
measured in the same run: a process that starts Python, loads python-hcl2's grammar and parses each of the
stack's .tf files once (what no plan of it could avoid while every process parsed), and the CPU as a multiple
of that floor; beside it the "kept" floor: the same process reading those trees back from the workspace's
parsed-tree cache ($GATEWAY_HOME/parsed-hcl, filled by the first plan), where the tree has one.

Goals (issue 25): each tree <= 3 s of CPU including start-up; the flat stack's plan <= 2 s (its apply is
measured by benchmarks/plan_large_stack.py). The tree whose code runs is the current directory's unless
`--tree` names another (a git worktree of an older commit, for a before/after).
Usage: python benchmarks/sandbox_module_trees.py [--runs N] [--tree PATH] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.module_registry import Registry, serve_registry  # noqa: E402 (the repository's tests are no package path)

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
from gateway.adapters.hcl.reading import _parser
texts = {}
for path in sorted(Path(sys.argv[1]).rglob("*.tf")):
    text = path.read_text(encoding="utf-8")
    texts[hashlib.sha256(text.encode()).hexdigest()] = text
for text in texts.values():
    _parser().parse(text if text.endswith("\\n") else text + "\\n")
"""
FLOOR_KEPT = """
import hashlib, sys
from pathlib import Path
from gateway.adapters.hcl.reading import parse_tree
from gateway.adapters.hcl.parsed_trees import keep_parsed_trees_in
keep_parsed_trees_in(Path(sys.argv[2]))
texts = {}
for path in sorted(Path(sys.argv[1]).rglob("*.tf")):
    text = path.read_text(encoding="utf-8")
    texts[hashlib.sha256(text.encode()).hexdigest()] = text
for text in texts.values():
    parse_tree(text)
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


def registry_packages(names: Sequence[str]) -> dict[tuple[str, str], Path]:
    """(module, version) -> the package folder a tree holds, for every registry module its modules.json names."""
    packages: dict[tuple[str, str], Path] = {}
    for name in names:
        folder, inside, _ = STACKS[name]
        if folder is None:
            continue
        root = TREES / folder / inside
        manifest = root / ".terraform" / "modules" / "modules.json"
        for entry in json.loads(manifest.read_text())["Modules"] if manifest.is_file() else ():
            if entry.get("Version"):
                module = entry["Source"].removeprefix("registry.terraform.io/")
                packages[(module, entry["Version"])] = root / entry["Dir"]
    return packages


def cached_packages(home: Path) -> set[tuple[str, str]]:
    """(module, version) of each registry package in the gateway's module cache."""
    found = set()
    for meta in (home / "modules").glob("*/.gateway-module.json"):
        kind, module, version = json.loads(meta.read_text())["key"].split(" ")
        if kind == "registry":
            found.add((module.removeprefix("registry.terraform.io/"), version))
    return found


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
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GATEWAY_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["GATEWAY_HOME"] = str(root / "home")
        env["PYTHONPATH"] = str(tree)
        registry, server = serve_registry(root)
        registry.packages = registry_packages(names)
        env.update({"GATEWAY_MODULE_REGISTRY_HOSTS": f"registry.terraform.io={registry.url}",
                    "GATEWAY_MODULE_ALLOWED_HOSTS": f"127.0.0.1:{registry.url.rsplit(':', 1)[1]}", "GATEWAY_MODULE_CA_BUNDLE": str(registry.ca_bundle)})
        try:
            run_stacks(tree, root, env, names, options.runs, registry)
        finally:
            server.shutdown()


def run_stacks(tree: Path, root: Path, env: dict[str, str], names: Sequence[str], runs: int,
               registry: Registry) -> None:
    """Each stack's first plan (fetching its modules), then `runs` plans with the cache warm, beside the floor."""
    token, folders = make_workspace(tree, root, env, names)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    print(f"tree {tree} at {commit.stdout.strip() or '?'}; {runs} warm runs each (medians); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'stack':24} {'plan':6} {'changes':>8} {'wall s':>8} {'CPU s':>8} {'floor CPU':>10} {'÷ floor':>8} "
          f"{'goal CPU':>9} {'kept floor':>10}")
    wanted: set[tuple[str, str]] = set()
    plan_env = {**env, "GATEWAY_TOKEN": token}
    for name in names:
        argv = [sys.executable, "-m", "gateway.cli", "plan", "--stack", name, "--format", "json"]
        _, floor = measure([sys.executable, "-c", FLOOR, str(folders[name])], tree, env, runs)
        first_wall, first_cpu = run_once(argv, tree, plan_env)
        wanted |= set(registry_packages([name]))
        if cached_packages(Path(env["GATEWAY_HOME"])) != wanted:  # the versions the tree was laid out with
            sys.exit(f"{name}: the module cache holds {sorted(cached_packages(Path(env['GATEWAY_HOME'])))}, "
                     f"not the tree's {sorted(wanted)}")
        out = subprocess.run(argv, cwd=tree, env=plan_env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"gateway plan --stack {name} failed: {out.stderr.strip()[-2000:]}")
        changes = out.stdout.count('"address"')  # rough: the preview's entries, to show it planned
        downloads = len(registry.downloads())
        wall, cpu = measure(argv, tree, plan_env, runs)
        if len(registry.downloads()) != downloads:
            sys.exit(f"{name}: a plan with the module cache warm downloaded a package again")
        kept = "-"
        if (tree / "gateway" / "adapters" / "parsed_trees.py").is_file():
            _, kept_cpu = measure([sys.executable, "-c", FLOOR_KEPT, str(folders[name]),
                                   str(Path(env["GATEWAY_HOME"]) / "parsed-hcl")], tree, env, runs)
            kept = f"{kept_cpu:.2f}"
        goal = STACKS[name][2]
        print(f"{name:24} {'first':6} {changes:8} {first_wall:8.2f} {first_cpu:8.2f} {floor:10.2f} "
              f"{first_cpu / floor:8.2f}")
        print(f"{name:24} {'warm':6} {changes:8} {wall:8.2f} {cpu:8.2f} {floor:10.2f} {cpu / floor:8.2f} "
              f"{goal:9.1f} {'met' if cpu <= goal else 'NOT MET':>7} {kept:>10}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
