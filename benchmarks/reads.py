"""Reads of a proposal through the real API process: the JSON document and the review page's first screen.

Opens a small proposal (one queue) and a big one (N queues, default 2,000) on the embedded default (SQLite),
starts `gateway serve --workers 0` (one API process, no job loops) with a `git` on its PATH that counts every
git process it starts, and has C client threads GET each target for a few seconds. Prints, per target and
client count: requests/s, p50 and p95, the server's CPU per read and git processes per read; beside them the
floor measured in the same run (a 404 from the same app: routing, middleware and HTTP, no work) and the
machine's load. Then how many rows the reads wrote (must be 0: reads never write). It is not a test.

With a PostgreSQL URL (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres) it runs on a database of its own
on that server, dropped afterwards.

Usage: python benchmarks/reads.py [N] [POSTGRES_ADMIN_URL]
"""

from __future__ import annotations

import os
import shutil
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

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.schema import audit_events, plans
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import open_proposal

SECONDS_PER_LEVEL = 3.0
CLIENTS = (1, 8)
TICKS = os.sysconf("SC_CLK_TCK")


def queues(count: int) -> str:
    return "".join(f'resource "aws_sqs_queue" "bench{i}" {{\n  name = "bench-{i}"\n  tags = local.tags\n}}\n'
                   for i in range(count))


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    configure_logging("warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    from scratch_db import scratch_database  # a sibling, imported when run as a script (reads_ab.py imports this)

    with scratch_database(sys.argv[2] if len(sys.argv) > 2 else None, "reads") as url:
        run(count, url)


def run(count: int, url: str | None) -> None:
    print(f"reads of a proposal on {'PostgreSQL' if url else 'SQLite'}; {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        ws = create_workspace(Settings(home=home, database_url=url))
        bootstrap_simulator(ws)
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}), PrincipalKind.PERSON)
        _, token = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}),
                                 PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), Path(tmp) / "clone")
        ids = {}
        for branch, n in (("small", 1), ("big", count)):
            clone.git.checkout("-q", "-B", branch, "origin/main")
            Path(clone.working_dir, "stacks/app-staging/bench.tf").write_text(queues(n))
            clone.git.add("-A")
            clone.git.execute(["git", "commit", "-qm", f"{n} queues"], env=committer_env())
            clone.git.push("-q", "origin", branch)
            started = time.perf_counter()
            ids[branch] = open_proposal(ws, alice, branch, f"{n} queues").id
            print(f"proposal of {n} creates planned in {time.perf_counter() - started:.1f} s")

        counter = Path(tmp) / "git-spawns"
        shim = Path(tmp) / "bin"
        shim.mkdir()
        real_git = shutil.which("git") or "/usr/bin/git"
        (shim / "git").write_text(f'#!/bin/sh\necho >> "{counter}"\nexec "{real_git}" "$@"\n')
        (shim / "git").chmod(0o755)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_HOME": str(home),
               "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"}
        if url:
            env["GATEWAY_DATABASE_URL"] = url
        server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers", "0"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(base)
            cookies = sign_in(base, token)
            before = rows(ws)
            targets = [("floor: a 404 of the same app", f"{base}/api/v1/no-such-route", {}, 404),
                       ("GET /api/v1/proposals/{id}, 1 resource", f"{base}/api/v1/proposals/{ids['small']}", {}, 200),
                       (f"GET /api/v1/proposals/{{id}}, {count} resources", f"{base}/api/v1/proposals/{ids['big']}",
                        {}, 200),
                       (f"review page, first screen, {count} resources", f"{base}/proposals/{ids['big']}", cookies,
                        200)]
            for label, target, jar, status in targets:
                page = httpx.get(target, headers={"Authorization": f"Bearer {token}"}, cookies=jar)
                print(f"{label}: {len(page.content) / 1024:.0f} KB")
                for clients in CLIENTS:
                    measure(label, target, token, jar, status, clients, server.pid, counter)
            print(f"rows written by the reads: {rows(ws) - before}; {load()}")
        finally:
            server.terminate()
            server.wait(30)
            ws.close()


def wait_until_up(base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/api/v1/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.2)


def sign_in(base: str, token: str) -> httpx.Cookies:
    with httpx.Client(base_url=base) as http:
        form = http.get("/login").text
        csrf = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        http.post("/login", data={"token": token, "csrf": csrf})
        return http.cookies


def rows(ws) -> int:  # type: ignore[no-untyped-def]
    with ws.store.db.transaction() as conn:
        return int(conn.scalar(select(func.count()).select_from(audit_events)) or 0) + \
            int(conn.scalar(select(func.count()).select_from(plans)) or 0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def spawned(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def measure(label: str, url: str, token: str, cookies: httpx.Cookies | dict[str, str], status: int, clients: int,
            pid: int, counter: Path) -> None:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + SECONDS_PER_LEVEL

    def client() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, cookies=cookies, timeout=60) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                response = http.get(url)
                elapsed = time.perf_counter() - t0
                assert response.status_code == status, response.text[:200]
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    cpu, gits, t0 = cpu_seconds(pid), spawned(counter), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n = len(latencies)
    q = statistics.quantiles(latencies, n=20) if n > 1 else latencies * 19
    print(f"  {clients:2} client(s): {n / wall:7.1f} GET/s, p50 {statistics.median(latencies) * 1000:7.1f} ms, "
          f"p95 {q[-1] * 1000:7.1f} ms, server CPU {(cpu_seconds(pid) - cpu) / n * 1000:6.2f} ms/read, "
          f"git processes {(spawned(counter) - gits) / n:.2f}/read ({n} requests; {load()})")


if __name__ == "__main__":
    main()
