"""The terraform engine's own local state is sealed at rest (real Terraform 1.0.3, installed by `make terraform`).

Terraform reads and writes it in clear only while a plan or apply runs; afterwards, and after a run that was
killed, nothing in the workspace holds the state or a supplied secret in clear. Skipped, saying why, only where
`make terraform` has not run; CI always runs it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup
from gateway.adapters.engines.terraform.state import LIVE_FILE, LOCK_FILE, SEALED_FILE, SealedLocalState
from gateway.adapters.sealing import BYTES_MARK, Sealer
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import BackendError
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.plan import ChangeKind, load_plan
from gateway.domain.proposal import Decision
from gateway.ports import StackInputs
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.jobs import enqueue_job, run_now_or_follow
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, add_people

INSTALLED = Path(__file__).resolve().parent.parent / ".tools" / "terraform"
ROOT = Path(__file__).resolve().parent.parent
SECRET = "tf-state-s3cr3t-4d1b"
# the workspace's secret store and keys, and the test provider's objects (the simulated cloud, not the gateway's)
KEPT_APART = ("secrets", "data.key", "audit-signing.key", "session.key", "sim-objects")
STACK = '''terraform {
  required_providers {
    sim = {
      source  = "example.local/gateway/sim"
      version = "0.1.0"
    }
  }
}
variable "api_key" {
  type = string
}
resource "sim_object" "a" {
  name   = "a"
  secret = var.api_key
}
'''
SECOND = 'resource "sim_object" "b" {\n  name    = "b"\n  content = sim_object.a.id\n}\n'  # made after a


@pytest.fixture(scope="module", autouse=True)
def _terraform_installed() -> None:
    if not (INSTALLED / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform` to run these contract tests")


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TerraformEngine:
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    monkeypatch.delenv("SIM_PROVIDER_DELAY_SECONDS", raising=False)
    return _engine(tmp_path)


def _engine(tmp_path: Path) -> TerraformEngine:
    """The engine as every process of one workspace builds it: same state directory, same data key."""
    return TerraformEngine(TerraformSetup(INSTALLED / "bin" / "terraform", INSTALLED / "terraformrc",
                                          tmp_path / "state", 300, {"SIM_PROVIDER_DIR": str(tmp_path / "objects")}),
                           Sealer.from_key_file(tmp_path / "data.key"))


def _stack(tmp_path: Path, name: str, hcl: str) -> Path:
    directory = tmp_path / "runs" / name
    directory.mkdir(parents=True)
    (directory / "main.tf").write_text(hcl)
    return directory


INPUTS = StackInputs({"api_key": SECRET}, frozenset({"api_key"}))

# A process of its own (a worker elsewhere): plans or applies with the engine the tests build, through files.
CHILD = '''
import base64, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.test_terraform_state import INPUTS, _engine
tmp, action, directory, planned = Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5])
engine = _engine(tmp)
if action == "plan":
    p = engine.plan("s", directory, INPUTS)
    planned.write_text(json.dumps({"document": p.document, "serial": p.state_serial,
                                   "artifact": base64.b64encode(p.artifact).decode()}))
else:
    p = json.loads(planned.read_text())
    progress = open(str(planned) + ".progress", "a", buffering=1)
    outcome = engine.apply("s", directory, p["document"], p["serial"], INPUTS, base64.b64decode(p["artifact"]),
                           lambda line: progress.write(line + "\\n"))
    print(json.dumps({"succeeded": outcome.succeeded, "error": outcome.error}))
'''


def _child(tmp_path: Path, action: str, directory: Path, planned: Path,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), str(tmp_path), action, str(directory),
                             str(planned)], env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _finish(process: subprocess.Popen[bytes]) -> str:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()[-3000:]
    return out.decode().strip().splitlines()[-1] if out.strip() else ""  # the last line: what the child reports


def _kinds(document: dict) -> dict[str, ChangeKind]:
    return {rc.address: rc.kind for rc in load_plan(document).resource_changes if rc.kind != ChangeKind.NO_OP}


def _in_clear(root: Path, *needles: bytes) -> list[str]:
    """Files under `root` (what is kept apart aside) holding any of `needles` as bytes."""
    return [str(path.relative_to(root)) for path in sorted(root.rglob("*"))
            if path.is_file() and path.relative_to(root).parts[0] not in KEPT_APART
            and any(n in path.read_bytes() for n in needles)]


def _assert_sealed_at_rest(state_dir: Path) -> None:
    assert sorted(p.name for p in state_dir.iterdir()) == [LOCK_FILE, SEALED_FILE]  # no live file, no backup
    assert (state_dir / SEALED_FILE).read_bytes().startswith(BYTES_MARK)
    assert oct((state_dir / SEALED_FILE).stat().st_mode)[-3:] == "600"
    assert oct(state_dir.stat().st_mode)[-3:] == "700"


def test_plan_apply_and_plan_again_in_separate_processes_leave_the_state_sealed(engine: TerraformEngine,
                                                                                tmp_path: Path) -> None:
    directory = _stack(tmp_path, "one", STACK)
    _finish(_child(tmp_path, "plan", directory, tmp_path / "plan.json"))
    assert _kinds(json.loads((tmp_path / "plan.json").read_text())["document"]) == {"sim_object.a": ChangeKind.CREATE}
    assert json.loads(_finish(_child(tmp_path, "apply", directory, tmp_path / "plan.json"))) == {
        "succeeded": True, "error": None}
    _finish(_child(tmp_path, "plan", directory, tmp_path / "again.json"))
    assert _kinds(json.loads((tmp_path / "again.json").read_text())["document"]) == {}  # the applied state was read
    state_dir = tmp_path / "state" / "s"
    _assert_sealed_at_rest(state_dir)
    assert _in_clear(state_dir, SECRET.encode(), b'"lineage"') == []
    assert engine.state_serial("s") > 0  # this process opens what another sealed
    with pytest.raises(BackendError, match=f"{SEALED_FILE}: .*does not open with this data key"):  # the key is needed
        TerraformEngine(engine.setup, Sealer.from_key_file(tmp_path / "other.key")).state_serial("s")


def test_an_applied_terraform_stack_leaves_no_secret_and_no_plaintext_state_in_the_workspace(
        tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    secret = str(stack_secrets(ws.settings, "files")["api_key"]).encode()
    Clone(ws, tmp_path / "clone").branch("more").edit("stacks/files/main.tf", "replicas=2", "replicas=3").push()
    proposal = open_proposal(ws, people.alice, "more", "three replicas")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
    assert done.status == JobStatus.SUCCEEDED, done.error
    state_dir = ws.settings.terraform_dir / "files"
    state = json.loads(Sealer.from_key_file(ws.settings.data_key_path).open_bytes(
        (state_dir / SEALED_FILE).read_bytes()))
    assert secret.decode() in json.dumps(state)  # the state does hold the secret: sealed, not dropped
    assert ws.engine.state_serial("files") == state["serial"] + 1
    ws.store.db.dispose()  # everything on disk, the WAL included
    _assert_sealed_at_rest(state_dir)
    assert _in_clear(ws.settings.home, secret, b'"lineage"') == []


def test_a_killed_apply_leaves_its_state_to_the_next_run_which_seals_it(engine: TerraformEngine,
                                                                        tmp_path: Path) -> None:
    directory = _stack(tmp_path, "one", STACK + SECOND)
    planned = tmp_path / "plan.json"
    _finish(_child(tmp_path, "plan", directory, planned))
    before = engine.state_serial("s")
    # the provider takes 4 s per object, b waits for a: the apply process dies while a is being made
    apply = _child(tmp_path, "apply", directory, planned, {"SIM_PROVIDER_DELAY_SECONDS": "4"})
    progress = Path(str(planned) + ".progress")
    _wait_until(lambda: progress.exists() and "sim_object.a: Creating" in progress.read_text(), 60)
    apply.send_signal(signal.SIGKILL)
    apply.wait(10)
    state_dir = tmp_path / "state" / "s"
    assert (state_dir / LIVE_FILE).exists()  # Terraform outlives the dead process, holding the stack's lock
    assert engine.state_serial("s") == before  # a read does not wait for it: the sealed state as it was
    plan = engine.plan("s", _stack(tmp_path, "next", STACK + SECOND), INPUTS)  # waits, then seals what it left
    made = sorted(json.loads(p.read_text())["name"] for p in (tmp_path / "objects").glob("*.json"))
    assert made[:1] == ["a"]  # the Terraform the dead process started finished a (1.0.3 here goes on to b too)
    expected = {} if made == ["a", "b"] else {"sim_object.b": ChangeKind.CREATE}
    assert _kinds(plan.document) == expected  # nothing made before the kill is planned again: its state is not lost
    assert plan.state_serial > before
    _assert_sealed_at_rest(state_dir)
    assert _in_clear(state_dir, SECRET.encode(), b'"lineage"') == []


def test_a_state_written_in_clear_before_sealing_is_sealed_on_first_use(engine: TerraformEngine,
                                                                        tmp_path: Path) -> None:
    directory = _stack(tmp_path, "one", STACK)
    planned = engine.plan("s", directory, INPUTS)
    assert engine.apply("s", directory, planned.document, planned.state_serial, INPUTS, planned.artifact).succeeded
    changed = STACK.replace("secret = var.api_key", "secret = var.api_key\n  content = \"v2\"")
    pending = engine.plan("s", _stack(tmp_path, "two", changed), INPUTS)  # approved before the upgrade, say
    serial = engine.state_serial("s")
    # the layout before sealing: Terraform's own file, in clear, where saved plans name it
    state_dir = tmp_path / "state" / "s"
    clear = Sealer.from_key_file(tmp_path / "data.key").open_bytes((state_dir / SEALED_FILE).read_bytes())
    (state_dir / LIVE_FILE).write_bytes(clear)
    (state_dir / SEALED_FILE).unlink()
    assert SECRET.encode() in clear
    fresh = _engine(tmp_path)  # a process started after the upgrade
    assert fresh.state_serial("s") == serial
    _assert_sealed_at_rest(state_dir)
    assert _kinds(fresh.plan("s", _stack(tmp_path, "three", STACK), INPUTS).document) == {}
    # a plan saved before the upgrade names the same state path: it still applies, exactly once
    applied = fresh.apply("s", _stack(tmp_path, "four", changed), pending.document, pending.state_serial, INPUTS,
                          pending.artifact)
    assert applied.succeeded and applied.applied == ("sim_object.a",)
    assert _kinds(fresh.plan("s", _stack(tmp_path, "five", changed), INPUTS).document) == {}
    _assert_sealed_at_rest(state_dir)
    assert _in_clear(state_dir, SECRET.encode(), b'"lineage"') == []


def test_a_state_cut_short_is_kept_for_a_person_and_refused_by_name(tmp_path: Path) -> None:
    local = SealedLocalState(tmp_path / "s", Sealer.from_key_file(tmp_path / "data.key"), "s")
    with local.in_use(0) as _:
        local.live.write_text('{"version": 4, "serial": 3, "lineage": "x"}')
    local.live.write_text('{"version": 4, "ser')  # Terraform killed while writing
    with pytest.raises(BackendError, match=f"{local.live}: .*not valid JSON.*restore it by hand"):
        local.read()
    with pytest.raises(BackendError, match="not valid JSON"):
        with local.in_use(0):
            pass
    assert local.live.read_text() == '{"version": 4, "ser' and local.sealed.exists()  # nothing lost


def test_a_run_that_left_no_state_seals_nothing(tmp_path: Path) -> None:
    local = SealedLocalState(tmp_path / "s", Sealer.from_key_file(tmp_path / "data.key"), "s")
    assert local.read() == {} and not local.directory.exists()  # a read of a stack never planned makes nothing
    with local.in_use(0):
        local.live.write_bytes(b"")  # Terraform makes an empty file when it locks a stack without state
        assert local.read_live() == {}
    assert not local.live.exists() and not local.sealed.exists() and local.read() == {}


def test_a_run_that_wrote_no_state_keeps_the_sealed_file_and_one_that_did_seals_the_new_state(tmp_path: Path) -> None:
    local = SealedLocalState(tmp_path / "s", Sealer.from_key_file(tmp_path / "data.key"), "s")
    with local.in_use(0):
        local.live.write_text('{"version": 4, "serial": 1, "lineage": "x"}')
    sealed = local.sealed.read_bytes()
    with local.in_use(0):  # a plan: Terraform reads the state and writes none
        assert local.read_live()["serial"] == 1
    assert local.sealed.read_bytes() == sealed and not local.live.exists()
    with local.in_use(0):  # an apply: the state it wrote is sealed, whatever it was before
        local.live.write_text('{"version": 4, "serial": 2, "lineage": "x"}')
    assert local.sealed.read_bytes() != sealed and not local.live.exists() and local.read()["serial"] == 2


def test_a_run_waits_for_the_stack_and_says_so_when_it_is_held_too_long(tmp_path: Path) -> None:
    local = SealedLocalState(tmp_path / "s", Sealer.from_key_file(tmp_path / "data.key"), "s")
    with local.in_use(0):
        local.live.write_text('{"version": 4, "serial": 1, "lineage": "x"}')
    held = os.open(local.directory / LOCK_FILE, os.O_RDWR)  # another process's run
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(BackendError, match="state of stack s is busy"):
            with local.in_use(0.3):
                pass
        assert local.read()["serial"] == 1  # a read does not wait: the sealed state
    finally:
        os.close(held)


@pytest.fixture
def tf_workspace(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    ws = create_workspace(Settings(home=tmp_path / "home", database_url=database_url, lock_wait_seconds=5),
                          sample="terraform")
    bootstrap_simulator(ws)  # main applied with Terraform
    yield ws
    ws.close()


def _wait_until(condition, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


