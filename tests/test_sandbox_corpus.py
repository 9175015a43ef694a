"""Public Terraform root configurations that nobody here wrote, planned by the sandbox from empty state.

The corpus (tests/fixtures/corpus, origins and licences in its SOURCES.md) is what a team tries
first: HashiCorp's tutorials, terraform-aws-modules examples, "Terraform: Up & Running", terratest's
examples. Each plan must create exactly the resource instances Terraform would (expectations.yaml).
An entry the sandbox cannot plan yet is in KNOWN_GAPS with its first error: it runs as a strict
xfail, so the suite stays green and fails the moment the entry starts passing (then drop it here).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup
from gateway.domain.plan import ChangeKind
from gateway.services.workspace import Workspace

from .conftest import Clone
from .corpus import CorpusEntry, created_addresses, load_corpus, plan_entry
from .fakes import FakeSandboxStore

# The first error of each entry the sandbox cannot plan today, as measured (one line each); after a change to
# the engine, `python benchmarks/corpus_coverage.py --known-gaps` prints this dict as it then stands.
KNOWN_GAPS: dict[str, str] = {}

ENTRIES = load_corpus()

# Entries whose only provider is the null provider at a version the local mirror has (2.1.2): their
# expectations are checked against the real Terraform 1.0.3 too. (tur-null-resource asks for null ~> 3.0.)
CHECKED_WITH_TERRAFORM = ["tt-null-parallelism"]
TERRAFORM = Path(__file__).resolve().parent.parent / ".tools" / "terraform"


def _param(entry: CorpusEntry) -> object:
    marks = [pytest.mark.xfail(reason=KNOWN_GAPS[entry.name], strict=True)] if entry.name in KNOWN_GAPS else []
    return pytest.param(entry, id=entry.name, marks=marks)


@pytest.fixture(scope="module")
def engine() -> SandboxEngine:
    """One simulated cloud for the module: each entry plans its own stack (named after it) from empty state."""
    return SandboxEngine(FakeSandboxStore())  # in memory: what the engine plans, not how SQL keeps it


def test_the_corpus_is_big_enough_and_every_entry_is_sourced() -> None:
    sources = (Path(__file__).parent / "fixtures" / "corpus" / "SOURCES.md").read_text()
    assert len(ENTRIES) >= 20
    assert [e.name for e in ENTRIES if f"`{e.name}`" not in sources] == []
    assert set(KNOWN_GAPS) <= {e.name for e in ENTRIES}  # a gap for an entry that is gone is stale


@pytest.mark.parametrize("entry", [_param(e) for e in ENTRIES])
def test_plans_what_terraform_plans(entry: CorpusEntry, engine: SandboxEngine, tmp_path: Path) -> None:
    plan = plan_entry(engine, entry, tmp_path)
    created = created_addresses(plan)
    assert plan.counts() == {ChangeKind.CREATE: entry.creates}, sorted(created)
    assert [a for a in entry.addresses if a not in created] == [], sorted(created)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.name in CHECKED_WITH_TERRAFORM], ids=lambda e: e.name)
def test_expectations_are_what_the_real_terraform_plans(entry: CorpusEntry, tmp_path: Path) -> None:
    if not (TERRAFORM / "bin" / "terraform").exists():
        pytest.skip("Terraform is not installed here: run `make terraform` to check expectations against it")
    engine = TerraformEngine(TerraformSetup(TERRAFORM / "bin" / "terraform", TERRAFORM / "terraformrc",
                                            tmp_path / "state", 300))
    plan = plan_entry(engine, entry, tmp_path)
    assert plan.counts() == {ChangeKind.CREATE: entry.creates}
    assert [a for a in entry.addresses if a not in created_addresses(plan)] == []


def test_a_stack_export_carries_the_local_modules_it_calls(workspace: Workspace, clone: Clone, tmp_path: Path) -> None:
    entry = next(e for e in ENTRIES if e.name == "tur-iam-users-module-count")  # live/... calls ../../../modules/...
    shutil.copytree(entry.directory, clone.branch("corpus").path / "corpus" / entry.name)
    sha = clone.push("a stack in the book's live/ and modules/ layout")
    directory = workspace.repo.export_stack(sha, f"corpus/{entry.name}/{entry.root}", tmp_path / "export")
    assert (directory / "main.tf").is_file()
    assert (directory / "../../../modules/landing-zone/iam-user/main.tf").is_file()
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["corpus", "gateway.yaml"]  # not the other stacks
