"""Drift at scale on the simulator: a stack of N resources (default 1,000) on main, D of them (default 100) edited
behind the gateway's back.

Prints the time of one drift check of the stack (a full refresh and plan of main) with and without drift, of a
worker's scheduled pass when no check is due (what housekeeping pays every 2 s), and of reading an open proposal's
previews with the open drift record put in front, against the same read without drift. It is not a test.

Usage: python benchmarks/drift.py [N] [D] [DATABASE_URL]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import git

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.adapters.git.repo import committer_env  # noqa: E402
from gateway.composition import create_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.domain.principals import Role  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.admin.bootstrap import bootstrap_simulator  # noqa: E402
from gateway.services.admin.users import add_principal  # noqa: E402
from gateway.services.change.proposals import open_proposal, stored_previews  # noqa: E402
from gateway.services.day_two.drift_records import check_drift, check_scheduled_drift  # noqa: E402


def queues(count: int) -> str:
    return "".join(f'resource "aws_sqs_queue" "bench{i}" {{\n  name = "bench-{i}"\n  tags = local.tags\n}}\n'
                   for i in range(count))


def timed(label: str, action: Callable[[], object], runs: int) -> None:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    p95 = sorted(samples)[max(0, int(len(samples) * 0.95) - 1)]
    print(f"{label:58} p50 {statistics.median(samples):9.1f} ms   p95 {p95:9.1f} ms   ({runs} runs)")


def push(clone: git.Repo, message: str, branch: str) -> None:
    clone.git.add("-A")
    clone.git.execute(["git", "commit", "-q", "-m", message], env=committer_env("admin"))
    clone.git.push("-q", "origin", branch)


def main() -> None:
    configure_logging("warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    drifted = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    url = sys.argv[3] if len(sys.argv) > 3 else None
    with tempfile.TemporaryDirectory() as tmp:
        ws = create_workspace(Settings(home=Path(tmp) / "home", database_url=url))
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}))
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}))
        clone = git.Repo.clone_from(str(ws.settings.repo_path), Path(tmp) / "clone")
        Path(clone.working_dir, "stacks/app-staging/bench.tf").write_text(queues(count))
        yaml = Path(clone.working_dir, "gateway.yaml")
        yaml.write_text(yaml.read_text().replace("    path: stacks/app-staging\n",
                                                 "    path: stacks/app-staging\n    drift: {interval: 6h}\n"))
        push(clone, f"{count} queues", "main")
        bootstrap_simulator(ws)
        print(f"stack app-staging: {count} queues plus the sample's resources; {drifted} queues drift; "
              f"database {ws.store.db.engine.dialect.name}")

        timed("drift check, no drift", lambda: check_drift(ws, admin, "app-staging"), 5)
        check_scheduled_drift(ws)
        timed("scheduled pass, nothing due (every stack)", lambda: check_scheduled_drift(ws), 50)

        clone.git.checkout("-q", "-b", "change")
        main_tf = Path(clone.working_dir, "stacks/app-staging/main.tf")
        main_tf.write_text(main_tf.read_text().replace('"cc-3003"', '"cc-3004"'))
        push(clone, "new cost centre", "change")
        proposal = open_proposal(ws, alice, "change", "new cost centre")
        timed("read an open proposal's previews, no open drift", lambda: stored_previews(ws, proposal), 20)

        for i in range(drifted):
            ws.simulator.edit_object("app-staging", f"aws_sqs_queue.bench{i}", {"tags": {"owner": "console"}})
        timed(f"drift check, {drifted} resources drifted", lambda: check_drift(ws, admin, "app-staging"), 5)
        timed(f"read the same previews, open drift of {drifted} in front", lambda: stored_previews(ws, proposal), 20)
        ws.close()


if __name__ == "__main__":
    main()
