"""GETs of a proposal through the real API process: latency and throughput at 1, 8 and 32 clients.

Opens a proposal that creates N resources (default 2,000) on the embedded default (SQLite), starts
`gateway serve --workers 0` (one API process, no job loops), and has C client threads GET
/api/v1/proposals/ID for a few seconds each. Prints requests/s, p50 and p95, and how many rows the
reads wrote (should be 0). It is not a test.

Usage: python benchmarks/reads.py [N] [DATABASE_URL]
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import git
import httpx
from sqlalchemy import func, select

from gateway.adapters.git_repo import committer_env
from gateway.adapters.sql_store import audit_events, plans
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import open_proposal

SECONDS_PER_LEVEL = 5.0


def queues(count: int) -> str:
    return "".join(f'resource "aws_sqs_queue" "bench{i}" {{\n  name = "bench-{i}"\n  tags = local.tags\n}}\n'
                   for i in range(count))


def main() -> None:
    configure_logging("warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        url = sys.argv[2] if len(sys.argv) > 2 else None
        ws = create_workspace(Settings(home=home, database_url=url))
        bootstrap_simulator(ws)
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}), PrincipalKind.PERSON)
        _, token = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}),
                                 PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), Path(tmp) / "clone")
        clone.git.checkout("-q", "-b", "big")
        Path(clone.working_dir, "stacks/app-staging/bench.tf").write_text(queues(count))
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", "many queues"], env=committer_env())
        clone.git.push("-q", "origin", "big")
        started = time.perf_counter()
        proposal = open_proposal(ws, alice, "big", "many queues")
        print(f"proposal of {count} creates planned in {time.perf_counter() - started:.1f} s")

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_HOME": str(home)}
        if url:
            env["GATEWAY_DATABASE_URL"] = url
        server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers", "0"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/api/v1/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
            before = rows(ws)
            for clients in (1, 8, 32):
                measure(f"{base}/api/v1/proposals/{proposal.id}", token, clients)
            print(f"rows written by the reads: {rows(ws) - before}")
        finally:
            server.terminate()
            server.wait(30)
            ws.close()


def rows(ws) -> int:  # type: ignore[no-untyped-def]
    with ws.store.db.transaction() as conn:
        return int(conn.scalar(select(func.count()).select_from(audit_events)) or 0) + \
            int(conn.scalar(select(func.count()).select_from(plans)) or 0)


def measure(url: str, token: str, clients: int) -> None:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + SECONDS_PER_LEVEL

    def client() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                response = http.get(url)
                elapsed = time.perf_counter() - t0
                assert response.status_code == 200, response.text[:200]
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20)
    print(f"{clients:3} client(s): {len(latencies) / wall:7.1f} GET/s, p50 {statistics.median(latencies) * 1000:7.1f} ms, "
          f"p95 {q[-1] * 1000:7.1f} ms ({len(latencies)} requests)")


if __name__ == "__main__":
    main()
