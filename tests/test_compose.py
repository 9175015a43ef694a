"""compose.yaml: valid by the Compose specification, and its services' exact commands work together.

No container runtime runs here, so each service's `command` is started as a local process with its
`environment` (the database host pointed at the local PostgreSQL), and a change is driven through
the API to an applied, merged commit by two workers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from compose_pydantic import ComposeSpecification

from .conftest import run_cli

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_file_is_valid_by_the_specification(compose: dict[str, Any]) -> None:
    # the spec's schema as pydantic models, unknown keys forbidden; top-level `x-*` extension fields are
    # allowed by the spec (its `^x-` pattern) but not modelled by the package, so they are set aside
    ComposeSpecification.model_validate({k: v for k, v in compose.items() if not k.startswith("x-")})
    services = compose["services"]
    assert {"postgres", "api", "worker", "init"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in compose["volumes"], f"{name} mounts an undeclared volume"
    assert "healthcheck" in services["api"] and "healthcheck" in services["postgres"]
    assert services["worker"]["command"][:2] == ["gateway", "worker"]
    assert "build" in services["api"] and (ROOT / "Dockerfile").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local(service: dict[str, Any], home: Path, database_url: str, port: int) -> tuple[list[str], dict[str, str]]:
    """A service's exact command and environment, pointed at this machine instead of the compose network."""
    command = [str(part).replace("8080", str(port)) for part in service["command"]]
    assert command[0] == "gateway"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    for key, value in service.get("environment", {}).items():
        environment[key] = str(value)
    assert environment["GATEWAY_DATABASE_URL"].startswith("postgresql+psycopg://postgres:")
    environment.update({"GATEWAY_HOME": str(home), "GATEWAY_DATABASE_URL": database_url})
    return [sys.executable, "-m", "gateway.cli", *command[1:]], environment


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_services_commands_apply_a_change_with_two_workers(compose: dict[str, Any], tmp_path: Path,
                                                               postgres_url: str,
                                                               processes: list[subprocess.Popen[bytes]]) -> None:
    services, home, port = compose["services"], tmp_path / "workspace", _free_port()

    command, env = _local(services["init"], home, postgres_url, port)
    assert subprocess.run(command, env=env, capture_output=True, timeout=120).returncode == 0
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already" in again.stdout  # the init service may run on every `up`

    tokens = {}
    for name, role, group in (("admin", "admin", None), ("alice", "requester", "app"), ("bob", "approver", "platform")):
        args = ["users", "add", name, "--role", role] + (["--group", group] if group else [])
        added = run_cli(args, home, tokens.get("admin"), database_url=postgres_url)
        assert added.returncode == 0, added.stderr
        tokens[name] = next(w for w in added.stdout.split() if w.startswith("gw_"))

    for name in ("api", "worker", "worker"):  # `--scale worker=2`
        command, env = _local(services[name], home, postgres_url, port)
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    base = f"http://127.0.0.1:{port}"
    health = [str(p).replace("8080", str(port)) for p in services["api"]["healthcheck"]["test"][1:]]
    deadline = time.monotonic() + 60
    while subprocess.run(health, capture_output=True).returncode != 0:  # the service's own health check
        assert time.monotonic() < deadline, "the API did not become healthy"
        assert all(p.poll() is None for p in processes), "a service exited"
        time.sleep(0.3)

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(home / "declarations.git"), str(clone)], check=True)
    main_tf = clone / "stacks/app-staging/main.tf"
    main_tf.write_text(main_tf.read_text().replace('"t3.small"', '"t3.medium"'))
    git = ["git", "-C", str(clone), "-c", "user.name=alice", "-c", "user.email=a@example.com"]
    subprocess.run([*git, "checkout", "-qb", "bigger"], check=True)
    subprocess.run([*git, "commit", "-qam", "more memory"], check=True)
    subprocess.run([*git, "push", "-q", "origin", "bigger"], check=True)
    proposed = run_cli(["propose", "--branch", "bigger", "-m", "more memory"], home, tokens["alice"],
                       database_url=postgres_url)
    assert proposed.returncode == 0, proposed.stderr

    with httpx.Client(base_url=base, timeout=30) as client:
        bob, alice = ({"Authorization": f"Bearer {tokens[n]}"} for n in ("bob", "alice"))
        assert client.post("/api/v1/proposals/1/approve", json={"comment": "ok"}, headers=bob).status_code == 200
        queued = client.post("/api/v1/proposals/1/apply", headers=alice)
        assert queued.status_code == 202
        deadline = time.monotonic() + 120
        while not (job := client.get(f"/api/v1/jobs/{queued.json()['id']}", headers=alice).json())["finished"]:
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "succeeded", job
        assert job["runner"] and "/" in job["runner"]  # run by a worker process's loop, not by the API
        shown = client.get("/api/v1/proposals/1", headers=bob).json()
    assert shown["status"] == "applied" and shown["merge_sha"] == job["result"]["merge_sha"]
    main_text = subprocess.run(["git", "-C", str(home / "declarations.git"), "show", "main:stacks/app-staging/main.tf"],
                               capture_output=True, text=True, check=True).stdout
    assert '"t3.medium"' in main_text
