"""The README's deployment, run for real: the image built from the Dockerfile, compose.yaml brought up.

The commands between README's `<!-- deploy -->` markers are run as written, in a scratch folder holding compose.yaml
(Compose as installed here: Debian's docker-compose for `docker compose`; root needs no sudo), with one override
(tests/docker/compose.test.yaml): the test machines allow the host's network only, so every service shares it on
ports the test picks, and the API's published port goes (Docker refuses one with host networking). Then a change
walks propose -> approve -> apply, run by the worker container with the image's own Terraform; the stack restarts
and nothing is lost (the trail verifies); the worker is stopped mid-apply and the apply finishes inside the grace.
Everything is torn down at the end, volumes included.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .docker_images import build_image, compose_command, docker_client
from .test_compose import _free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("image")  # one test process builds it and runs them all
SIM_DELAY_SECONDS = 8  # each object the sample's test provider writes, in the worker: a long apply


def readme_deployment() -> list[str]:
    """The README's deployment commands, continuation lines joined."""
    block = re.search(r"<!-- deploy -->\n```sh\n(.*?)```\n<!-- /deploy -->", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md lost its deployment block"
    return [line.split("  # ")[0].strip() for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


class Stack:
    """compose.yaml in a scratch folder, with the test's override and ports."""

    def __init__(self, folder: Path, compose: list[str]):
        self.folder, self.compose = folder, compose
        self.api_port, self.metrics_port = _free_port(), _free_port()
        self.env = {**os.environ, "COMPOSE_PROJECT_NAME": f"gwtest{os.getpid()}",
                    "COMPOSE_FILE": f"{folder / 'compose.yaml'}:{ROOT / 'tests/docker/compose.test.yaml'}",
                    "GW_PG_PORT": str(_free_port()), "GW_API_PORT": str(self.api_port),
                    "GW_METRICS_PORT": str(self.metrics_port), "GW_SIM_DELAY_SECONDS": str(SIM_DELAY_SECONDS)}
        text = (ROOT / "compose.yaml").read_text()
        published = '    ports:\n      - "${GATEWAY_PORT:-8443}:8080"\n'
        assert published in text
        (folder / "compose.yaml").write_text(text.replace(published, ""))  # no published port on the host network

    def shell(self, line: str, timeout: float = 600) -> str:
        """One README line, as a person runs it here."""
        line = line.replace("docker compose", " ".join(self.compose)).replace("sudo ", "")
        line = line.replace(" exec ", " exec -T ")  # no terminal here
        line = line.replace("localhost:8443", f"localhost:{self.api_port}")
        done = subprocess.run(["bash", "-c", line], cwd=self.folder, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def run(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run([*self.compose, *args], cwd=self.folder, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def gateway(self, token: str | None, *args: str) -> str:
        env = ["-e", f"GATEWAY_TOKEN={token}"] if token else []
        return self.run("exec", "-T", *env, "api", "gateway", *args)

    def healthy(self, *services: str, within: float = 300) -> None:
        deadline = time.monotonic() + within
        while True:
            states = self.run("ps")
            if all(re.search(rf"_{name}_1 .*Up \(healthy\)", states) for name in services):
                return
            assert time.monotonic() < deadline, f"not healthy within {within} s:\n{states}\n{self.logs()}"
            time.sleep(2)

    def logs(self) -> str:
        return subprocess.run([*self.compose, "logs", "--no-color", "--tail", "60"], cwd=self.folder, env=self.env,
                              capture_output=True, text=True).stdout[-6000:]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    docker = docker_client()
    compose = compose_command()
    build_image(docker)
    made = Stack(tmp_path_factory.mktemp("deploy"), compose)
    try:
        yield made
    finally:
        subprocess.run([*compose, "down", "-v", "--remove-orphans", "-t", "30"], cwd=made.folder, env=made.env,
                       capture_output=True, timeout=300)
        shutil.rmtree(made.folder / "tls", ignore_errors=True)


def _client(stack: Stack, token: str) -> httpx.Client:
    trusted = ssl.create_default_context(cafile=stack.folder / "tls/cert.pem")
    return httpx.Client(base_url=f"https://localhost:{stack.api_port}", verify=trusted, timeout=60,
                        headers={"Authorization": f"Bearer {token}"})


def _finished(client: httpx.Client, job: dict[str, Any], within: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while not job["finished"]:
        assert time.monotonic() < deadline, job
        time.sleep(1)
        job = client.get(f"/api/v1/jobs/{job['id']}").json()
    return job


def _propose(stack: Stack, token: str, branch: str, path: str, old: str, new: str) -> None:
    """A person's change, pushed to the declaration repo in the workspace volume and proposed (no forge here)."""
    script = (f"set -e; rm -rf /tmp/{branch}; git clone -q /workspace/declarations.git /tmp/{branch}; cd /tmp/{branch};"
              f" git checkout -qb {branch}; sed -i 's/{old}/{new}/' {path}; git -c user.name=alice"
              f" -c user.email=alice@example.com commit -qam '{branch}'; git push -q origin {branch}")
    stack.run("exec", "-T", "api", "sh", "-c", script)
    stack.gateway(token, "propose", "--branch", branch, "-m", branch)


def test_the_readme_deployment_walks_a_change_survives_a_restart_and_lets_an_apply_finish(stack: Stack) -> None:
    stack.env["POSTGRES_PASSWORD"] = "deploy-test-" + os.urandom(8).hex()  # what the README's export sets
    for line in readme_deployment():
        if line == "docker compose build":  # built by the fixture, with the build secret Compose 1.29 cannot pass
            continue
        if line.startswith("export POSTGRES_PASSWORD="):
            continue
        if line.startswith("docker compose up"):
            stack.shell(line)
            stack.healthy("postgres", "api", "worker")
        elif "users add admin" in line:
            admin = next(word for word in stack.shell(line).split() if word.startswith("gw_"))
        elif line.startswith("curl"):
            assert '"status":"ready"' in stack.shell(line)
        else:
            stack.shell(line)

    tokens = {"admin": admin}
    for name, role, group in (("alice", "requester", "app"), ("bob", "approver", "platform"),
                              ("dana", "auditor", None)):
        out = stack.gateway(admin, "users", "add", name, "--role", role, *(["--group", group] if group else []))
        tokens[name] = next(word for word in out.split() if word.startswith("gw_"))

    # propose -> approve -> apply, run by the worker container with the image's Terraform
    _propose(stack, tokens["alice"], "release-2", "stacks/scratch/main.tf", 'release = "1"', 'release = "2"')
    with _client(stack, tokens["bob"]) as bob, _client(stack, tokens["alice"]) as alice:
        assert bob.post("/api/v1/proposals/1/approve", json={"comment": "ok"}).status_code == 200
        job = _finished(alice, alice.post("/api/v1/proposals/1/apply").json())
        assert job["status"] == "succeeded", job
        assert job["runner"].count("/") == 1  # a worker's loop ran it, not the API
        assert bob.get("/api/v1/proposals/1").json()["status"] == "applied"

    # a restart loses nothing: the proposal, its trail, the keys that verify it
    stack.run("restart", timeout=900)
    stack.healthy("postgres", "api", "worker")
    with _client(stack, tokens["dana"]) as dana:
        assert dana.get("/api/v1/proposals/1").json()["status"] == "applied"
        verified = dana.get("/api/v1/audit/verify").json()
        assert verified["intact"] and verified["events"] > 10, verified

    # `docker compose stop` mid-apply: the worker lets it finish and record its end inside the grace
    _propose(stack, tokens["alice"], "config-3", "stacks/files/main.tf", "replicas=2", "replicas=3")
    with _client(stack, tokens["bob"]) as bob, _client(stack, tokens["alice"]) as alice:
        proposal = alice.get("/api/v1/proposals").json()[0]["id"]
        assert bob.post(f"/api/v1/proposals/{proposal}/approve", json={"comment": "ok"}).status_code == 200
        job = alice.post(f"/api/v1/proposals/{proposal}/apply").json()
        deadline = time.monotonic() + 300
        while not any("applying stack" in line for line in alice.get(f"/api/v1/jobs/{job['id']}").json()["progress"]):
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.5)
        started = time.monotonic()
        stack.run("stop", "worker", timeout=700)  # SIGTERM, then Docker waits stop_grace_period (10m)
        stopped_after = time.monotonic() - started
        done = alice.get(f"/api/v1/jobs/{job['id']}").json()
        assert done["status"] == "succeeded", (done, stack.logs())
        assert alice.get(f"/api/v1/proposals/{proposal}").json()["status"] == "applied"
    assert SIM_DELAY_SECONDS / 2 < stopped_after < 540, stopped_after  # it waited for the apply, not for the kill
    worker_log = subprocess.run([*stack.compose, "logs", "--no-color", "worker"], cwd=stack.folder, env=stack.env,
                                capture_output=True, text=True).stdout
    assert "worker.stopping" in worker_log and "worker.stopped" in worker_log
    assert "Traceback" not in worker_log
