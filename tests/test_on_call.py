"""On call for a day: a real Prometheus scraping a real API and a real worker on PostgreSQL, with the shipped rules.

Debian's `prometheus` scrapes `gateway serve` and `gateway worker --metrics-port` every second and evaluates
deploy/prometheus/alerts.yml (its `for` durations cut to a second; promtool's unit tests hold the real ones). What is
asserted is what the person on call sees through Prometheus' HTTP API: an apply `gateway apply` ran and failed in its
own process raises the failure count and fires GatewayApplyFailed; a worker SIGKILLed mid-apply fires
GatewayNoWorker; the next worker settles the apply as interrupted as it starts, and that is counted and alerted too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.day_two.simulator import inject_delay
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace, run_cli

ROOT = Path(__file__).resolve().parents[1]
# short intervals so the day fits in a minute: a worker beats every 0.5 s (dead after 1.5 s), and a job or lock not
# heart-beaten for 3 s is recovered
SETTINGS = {"GATEWAY_WORKER_BEAT_SECONDS": "0.5", "GATEWAY_LOCK_TTL_SECONDS": "3"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.2)
    return result


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    found = "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing: CI must run the on-call test (apt-get install prometheus)")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    return found


class Processes:
    """The processes a test starts, each logging to a file of its own; killed at the end if still running."""

    def __init__(self, directory: Path, env: dict[str, str]):
        self.directory, self.env = directory, env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        process = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(process)
        return process

    def gateway(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, "-m", "gateway.cli", *args])

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


class Prometheus:
    """Prometheus' HTTP API, as the person on call reads it."""

    def __init__(self, url: str):
        self.url = url

    def value(self, query: str) -> float | None:
        """The query's one value now (None: no series)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=5)
        answer.raise_for_status()
        result = answer.json()["data"]["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def firing(self, alert: str, **labels: str) -> bool:
        alerts = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return any(a["labels"]["alertname"] == alert and a["state"] == "firing"
                   and all(a["labels"].get(k) == v for k, v in labels.items()) for a in alerts)

    def ready(self) -> bool:
        """Prometheus answers 503 "Service Unavailable" until its storage is open."""
        return httpx.get(f"{self.url}/-/ready", timeout=5).status_code == 200

    def targets_up(self) -> int:
        return int(self.value("sum(up)") or 0)


def _rules_in_seconds(directory: Path) -> Path:
    """The shipped rules, every `for` cut to one second."""
    rules = re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    path = directory / "alerts.yml"
    path.write_text(rules)
    return path


def _prometheus_config(directory: Path, targets: list[int]) -> Path:
    rules = _rules_in_seconds(directory)
    listed = ", ".join(f'"127.0.0.1:{port}"' for port in targets)
    config = directory / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: gateway
    static_configs:
      - targets: [{listed}]
""")
    return config


@pytest.fixture
def day(tmp_path: Path, postgres_url: str, prometheus_binary: str) -> Iterator[dict[str, Any]]:
    """A workspace on PostgreSQL with its people, `gateway serve` (no job loops), one `gateway worker`, and Prometheus
    scraping both with the rules loaded."""
    ws = make_workspace(tmp_path / "home", postgres_url)
    people = add_people(ws)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_DATABASE_URL": postgres_url, **SETTINGS})
    processes = Processes(tmp_path, env)
    api_port, worker_port, prometheus_port = _free_port(), _free_port(), _free_port()
    processes.gateway("api", "serve", "--port", str(api_port), "--workers", "0")
    processes.gateway("worker-1", "worker", "--loops", "1", "--poll", "0.2", "--metrics-port", str(worker_port),
                      "--metrics-host", "127.0.0.1")
    config = _prometheus_config(tmp_path, [api_port, worker_port])
    processes.start("prometheus", [prometheus_binary, f"--config.file={config}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"])
    prometheus = Prometheus(f"http://127.0.0.1:{prometheus_port}")
    try:
        _until("Prometheus to scrape the API and the worker", lambda: _answers(prometheus) == 2, timeout=90)
        yield {"ws": ws, "people": people, "processes": processes, "prometheus": prometheus,
               "worker_port": worker_port, "home": ws.settings.home, "database_url": postgres_url}
    finally:
        processes.stop_all()
        ws.close()
        for name in ("api", "worker-1", "worker-2", "prometheus"):  # shown when the test fails
            if (tmp_path / f"{name}.log").exists():
                print(f"--- {name}\n{processes.log(name)}")


def _answers(prometheus: Prometheus) -> int:
    try:
        return prometheus.targets_up() if prometheus.ready() else 0
    except httpx.HTTPError:
        return 0


def _approved(ws: Workspace, people: People, clone: Clone, branch: str, path: str, old: str, new: str) -> int:
    clone.branch(branch).edit(path, old, new).push(branch)
    proposal = open_proposal(ws, people.alice, branch, f"change {branch}")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    return proposal.id


def test_what_the_person_on_call_sees_through_prometheus(day: dict[str, Any], tmp_path: Path) -> None:
    ws, people, processes, prometheus = day["ws"], day["people"], day["processes"], day["prometheus"]
    started = time.monotonic()
    clone = Clone(ws, tmp_path / "clone")
    failing = _approved(ws, people, clone, "staging", "stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"')
    failed = 'max(gateway_jobs_finished_total{kind="apply", outcome="failed"})'
    _until("the failure count at 0, from the start", lambda: prometheus.value(failed) == 0)
    assert prometheus.value("max(gateway_workers_alive)") == 1

    ws.simulator.inject_fault("app-staging", "aws_instance.web[0]", "InsufficientInstanceCapacity")
    applied = run_cli(["apply", str(failing)], day["home"], token=people.tokens["alice"],
                      database_url=day["database_url"], **SETTINGS)
    assert applied.returncode != 0 and "InsufficientInstanceCapacity" in applied.stdout + applied.stderr
    _until("the failure count to rise", lambda: prometheus.value(failed) == 1, timeout=20)
    _until("GatewayApplyFailed to fire", lambda: prometheus.firing("GatewayApplyFailed", outcome="failed"),
           timeout=20)
    assert not prometheus.firing("GatewayNoWorker")

    slow = _approved(ws, people, clone, "prod", "stacks/app-prod/main.tf", '"t3.large"', '"t3.medium"')
    inject_delay(ws, people.admin, "app-prod", "aws_instance.web[0]", 60)  # a provider slower than the test
    job = enqueue_job(ws, people.alice, JobKind.APPLY, slow)
    _until("the worker to be applying", lambda: any("applying stack" in line
                                                    for line in ws.store.queue.get(job.id).progress))
    processes.started[1].send_signal(signal.SIGKILL)  # the worker dies mid-apply
    processes.started[1].wait(10)
    _until("GatewayNoWorker to fire", lambda: prometheus.firing("GatewayNoWorker"), timeout=20)
    assert prometheus.value("max(gateway_workers_alive)") == 0  # the API reports it, from the database

    processes.gateway("worker-2", "worker", "--loops", "1", "--poll", "0.2", "--metrics-port",
                      str(day["worker_port"]), "--metrics-host", "127.0.0.1")
    _until("the new worker to settle the apply", lambda: ws.store.queue.get(job.id).status == JobStatus.INTERRUPTED,
           timeout=30)
    interrupted = 'max(gateway_jobs_finished_total{kind="apply", outcome="interrupted"})'
    _until("the interrupted apply to be counted", lambda: prometheus.value(interrupted) == 1, timeout=20)
    _until("GatewayApplyFailed to fire for it", lambda: prometheus.firing("GatewayApplyFailed", outcome="interrupted"),
           timeout=20)
    _until("GatewayNoWorker to resolve", lambda: not prometheus.firing("GatewayNoWorker"), timeout=20)
    assert prometheus.value(failed) == 1  # counted once, however many targets report it
    print(f"\nthe day took {time.monotonic() - started:.1f} s after the processes were up")
