"""Fail closed where a check cannot be made: what the secret checks cannot read is refused, naming it.

Issue 23: with `engine: terraform`, a file Terraform accepts and python-hcl2 cannot parse (a non-ASCII
name in an object) used to be skipped by the literal-secret check, so a password committed beside it
went unseen. Now such a file is refused before any engine runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from gateway.adapters.hcl.sensitivity import find_literal_secrets
from gateway.api.app import create_app
from gateway.domain.errors import ConfigError
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, add_people, sign_in_client

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


def test_terraform_engine_refuses_what_the_secret_checks_cannot_read(tf_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = tf_workspace, add_people(tf_workspace)
    Clone(ws, tmp_path / "clone").branch("unicode").write("stacks/files/db.tf", UNREADABLE).push()
    with pytest.raises(ConfigError, match=r"db\.tf:3:.*cannot read") as refused:
        open_proposal(ws, people.alice, "unicode", "a database object")
    assert LITERAL not in str(refused.value)
    with ws.store.session() as session:
        assert session.proposals.list() == []


# --- a database error is the database's, never "not signed in" --------------------------------


def _rename_table(database_url: str, old: str, new: str) -> None:
    """Break the database under the running app (as an outage or a bad migration would), from outside it."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    engine.dispose()


def test_a_database_error_while_loading_the_signed_in_person_is_503_and_keeps_the_session(
        any_workspace: Workspace) -> None:
    ws = any_workspace
    people = add_people(ws)
    url = ws.settings.db_url
    with TestClient(create_app(ws.settings, workers=0), raise_server_exceptions=False) as client:
        sign_in_client(client, people.tokens["alice"])
        assert client.get("/", follow_redirects=False).status_code == 200
        _rename_table(url, "principals", "principals_away")
        try:
            page = client.get("/", follow_redirects=False)
            api = client.get("/api/v1/proposals", headers={"Authorization": f"Bearer {people.tokens['alice']}"})
        finally:
            _rename_table(url, "principals_away", "principals")
        assert page.status_code == 503, (page.status_code, page.headers.get("location"))
        assert "database" in page.text and "Traceback" not in page.text
        assert api.status_code == 503 and "database" in api.json()["detail"]
        # the outage over, she is still signed in: an outage logs nobody out
        assert client.get("/", follow_redirects=False).status_code == 200
