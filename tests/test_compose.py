"""compose.yaml: valid by the Compose specification, and its services' exact commands work together.

No container runtime runs here, so each service's `command` is started as a local process with its
`environment` (the database host pointed at the local PostgreSQL), and a change to an `engine: terraform`
stack (the real Terraform `make terraform` installs, as the image does) is driven through the API to an
applied, merged commit by two workers, healthy by their own health checks, scraped on their metrics ports,
and stopped with SIGTERM within the stop grace period.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
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
from prometheus_client.parser import text_string_to_metric_families

from .conftest import TERRAFORM, run_cli

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
            source = volume.split(":")[0]
            assert source.startswith("./") or source in compose["volumes"], f"{name} mounts an undeclared volume"
    assert "healthcheck" in services["api"] and "healthcheck" in services["postgres"]


def test_compose_file_has_no_insecure_default_and_an_apply_finishes_inside_the_stop_grace(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "name" not in compose  # Debian's docker-compose 1.29 refuses a top-level name
    text = (ROOT / "compose.yaml").read_text()
    assert ":-gateway" not in text and "${POSTGRES_PASSWORD:?" in text  # no default password: an error without one
    for name in ("postgres", "api", "worker"):
        assert services[name]["restart"] == "unless-stopped"
    for name in ("api", "worker"):
        assert "keys:/keys:ro" in services[name]["volumes"]  # only init writes the keys
    assert "keys:/keys" in services["init"]["volumes"] and compose["volumes"].keys() >= {"keys", "workspace"}
    api = services["api"]["environment"]
    assert api["GATEWAY_TLS_CERT_FILE"] and api["GATEWAY_TLS_KEY_FILE"] and api["GATEWAY_SECURE_COOKIES"] == "true"
    assert "https://" in " ".join(services["api"]["healthcheck"]["test"])
    command = services["worker"]["command"]
    timeout = float(services["worker"]["environment"]["GATEWAY_TERRAFORM_TIMEOUT_SECONDS"])
    grace = float(command[command.index("--grace") + 1])
    assert timeout < grace < _seconds(services["worker"]["stop_grace_period"])
    assert services["worker"]["command"][:2] == ["gateway", "worker"]
    assert {"--metrics-port", "--ready-file"} <= set(services["worker"]["command"])
    assert "/api/v1/ready" in " ".join(services["api"]["healthcheck"]["test"])
    assert "build" in services["api"] and (ROOT / "Dockerfile").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local(service: dict[str, Any], home: Path, database_url: str,
           replace: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """A service's exact command and environment, pointed at this machine instead of the compose network (its
    ports and files renamed by `replace`, so two workers can run side by side)."""
    command = [_replaced(str(part), replace) for part in service["command"]]
    assert command[0] == "gateway"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    for key, value in service.get("environment", {}).items():
        environment[key] = _replaced(_interpolated(str(value)), replace)
    assert environment["GATEWAY_DATABASE_URL"].startswith("postgresql+psycopg://postgres:")
    environment.update({"GATEWAY_HOME": str(home), "GATEWAY_DATABASE_URL": database_url})
    return [sys.executable, "-m", "gateway.cli", *command[1:]], environment


def self_signed(folder: Path) -> Path:
    """cert.pem and key.pem for 127.0.0.1 and localhost in `folder`, as compose.yaml's ./tls holds them."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).add_extension(names, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    (folder / "key.pem").chmod(0o600)
    return folder


def _interpolated(text: str) -> str:
    """Compose's `${VAR:-default}` and `${VAR:?error}` as `up` reads them, POSTGRES_PASSWORD set."""
    variables = {"POSTGRES_PASSWORD": "not-used-here"}

    def value(match: re.Match[str]) -> str:
        name, kind, rest = match.group(1), match.group(2), match.group(3)
        if name in variables:
            return variables[name]
        assert kind != ":?", f"compose refuses to start without {name}: {rest}"
        return rest

    return re.sub(r"\$\{(\w+)(:-|:\?)([^}]*)\}", value, text)


def _replaced(text: str, replace: dict[str, str]) -> str:
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def _seconds(duration: str) -> float:
    """A Compose duration such as `10m` or `1m30s`."""
    units = {"h": 3600, "m": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration)))


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
    for process in started:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_services_commands_apply_a_terraform_change_with_two_workers(
        compose: dict[str, Any], tmp_path: Path, postgres_url: str,
        processes: list[subprocess.Popen[bytes]]) -> None:
    if not (TERRAFORM / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform`")
    services, home, port = compose["services"], tmp_path / "workspace", _free_port()
    metrics_ports = [_free_port(), _free_port()]
    keys, tls = tmp_path / "keys", self_signed(tmp_path / "tls")
    files = {"/keys": str(keys), "/tls/": f"{tls}/"}  # the volumes' mount points, here

    command, env = _local(services["init"], home, postgres_url, {"8080": str(port), **files})
    created = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, created.stderr
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already" in again.stdout  # the init service may run on every `up`
    main_yaml = subprocess.run(["git", "-C", str(home / "declarations.git"), "show", "main:gateway.yaml"],
                               capture_output=True, text=True, check=True).stdout
    assert "engine: terraform" in main_yaml  # the workers run `engine: terraform` stacks

    tokens = {}
    for name, role, group in (("admin", "admin", None), ("alice", "requester", "app"), ("bob", "approver", "platform")):
        args = ["users", "add", name, "--role", role] + (["--group", group] if group else [])
        added = run_cli(args, home, tokens.get("admin"), database_url=postgres_url, GATEWAY_KEYS_DIR=str(keys))
        assert added.returncode == 0, added.stderr
        tokens[name] = next(w for w in added.stdout.split() if w.startswith("gw_"))

    command, env = _local(services["api"], home, postgres_url, {"8080": str(port), **files})
    processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                      stderr=(tmp_path / "api.log").open("w")))
    workers, ready_files = [], []
    for index, metrics_port in enumerate(metrics_ports):  # `--scale worker=2`
        ready = tmp_path / f"worker-{index}.ready"
        renamed = {"9100": str(metrics_port), "/tmp/gateway-worker.ready": str(ready), **files}
        command, env = _local(services["worker"], home, postgres_url, renamed)
        log = (tmp_path / f"worker-{index}.log").open("w")
        workers.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log))
        ready_files.append((ready, renamed))
    processes.extend(workers)
    base = f"https://127.0.0.1:{port}"  # the API answers HTTPS only
    api_check = [_replaced(str(p), {"8080": str(port)}) for p in services["api"]["healthcheck"]["test"][1:]]
    worker_check = services["worker"]["healthcheck"]["test"]
    assert worker_check[0] == "CMD-SHELL"
    deadline = time.monotonic() + 90
    while (subprocess.run(api_check, capture_output=True).returncode != 0  # the services' own health checks
           or any(subprocess.run(["sh", "-c", _replaced(worker_check[1], renamed)]).returncode != 0
                  for _, renamed in ready_files)):
        assert time.monotonic() < deadline, "the services did not become healthy"
        assert all(p.poll() is None for p in processes), "a service exited: " + "\n".join(
            log.read_text()[-2000:] for log in tmp_path.glob("*.log"))
        time.sleep(0.3)

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(home / "declarations.git"), str(clone)], check=True)
    main_tf = clone / "stacks/scratch/main.tf"
    main_tf.write_text(main_tf.read_text().replace('release = "1"', 'release = "2"'))
    git = ["git", "-C", str(clone), "-c", "user.name=alice", "-c", "user.email=a@example.com"]
    subprocess.run([*git, "checkout", "-qb", "release-2"], check=True)
    subprocess.run([*git, "commit", "-qam", "release 2"], check=True)
    subprocess.run([*git, "push", "-q", "origin", "release-2"], check=True)
    proposed = run_cli(["propose", "--branch", "release-2", "-m", "release 2"], home, tokens["alice"],
                       database_url=postgres_url, timeout=300, GATEWAY_KEYS_DIR=str(keys))
    assert proposed.returncode == 0, proposed.stderr
    assert "null_resource.marker" in proposed.stdout  # planned by the real Terraform

    trusted = ssl.create_default_context(cafile=tls / "cert.pem")
    with httpx.Client(base_url=base, timeout=30, verify=trusted) as client:
        bob, alice = ({"Authorization": f"Bearer {tokens[n]}"} for n in ("bob", "alice"))
        assert client.post("/api/v1/proposals/1/approve", json={"comment": "ok"}, headers=bob).status_code == 200
        queued = client.post("/api/v1/proposals/1/apply", headers=alice)
        assert queued.status_code == 202
        deadline = time.monotonic() + 300
        while not (job := client.get(f"/api/v1/jobs/{queued.json()['id']}", headers=alice).json())["finished"]:
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        assert job["status"] == "succeeded", job
        assert job["runner"] and "/" in job["runner"]  # run by a worker process's loop, not by the API
        shown = client.get("/api/v1/proposals/1", headers=bob).json()
        api_metrics = client.get("/metrics").text
    assert shown["status"] == "applied" and shown["merge_sha"] == job["result"]["merge_sha"]
    main_text = subprocess.run(["git", "-C", str(home / "declarations.git"), "show", "main:stacks/scratch/main.tf"],
                               capture_output=True, text=True, check=True).stdout
    assert 'release = "2"' in main_text
    assert "gateway_jobs" in api_metrics
    applied = [_scrape(p).get(("gateway_jobs_finished_total", (("kind", "apply"), ("outcome", "succeeded"))), 0)
               for p in metrics_ports]
    assert applied == [1, 1]  # one worker ran it; counted in the database, every worker's metrics port says so
    ran = sum(_scrape(p).get(("gateway_job_duration_seconds_count", (("kind", "apply"),)), 0) for p in metrics_ports)
    assert ran == 1  # its run time, by the one that ran it

    grace = _seconds(services["worker"]["stop_grace_period"])
    for worker in workers:  # `docker compose stop`: SIGTERM, then the grace period
        worker.send_signal(signal.SIGTERM)
    for worker, (ready, _) in zip(workers, ready_files, strict=True):
        assert worker.wait(grace) == 0
        assert not ready.exists()
