"""How the long-running processes start and live beside their database, as an orchestrator runs them.

The real `gateway serve` and `gateway worker` in subprocesses, on PostgreSQL reached through a TCP gate the test
opens and cuts (tests/tcp_gate.py): they start with the database down and say so (readiness 503 naming it, one log
line per backoff step), recover when it comes back, and a worker that loses it later backs off instead of logging
a traceback per poll. Also: a failing API process makes `serve --processes N` exit non-zero; an unwritable
workspace is refused naming the path and the uid; every log line is JSON, one per request with the route's
template and the principal, never the query string.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.services.admin.bootstrap import bootstrap_simulator

from .conftest import run_cli
from .tcp_gate import TcpGate
from .test_compose import _free_port


def _environment(home: Path, database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_DATABASE_URL": database_url, "GATEWAY_LOG_LEVEL": "info", **extra})
    return env


def _gated(url: str, gate: TcpGate) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{gate.port}").geturl()


@pytest.fixture
def gate(postgres_url: str) -> Iterator[TcpGate]:
    parts = urlsplit(postgres_url)
    opened = TcpGate((parts.hostname or "127.0.0.1", parts.port or 5432))
    yield opened
    opened.close()


@pytest.fixture
def home(tmp_path: Path, postgres_url: str) -> Path:
    ws = create_workspace(Settings(home=tmp_path / "home", database_url=postgres_url))
    bootstrap_simulator(ws)
    ws.close()
    return tmp_path / "home"


class Process:
    """A gateway command in a subprocess, its stderr (the log) read as JSON lines."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.popen = subprocess.Popen([sys.executable, "-m", "gateway.cli", *args], env=env,
                                      stdout=subprocess.DEVNULL, stderr=log.open("wb"))

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
        return self.popen.wait(60)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    made: list[Process] = []

    def start(args: list[str], env: dict[str, str], name: str = "process") -> Process:
        made.append(Process(args, env, tmp_path / f"{name}-{len(made)}.log"))
        return made[-1]

    yield start
    for process in made:
        process.stop()


def _eventually(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what}")


def _readiness(port: int) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/v1/ready", timeout=5)
    except httpx.TransportError:
        return None


@pytest.mark.postgres
def test_the_api_starts_with_the_database_down_says_so_and_recovers_when_it_comes_back(
        home: Path, postgres_url: str, gate: TcpGate, started: Callable[..., Process]) -> None:
    port = _free_port()
    api = started(["serve", "--port", str(port), "--workers", "0"], _environment(home, _gated(postgres_url, gate)),
                  "api")
    answer = _eventually(lambda: _readiness(port), 60, "the API answers while its database is down")
    assert answer.status_code == 503
    assert answer.json()["failed"][0] == "database" and "does not answer" in answer.json()["checks"]["database"]
    assert httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5).status_code == 200  # alive, not ready

    time.sleep(3)  # a few backoff steps
    gate.open()
    _eventually(lambda: (r := _readiness(port)) is not None and r.status_code == 200, 60, "ready once it is back")

    ready = _eventually(lambda: api.events("database.ready"), 60, "the API brings the database up")
    assert len(ready) == 1 and ready[0]["schema_version"] >= 21
    waits = api.events("database.waiting")
    assert 2 <= len(waits) <= 8, waits  # one line per backoff step, not one per poll
    assert [w["attempt"] for w in waits] == list(range(1, len(waits) + 1))
    assert all(0 < w["retry_in_seconds"] <= 30 for w in waits)
    start = api.events("gateway.started")[0]
    assert start["process"] == "api" and start["database"] == "postgresql" and start["version"]
    assert "postgres@" not in api.log.read_text()  # the database URL is never logged
    assert "Traceback" not in api.log.read_text()


@pytest.mark.postgres
def test_a_worker_that_loses_its_database_backs_off_says_so_once_a_step_and_carries_on(
        home: Path, postgres_url: str, gate: TcpGate, started: Callable[..., Process], tmp_path: Path) -> None:
    ready_file = tmp_path / "worker.ready"
    worker = started(["worker", "--loops", "2", "--poll", "0.2", "--ready-file", str(ready_file)],
                     _environment(home, _gated(postgres_url, gate)), "worker")
    time.sleep(2)
    assert worker.popen.poll() is None, "the worker exited with its database down"
    assert not ready_file.exists()
    gate.open()
    _eventually(ready_file.exists, 30, "the worker is ready once its database answers")

    cut_at = len(worker.lines())
    gate.cut()
    _eventually(lambda: not ready_file.exists(), 30, "the ready file goes with the database")
    time.sleep(6)
    during = worker.lines()[cut_at:]
    gate.open()
    _eventually(ready_file.exists, 60, "ready again once it is back")
    # a loop tries again when its backoff step ends (30 s at most), so it says so within that, and a loaded machine
    _eventually(lambda: worker.events("loop.recovered"), 90,
                "the loops say they are back:\n" + worker.log.read_text()[-3000:])

    complaints = [line for line in during if line["level"] in ("warning", "error")]
    # two loops, housekeeping and readiness, ~7 s: each backs off from its poll doubling, so a handful of lines
    # each (polling at 0.2 s with a line each would be well over a hundred)
    assert 0 < len(complaints) <= 30, complaints
    assert not [line for line in during if line["level"] == "error"], "a database outage is not an error of ours"
    assert "Traceback" not in worker.log.read_text()
    assert worker.stop() == 0


def test_serve_with_several_processes_exits_non_zero_when_one_cannot_start(
        workspace: Any, started: Callable[..., Process]) -> None:
    home = workspace.settings.home
    # a sign-in provider half configured: every API process refuses to start, saying why
    env = _environment(home, workspace.settings.db_url, GATEWAY_OIDC_ISSUER="https://id.example.com")
    api = started(["serve", "--port", str(_free_port()), "--workers", "0", "--processes", "2"], env, "api")
    code = api.popen.wait(120)
    assert code == 3, api.log.read_text()
    failed = api.events("serve.failed")
    assert failed and failed[0]["processes"]
    assert "GATEWAY_OIDC_CLIENT_ID" in api.log.read_text()


def test_an_unwritable_workspace_is_refused_naming_the_path_and_the_user(workspace: Any, tmp_path: Path) -> None:
    home = workspace.settings.home.resolve()
    env = _environment(home, workspace.settings.db_url)
    for args in (["worker"], ["serve", "--port", str(_free_port())], ["propose", "--branch", "x", "-m", "why"]):
        command = [sys.executable, "-m", "gateway.cli", *args]
        if os.getuid() == 0:  # root may write any folder: the workspace is mounted read-only instead
            command = ["unshare", "--mount", "sh", "-c", f'mount --bind -o ro "{home}" "{home}" && exec "$@"', "-",
                       *command]
            expected = "it is on a read-only filesystem"
        else:
            home.chmod(0o500)
            expected = f"the folder belongs to uid {os.getuid()}, mode 500"
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        finally:
            home.chmod(0o755)
        assert result.returncode != 0
        assert f"the workspace {home} is not writable by this process (uid {os.getuid()}" in result.stderr, \
            result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr


def test_each_request_is_one_json_line_with_its_route_principal_and_id_never_its_query(
        workspace: Any, people: Any, started: Callable[..., Process]) -> None:
    port = _free_port()
    api = started(["serve", "--port", str(port), "--workers", "0"],
                  _environment(workspace.settings.home, workspace.settings.db_url), "api")
    _eventually(lambda: (r := _readiness(port)) is not None and r.status_code == 200, 60, "the API is ready")
    token = people.tokens["bob"]
    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/audit/events?text=hunter2-not-logged",
                       headers={"Authorization": f"Bearer {token}", "X-Request-ID": "req-from-the-proxy-1"})
    assert answer.headers["x-request-id"] == "req-from-the-proxy-1"
    missing = httpx.get(f"http://127.0.0.1:{port}/api/v1/proposals/999", headers={"Authorization": f"Bearer {token}"})
    assert missing.status_code == 404 and len(missing.headers["x-request-id"]) >= 8
    api.stop()

    requests = api.events("http.request")
    by_id = {line["request_id"]: line for line in requests}
    line = by_id["req-from-the-proxy-1"]
    assert line["route"] == "/api/v1/audit/events" and line["method"] == "GET"
    assert line["principal"] == people.bob.id and isinstance(line["duration_ms"], float)
    assert by_id[missing.headers["x-request-id"]]["route"] == "/api/v1/proposals/{proposal_id}"
    assert by_id[missing.headers["x-request-id"]]["status"] == 404
    text = api.log.read_text()
    assert "hunter2" not in text and token not in text
    assert all(line.get("logger", "gateway") for line in api.lines())  # every line parsed as JSON above
    assert any(line.get("logger") == "uvicorn.error" for line in api.lines())  # libraries' lines too, as JSON


def test_init_makes_every_key_in_the_keys_folder_apart_from_the_workspace(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    created = run_cli(["init"], tmp_path / "home", GATEWAY_KEYS_DIR=str(keys))
    assert created.returncode == 0, created.stderr
    assert sorted(p.name for p in keys.iterdir()) == ["audit-signing.key", "data.key", "session.key"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in keys.iterdir())
    assert not list((tmp_path / "home").glob("*.key"))
