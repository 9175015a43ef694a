"""Stacks that call a local module elsewhere in the repo (`source = "../../modules/x"`): the module is
planned, checked and applied with each stack that calls it, and a change to it is a change to those stacks.

Run on the terraform engine against the real Terraform 1.0.3 (skipped where `make terraform` has not run).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.composition import create_workspace, sample_repo_path
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.jobs import enqueue_job, run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal, open_proposal, sync_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, add_people

INSTALLED = Path(__file__).resolve().parent.parent / ".tools" / "terraform"
MODULE = '''terraform {
  required_providers {
    null = {
      source  = "hashicorp/null"
      version = "2.1.2"
    }
  }
}

variable "release" {
  type = string
}

resource "null_resource" "marker" {
  triggers = {
    release = var.release
  }
}
'''
GATEWAY_YAML = '''engine: terraform
approvals:
  required: 1
  config_approvers: [platform]
stacks:
  scratch:
    path: stacks/scratch
    approvers: [platform, app]
  second:
    path: stacks/second
    approvers: [platform, app]
policy:
  owners: [security]
  required_tags: []
  checkov: "off"
'''


def caller(release: str) -> str:
    return f'module "marker" {{\n  source  = "../../modules/marker"\n  release = "{release}"\n}}\n'


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    if not (INSTALLED / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform` to run these tests")
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    content = tmp_path / "content"
    shutil.copytree(sample_repo_path("terraform"), content)
    shutil.rmtree(content / "stacks")
    (content / "gateway.yaml").write_text(GATEWAY_YAML)
    for path, text in {"modules/marker/main.tf": MODULE, "stacks/scratch/main.tf": caller("1"),
                       "stacks/second/main.tf": caller("2")}.items():
        (content / path).parent.mkdir(parents=True, exist_ok=True)
        (content / path).write_text(text)
    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5), content=content)
    bootstrap_simulator(ws)  # each stack applied from an export that carries the module it calls
    yield ws
    ws.close()


def test_a_change_to_a_shared_module_plans_and_applies_every_stack_that_calls_it(shared: Workspace,
                                                                                  tmp_path: Path) -> None:
    ws, people = shared, add_people(shared)
    clone = Clone(ws, tmp_path / "clone")
    clone.branch("only-scratch").edit("stacks/scratch/main.tf", 'release = "1"', 'release = "3"').push()
    waiting = open_proposal(ws, people.alice, "only-scratch", "release 3 of scratch")
    assert waiting.stacks == ("scratch",)

    clone.branch("module").edit("modules/marker/main.tf", "release = var.release", 'release = var.release\n    v = "2"')
    clone.push()
    proposal = open_proposal(ws, people.alice, "module", "a second trigger on every marker")
    assert proposal.stacks == ("scratch", "second")  # only the module's files changed
    assert {s: p.counts for s, p in proposal.plans.items()} == {"scratch": {"replace": 1}, "second": {"replace": 1}}
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert get_proposal(ws, proposal.id).status == ProposalStatus.APPLIED

    # main moved under a module the waiting proposal's stack calls: its plan is re-made, on the new module
    _, changes = sync_proposal(ws, waiting.id)
    assert changes, "a change to a module the stack calls must make its plan stale"
    replanned = get_proposal(ws, waiting.id)
    assert replanned.plans["scratch"].counts == {"replace": 1}


def test_a_module_elsewhere_in_the_repo_is_checked_like_the_stack(shared: Workspace, tmp_path: Path) -> None:
    ws, people = shared, add_people(shared)
    Clone(ws, tmp_path / "clone").branch("unmask").write(
        "modules/marker/out.tf", 'output "release" {\n  value = nonsensitive(var.release)\n}\n').push()
    with pytest.raises(ConfigError, match=r"stack scratch: modules/marker/out.tf: nonsensitive\(\) in a module is refused"):
        open_proposal(ws, people.alice, "unmask", "show the release")
