"""Parsed HCL trees kept on disk (gateway/adapters/hcl/parsed_trees.py): what one process parsed, the next reads
back, and only what is sound: a changed file is parsed again, a damaged entry is ignored and rewritten. Each
run is its own process (the in-memory cache of one process would hide the disk), the parser's calls counted.
"""

from __future__ import annotations

import json
import marshal
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.hcl.parsed_trees import FORMAT
from gateway.services.change.planning import plan_stack
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone

TREES = Path(__file__).parent / "fixtures" / "module_trees"
ROOT = Path(__file__).resolve().parents[1]

READ = """
import json, sys
from pathlib import Path
from lark import Lark, Token, Tree
from gateway.adapters.hcl import reading as hcl
from gateway.adapters.hcl.parsed_trees import keep_parsed_trees_in

keep_parsed_trees_in(Path(sys.argv[1]) if sys.argv[1] else None)
parsed = []
original = Lark.parse
def parse(self, text, *args, **kwargs):
    parsed.append(text)
    return original(self, text, *args, **kwargs)
Lark.parse = parse

def fields(node):  # every field of every node, so a tree read back must equal the parser's in all of them
    if isinstance(node, Tree):
        return [node.data, [fields(c) for c in node.children]]
    return [node.type, str(node), node.start_pos, node.line, node.column, node.end_line, node.end_column, node.end_pos]

files = sorted(Path(sys.argv[2]).rglob("*.tf"))
trees = {p.name: fields(hcl.parse_tree(p.read_text())) for p in files}
documents = {p.name: hcl.hcl_document(p.read_text()) for p in files}
print(json.dumps({"parsed": len(parsed), "trees": trees, "documents": documents}))
"""


def read(cache: Path | None, folder: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", READ, str(cache or ""), str(folder)], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vpc")
    vpc = TREES / "vpc-complete"
    for path in [*sorted((vpc / "examples" / "complete").glob("*.tf")), vpc / "vpc-flow-logs.tf"]:
        shutil.copy(path, folder / path.name)  # five files, one of them empty
    return folder


@pytest.fixture(scope="module")
def fresh(stack: Path) -> dict[str, Any]:
    """The trees and documents the parser makes with no cache."""
    return read(None, stack)


def test_a_tree_one_process_parsed_is_read_back_by_the_next_as_the_parser_made_it(
        stack: Path, fresh: dict[str, Any], tmp_path: Path) -> None:
    first = read(tmp_path / "trees", stack)
    second = read(tmp_path / "trees", stack)
    assert first["parsed"] == fresh["parsed"] == len(list(stack.glob("*.tf")))
    assert second["parsed"] == 0
    assert second["trees"] == first["trees"] == fresh["trees"]
    assert second["documents"] == fresh["documents"]  # python-hcl2's dict form, built from the tree read back


def test_a_changed_file_is_parsed_again(stack: Path, fresh: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "stack"
    shutil.copytree(stack, copy)
    read(tmp_path / "trees", copy)
    main = copy / "main.tf"
    main.write_text(main.read_text() + 'locals {\n  added = 1\n}\n')
    after = read(tmp_path / "trees", copy)
    assert after["parsed"] == 1
    assert after["trees"] == read(None, copy)["trees"]
    assert after["trees"]["main.tf"] != fresh["trees"]["main.tf"]


def _damage(entry: Path, how: str) -> None:
    data = entry.read_bytes()
    body = len(FORMAT) + 32
    if how == "truncated":
        entry.write_bytes(data[:len(data) // 2])
    elif how == "a flipped byte":
        at = body + (len(data) - body) // 2
        entry.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    elif how == "another tree":  # a well-formed payload, not the one its checksum was made for
        entry.write_bytes(data[:body] + marshal.dumps(("body", [])))
    else:
        entry.write_bytes(b"")


def test_a_damaged_entry_is_ignored_and_rewritten(stack: Path, fresh: dict[str, Any], tmp_path: Path) -> None:
    read(tmp_path / "trees", stack)
    entries = sorted(p for p in (tmp_path / "trees").rglob("*") if p.is_file())
    assert len(entries) == len(list(stack.glob("*.tf")))
    for entry, how in zip(entries, ["truncated", "a flipped byte", "another tree", "empty", "truncated"], strict=True):
        _damage(entry, how)
    damaged = read(tmp_path / "trees", stack)
    assert damaged["parsed"] == len(entries)  # nothing damaged was trusted
    assert damaged["trees"] == fresh["trees"]
    assert read(tmp_path / "trees", stack)["parsed"] == 0  # and each entry was written again, whole


def test_a_template_made_while_planning_is_never_kept_on_disk(workspace: Workspace, clone: Clone) -> None:
    secret = str(stack_secrets(workspace.settings, "data")["db_password"])
    clone.branch("template").write("stacks/data/template.tf", (  # the template's text holds the secret itself
        'locals {\n  template = "pw=${var.db_password} %{ if true }on%{ endif }"\n}\n'
        'output "rendered" {\n  value     = templatestring(local.template, {})\n  sensitive = true\n}\n')).push()
    result = plan_stack(workspace, "data", "template")
    assert result.plan.raw["output_changes"]["rendered"]["after_sensitive"] is True
    kept = [p for p in (workspace.settings.home / "parsed-hcl").rglob("*") if p.is_file()]
    assert kept  # the stack's files were kept
    assert [p.name for p in kept if secret.encode() in p.read_bytes()] == []
