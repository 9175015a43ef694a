"""The gateway's overhead around Terraform, and `gateway preview` against `terraform show`.

1. A stack of N null_resource (default 500) with its dependency lock file committed, as Terraform asks
   (`--no-lock`: without one), applied once; then a change to every one (500 replacements).
   In the same run, on the same state: bare Terraform (`init` + `plan -out` + `show -json`, then `apply` of
   that plan file) is the floor; beside it the gateway's propose of the same change (merge preview, secret
   checks, engine plan, policy, risk, preview rendered and stored) and its apply (approval re-checked, locks,
   state sealed and opened, exactly the saved plan, merge). The plans are made `--runs` times (default 3),
   bare and gateway in turn, each gateway propose from its own branch with an engine made afresh, as a new
   `gateway` or worker process has it (nothing learned in memory, only what the workspace keeps); the
   medians are printed. The apply runs once. Prints wall times, each one's ratio to the floor, and CPU: the
   gateway's own (this process) and that of the processes it ran (Terraform, its provider, git).
2. `gateway preview PLAN.json` (the CLI process, end to end) against `terraform show -json PLANFILE` on
   the plan of 2,000 creates.

Goal (issue 25): the gateway's plan and apply <= 1.05 x bare Terraform's.
Needs `make terraform`. It is not a test. `--profile` also prints where the gateway's own CPU of the propose
goes (cProfile, by cumulative time); `--processes` the CPU and wall time of each process run (Terraform by command,
git), bare and gateway.
Usage: python benchmarks/terraform_overhead.py [N] [--runs R] [--no-lock] [--profile] [--processes]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git

from gateway.adapters.engines.terraform.state import SealedLocalState
from gateway.adapters.git.repo import committer_env
from gateway.composition import create_workspace, open_workspace, terraform_setup
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal

HEADER = 'terraform {\n  required_providers {\n    null = {\n      source  = "hashicorp/null"\n      version = "2.1.2"\n    }\n  }\n}\n'
GOAL = 1.05
LOCK_FILE = ".terraform.lock.hcl"


def nulls(count: int, release: str) -> str:
    return HEADER + "".join(f'resource "null_resource" "n{i}" {{\n  triggers = {{ release = "{release}" }}\n}}\n'
                            for i in range(count))


def repo_content(directory: Path, count: int, lock: str | None) -> Path:
    (directory / "stacks" / "many").mkdir(parents=True)
    (directory / "stacks" / "many" / "main.tf").write_text(nulls(count, "1"))
    if lock is not None:
        (directory / "stacks" / "many" / LOCK_FILE).write_text(lock)
    (directory / "gateway.yaml").write_text("engine: terraform\nstacks:\n  many:\n    path: stacks/many\n"
                                            "    approvers: [platform]\npolicy:\n  required_tags: []\n  checkov: \"off\"\n"
                                            "  max_deletes: 100000\n")
    return directory


@dataclass(frozen=True)
class Timing:
    wall: float
    own_cpu: float  # this process
    child_cpu: float  # the processes it ran and waited for

    @property
    def cpu(self) -> float:
        return self.own_cpu + self.child_cpu


def timed(work: Callable[[], object]) -> Timing:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, own = time.perf_counter(), time.process_time()
    work()
    wall, own = time.perf_counter() - wall, time.process_time() - own
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Timing(wall, own, (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime))


class ProcessLedger:
    """The CPU and wall time of every child process, by phase and command: subprocess reaps them with wait4 here,
    which says the CPU; the wall time runs from its start to its reaping."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        self._commands: dict[int, tuple[str, float]] = {}
        started, ledger = subprocess.Popen.__init__, self

        def start(popen: subprocess.Popen, *args: object, **kwargs: object) -> None:
            began = time.perf_counter()
            started(popen, *args, **kwargs)
            ledger._commands[popen.pid] = (ledger._command(popen.args), began)

        def reap(pid: int, flags: int) -> tuple[int, int]:
            reaped, status, usage = os.wait4(pid, flags)
            if reaped:
                command, began = ledger._commands.pop(reaped, ("?", time.perf_counter()))
                entry = ledger.cpu[(ledger.phase, command)]
                entry[0] += 1
                entry[1] += usage.ru_utime + usage.ru_stime
                entry[2] += time.perf_counter() - began
            return reaped, status

        subprocess.Popen.__init__ = start  # type: ignore[method-assign]
        os.waitpid = reap  # Popen.wait's
        poll = subprocess.Popen._internal_poll  # type: ignore[attr-defined]
        poll.__defaults__ = (poll.__defaults__[0], reap, *poll.__defaults__[2:])

    @staticmethod
    def _command(args: object) -> str:
        words = [str(a) for a in (args if isinstance(args, list | tuple) else [args])]
        words = words[words.index("--") + 1:] if "--" in words else words  # setpriv --pdeathsig INT -- terraform
        return " ".join([Path(words[0]).name, *[w for w in words[1:] if not w.startswith("-")][:1]])

    def print(self, runs: int) -> None:
        print(f"CPU and wall time of the processes run, per plan (of {runs}) or apply:")
        for (phase, command), (count, cpu, wall) in sorted(self.cpu.items()):
            if phase != "setup":
                print(f"  {phase:14} {command:28} x{count:<3} CPU {cpu:7.3f} s wall {wall:7.3f} s" + (
                    f"  each plan: CPU {cpu / runs:6.3f} s wall {wall / runs:6.3f} s" if "plan" in phase else ""))


def median(timings: list[Timing]) -> Timing:
    return Timing(*(statistics.median(getattr(t, f) for t in timings) for f in ("wall", "own_cpu", "child_cpu")))


def row(name: str, t: Timing, floor: Timing | None = None) -> str:
    ratio = f"{t.wall / floor.wall:7.2f} {t.cpu / floor.cpu:7.2f}" if floor else " " * 15
    verdict = "" if floor is None else ("met" if t.wall / floor.wall <= GOAL else "NOT MET")
    return f"{name:34} {t.wall:7.2f} {t.own_cpu:8.2f} {t.child_cpu:8.2f} {ratio} {verdict}"


def main() -> None:
    configure_logging("warning")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("count", type=int, nargs="?", default=500, help="null_resources in the stack")
    parser.add_argument("--runs", type=int, default=3, help="plans of each, bare and gateway in turn")
    parser.add_argument("--no-lock", action="store_true", help="no dependency lock file committed in the stack")
    parser.add_argument("--profile", action="store_true", help="where the gateway's own CPU of a propose goes")
    parser.add_argument("--processes", action="store_true", help="the CPU of each process run, bare and gateway")
    options = parser.parse_args()
    ledger = ProcessLedger() if options.processes else None

    def phase(name: str) -> None:
        if ledger:
            ledger.phase = name
    count, runs = options.count, options.runs
    profiler = cProfile.Profile() if options.profile else None
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = Settings(home=root / "home")
        setup = terraform_setup(settings)
        env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
        if setup.cli_config:
            env["TF_CLI_CONFIG_FILE"] = str(setup.cli_config)

        def terraform(directory: Path, *args: str) -> None:
            subprocess.run([str(setup.binary), *args], cwd=directory, env=env, check=True, capture_output=True)

        lock = None
        if not options.no_lock:  # the lock file `init` writes for these providers, committed with the stack
            (root / "locked").mkdir()
            (root / "locked" / "main.tf").write_text(HEADER)
            terraform(root / "locked", "init", "-input=false", "-no-color")
            lock = (root / "locked" / LOCK_FILE).read_text()
        print(f"dependency lock file committed: {'no' if lock is None else 'yes'}")
        ws = create_workspace(settings, repo_content(root / "content", count, lock))
        bootstrap_simulator(ws)  # main applied by Terraform
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset(), PrincipalKind.PERSON)
        bob, _ = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}),
                               PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), root / "clone")
        releases = [str(2 + run) for run in range(runs)]
        for release in releases:  # one branch per gateway plan: each replaces all N
            clone.git.checkout("-q", "-B", f"release-{release}", "origin/main")
            Path(clone.working_dir, "stacks/many/main.tf").write_text(nulls(count, release))
            clone.git.add("-A")
            clone.git.execute(["git", "commit", "-qm", f"release {release}"], env=committer_env())
            clone.git.push("-q", "origin", f"release-{release}")

        with SealedLocalState(ws.settings.terraform_dir / "many", ws.store.sealer, "many").in_use(60) as _:
            state = (ws.settings.terraform_dir / "many" / "terraform.tfstate").read_bytes()

        def bare_plan(release: str) -> Path:
            bare = root / f"bare-{release}"  # a fresh directory, as the gateway's scratch copy is
            bare.mkdir()
            (bare / "main.tf").write_text(nulls(count, release))
            (bare / "terraform.tfstate").write_bytes(state)
            if lock is not None:
                (bare / LOCK_FILE).write_text(lock)
            terraform(bare, "init", "-input=false", "-no-color")
            terraform(bare, "plan", "-input=false", "-no-color", "-out=p.tfplan")
            terraform(bare, "show", "-json", "p.tfplan")
            return bare

        floor_plans, gateway_plans, proposals, fresh = [], [], [], None
        for release in releases:
            phase("bare plan")
            floor_plans.append(timed(lambda: bare_plan(release)))  # noqa: B023 (called at once)
            phase("gateway plan")
            fresh = open_workspace(ws.settings)  # a new process's engine
            if profiler:
                profiler.enable()
            gateway_plans.append(timed(lambda: proposals.append(
                open_proposal(fresh, alice, f"release-{release}", f"release {release}"))))  # noqa: B023
            if profiler:
                profiler.disable()
        assert fresh is not None
        last = proposals[-1]
        phase("decide")
        decide(fresh, bob, last.id, Decision.APPROVE, "ok")
        phase("bare apply")
        floor_apply = timed(lambda: terraform(root / f"bare-{releases[-1]}", "apply", "-input=false", "-no-color",
                                              "-json", "p.tfplan"))
        report: list = []
        phase("gateway apply")
        gateway_apply = timed(lambda: report.append(apply_proposal(fresh, bob, last.id)))
        assert report[0].succeeded, report[0]
        print(f"{count} null_resource replacements ({last.plans['many'].counts}), same state for both; plans: median "
              f"of {runs}:")
        print(f"{'':34} {'wall s':>7} {'own CPU':>8} {'run CPU':>8} {'÷ wall':>7} {'÷ CPU':>7}")
        print(row("bare terraform init+plan+show", median(floor_plans)))
        print(row("gateway propose", median(gateway_plans), median(floor_plans)))
        print(row("bare terraform apply PLANFILE", floor_apply))
        print(row("gateway apply (and merge)", gateway_apply, floor_apply))
        fresh.close()
        phase("setup")
        if ledger:
            ledger.print(runs)
        if profiler:
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(r"gateway", 25)
            stats.sort_stats("tottime").print_stats(25)  # waits on Terraform show here as the builtin waits

        big = root / "big"
        big.mkdir()
        (big / "main.tf").write_text(nulls(2000, "1"))
        subprocess.run([str(setup.binary), "init", "-input=false"], cwd=big, env=env, check=True, capture_output=True)
        subprocess.run([str(setup.binary), "plan", "-input=false", "-out=big.tfplan"], cwd=big, env=env, check=True,
                       capture_output=True)
        plan_json = big / "big.json"
        show = timed(lambda: plan_json.write_bytes(subprocess.run(
            [str(setup.binary), "show", "-json", "big.tfplan"], cwd=big, env=env, check=True,
            capture_output=True).stdout))
        preview = timed(lambda: subprocess.run([sys.executable, "-m", "gateway.cli", "preview", str(plan_json)],
                                               check=True, capture_output=True))
        print(f"2,000 creates: terraform show -json {show.wall:.2f} s ({show.cpu:.2f} s CPU); gateway preview (whole "
              f"CLI process) {preview.wall:.2f} s ({preview.cpu:.2f} s CPU); ratio {preview.wall / show.wall:.2f}")
        ws.close()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
