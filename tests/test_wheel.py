"""The wheel, as a platform team installs it: built from this checkout, installed (not editable) into a new
virtualenv with the runtime lock, and run from anywhere but the checkout: the demo, the API with a page and its
readiness, and the MCP server's start-up. Nothing of the source tree is on the path: what the code reads at run time
(prompts, templates, the sample repos) must be in the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from .test_compose import _free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("wheel")  # one test process builds it and runs them all


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the runtime lock and the wheel built from this checkout; its bin folder."""
    scratch = tmp_path_factory.mktemp("wheel")
    source = _package_source(scratch / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(scratch / "dist"), str(source)], capture_output=True, text=True, timeout=300,
                           cwd=scratch)
    assert built.returncode == 0, built.stderr
    wheel = next((scratch / "dist").glob("change_gateway-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "agents/prompts/agent_system.md" in names and "gateway/api/templates/login.html" in names
    assert "gateway/evidence_verifier.py" in names and "gateway/api/templates/audit_report.html" in names  # handed out
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    for args in (["--require-hashes", "-r", str(ROOT / "requirements.lock")], ["--no-deps", str(wheel)]):
        done = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", *args],
                              capture_output=True, text=True, timeout=900, cwd=scratch)
        if done.returncode != 0 and not os.environ.get("CI") and "NewConnectionError" in done.stderr:
            pytest.skip("the package index cannot be reached here")
        assert done.returncode == 0, done.stderr
    return venv / "bin"


def _package_source(into: Path) -> Path:
    """What the wheel is built from, as the image's build context holds it: a copy, so the build leaves nothing in
    the checkout and finds nothing there (setuptools builds in the source's build/ folder, and a build killed
    half-way in a checkout made every later one fail with 'File exists: build/bdist…/…dist-info')."""
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        into.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, into / name)
    for package in ("gateway", "agents"):
        shutil.copytree(ROOT / package, into / package, ignore=ignored)
    return into


def _environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "PYTHON", "VIRTUAL_ENV", "PROMETHEUS_"))}
    return {**env, "GATEWAY_HOME": str(home), **extra}


def test_the_installed_package_is_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run([str(installed / "python"), "-c", "import gateway, agents.prompts; "
                            "print(gateway.__file__); print(agents.prompts.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_environment(tmp_path), check=True)
    assert all("site-packages" in line and str(ROOT) not in line for line in where.stdout.splitlines())
    # the runtime lock alone: no test tool came with it
    missing = subprocess.run([str(installed / "python"), "-c", "import pytest"], capture_output=True, cwd=tmp_path)
    assert missing.returncode != 0


def test_the_demo_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    demo = subprocess.run([str(installed / "gateway"), "demo"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=_environment(tmp_path / "unused"))
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "apply.succeeded" in demo.stdout and "audit trail intact" in demo.stdout


def test_the_api_serves_a_page_and_readiness_and_the_mcp_server_starts(installed: Path, tmp_path: Path) -> None:
    home, env = tmp_path / "home", _environment(tmp_path / "home", GATEWAY_LOG_LEVEL="info")
    created = subprocess.run([str(installed / "gateway"), "init"], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    added = subprocess.run([str(installed / "gateway"), "users", "add", "ops", "--role", "admin"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    token = next(word for word in added.stdout.split() if word.startswith("gw_"))

    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen([str(installed / "gateway"), "serve", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/api/v1/ready", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the API never answered"
                time.sleep(0.3)
        assert ready.status_code == 200, ready.text
        page = httpx.get(f"http://127.0.0.1:{port}/login", timeout=10)
        assert page.status_code == 200 and "<form" in page.text  # a template from the wheel
    finally:
        server.terminate()
        server.wait(60)
    assert "TemplateNotFound" not in (tmp_path / "serve.log").read_text()

    async def tools() -> list[str]:
        parameters = StdioServerParameters(command=str(installed / "gateway"), args=["mcp"],
                                           env={**env, "GATEWAY_TOKEN": token, "GATEWAY_LOG_LEVEL": "error"},
                                           cwd=str(tmp_path))
        async with Client(parameters) as client:  # its instructions are agents/prompts/mcp_instructions.md
            return [tool.name for tool in (await client.list_tools()).tools]

    assert {"list_stacks", "propose", "proposal_status"} <= set(anyio.run(tools))
