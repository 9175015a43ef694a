"""What keeps the sandbox fast on real module trees and on big stacks, guarded where it could regress silently:
each file is parsed once per plan (whatever reads it: the secret checks, the backend check, the engine, and a
module installed twice by `terraform init`), and an apply writes the simulated cloud and its state in one
transaction, not one per resource. Timings themselves are benchmarks (benchmarks/sandbox_module_trees.py,
benchmarks/plan_large_stack.py), not tests.
"""

from __future__ import annotations

import shutil
import uuid
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
from lark import Lark
from sqlalchemy import event, func, select

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.sandbox.state import StackState
from gateway.adapters.engines.sandbox.store import SqlSandboxStore
from gateway.adapters.store.schema import Database, sandbox_objects
from gateway.domain.plan import ChangeKind, load_plan
from gateway.ports import StackInputs
from gateway.services.change.planning import plan_stack
from gateway.services.workspace import Workspace

from .conftest import Clone

TREES = Path(__file__).parent / "fixtures" / "module_trees"


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the HCL grammar parses from now on (python-hcl2's own parser included: it is lark's too)."""
    texts: list[str] = []
    original = Lark.parse

    def parse(self: Lark, text: str, *args: Any, **kwargs: Any) -> Any:
        texts.append(text)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(Lark, "parse", parse)
    return texts


class CountingStore(SqlSandboxStore):
    """The real SQL store, counting the writes the engine asks of it."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.writes: Counter[str] = Counter()

    def write_state(self, stack: str, state: StackState, expected_serial: int,
                    changed: Collection[str] | None = None) -> None:
        self.writes["write_state"] += 1
        super().write_state(stack, state, expected_serial, changed)

    def write_apply(self, stack: str, state: StackState, expected_serial: int, changed: Collection[str],
                    objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> None:
        self.writes["write_apply"] += 1
        super().write_apply(stack, state, expected_serial, changed, objects)

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        self.writes["put_object"] += 1
        super().put_object(rtype, rid, attributes)

    def delete_object(self, rtype: str, rid: str) -> None:
        self.writes["delete_object"] += 1
        super().delete_object(rtype, rid)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    db = Database(f"sqlite:///{tmp_path / 'sandbox.db'}")
    db.migrate()
    return CountingStore(db)


def test_a_plan_through_the_gateway_parses_each_file_once(workspace: Workspace, clone: Clone,
                                                          parsed: list[str]) -> None:
    nonce = uuid.uuid4().hex  # texts no earlier test parsed
    files = {  # words that make the literal-secret check and the backend check read a file: "token", "backend"
        "stacks/app-staging/queues.tf": f'# {nonce} queues\nresource "aws_sqs_queue" "jobs" {{\n  name = "jobs"\n'
                                        '  tags = { token_rotation = "weekly" }\n}\n',
        "stacks/app-staging/topics.tf": f'# {nonce} topics\nresource "aws_sns_topic" "events" {{\n  name = "events"\n}}\n',
        "stacks/app-staging/settings.tf": f'# {nonce} settings: the backend is the gateway\'s\nterraform {{\n'
                                          '  required_version = ">= 1.0"\n}\n',
    }
    branch = clone.branch("more")
    for path, text in files.items():
        branch.write(path, text)
    branch.push()
    result = plan_stack(workspace, "app-staging", "more")
    assert result.plan.find("aws_sqs_queue.jobs").kind == ChangeKind.CREATE
    # the secret checks, the backend check and the engine all read these files
    assert Counter(name for text in parsed for name in ("queues", "topics", "settings") if nonce in text
                   and f"{nonce} {name}" in text) == {"queues": 1, "topics": 1, "settings": 1}


def test_a_module_installed_twice_is_parsed_once(store: CountingStore, tmp_path: Path, parsed: list[str]) -> None:
    stack = tmp_path / "eks"
    shutil.copytree(TREES / "eks-managed-node-group", stack)
    marker = f"# {uuid.uuid4().hex}\n"  # every text new to this process, so each counts
    for path in stack.rglob("*.tf"):
        path.write_text(marker + path.read_text())
    texts = {p.read_text() for p in stack.rglob("*.tf")}
    SandboxEngine(store).plan("eks", stack, StackInputs())
    files = [t for t in parsed if t.startswith(marker)]
    # terraform init copies the eks module once per call: 67 files, 35 different texts, each parsed once
    assert len(list(stack.rglob("*.tf"))) > len(texts)
    assert len(files) == len(set(files)) == len(texts)


FLAT = '''
resource "aws_vpc" "main" {
  cidr_block = "10.0.0.0/16"
}
resource "aws_subnet" "s" {
  count      = 30
  vpc_id     = aws_vpc.main.id
  cidr_block = cidrsubnet(aws_vpc.main.cidr_block, 8, count.index)
}
resource "aws_s3_bucket" "b" {
  count  = 9
  bucket = "logs-${count.index}"
}
'''


def _objects(store: SqlSandboxStore) -> int:
    with store.db.transaction(readonly=True) as conn:
        return int(conn.scalar(select(func.count()).select_from(sandbox_objects)) or 0)


def test_an_apply_writes_the_cloud_and_the_state_in_one_transaction(store: CountingStore, tmp_path: Path) -> None:
    stack = tmp_path / "flat"
    stack.mkdir()
    (stack / "main.tf").write_text(FLAT)
    engine = SandboxEngine(store)
    planned = engine.plan("flat", stack, StackInputs())
    transactions: list[bool] = []
    event.listen(store.db.engine, "begin", lambda conn: transactions.append(True))
    outcome = engine.apply("flat", stack, planned.document, planned.state_serial, StackInputs())
    assert outcome.succeeded, outcome.error
    assert store.writes == {"write_apply": 1}
    assert len(transactions) <= 4 + 9  # the state, the faults, the one write; a named bucket's id is checked
    state = store.read_state("flat")
    assert state is not None and len(state.resources) == 40 and state.serial == outcome.state_serial == 40  # raised by each step, as before
    assert _objects(store) == 40
    assert not load_plan(engine.plan("flat", stack, StackInputs()).document).has_changes


def test_a_failed_apply_keeps_what_it_did_in_the_cloud_and_the_state_alike(store: CountingStore,
                                                                          tmp_path: Path) -> None:
    stack = tmp_path / "flat"
    stack.mkdir()
    (stack / "main.tf").write_text(FLAT)
    engine = SandboxEngine(store)
    planned = engine.plan("flat", stack, StackInputs())
    store.inject_fault("flat", "aws_subnet.s[12]", "the provider said no")
    outcome = engine.apply("flat", stack, planned.document, planned.state_serial, StackInputs())
    assert not outcome.succeeded and outcome.failed_address == "aws_subnet.s[12]"
    assert store.writes == {"write_apply": 1}
    state = store.read_state("flat")
    assert state is not None and sorted(state.resources) == sorted(outcome.applied)
    assert _objects(store) == len(outcome.applied)  # nothing in the cloud that the state does not know
    retried = engine.plan("flat", stack, StackInputs())
    assert load_plan(retried.document).counts() == {ChangeKind.CREATE: 40 - len(outcome.applied)}
