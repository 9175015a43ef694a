"""Queues 200 approved proposals over 20 stacks at once and runs 1, 2 and 4 worker processes on PostgreSQL.

Prints, per worker count: jobs finished per second, p95 queue wait, how many applied and how many were
refused (on each stack the first apply moves the state, so the other nine re-plan, differ, and need new
approvals: the gateway's rule, not a failure), and whether any stack ever had two writers (apply
intervals on one stack that overlap). It is not a test.

Usage: python benchmarks/workers.py [POSTGRES_ADMIN_URL]   (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git
from scratch_db import scratch_database  # a sibling: this script's directory is on the path
from sqlalchemy import select

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.schema import applies, jobs
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.jobs import JobKind
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.workspace import Workspace

STACKS, PER_STACK = 20, 10


def declarations(directory: Path) -> Path:
    stacks = "\n".join(f"  s{i:02}:\n    path: stacks/s{i:02}\n    approvers: [platform]" for i in range(STACKS))
    (directory / "gateway.yaml").write_text(f"engine: sandbox\napprovals:\n  required: 1\nstacks:\n{stacks}\n"
                                            "policy:\n  required_tags: []\n")
    for i in range(STACKS):
        stack = directory / "stacks" / f"s{i:02}"
        stack.mkdir(parents=True)
        stack.joinpath("main.tf").write_text(
            f'resource "aws_sqs_queue" "base" {{\n  name = "base-{i}"\n}}\n')
    return directory


def prepare(home: Path, url: str) -> tuple[Workspace, list[int]]:
    with tempfile.TemporaryDirectory() as content:
        ws = create_workspace(Settings(home=home, database_url=url, lock_wait_seconds=600),
                              declarations(Path(content)))
    bootstrap_simulator(ws)
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
    alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}), PrincipalKind.PERSON)
    bob, _ = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}), PrincipalKind.PERSON)
    clone = git.Repo.clone_from(str(ws.settings.repo_path), home / "clone")
    ids = []
    for n in range(PER_STACK):
        for i in range(STACKS):
            branch = f"q{i:02}-{n}"
            clone.git.checkout("-q", "-B", branch, "origin/main")
            Path(clone.working_dir, f"stacks/s{i:02}/q{n}.tf").write_text(
                f'resource "aws_sqs_queue" "q{n}" {{\n  name = "q-{i}-{n}"\n}}\n')
            clone.git.add("-A")
            clone.git.execute(["git", "commit", "-qm", branch], env=committer_env())
            clone.git.push("-q", "origin", branch)
            proposal = open_proposal(ws, alice, branch, f"queue {n} on stack {i}")
            decide(ws, bob, proposal.id, Decision.APPROVE, "ok")
            ids.append(proposal.id)
    for pid in ids:
        enqueue_job(ws, alice, JobKind.APPLY, pid)
    return ws, ids


def run(workers: int, admin_url: str) -> None:
    with scratch_database(admin_url, "workers") as url, tempfile.TemporaryDirectory() as tmp:
        assert url is not None
        ws, ids = prepare(Path(tmp) / "home", url)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
               "GATEWAY_HOME": str(ws.settings.home), "GATEWAY_DATABASE_URL": url, "GATEWAY_LOCK_WAIT_SECONDS": "600"}
        started = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.05"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(workers)]
        try:
            while True:
                with ws.store.db.transaction() as conn:
                    rows = conn.execute(select(jobs.c.status, jobs.c.created_at, jobs.c.started_at)
                                        .where(jobs.c.kind == "apply")).all()
                if all(r.status not in ("queued", "running") for r in rows):
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
        waits = sorted((r.started_at - r.created_at).total_seconds() for r in rows)
        statuses = [r.status for r in rows]
        with ws.store.db.transaction() as conn:
            spans = conn.execute(select(applies.c.stack, applies.c.started_at, applies.c.finished_at)).all()
        overlaps = 0
        by_stack: dict[str, list] = {}
        for stack, start, end in spans:
            by_stack.setdefault(stack, []).append((start, end))
        for intervals in by_stack.values():
            intervals.sort()
            overlaps += sum(1 for a, b in zip(intervals, intervals[1:], strict=False) if b[0] < a[1])
        print(f"{workers} worker(s): {len(rows)} apply jobs in {elapsed:6.1f} s = {len(rows) / elapsed:5.1f} jobs/s; "
              f"p95 queue wait {statistics.quantiles(waits, n=20)[-1]:6.1f} s; "
              f"succeeded {statuses.count('succeeded')}, refused {statuses.count('refused')}, "
              f"failed {statuses.count('failed')}; stacks with two writers at once: {overlaps}")
        ws.close()


if __name__ == "__main__":
    configure_logging("warning")
    admin_url = sys.argv[1] if len(sys.argv) > 1 else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    print(f"{STACKS * PER_STACK} approved proposals over {STACKS} stacks, queued at once; PostgreSQL; sandbox engine")
    for count in (1, 2, 4):
        run(count, admin_url)
