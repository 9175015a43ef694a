"""A GitHub review to the approval recorded: signed `pull_request_review` deliveries at a steady rate, one worker loop.

The real app served by uvicorn on loopback, GitHub's fake (tests/github_fake.py: real HTTP, real git) in a thread,
one `Worker` with one loop at the CLI's default poll (0.5 s), N open pull requests. Each approving review is posted
as a signed delivery at `--rate` per second; its latency is from the POST to the decision's row in the store.

Prints p50/p95, the CPU of this process (and of its git children) per review, the GitHub API calls per review by
endpoint, split by the job that made them (a webhook job is what the approval waits for; publish jobs update the
sticky comment and checks after it), the git commands against GitHub per review, `os.getloadavg()`, and the floor
measured in the same run: one webhook POST refused at the signature check (the HTTP round trip and the app).

It is not a test. Usage: python benchmarks/github_review_latency.py [--pulls 20] [--rate 10] [--postgres URL]
[--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import hmac
import json
import logging
import os
import pstats
import re
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch_db import scratch_database  # noqa: E402  (a sibling: this script's directory is on the path)

from gateway import worker as worker_module  # noqa: E402
from gateway.adapters.forges import github as github_forge  # noqa: E402
from gateway.adapters.store.schema import decisions  # noqa: E402
from gateway.api.app import create_app  # noqa: E402
from gateway.composition import create_workspace, open_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.admin.bootstrap import bootstrap_simulator  # noqa: E402
from gateway.services.forge.github import link_account  # noqa: E402
from tests.conftest import add_people  # noqa: E402
from tests.github_fake import FakeGitHub  # noqa: E402
from tests.round_trips import RoundTrips  # noqa: E402
from tests.test_github import make_github_the_forge  # noqa: E402

SECRET = "benchmark-secret"


def signed(event: str, payload: dict, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    return body, {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()), "Content-Type": "application/json",
                  "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint(method: str, path: str) -> str:
    return f"{method} " + re.sub(r"/\d+(?=/|$)", "/{n}", re.sub(r"/[0-9a-f]{40}(?=/|$)", "/{sha}", path))


class Attribution:
    """Which job kind each GitHub request and git command came from (one worker loop: one job at a time)."""

    def __init__(self, gh: FakeGitHub, profile: cProfile.Profile | None = None):
        self.gh = gh
        self.profile = profile
        self.api: dict[str, Counter[str]] = {}
        self.git: dict[str, Counter[str]] = {}
        self.jobs: Counter[str] = Counter()
        self.run_seconds: dict[str, list[float]] = {}
        self.waited_seconds: dict[str, list[float]] = {}
        self.kind = "outside a job"
        self.counting = False
        original_git = github_forge.GitHubForge._git

        def counted_git(forge: Any, *args: str) -> None:
            if self.counting:
                self.git.setdefault(self.kind, Counter())[f"git {args[0]}"] += 1
            original_git(forge, *args)

        github_forge.GitHubForge._git = counted_git  # type: ignore[method-assign]

    def wrap(self, handlers: dict) -> dict:
        def wrapped(kind: Any, handler: Any) -> Any:
            def run(ws: Any, job: Any, runner: str, progress: Any) -> Any:
                before, self.kind = len(self.gh.request_log), kind.value
                profiled = self.profile is not None and self.counting and kind.value == "webhook"
                if profiled:
                    self.profile.enable()
                began = time.perf_counter()
                if self.counting and job.created_at is not None:
                    created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=UTC)
                    self.waited_seconds.setdefault(kind.value, []).append(
                        (datetime.now(UTC) - created).total_seconds())
                try:
                    return handler(ws, job, runner, progress)
                finally:
                    if profiled:
                        self.profile.disable()
                    if self.counting:
                        self.jobs[kind.value] += 1
                        self.run_seconds.setdefault(kind.value, []).append(time.perf_counter() - began)
                        for r in self.gh.request_log[before:]:
                            self.api.setdefault(kind.value, Counter())[endpoint(r.method, r.path)] += 1
                    self.kind = "outside a job"
            return run
        return {kind: wrapped(kind, handler) for kind, handler in handlers.items()}


def run(pulls: int, rate: float, root: Path, database_url: str | None, profile: bool = False) -> None:
    with FakeGitHub(root / "github") as gh:
        settings = Settings(home=root / "home", database_url=database_url, github_token="ghp_bench",
                            github_webhook_secret=SECRET, github_write_interval_seconds=0,
                            public_url="http://gateway.test")
        ws = create_workspace(settings)
        bootstrap_simulator(ws)
        people = add_people(ws)
        make_github_the_forge(ws, gh, root / "clone")
        for name in ("alice", "carol"):
            link_account(ws, people.admin, name, name, gh.add_user(name))
        gh.add_team("platform-team", ["carol"])
        attribution = Attribution(gh, cProfile.Profile() if profile else None)
        worker_ws = open_workspace(settings)
        worker_ws = replace(worker_ws, job_handlers=attribution.wrap(worker_ws.job_handlers))
        worker = worker_module.Worker(worker_ws, loops=1).start()  # `gateway worker`'s defaults: one loop, 0.5 s poll

        port = free_port()
        app = create_app(settings, workers=0)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        # the app's and the worker's round trips to PostgreSQL (the benchmark's own polling is not counted)
        trips = [RoundTrips(w.store.db.engine) for w in (app.state.workspace, worker_ws)] if database_url else []
        url = f"http://127.0.0.1:{port}/api/v1/github/webhook"
        client = httpx.Client(timeout=30)

        numbers = []
        for i in range(pulls):
            branch = f"feature/q{i}"
            gh.push_commit(branch, {f"stacks/app-staging/q{i}.tf": f'resource "aws_sqs_queue" "q{i}" {{\n'
                                    f'  name = "q{i}"\n  tags = {{ owner = "a", "cost-centre" = "b" }}\n}}\n'},
                           f"queue {i}", author_login="alice")
            number = gh.open_pull(branch, f"Queue {i}", "", "alice")
            body, headers = signed("pull_request", gh.pull_request_event(number, "opened", sender="alice"))
            client.post(url, content=body, headers=headers).raise_for_status()
            numbers.append(number)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # every proposal open and its pull request published: a quiet queue
            with ws.store.session(readonly=True) as session:
                pids = {session.github.proposal_for_pull_request(gh.full_name, n): n for n in numbers}
                quiet = None not in pids and not any(d.count for d in ws.store.queue.depth())
                if quiet and all((session.github.pull_request_of(p) or {}).get("comment_id") for p in pids):
                    break
            time.sleep(0.2)
        time.sleep(2 * worker_module.HOUSEKEEPING_SECONDS)

        # the floor: a delivery refused at the signature check (HTTP round trip, the app, the HMAC)
        refused = []
        for _ in range(50):
            body, headers = signed("pull_request_review", {"zen": "x"}, secret="wrong")
            started = time.perf_counter()
            assert client.post(url, content=body, headers=headers).status_code == 401
            refused.append(time.perf_counter() - started)

        reviews = {pid: signed("pull_request_review", gh.review_event(gh.add_review(number, "carol", "APPROVED")))
                   for pid, number in pids.items()}
        sent: dict[int, float] = {}
        attribution.counting = True
        for counter in trips:
            counter.messages()
        cpu0, children0, load0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()
        started = time.perf_counter()
        for i, (pid, (body, headers)) in enumerate(reviews.items()):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent[pid] = datetime.now(UTC).timestamp()
            client.post(url, content=body, headers=headers).raise_for_status()
        latencies: dict[int, float] = {}
        deadline = time.monotonic() + 600
        while len(latencies) < len(sent) and time.monotonic() < deadline:
            with ws.store.db.transaction(readonly=True) as conn:
                for row in conn.execute(select(decisions.c.proposal_id, decisions.c.created_at)):
                    if row.proposal_id in sent and row.proposal_id not in latencies:
                        at = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
                        latencies[row.proposal_id] = at.timestamp() - sent[row.proposal_id]
            time.sleep(0.02)
        cpu = time.process_time() - cpu0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        time.sleep(3 * worker_module.HOUSEKEEPING_SECONDS)  # the publish jobs that follow the approvals
        attribution.counting = False
        sent_trips = [m for counter in trips for m in counter.messages()]
        server.should_exit = True
        thread.join()
        worker.stop()
        ws.close()
        worker_ws.close()

    values = sorted(latencies.values())
    n = len(values)
    p95 = values[max(0, int(round(0.95 * n)) - 1)] if values else float("nan")
    print(f"database {'postgresql' if database_url else 'sqlite'}; {pulls} reviews at {rate:g}/s, one worker loop "
          f"(poll 0.5 s); load {load0[0]:.2f} {load0[1]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"delivery -> approval recorded for {n}/{len(sent)}: p50 {statistics.median(values) * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms, max {values[-1] * 1000:.0f} ms")
    print(f"floor: a webhook POST refused at the signature check: p50 {statistics.median(refused) * 1000:.1f} ms")
    if sent_trips:
        begins = sum(m.startswith('Query  "BEGIN') for m in sent_trips)
        print(f"PostgreSQL per review (app and worker, the publish jobs and idle polls included): "
              f"{len(sent_trips) / len(sent):.1f} round trips, {begins / len(sent):.1f} transactions")
    print(f"CPU per review: {cpu / len(sent) * 1000:.0f} ms in this process (app, worker, fake GitHub), "
          f"{child_cpu / len(sent) * 1000:.0f} ms in git children")
    for kind in sorted(set(attribution.api) | set(attribution.git) | set(attribution.jobs)):
        jobs = attribution.jobs.get(kind, 0)
        api, git_calls = attribution.api.get(kind, Counter()), attribution.git.get(kind, Counter())
        print(f"{kind} jobs: {jobs} ({jobs / len(sent):.2f} per review); per review: "
              f"{sum(api.values()) / len(sent):.2f} GitHub API calls, {sum(git_calls.values()) / len(sent):.2f} git "
              f"commands against GitHub")
        if attribution.run_seconds.get(kind):
            print(f"    run p50 {statistics.median(attribution.run_seconds[kind]) * 1000:.0f} ms, "
                  f"queued before it ran p50 {statistics.median(attribution.waited_seconds[kind]) * 1000:.0f} ms, "
                  f"max {max(attribution.waited_seconds[kind]) * 1000:.0f} ms")
        for name, count in sorted((api + git_calls).items(), key=lambda kv: -kv[1]):
            print(f"    {count / len(sent):5.2f}  {name}")
    if attribution.profile is not None:
        print("webhook jobs, cProfile (cumulative):")
        pstats.Stats(attribution.profile).sort_stats("cumulative").print_stats(r"gateway/", 45)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pulls", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="reviews per second")
    parser.add_argument("--postgres", default=None, metavar="URL",
                        help="a PostgreSQL server (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres) to make "
                             "a scratch database on (default: SQLite)")
    parser.add_argument("--profile", action="store_true", help="cProfile the webhook jobs")
    args = parser.parse_args()
    configure_logging("error")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="gw-bench-review-") as tmp, scratch_database(args.postgres, "review") as url:
        run(args.pulls, args.rate, Path(tmp), url, args.profile)


if __name__ == "__main__":
    main()
