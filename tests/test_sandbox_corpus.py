"""Public Terraform root configurations that nobody here wrote, planned by the sandbox from empty state.

The corpus (tests/fixtures/corpus, origins and licences in its SOURCES.md) is what a team tries
first: HashiCorp's tutorials, terraform-aws-modules examples, "Terraform: Up & Running", terratest's
examples. Each plan must create exactly the resource instances Terraform would (expectations.yaml).
An entry the sandbox cannot plan yet is in KNOWN_GAPS with its first error: it runs as a strict
xfail, so the suite stays green and fails the moment the entry starts passing (then drop it here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters.sandbox.engine import SandboxEngine
from gateway.adapters.sandbox.store import SqlSandboxStore
from gateway.adapters.sql_store import Database
from gateway.domain.plan import ChangeKind

from .corpus import CorpusEntry, created_addresses, load_corpus, plan_entry

# The first error of each entry the sandbox cannot plan today, as measured (one line each).
KNOWN_GAPS: dict[str, str] = {
}

ENTRIES = load_corpus()


def _param(entry: CorpusEntry) -> object:
    marks = [pytest.mark.xfail(reason=KNOWN_GAPS[entry.name], strict=True)] if entry.name in KNOWN_GAPS else []
    return pytest.param(entry, id=entry.name, marks=marks)


@pytest.fixture
def engine(tmp_path: Path) -> SandboxEngine:
    db = Database(f"sqlite:///{tmp_path / 'corpus.db'}")
    db.migrate()
    return SandboxEngine(SqlSandboxStore(db))


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
