"""Fail closed where a check cannot be made: what the secret checks cannot read is refused, naming it.

Issue 23: with `engine: terraform`, a file Terraform accepts and python-hcl2 cannot parse (a non-ASCII
name in an object) used to be skipped by the literal-secret check, so a password committed beside it
went unseen. Now such a file is refused before any engine runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.adapters.hcl_sensitivity import find_literal_secrets
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.services.bootstrap import bootstrap_simulator
from gateway.services.proposals import open_proposal
from gateway.services.workspace import Workspace, create_workspace

from .conftest import Clone, add_people

INSTALLED = Path(__file__).resolve().parent.parent / ".tools" / "terraform"
LITERAL = "hunter2-committed-in-git"
# Terraform reads `café` as a name (HCL names are Unicode identifiers); python-hcl2 cannot parse it
UNREADABLE = f'''resource "sim_object" "db" {{
  name    = "db"
  content = jsonencode({{ café = "au lait" }})
  secret  = "{LITERAL}"
}}
'''


def test_a_file_the_literal_secret_check_cannot_read_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"files/db\.tf:3:.*cannot read") as refused:
        find_literal_secrets({"files/db.tf": UNREADABLE, "files/fine.tf": 'resource "a" "b" {\n  name = "x"\n}\n'})
    assert LITERAL not in str(refused.value)


def test_a_readable_file_is_still_judged() -> None:
    [found] = find_literal_secrets({"files/db.tf": UNREADABLE.replace("café", "cafe")})
    assert (found.address, found.attribute) == ("sim_object.db", "secret")


@pytest.fixture
def tf_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    if not (INSTALLED / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform` to run this test")
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5), sample="terraform")
    bootstrap_simulator(ws)
    yield ws
    ws.close()


def test_terraform_engine_refuses_what_the_secret_checks_cannot_read(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    Clone(ws, tmp_path / "clone").branch("unicode").write("stacks/files/db.tf", UNREADABLE).push()
    with pytest.raises(ConfigError, match=r"db\.tf:3:.*cannot read") as refused:
        open_proposal(ws, people.alice, "unicode", "a database object")
    assert LITERAL not in str(refused.value)
    with ws.store.session() as session:
        assert session.list_proposals() == []
