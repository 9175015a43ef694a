"""The Dockerfile, read as Docker reads it, and its engine step run for real.

No container runtime runs here, so the image is checked statically (its instructions in order, every file it
copies present, the engine it installs named by its environment), and the step that installs the engine,
tools/install_engine.sh, runs outside Docker into a scratch folder: the pinned Terraform and providers arrive
sha256-checked, with their licence notice, and the gateway, pointed at them by the image's own ENV lines,
initialises the Terraform sample by applying it with that Terraform.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from install_terraform import BINARIES  # noqa: E402  (the pins `make terraform` uses)

ROOT = Path(__file__).resolve().parents[1]


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (KEYWORD, arguments), comments dropped and continuation lines joined."""
    found, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        found.append((keyword.upper(), args.strip()))
        pending = ""
    return found


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in steps:
        if keyword == "ENV":
            env.update(dict(part.split("=", 1) for part in shlex.split(args)))
    return env


def test_the_image_installs_its_engine_before_the_gateway_and_names_it() -> None:
    steps = instructions()
    keywords = [k for k, _ in steps]
    assert keywords[0] == "FROM" and steps[0][1].startswith("python:3.11")
    assert ("ARG", "ENGINE=terraform") in steps
    install = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "tools/install_engine.sh" in a)
    assert '"$ENGINE" /opt/engine' in steps[install][1]
    assert keywords.index("ARG") < install
    assert steps.index(("COPY", "tools tools")) < install  # the script and its pins are in the image when it runs
    assert steps.index(("RUN", "pip install --no-cache-dir -r requirements.lock")) < install  # the test provider's tf
    env = _env(steps)
    assert env["GATEWAY_TERRAFORM_BIN"] == "/opt/engine/bin/terraform"
    assert env["GATEWAY_TERRAFORM_CLI_CONFIG"] == "/opt/engine/terraformrc"
    assert "/opt/engine/NOTICE" in steps[install][1]  # the licence notice is kept in the image
    assert steps[-1][0] == "CMD" and ("USER", "gateway") in steps
    assert keywords.index("USER") > install  # installed as root, run as the gateway user


def test_everything_the_image_copies_exists() -> None:
    for keyword, args in instructions():
        if keyword == "COPY":
            *sources, _dest = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repo"


def test_the_image_installs_the_metrics_client_from_the_lock() -> None:
    lock = (ROOT / "requirements.lock").read_text().splitlines()
    assert "prometheus-client==0.26.0" in lock


def test_an_engine_this_image_cannot_pin_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(["sh", str(ROOT / "tools/install_engine.sh"), "opentofu", str(tmp_path / "engine")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "only terraform is pinned" in done.stderr
    assert not (tmp_path / "engine").exists()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's engine step, run for real (PyPI source distributions, sha256-checked) into a scratch folder."""
    dest = tmp_path_factory.mktemp("image") / "opt-engine"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # python3: this interpreter
    done = subprocess.run(["sh", str(ROOT / "tools/install_engine.sh"), "terraform", str(dest)], env=env,
                          capture_output=True, text=True, timeout=540)
    if done.returncode != 0 and not os.environ.get("CI") and "pip" in done.stderr:
        pytest.skip(f"the package index cannot be reached here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return dest


def test_the_engine_step_installs_the_pinned_terraform_with_its_notice(engine: Path) -> None:
    for _pin, _member, digest, target in BINARIES:
        assert hashlib.sha256((engine / target).read_bytes()).hexdigest() == digest
    version = subprocess.run([str(engine / "bin/terraform"), "version"], capture_output=True, text=True,
                             env={**os.environ, "CHECKPOINT_DISABLE": "1"}, timeout=60)
    assert version.stdout.startswith("Terraform v1.0.3")
    notice = (engine / "NOTICE").read_text()
    assert "Mozilla Public License" in notice and "HashiCorp" in notice
    assert str(engine / "mirror") in (engine / "terraformrc").read_text()


def test_the_gateway_runs_terraform_stacks_with_the_images_engine(engine: Path, tmp_path: Path) -> None:
    env = {k: v.replace("/opt/engine", str(engine)) for k, v in _env(instructions()).items()
           if k.startswith("GATEWAY_TERRAFORM") or k == "CHECKPOINT_DISABLE"}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environment.update({**env, "GATEWAY_HOME": str(tmp_path / "workspace")})
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "init", "--sample", "terraform"], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "main's stacks applied to Terraform's local state" in done.stdout
    # and it was this engine that did it: without it where the image's ENV says, the same init fails
    environment.update({"GATEWAY_HOME": str(tmp_path / "other"),
                        "GATEWAY_TERRAFORM_BIN": str(engine / "bin" / "missing-terraform")})
    missing = subprocess.run([sys.executable, "-m", "gateway.cli", "init", "--sample", "terraform"], env=environment,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "missing-terraform" in missing.stdout + missing.stderr
