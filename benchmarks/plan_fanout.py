"""A module change that 100 sandbox stacks call: wall time to a complete preview with 1, 2 and 4 worker processes.

Builds a declaration repo of 100 stacks that each call one local module, opens a proposal that changes the module
(planned here, once, as setup), then for each worker count starts that many `gateway worker` processes (one loop
each), pushes a new commit to the branch, queues the proposal's plan job and times it until the round of 100
`plan_stack` jobs has written the proposal's plans. Each figure is printed beside its floors: the 1-worker time / N,
and one stack's plan time (measured here) × 100 / N. The goal on 2 cores: ≤ 0.6 × the 1-worker time at 2 workers.
It is not a test.

Usage: python benchmarks/plan_fanout.py [POSTGRES_ADMIN_URL | sqlite]
       (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import git
from scratch_db import scratch_database  # a sibling: this script's directory is on the path
from sqlalchemy import select

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.rows import aware
from gateway.adapters.store.schema import jobs
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.jobs import JobKind
from gateway.domain.plan_rounds import RoundState
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.users import add_principal
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.planning import plan_stack
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

STACKS = 100
WORKER_COUNTS = (1, 2, 4)
MODULE = """variable "name" {{ type = string }}
variable "env" {{ type = string }}
locals {{ tags = {{ owner = "platform", env = var.env, release = "{release}" }} }}
resource "aws_sqs_queue" "events" {{
  count = 40
  name  = "${{var.name}}-events-${{count.index}}"
  tags  = merge(local.tags, {{ shard = tostring(count.index) }})
}}
resource "aws_sqs_queue" "dead_letters" {{
  count = 40
  name  = "${{var.name}}-dead-letters-${{count.index}}"
  tags  = local.tags
}}
resource "aws_s3_bucket" "archive" {{
  count  = 20
  bucket = "${{var.name}}-archive-${{count.index}}"
  tags   = local.tags
}}
output "queues" {{ value = aws_sqs_queue.events[*].name }}
"""  # 100 resources a stack: a plan the size of a service's


def declarations(directory: Path) -> Path:
    stacks = "\n".join(f"  s{i:03}:\n    path: stacks/s{i:03}\n    approvers: [platform]" for i in range(STACKS))
    (directory / "gateway.yaml").write_text(f"engine: sandbox\napprovals:\n  required: 1\nstacks:\n{stacks}\n"
                                            "policy:\n  required_tags: []\n")
    (directory / "modules" / "service").mkdir(parents=True)
    (directory / "modules" / "service" / "main.tf").write_text(MODULE.format(release="r0"))
    for i in range(STACKS):
        stack = directory / "stacks" / f"s{i:03}"
        stack.mkdir(parents=True)
        stack.joinpath("main.tf").write_text(
            f'module "service" {{\n  source = "../../modules/service"\n  name   = "svc-{i:03}"\n'
            f'  env    = "prod"\n}}\n')
    return directory


def push_release(clone: git.Repo, release: str) -> str:
    Path(clone.working_dir, "modules/service/main.tf").write_text(MODULE.format(release=release))
    clone.git.add("-A")
    clone.git.execute(["git", "commit", "-qm", f"module release {release}"], env=committer_env())
    clone.git.push("-q", "--force", "origin", "module-release")
    return clone.head.commit.hexsha


def one_stack_seconds(ws: Workspace, head: str) -> float:
    """The median time of one stack's plan in this process (the floor's unit)."""
    merged = ws.repo.merge_preview(ws.repo.resolve(ws.main_branch()), head)
    times = []
    for i in range(7):
        started = time.perf_counter()
        plan_stack(ws, f"s{i:03}", merged)
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:])


def time_round(ws: Workspace, env: dict[str, str], workers: int, pid: int, clone: git.Repo, alice) -> float:  # type: ignore[no-untyped-def]
    ready = [Path(env["GATEWAY_HOME"]) / f"ready-{workers}-{n}" for n in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.05",
                               "--ready-file", str(path)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for path in ready]
    try:
        while not all(path.exists() for path in ready):
            time.sleep(0.1)
        push_release(clone, f"r{workers}")
        started = time.monotonic()
        job = enqueue_job(ws, alice, JobKind.PLAN, pid)
        while True:
            with ws.store.session(readonly=True) as session:
                current = session.plan_rounds.latest(pid)
            if current is not None and current.finished and ws.store.queue.get(job.id).finished:
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        assert current.state == RoundState.ASSEMBLED, current.reasons()
        print("   ", phases(ws, current))
        return elapsed
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)


def phases(ws: Workspace, current) -> str:  # type: ignore[no-untyped-def]
    """Where a round's time went: queued to its first stack's start, the stacks, the plans written by the last job
    (the round ends when it starts writing them), and how many stacks each worker planned."""
    with ws.store.db.transaction(readonly=True) as conn:
        rows = conn.execute(select(jobs.c.runner, jobs.c.started_at, jobs.c.finished_at).where(
            jobs.c.id.in_([s.job_id for s in current.stacks]))).all()
    created, ended = current.created_at, current.finished_at
    started, finished = [aware(r.started_at) for r in rows], [aware(r.finished_at) for r in rows]  # SQLite: naive
    first, last = min(started), max(finished)
    busy = sum((f - s).total_seconds() for s, f in zip(started, finished, strict=True))
    by = sorted(Counter(r.runner.split("/")[0] for r in rows).values(), reverse=True)
    return (f"round queued → first stack {(first - created).total_seconds():.2f} s, first stack → last job's end "
            f"{(last - first).total_seconds():.2f} s ({busy / len(rows) * 1000:.0f} ms a job), of which the last job "
            f"writing the 100 plans {(last - ended).total_seconds():.2f} s; stacks per worker {by}")


def main(admin_url: str | None) -> None:
    configure_logging("WARNING")
    with scratch_database(admin_url, "fanout") as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        with tempfile.TemporaryDirectory() as content:
            ws = create_workspace(Settings(home=home, database_url=url, lock_wait_seconds=600),
                                  declarations(Path(content)))
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}),
                                 PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), home / "clone")
        clone.git.checkout("-q", "-B", "module-release", "origin/main")
        head = push_release(clone, "r-setup")
        started = time.monotonic()
        pid = open_proposal(ws, alice, "module-release", "a release of the service module").id
        print(f"setup: proposal {pid} opened, {STACKS} stacks planned in this process in "
              f"{time.monotonic() - started:.1f} s")
        unit = one_stack_seconds(ws, head)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
               "GATEWAY_HOME": str(ws.settings.home), "GATEWAY_LOCK_WAIT_SECONDS": "600"}
        if url:
            env["GATEWAY_DATABASE_URL"] = url
        print(f"one stack's plan here: {unit * 1000:.0f} ms (×{STACKS} = {unit * STACKS:.1f} s); "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other work shares the machine)")
        single = None
        for workers in WORKER_COUNTS:
            elapsed = time_round(ws, env, workers, pid, clone, alice)
            single = single or elapsed
            print(f"{workers} worker(s): {STACKS} stacks planned, preview complete in {elapsed:6.1f} s "
                  f"(floor: 1-worker / {workers} = {single / workers:5.1f} s, one plan × {STACKS} / {workers} = "
                  f"{unit * STACKS / workers:5.1f} s; {elapsed / single:.2f} × the 1-worker time; "
                  f"load average {os.getloadavg()[0]:.1f})")
        ws.close()


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    main(None if arg == "sqlite" else arg)
