"""The Docker engine and the project's image, for the tests that run what ships as an image.

The image is built from the Dockerfile unchanged, on stand-ins of its base images made from Debian's packages
(tests/docker/standins.sh: no container registry is reachable from the test machines), with the host's CA bundle
as a build secret (a proxy that inspects TLS sits between these machines and the package registries). Two test
processes may want it at once: the build is under a file lock, and the second finds Docker's cache warm.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "change-gateway:latest"  # what compose.yaml names
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def docker_client() -> str:
    """The Docker CLI that goes with the engine: Debian's, whose built-in BuildKit takes build secrets without the
    buildx plugin; else whatever `docker` is on the path. Skips (fails in CI) when no engine answers."""
    client = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else shutil.which("docker") or "docker"
    try:
        answered = subprocess.run([client, "info"], capture_output=True, text=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    if not answered:
        if os.environ.get("CI"):
            pytest.fail("no Docker engine answers: .ci/run must install docker.io and start dockerd")
        pytest.skip("no Docker engine answers here (Debian's docker.io, dockerd started)")
    return client


def compose_command() -> list[str]:
    """Compose: Debian's docker-compose (1.29), else the CLI plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if os.environ.get("CI"):
        pytest.fail("no docker-compose: .ci/run must install Debian's docker-compose")
    pytest.skip("no docker-compose here")
    raise AssertionError("unreachable")


def build_image(docker: str) -> str:
    """The stand-ins, then the project's image from its Dockerfile; its name."""
    with (Path(tempfile.gettempdir()) / "gateway-test-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = subprocess.run(["sh", str(ROOT / "tests/docker/standins.sh"), docker], capture_output=True, text=True,
                              timeout=1800)
        assert made.returncode == 0, made.stdout + made.stderr
        secret = ["--secret", f"id=ca,src={CA_BUNDLE}"] if CA_BUNDLE.exists() else []
        built = subprocess.run([docker, "build", "--network", "host", *secret, "-t", IMAGE, str(ROOT)],
                               env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True,
                               timeout=1800)
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return IMAGE


def image_size(docker: str, image: str) -> int:
    return int(subprocess.run([docker, "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True,
                              check=True).stdout)
