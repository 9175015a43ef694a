"""The terraform engine against a real Terraform 1.0.3 and real providers (installed by `make terraform`).

The test provider (tools/terraform/sim_provider.py) keeps its objects as JSON files, so drift is a
file edited behind Terraform's back. Skipped, saying why, only where `make terraform` has not run;
CI always runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gateway.adapters.engines.terraform.data_dir import KEPT_DATA_DIRS, MANIFEST, KeptDataDirs
from gateway.adapters.engines.terraform.engine import UNKNOWN_SCHEMA, TerraformEngine, TerraformSetup
from gateway.adapters.engines.terraform.schemas import KEPT_DIR, LOCK_FILE, KeptSchemas
from gateway.adapters.store.rows import now
from gateway.composition import create_workspace, open_workspace, terraform_setup
from gateway.config import Settings
from gateway.domain.approvals import approval_blockers
from gateway.domain.errors import ApplyError, BackendError, ConfigError, PlanError
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.plan import ChangeKind, load_plan
from gateway.domain.preview import RENDERERS, build_preview, render_text
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.ports import StackInputs
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.jobs import enqueue_job, run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal, open_proposal, proposal_previews, sync_proposal
from gateway.services.change.runner import merge_unmerged
from gateway.services.workspace import Workspace, stack_secrets
from gateway.worker import Worker

from .conftest import Clone, add_people

INSTALLED = Path(__file__).resolve().parent.parent / ".tools" / "terraform"
SIM = '''terraform {
  required_providers {
    sim = {
      source  = "example.local/gateway/sim"
      version = "0.1.0"
    }
  }
}
'''


@pytest.fixture(scope="module", autouse=True)
def _terraform_installed() -> None:
    if not (INSTALLED / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform` to run these contract tests")


@pytest.fixture
def objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test provider keeps its objects (the 'cloud')."""
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    return tmp_path / "objects"


@pytest.fixture
def engine(tmp_path: Path, objects: Path) -> TerraformEngine:
    return TerraformEngine(TerraformSetup(INSTALLED / "bin" / "terraform", INSTALLED / "terraformrc",
                                          tmp_path / "state", 300, {"SIM_PROVIDER_DIR": str(objects)}))


class Stack:
    """One stack's files in a scratch directory, planned and applied like the gateway does."""

    def __init__(self, engine: TerraformEngine, root: Path, inputs: StackInputs | None = None):
        self.engine, self.root, self.inputs, self.runs = engine, root, inputs or StackInputs(), 0
        self.lock: str | None = None  # the dependency lock file committed with the stack

    def plan(self, hcl: str, header: str = SIM):  # type: ignore[no-untyped-def]
        self.runs += 1
        directory = self.root / f"run{self.runs}"
        directory.mkdir(parents=True)
        (directory / "main.tf").write_text(header + hcl)
        if self.lock is not None:
            (directory / LOCK_FILE).write_text(self.lock)
        return self.engine.plan("s", directory, self.inputs), directory

    def apply(self, planned, directory: Path):  # type: ignore[no-untyped-def]
        return self.engine.apply("s", directory, planned.document, planned.state_serial, self.inputs, planned.artifact)

    def plan_and_apply(self, hcl: str):  # type: ignore[no-untyped-def]
        planned, directory = self.plan(hcl)
        outcome = self.apply(planned, directory)
        assert outcome.succeeded, outcome.error
        return planned, outcome


def _kinds(document: dict) -> dict[str, ChangeKind]:
    return {rc.address: rc.kind for rc in load_plan(document).resource_changes}


def test_create_update_replace_delete(engine: TerraformEngine, tmp_path: Path, objects: Path) -> None:
    stack = Stack(engine, tmp_path / "s")
    created, outcome = stack.plan_and_apply('resource "sim_object" "a" {\n  name = "a"\n  content = "one"\n}\n')
    assert created.document["format_version"] == "0.2" and created.artifact
    assert _kinds(created.document) == {"sim_object.a": ChangeKind.CREATE}
    assert outcome.applied == ("sim_object.a",) and outcome.state_serial > 0
    assert [json.loads(p.read_text())["content"] for p in objects.glob("*.json")] == ["one"]

    updated, _ = stack.plan_and_apply('resource "sim_object" "a" {\n  name = "a"\n  content = "two"\n}\n')
    assert _kinds(updated.document) == {"sim_object.a": ChangeKind.UPDATE}

    replaced, _ = stack.plan_and_apply('resource "sim_object" "a" {\n  name = "b"\n  content = "two"\n}\n')
    change = load_plan(replaced.document).find("sim_object.a")
    assert change.kind == ChangeKind.REPLACE and change.action_reason == "replace_because_cannot_update"
    assert "name" in render_text(build_preview(load_plan(replaced.document)))

    deleted, _ = stack.plan_and_apply("")
    assert _kinds(deleted.document) == {"sim_object.a": ChangeKind.DELETE}
    assert list(objects.glob("*.json")) == []


def test_prevent_destroy_fails_the_plan_naming_the_resource(engine: TerraformEngine, tmp_path: Path) -> None:
    stack = Stack(engine, tmp_path / "s")
    guarded = 'resource "sim_object" "keep" {\n  name = "%s"\n  lifecycle {\n    prevent_destroy = true\n  }\n}\n'
    stack.plan_and_apply(guarded % "one")
    with pytest.raises(PlanError, match="sim_object.keep"):
        stack.plan(guarded % "two")  # a replacement would destroy it


def test_drift_shows_what_the_apply_would_revert(engine: TerraformEngine, tmp_path: Path, objects: Path) -> None:
    stack = Stack(engine, tmp_path / "s")
    hcl = 'resource "sim_object" "a" {\n  name = "a"\n  content = "declared"\n}\n'
    stack.plan_and_apply(hcl)
    live = next(objects.glob("*.json"))
    live.write_text(json.dumps({**json.loads(live.read_text()), "content": "edited in a console"}))
    planned, _ = stack.plan(hcl)
    plan = load_plan(planned.document)
    assert [d.address for d in plan.resource_drift] == ["sim_object.a"]
    text = render_text(build_preview(plan))
    assert "edited in a console" in text and "revert" in text


def test_a_plan_is_applied_once_and_a_stale_one_is_refused(engine: TerraformEngine, tmp_path: Path) -> None:
    stack = Stack(engine, tmp_path / "s")
    first, first_dir = stack.plan('resource "sim_object" "a" {\n  name = "a"\n}\n')
    second, second_dir = stack.plan('resource "sim_object" "a" {\n  name = "a"\n  content = "x"\n}\n')
    assert stack.apply(first, first_dir).succeeded
    with pytest.raises(ApplyError, match="moved since the plan"):  # Terraform itself would create twice
        stack.apply(first, first_dir)
    with pytest.raises(ApplyError, match="moved since the plan"):
        stack.apply(second, second_dir)


def test_supplied_secrets_stay_masked_whatever_the_configuration_says(engine: TerraformEngine, tmp_path: Path) -> None:
    secret = "s3cr3t-from-the-gateway-7f1e"
    stack = Stack(engine, tmp_path / "s", StackInputs({"api_key": secret}, frozenset({"api_key"})))
    declared_plain = 'variable "api_key" {\n  type = string\n}\n'  # the branch does not declare it sensitive
    planned, _ = stack.plan(declared_plain +
                            'resource "sim_object" "a" {\n  name = "a"\n  content = "key=${var.api_key}"\n}\n')
    plan = load_plan(planned.document)
    assert plan.find("sim_object.a").change.after_sensitive["content"] is True  # Terraform alone: False
    preview = build_preview(plan)
    for render in RENDERERS.values():
        assert secret not in render(preview)
    assert secret not in json.dumps(planned.document.get("variables", {}))
    # the gateway makes it sensitive to Terraform itself, so an output built from it is refused by Terraform
    with pytest.raises(PlanError, match="Output refers to sensitive values") as refused:
        stack.plan(declared_plain + 'output "leak" {\n  value = var.api_key\n}\n')
    assert secret not in str(refused.value)


def test_terraform_errors_reach_the_person_without_secrets(engine: TerraformEngine, tmp_path: Path) -> None:
    secret = "another-s3cr3t-9c2a"
    stack = Stack(engine, tmp_path / "s", StackInputs({"api_key": secret}, frozenset({"api_key"})))
    with pytest.raises(PlanError) as failure:
        stack.plan('variable "api_key" {\n  type = number\n}\n')  # the secret is not a number: Terraform quotes it
    assert secret not in str(failure.value) and "api_key" in str(failure.value)


OBJECT = 'resource "sim_object" "a" {\n  name = "a"\n  content = "one"\n}\n'


def test_the_providers_schema_is_asked_once_per_set_of_providers_and_kept_in_the_workspace(
        engine: TerraformEngine, tmp_path: Path) -> None:
    Stack(engine, tmp_path / "s").plan(OBJECT)
    assert engine.sensitive_attributes("s", "sim_object") == {"secret"}
    [kept] = (tmp_path / "state" / KEPT_DIR).glob("*.json")
    # A new process's engine takes the kept answer instead of starting the providers again (what it then
    # says is the kept file's, edited here to tell the two apart); it fails closed until it has planned.
    kept.write_text(json.dumps({"sensitive": {"sim_object": ["content", "secret"]}}))
    later = TerraformEngine(engine.setup)
    assert later.sensitive_attributes("s", "sim_object") == UNKNOWN_SCHEMA
    Stack(later, tmp_path / "t").plan(OBJECT)
    assert later.sensitive_attributes("s", "sim_object") == {"content", "secret"}
    # a kept file that cannot be read whole is not trusted in part: Terraform is asked again, and it is kept anew
    kept.write_text(json.dumps({"sensitive": {"sim_object": "secret"}}))
    again = TerraformEngine(engine.setup)
    Stack(again, tmp_path / "u").plan(OBJECT)
    assert again.sensitive_attributes("s", "sim_object") == {"secret"}
    assert json.loads(kept.read_text())["sensitive"]["sim_object"] == ["secret"]


def test_other_providers_or_another_terraform_never_get_a_kept_schema(tmp_path: Path) -> None:
    def initialised(name: str, lock: str) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / ".terraform.lock.hcl").write_text(lock)
        return directory

    pinned = 'provider "example.local/gateway/sim" {\n  version = "0.1.0"\n  hashes = ["h1:aaaa"]\n}\n'
    one, same, rebuilt = initialised("one", pinned), initialised("same", pinned), initialised("rebuilt",
                                                                                              pinned.replace("aaaa", "bbbb"))
    kept = KeptSchemas(tmp_path / "kept", INSTALLED / "bin" / "terraform", INSTALLED / "terraformrc")
    assert kept.key(one) == kept.key(same) != kept.key(rebuilt)
    copy = tmp_path / "terraform"
    copy.write_bytes((INSTALLED / "bin" / "terraform").read_bytes()[:1024])  # another binary
    assert KeptSchemas(tmp_path / "kept", copy, INSTALLED / "terraformrc").key(one) != kept.key(one)
    assert kept.key(tmp_path) is None  # no lock file: nothing pins the providers
    overrides = tmp_path / "dev.terraformrc"
    overrides.write_text('provider_installation {\n  dev_overrides {\n    "example.local/gateway/sim" = "/src"\n  }\n'
                         '  direct {}\n}\n')
    assert KeptSchemas(tmp_path / "kept", INSTALLED / "bin" / "terraform", overrides).key(one) is None


# --- what `init` made, kept by the committed lock file ---------------------------------------------


def _packed_mirror(tmp_path: Path) -> Path:
    """A CLI configuration whose mirror holds the test provider as a zip archive, and no plugin cache: init
    unpacks a copy of the package into `.terraform` (from the installed mirror's directory it only links)."""
    source = INSTALLED / "mirror" / "example.local" / "gateway" / "sim" / "0.1.0" / "linux_amd64"
    archive = tmp_path / "mirror" / "example.local" / "gateway" / "sim" / "terraform-provider-sim_0.1.0_linux_amd64.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as packed:
        for path in source.iterdir():
            entry = zipfile.ZipInfo(path.name)
            entry.external_attr = 0o755 << 16
            packed.writestr(entry, path.read_bytes())
    config = tmp_path / "packed.terraformrc"
    config.write_text(f'provider_installation {{\n  filesystem_mirror {{\n    path    = "{tmp_path / "mirror"}"\n'
                      '    include = ["example.local/*/*"]\n  }\n  direct {\n    exclude = ["example.local/*/*"]\n'
                      '  }\n}\ndisable_checkpoint = true\n')
    return config


def _noting(tmp_path: Path, objects: Path, config: Path = INSTALLED / "terraformrc") -> tuple[TerraformEngine, Path]:
    """An engine whose Terraform (the real one, behind a script that execs it) notes each command it is given."""
    noted, wrapper = tmp_path / "commands.log", tmp_path / "bin" / "terraform"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> "{noted}"\nexec "{INSTALLED / "bin" / "terraform"}" "$@"\n')
    wrapper.chmod(0o755)
    return TerraformEngine(TerraformSetup(wrapper, config, tmp_path / "state", 300,
                                          {"SIM_PROVIDER_DIR": str(objects)})), noted


def _commands(noted: Path) -> list[str]:
    """The commands run since the last look."""
    commands = noted.read_text().split() if noted.exists() else []
    noted.unlink(missing_ok=True)
    return commands


@pytest.fixture(scope="module")
def sim_lock(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The lock file `terraform init` writes for the test provider, as a stack would commit it."""
    directory = tmp_path_factory.mktemp("locked")
    (directory / "main.tf").write_text(SIM)
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(INSTALLED / "terraformrc"), "CHECKPOINT_DISABLE": "1"}
    subprocess.run([str(INSTALLED / "bin" / "terraform"), "init", "-input=false", "-no-color"], cwd=directory,
                   env=env, check=True, capture_output=True)
    return (directory / LOCK_FILE).read_text()


def test_with_a_committed_lock_file_a_plan_does_not_run_init_again_and_plans_the_same(
        tmp_path: Path, objects: Path, sim_lock: str) -> None:
    engine, noted = _noting(tmp_path, objects)
    stack = Stack(engine, tmp_path / "s")
    stack.lock = sim_lock
    first, _ = stack.plan(OBJECT)
    assert _commands(noted) == ["init", "plan", "show", "providers"]
    second, directory = stack.plan(OBJECT)
    assert _commands(noted) == ["plan", "show"]  # the providers laid out as init left them: no init
    assert second.document == first.document and second.state_serial == first.state_serial
    assert render_text(build_preview(load_plan(second.document))) == render_text(build_preview(load_plan(first.document)))
    outcome = stack.apply(second, directory)  # the saved plan file, in a copy init prepares as before
    assert outcome.succeeded, outcome.error
    assert _commands(noted) == ["init", "apply"] and outcome.applied == ("sim_object.a",)
    assert not (directory / ".terraform").exists()  # the caller's directory is never written to

    later = TerraformEngine(engine.setup)  # another process: what init made is kept in the workspace
    again = Stack(later, tmp_path / "t")
    again.lock = sim_lock
    updated, _ = again.plan(OBJECT.replace('"one"', '"two"'))
    assert _commands(noted) == ["plan", "show"]  # and so is the providers' schema
    assert _kinds(updated.document) == {"sim_object.a": ChangeKind.UPDATE}

    # another lock file (one more hash pinned) is another key: init runs, once. The hash is pinned first, where a
    # hand edit or a merge of two branches may put it, and init writes it last (it sorts the hashes, and this one
    # sorts after any): the same pins, so what init made is kept all the same, whatever the provider's own hash
    # (the test provider's script names this checkout's path, so its hash is each checkout's own)
    again.lock = sim_lock.replace('    "h1:', '    "h1:' + "z" * 42 + 'w=",\n    "h1:', 1)
    again.plan(OBJECT)
    assert _commands(noted)[:1] == ["init"]
    again.plan(OBJECT)
    assert _commands(noted) == ["plan", "show"]
    assert len(list((tmp_path / "state" / KEPT_DATA_DIRS).iterdir())) == 2

    # no lock file committed: init runs for every plan, as before
    again.lock = None
    for _ in range(2):
        again.plan(OBJECT)
        assert _commands(noted)[:1] == ["init"]


def test_a_branch_that_asks_for_a_provider_its_lock_file_does_not_pin_is_planned_after_init(
        tmp_path: Path, objects: Path, sim_lock: str) -> None:
    engine, noted = _noting(tmp_path, objects)
    stack = Stack(engine, tmp_path / "s")
    stack.lock = sim_lock
    stack.plan(OBJECT)
    _commands(noted)
    both = SIM.replace("  required_providers {\n", '  required_providers {\n    null = {\n      source  = '
                       '"hashicorp/null"\n      version = "2.1.2"\n    }\n', 1)
    planned, _ = stack.plan(OBJECT + 'resource "null_resource" "n" {}\n', header=both)
    assert _commands(noted) == ["plan", "init", "plan", "show", "providers"]  # init adds null to the lock file
    assert _kinds(planned.document) == {"sim_object.a": ChangeKind.CREATE, "null_resource.n": ChangeKind.CREATE}
    stack.plan(OBJECT)  # what was kept was dropped, and is made again
    assert _commands(noted) == ["init", "plan", "show"]
    stack.plan(OBJECT)
    assert _commands(noted) == ["plan", "show"]


def test_a_kept_provider_that_was_changed_is_never_used(tmp_path: Path, objects: Path, sim_lock: str) -> None:
    engine, noted = _noting(tmp_path, objects, _packed_mirror(tmp_path))  # a package of its own: editable
    stack = Stack(engine, tmp_path / "s")
    stack.lock = sim_lock
    first, _ = stack.plan(OBJECT)
    [kept] = (tmp_path / "state" / KEPT_DATA_DIRS).iterdir()
    [package] = [p for p in (kept / "providers").rglob("terraform-provider-sim*") if p.is_file()]
    content = package.read_bytes()
    package.write_bytes(content[:-1] + (b" " if content[-1:] != b" " else b"\n"))  # same size: Terraform tells
    _commands(noted)
    planned, _ = stack.plan(OBJECT)
    assert _commands(noted) == ["plan", "init", "plan", "show"]  # Terraform refused the package: init ran
    assert planned.document == first.document
    assert package.read_bytes() == content  # kept again, from what init installed
    (kept / MANIFEST).write_text("{}")  # a kept directory not as it was written is not laid out either
    stack.plan(OBJECT)
    assert _commands(noted) == ["init", "plan", "show"]


def test_two_runs_keeping_the_same_init_at_once_keep_one_whole(tmp_path: Path, sim_lock: str) -> None:
    config = _packed_mirror(tmp_path)
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1"}
    backend = 'terraform {\n  backend "local" {\n    path = "%s"\n  }\n}\n' % (tmp_path / "live.tfstate")
    works = []
    for name in ("one", "two"):
        work = tmp_path / name
        work.mkdir()
        (work / "main.tf").write_text(SIM)
        (work / "backend_override.tf").write_text(backend)
        (work / LOCK_FILE).write_text(sim_lock)
        subprocess.run([str(INSTALLED / "bin" / "terraform"), "init", "-input=false", "-no-color"], cwd=work,
                       env=env, check=True, capture_output=True)
        works.append(work)
    kept = KeptDataDirs(tmp_path / "kept", INSTALLED / "bin" / "terraform", config)
    key = kept.key(works[0], works[0] / "backend_override.tf", {})
    assert key is not None and key == kept.key(works[1], works[1] / "backend_override.tf", {})
    stale = tmp_path / "kept" / "an-init-of-a-lock-file-long-gone"
    stale.mkdir(parents=True)
    (stale / MANIFEST).write_text("{}")
    os.utime(stale / MANIFEST, (time.time() - 30 * 86400,) * 2)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda work: kept.keep(key, work, sim_lock.encode()), works))
    assert sorted(done) == [False, True]
    # no half-made directory left beside it, and keeping a new one dropped the one no run had used for a month
    assert [p.name for p in (tmp_path / "kept").iterdir()] == [key]
    fresh = tmp_path / "fresh"  # a third copy of the stack, where init never ran
    shutil.copytree(works[0], fresh, ignore=shutil.ignore_patterns(".terraform"))
    month_ago = time.time() - 30 * 86400
    os.utime(tmp_path / "kept" / key / MANIFEST, (month_ago, month_ago))
    assert kept.lay_out(key, fresh)
    kept.prune(time.time())  # laid out just now: used, so kept
    planned = subprocess.run([str(INSTALLED / "bin" / "terraform"), "plan", "-input=false", "-no-color"], cwd=fresh,
                             env=env, capture_output=True, text=True)
    assert planned.returncode == 0 and "No changes" in planned.stdout, planned.stdout + planned.stderr


def test_kept_inits_no_run_used_for_two_weeks_are_dropped_with_what_crashed_runs_left(tmp_path: Path) -> None:
    kept = KeptDataDirs(tmp_path / "kept", INSTALLED / "bin" / "terraform", None)
    now = time.time()
    ages = {"used-yesterday": 1, "used-13-days-ago": 13, "unused-15-days": 15, "unused-a-year": 365}
    for name, days in ages.items():
        (tmp_path / "kept" / name / "providers").mkdir(parents=True)
        (tmp_path / "kept" / name / MANIFEST).write_text("{}")
        os.utime(tmp_path / "kept" / name / MANIFEST, (now - days * 86400, now - days * 86400))
    for name, hours in ((".partial-crashed", 30), (".dropped-crashed", 30), (".partial-running", 1)):
        (tmp_path / "kept" / name).mkdir()
        os.utime(tmp_path / "kept" / name, (now - hours * 3600, now - hours * 3600))
    kept.prune(now)
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".partial-running", "used-13-days-ago",
                                                                     "used-yesterday"]


def test_a_stack_whose_opentofu_files_call_a_module_is_never_laid_out_from_a_kept_init(tmp_path: Path,
                                                                                      sim_lock: str) -> None:
    """init installs the modules a stack calls, and OpenTofu reads `.tofu` files as `.tf` ones: a call there means
    init must run, as a call in a `.tf` file does."""
    config = _packed_mirror(tmp_path)
    work = tmp_path / "stack"
    work.mkdir()
    (work / "main.tf").write_text(SIM)
    (work / LOCK_FILE).write_text(sim_lock)
    (work / "backend_override.tf").write_text('terraform {\n  backend "local" {}\n}\n')
    kept = KeptDataDirs(tmp_path / "kept", INSTALLED / "bin" / "terraform", config)
    assert kept.key(work, work / "backend_override.tf", {}) is not None
    for name, calls in (("calls.tofu", 'module "m" {\n  source = "./m"\n}\n'),
                       ("calls.tofu.json", '{"module": {"m": {"source": "./m"}}}')):
        (work / name).write_text(calls)
        assert kept.key(work, work / "backend_override.tf", {}) is None, name
        (work / name).unlink()


def test_a_terraform_run_past_its_time_is_stopped_with_a_clear_error(tmp_path: Path, objects: Path) -> None:
    hurried = TerraformEngine(TerraformSetup(INSTALLED / "bin" / "terraform", INSTALLED / "terraformrc",
                                             tmp_path / "state", 0.01, {"SIM_PROVIDER_DIR": str(objects)}))
    with pytest.raises(BackendError, match=r"terraform init took longer than 0.01 s and was stopped"):
        Stack(hurried, tmp_path / "s").plan(OBJECT)


@pytest.mark.postgres
def test_a_stack_keeps_its_state_in_the_backend_it_declares(engine: TerraformEngine, tmp_path: Path,
                                                            postgres_url: str) -> None:
    conn = postgres_url.replace("postgresql+psycopg://", "postgres://") + "?sslmode=disable"
    backend = f'terraform {{\n  backend "pg" {{\n    conn_str = "{conn}"\n  }}\n}}\n'
    stack = Stack(engine, tmp_path / "s")
    first, first_dir = stack.plan(backend + 'resource "sim_object" "a" {\n  name = "a"\n}\n')
    second, second_dir = stack.plan(backend + 'resource "sim_object" "a" {\n  name = "a"\n  content = "x"\n}\n')
    outcome = stack.apply(first, first_dir)
    assert outcome.succeeded and outcome.state_serial > 0
    assert engine.state_serial("s") == outcome.state_serial  # read from PostgreSQL, where Terraform keeps it
    assert not (tmp_path / "state" / "s" / "terraform.tfstate").exists()
    pg = create_engine(postgres_url)
    with pg.connect() as connection:
        stored = connection.execute(text("select data from terraform_remote_state.states")).scalar_one()
    pg.dispose()
    assert [r["name"] for r in json.loads(stored)["resources"]] == ["a"]
    with pytest.raises(ApplyError, match="moved since the plan"):  # applied once, even from an empty state
        stack.apply(first, first_dir)
    with pytest.raises(ApplyError, match="moved since the plan"):
        stack.apply(second, second_dir)
    updated, _ = stack.plan_and_apply(backend + 'resource "sim_object" "a" {\n  name = "a"\n  content = "y"\n}\n')
    assert _kinds(updated.document) == {"sim_object.a": ChangeKind.UPDATE}  # the state in PostgreSQL was used


def test_a_branch_cannot_move_a_stacks_state(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    backend = 'terraform {\n  backend "local" {\n    path = "PATH"\n  }\n}\n'
    admin = Clone(ws, tmp_path / "admin")
    admin.write("stacks/files/backend.tf", backend.replace("PATH", str(tmp_path / "files.tfstate"))).push(
        "files' state in a place of its own", author="admin")
    clone = Clone(ws, tmp_path / "clone").branch("elsewhere")
    clone.write("stacks/files/backend.tf", backend.replace("PATH", str(tmp_path / "empty.tfstate"))).push()
    with pytest.raises(ConfigError, match="moves where the stack's state lives"):
        open_proposal(ws, people.alice, "elsewhere", "start from an empty state")
    clone.branch("fine").edit("stacks/files/main.tf", "replicas=2", "replicas=3").push()
    proposal = open_proposal(ws, people.alice, "fine", "three replicas")  # the backend as main has it
    # main moved the state to a new, empty place (not migrated): everything is created there, nothing updated
    assert set(proposal.plans["files"].counts) == {"create"}, proposal.plans["files"].counts


# --- the whole change path with `engine: terraform` --------------------------------------------


@pytest.fixture
def tf_workspace(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    ws = create_workspace(Settings(home=tmp_path / "home", database_url=database_url, lock_wait_seconds=5),
                          sample="terraform")
    assert terraform_setup(ws.settings).binary == INSTALLED / "bin" / "terraform"
    bootstrap_simulator(ws)  # main applied with Terraform
    yield ws
    ws.close()


def test_the_change_path_with_the_terraform_engine(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    Clone(ws, tmp_path / "clone").branch("more").edit("stacks/files/main.tf", "replicas=2", "replicas=3").push()
    proposal = open_proposal(ws, people.alice, "more", "three replicas")
    assert proposal.plans["files"].counts == {"update": 1}
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert any("sim_object.config" in line and "Modifications complete" in line for line in done.progress), done.progress
    after = get_proposal(ws, proposal.id)
    assert after.status == ProposalStatus.APPLIED and after.merge_sha
    contents = [json.loads(p.read_text())["content"] for p in (ws.settings.home / "sim-objects").glob("*.json")]
    assert "replicas=3" in contents
    from gateway.services.admin.audit import verify_trail

    count, broken = verify_trail(ws, people.admin)
    assert broken is None and count > 0


def test_a_branch_cannot_unmask_the_secret_on_the_terraform_engine(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    secret = str(stack_secrets(ws.settings, "files")["api_key"])
    plain = open_workspace(ws.settings.model_copy(update={"scrub_known_secrets": False}))
    clone = Clone(ws, tmp_path / "clone")
    try:
        # the attack: Terraform's nonsensitive() would unmask, so the gateway refuses to plan it at all
        clone.branch("leak").edit("stacks/files/main.tf", "  sensitive   = true\n", "")
        clone.write("stacks/files/leak.tf", 'output "c" {\n  value = nonsensitive(var.api_key)\n}\n').push()
        with pytest.raises(ConfigError, match="output.c: nonsensitive\\(\\) over a secret is refused") as refused:
            open_proposal(plain, people.alice, "leak", "innocent")
        assert secret not in str(refused.value)
        # without nonsensitive(): Terraform itself sees the variable as sensitive and refuses the output
        clone.write("stacks/files/leak.tf", 'output "c" {\n  value = "key: ${var.api_key}"\n}\n').push()
        with pytest.raises(PlanError, match="Output refers to sensitive values") as refused:
            open_proposal(plain, people.alice, "leak", "innocent")
        assert secret not in str(refused.value)
        # the declaration removed alone: the plan runs, the value stays masked, and the change is denied
        clone.write("stacks/files/leak.tf", 'resource "sim_object" "copy" {\n  name    = "copy"\n'
                    '  content = "key: ${var.api_key}"\n}\n').push()
        proposal = open_proposal(plain, people.alice, "leak", "innocent")
        rendered = [render(p) for p in proposal_previews(plain, proposal).values() for render in RENDERERS.values()]
    finally:
        plain.close()
    assert all(secret not in text for text in rendered)
    denied = {f.address for f in proposal.plans["files"].findings if f.rule == "secret-unmasked"}
    assert denied == {"var.api_key"}
    blockers = approval_blockers(get_proposal(ws, proposal.id), ws.repo_settings(), now())
    assert any("var.api_key" in b for b in blockers), blockers


def test_a_worker_killed_mid_terraform_apply_is_recorded_and_terraform_lets_go(tf_workspace: Workspace,
                                                                               tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    Clone(ws, tmp_path / "clone").branch("more").edit("stacks/files/main.tf", "replicas=2", "replicas=3").push()
    proposal = open_proposal(ws, people.alice, "more", "three replicas")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    job = enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id)
    lock_file = ws.settings.terraform_dir / "files" / ".terraform.tfstate.lock.info"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_LOCK_TTL_SECONDS": "2",
                "SIM_PROVIDER_DELAY_SECONDS": "6"})  # the provider takes 6 s per change: time to kill the worker
    if ws.settings.database_url:
        env["GATEWAY_DATABASE_URL"] = ws.settings.database_url
    worker = subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--loops", "1", "--poll", "0.1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until(lambda: lock_file.exists(), 60)  # Terraform is applying, holding its state lock
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    _wait_until(lambda: not lock_file.exists(), 60)  # Terraform, interrupted, finished cleanly and let go
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": 2})
    time.sleep(2.1)
    survivor = Worker(ws, loops=1, poll_seconds=0.05).start()
    try:
        _wait_until(lambda: ws.store.queue.get(job.id).finished, 30)
    finally:
        survivor.stop()
    assert ws.store.queue.get(job.id).status == JobStatus.INTERRUPTED
    with ws.store.session() as session:
        assert [a.status for a in session.proposals.applies_of(proposal.id)] == ["interrupted"]
        events = session.audit.events(proposal_id=proposal.id)
    assert "apply.succeeded" not in [e.kind for e in events]
    # the recovery read what Terraform's state holds (it may have finished the change it was making when its
    # worker died) and settled the proposal by it: applied and kept for a merge, or failed and re-planned
    [read] = [e.payload["read"]["files"] for e in events if e.kind == "apply.interrupted"]
    if read["result"] == "applied":
        assert get_proposal(ws, proposal.id).status == ProposalStatus.UNMERGED
        assert merge_unmerged(ws, people.bob, proposal.id).status == ProposalStatus.APPLIED
        return
    assert "proposal.interrupt" in [e.kind for e in events]
    # Terraform's state is not locked: a re-plan (the survivor may already have queued one) shows what is left
    replanned, _ = sync_proposal(ws, proposal.id)
    assert replanned.status == ProposalStatus.OPEN and "files" in replanned.plans


def _wait_until(condition, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_two_workers_never_run_terraform_on_one_stack_at_once(tf_workspace: Workspace, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    ws.settings = ws.settings.model_copy(update={"lock_wait_seconds": 60})
    clone = Clone(ws, tmp_path / "clone")
    ids = []
    for branch, new in (("three", "replicas=3"), ("four", "replicas=4")):
        clone.branch(branch).edit("stacks/files/main.tf", "replicas=2", new).push()
        ids.append(open_proposal(ws, people.alice, branch, new).id)
        decide(ws, people.bob, ids[-1], Decision.APPROVE, "ok")
    monkeypatch.setenv("SIM_PROVIDER_DELAY_SECONDS", "2")  # each apply takes a while: the two would overlap
    jobs = [enqueue_job(ws, people.alice, JobKind.APPLY, pid) for pid in ids]
    worker = Worker(ws, loops=2, poll_seconds=0.05).start()
    try:
        _wait_until(lambda: all(ws.store.queue.get(j.id).finished for j in jobs), 120)
    finally:
        worker.stop()
    statuses = sorted(ws.store.queue.get(j.id).status.value for j in jobs)
    assert statuses == ["refused", "succeeded"], [ws.store.queue.get(j.id).error for j in jobs]  # the second re-plans
    with ws.store.session() as session:
        spans = [(a.started_at, a.finished_at) for pid in ids for a in session.proposals.applies_of(pid)]
    assert len(spans) == 1 or spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0]
    assert all("state lock" not in (ws.store.queue.get(j.id).error or "") for j in jobs)


def test_provider_credentials_never_reach_the_agent_or_the_model(tf_workspace: Workspace, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials live in the worker's environment; the agent plans with them and never sees them."""
    from agents.llm import ChatModel
    from gateway.services.agents.agent_requests import submit_request

    from .model_stub import ModelStub, tool_call

    marker = "AKIA-MARKED-FAKE-CREDENTIAL-3f9c"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", marker)
    monkeypatch.setenv("SIM_PROVIDER_TOKEN", marker)
    ws, people = tf_workspace, add_people(tf_workspace)
    with ModelStub() as stub:
        stub.turns = [
            tool_call("read_file", path="stacks/files/main.tf"),
            tool_call("write_file", path="stacks/files/extra.tf",
                      content='resource "sim_object" "extra" {\n  name    = "extra"\n  content = "hello"\n}\n'),
            tool_call("run_preview", stack="files"),
            tool_call("finish", summary="Added sim_object.extra; the plan only creates it."),
        ]
        outcome = submit_request(ws, people.alice, "add an object named extra", model=ChatModel(
            stub.base_url, "test-key", "stub-model"))
    assert outcome.proposal is not None and outcome.proposal.plans["files"].counts == {"create": 1}
    assert "sim_object.extra" in json.dumps(stub.requests[3])  # the agent saw the real plan
    assert all(marker not in json.dumps(body) for body in stub.requests)
    with ws.store.session() as session:
        assert marker not in json.dumps([e.payload for e in session.audit.events()])
