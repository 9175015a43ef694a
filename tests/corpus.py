"""The corpus of public Terraform root configurations (tests/fixtures/corpus) and how to plan one.

Each entry is a configuration nobody here wrote, copied with the local modules it calls (see
SOURCES.md), and what Terraform would plan for it from empty state with its default variables
(expectations.yaml). Shared by tests/test_sandbox_corpus.py and benchmarks/corpus_coverage.py.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import git
import yaml

from gateway.domain.plan import ChangeKind, Plan, load_plan
from gateway.ports import Engine, StackInputs

CORPUS = Path(__file__).parent / "fixtures" / "corpus"


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    root: str  # the root configuration's folder inside the entry (local modules sit beside it)
    creates: int  # resource instances Terraform plans to create, modules' included
    addresses: tuple[str, ...]  # some of them, as Terraform writes them

    @property
    def directory(self) -> Path:
        return CORPUS / self.name


def load_corpus() -> list[CorpusEntry]:
    """Every entry of expectations.yaml, checked to exist on disk."""
    data = yaml.safe_load((CORPUS / "expectations.yaml").read_text())
    entries = []
    for name, spec in data.items():
        entry = CorpusEntry(name=name, root=spec.get("root", "."), creates=int(spec["creates"]),
                            addresses=tuple(spec["addresses"]))
        if not (entry.directory / entry.root).is_dir():
            raise FileNotFoundError(f"expectations.yaml names {name}/{entry.root}, which is not in {CORPUS}")
        entries.append(entry)
    return entries


def plan_entry(engine: Engine, entry: CorpusEntry, workdir: Path) -> Plan:
    """Plan the entry from empty state the way the gateway plans a stack: a copy of its files, no inputs.

    The copy is a git repository of its own, as the entry's origin is, so a root in a subfolder may call
    modules beside it (`../../modules/...`) without reaching outside its repository.
    """
    copy = workdir / entry.name
    shutil.copytree(entry.directory, copy)
    git.Repo.init(copy)
    return load_plan(engine.plan(entry.name, copy / entry.root, StackInputs()).document)


def created_addresses(plan: Plan) -> list[str]:
    """The managed resource instances the plan creates."""
    return [rc.address for rc in plan.resource_changes if rc.mode == "managed" and rc.kind == ChangeKind.CREATE]
