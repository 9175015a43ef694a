"""Reads of a proposal by two versions of the code at once, for a machine other work shares.

One home (SQLite), a small and a 2,000-resource proposal, two API processes (`gateway serve --workers 0`) on it: A
runs the code at the first path, B at the second (e.g. the main checkout and a worktree). Each target and client
count is measured in rounds of one second, A then B, so both see the same load; per server it prints the median
(and least) CPU per read over the rounds and the p50/p95 of all their requests. CPU per read is the figure to
compare: latencies follow the machine. It is not a test.

Usage: python benchmarks/reads_ab.py PATH_A PATH_B [ROUNDS]
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

from benchmarks.reads import cpu_seconds, queues, wait_until_up
from gateway.adapters.git.repo import committer_env
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import open_proposal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def requests_for(url: str, token: str, clients: int, seconds: float) -> list[float]:
    """Latencies of `clients` threads reading `url` back to back for `seconds`."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                status = http.get(url).status_code
                elapsed = time.perf_counter() - t0
                assert status in (200, 404), status
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def make_home(tmp: Path) -> tuple[Path, str, dict[str, int]]:
    home = tmp / "home"
    ws = create_workspace(Settings(home=home))
    bootstrap_simulator(ws)
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
    alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}), PrincipalKind.PERSON)
    _, token = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}),
                             PrincipalKind.PERSON)
    clone = git.Repo.clone_from(str(ws.settings.repo_path), tmp / "clone")
    ids = {}
    for branch, n in (("small", 1), ("big", 2000)):
        clone.git.checkout("-q", "-B", branch, "origin/main")
        Path(clone.working_dir, "stacks/app-staging/bench.tf").write_text(queues(n))
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", f"{n} queues"], env=committer_env())
        clone.git.push("-q", "origin", branch)
        ids[branch] = open_proposal(ws, alice, branch, f"{n} queues").id
    ws.close()
    return home, token, ids


def main() -> None:
    configure_logging("warning")
    code = {"A": sys.argv[1], "B": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    with tempfile.TemporaryDirectory() as tmp:
        home, token, ids = make_home(Path(tmp))
        servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        for name, path in code.items():
            port = free_port()
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_HOME": str(home),
                   "PYTHONPATH": path}
            servers[name] = (subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
                                               "--workers", "0"], env=env, cwd=path, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}")
        try:
            targets = [("floor: a 404", "/api/v1/no-such-route"), ("1 resource", f"/api/v1/proposals/{ids['small']}"),
                       ("2000 resources", f"/api/v1/proposals/{ids['big']}")]
            for _, base in servers.values():
                wait_until_up(base)
                for _, path in targets:
                    requests_for(base + path, token, 1, 0.5)  # warm: caches, pools, imports
            for label, path in targets:
                for clients in (1, 8):
                    measure(servers, label, base_path=path, token=token, clients=clients, rounds=rounds)
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(30)


def measure(servers: dict[str, tuple[subprocess.Popen[bytes], str]], label: str, base_path: str, token: str,
            clients: int, rounds: int) -> None:
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, (process, base) in servers.items():
            before = cpu_seconds(process.pid)
            found = requests_for(base + base_path, token, clients, 1.0)
            cpu[name].append((cpu_seconds(process.pid) - before) / len(found) * 1000)
            latencies[name] += found
    for name in servers:
        q = statistics.quantiles(latencies[name], n=20)
        print(f"{label:15} {clients} client(s) {name}: CPU/read median {statistics.median(cpu[name]):.2f} ms "
              f"(least {min(cpu[name]):.2f}), p50 {statistics.median(latencies[name]) * 1000:.1f} ms, "
              f"p95 {q[-1] * 1000:.1f} ms ({len(latencies[name])} requests; load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
