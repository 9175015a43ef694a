"""Signed GitHub webhook deliveries through the real app on loopback, with 1 and 2 worker loops.

Prints, per worker count:
- deliveries accepted per second: signed `pull_request_review` deliveries (comment-only reviews, which
  the worker records and ignores) posted by 4 client threads to the app served by uvicorn over HTTP;
- p50/p95 from sending an approving review's delivery to the approval being recorded, for 20 open pull
  requests at once (each approval fetches main and the branch from GitHub, re-checks team membership
  with GitHub and binds to the plan; the worker also publishes comments and statuses meanwhile).

GitHub is the tests' fake (real HTTP, real git). It is not a test.

Usage: python benchmarks/github_webhooks.py
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import worker as worker_module  # noqa: E402
from gateway.adapters.store.schema import decisions  # noqa: E402
from gateway.api.app import create_app  # noqa: E402
from gateway.composition import create_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.admin.bootstrap import bootstrap_simulator  # noqa: E402
from gateway.services.forge.github import link_account  # noqa: E402
from tests.conftest import add_people  # noqa: E402
from tests.github_fake import FakeGitHub  # noqa: E402
from tests.test_github import make_github_the_forge  # noqa: E402

SECRET = "benchmark-secret"
PULLS, DELIVERIES, CLIENTS = 20, 400, 4


def signed(event: str, payload: dict) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    return body, {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()), "Content-Type": "application/json",
                  "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(workers: int, root: Path) -> None:
    with FakeGitHub(root / "github") as gh:
        settings = Settings(home=root / "home", github_token="ghp_bench", github_webhook_secret=SECRET,
                            github_write_interval_seconds=0, public_url="http://gateway.test")
        ws = create_workspace(settings)
        bootstrap_simulator(ws)
        people = add_people(ws)
        make_github_the_forge(ws, gh, root / "clone")
        for name in ("alice", "carol"):
            link_account(ws, people.admin, name, name, gh.add_user(name))
        gh.add_team("platform-team", ["carol"])

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings, workers=workers), host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/api/v1/github/webhook"
        client = httpx.Client(timeout=30)

        numbers = []
        for i in range(PULLS):
            branch = f"feature/q{i}"
            gh.push_commit(branch, {f"stacks/app-staging/q{i}.tf": f'resource "aws_sqs_queue" "q{i}" {{\n'
                                    f'  name = "q{i}"\n  tags = {{ owner = "a", "cost-centre" = "b" }}\n}}\n'},
                           f"queue {i}", author_login="alice")
            number = gh.open_pull(branch, f"Queue {i}", "", "alice")
            body, headers = signed("pull_request", gh.pull_request_event(number, "opened", sender="alice"))
            client.post(url, content=body, headers=headers).raise_for_status()
            numbers.append(number)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with ws.store.session(readonly=True) as session:
                if all(session.github.proposal_for_pull_request(gh.full_name, n) for n in numbers):
                    break
            time.sleep(0.2)

        # 1. deliveries accepted per second
        review = gh.add_review(numbers[0], "carol", "COMMENTED", body="a comment")
        deliveries = [signed("pull_request_review", gh.review_event(review)) for _ in range(DELIVERIES)]
        started = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(lambda d: client.post(url, content=d[0], headers=d[1]).status_code, deliveries))
        accepted = time.perf_counter() - started
        assert set(statuses) == {202}, set(statuses)

        # 2. delivery -> recorded approval, 20 at once
        sent: dict[int, float] = {}
        with ws.store.session(readonly=True) as session:
            pids = {session.github.proposal_for_pull_request(gh.full_name, n): n for n in numbers}
        for pid, number in pids.items():
            body, headers = signed("pull_request_review", gh.review_event(gh.add_review(number, "carol", "APPROVED")))
            sent[pid] = datetime.now(UTC).timestamp()
            client.post(url, content=body, headers=headers).raise_for_status()
        latencies: dict[int, float] = {}
        deadline = time.monotonic() + 600
        while len(latencies) < len(pids) and time.monotonic() < deadline:
            with ws.store.db.transaction(readonly=True) as conn:
                for row in conn.execute(select(decisions.c.proposal_id, decisions.c.created_at)):
                    if row.proposal_id in sent and row.proposal_id not in latencies:
                        at = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
                        latencies[row.proposal_id] = at.timestamp() - sent[row.proposal_id]
            time.sleep(0.05)
        server.should_exit = True
        thread.join()
        ws.close()
    values = sorted(latencies.values())
    p95 = values[max(0, int(round(0.95 * len(values))) - 1)] if values else float("nan")
    print(f"{workers} worker loop(s): {DELIVERIES / accepted:7.1f} deliveries/s accepted; delivery -> recorded "
          f"approval for {len(values)}/{PULLS}: p50 {statistics.median(values):.2f} s, p95 {p95:.2f} s")


def main() -> None:
    configure_logging("error")
    worker_module.HOUSEKEEPING_SECONDS = 0.5
    for workers in (1, 2):
        with tempfile.TemporaryDirectory(prefix="gw-bench-github-") as tmp:
            run(workers, Path(tmp))


if __name__ == "__main__":
    main()
