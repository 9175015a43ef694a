"""A change's story reads at any size: `gateway audit show` and the story page give a long list's count, its first
few and "and 295 more", the whole list on demand, and never cut one silently; `gateway audit list` takes every
filter the API takes and says when more events follow."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, run_cli, sign_in_client
from .test_audit import run_one_change

GROUPS = 300


def security_groups(count: int) -> str:
    return "".join(f'resource "aws_security_group" "g{i}" {{\n  name   = "g{i}"\n  vpc_id = var.vpc_id\n'
                   f'  tags   = local.tags\n}}\n' for i in range(count))


def test_a_300_resource_change_reads_summarised_and_whole_on_demand(workspace: Workspace, people: People,
                                                                     clone: Clone) -> None:
    clone.branch("groups").write("stacks/app-staging/groups.tf", security_groups(GROUPS)).push("300 groups")
    pid = open_proposal(workspace, people.alice, "groups", "a group per tenant").id
    shown = run_cli(["audit", "show", str(pid)], workspace.settings.home, token=people.tokens["dana"])
    assert shown.returncode == 0, shown.stderr
    first = ", ".join(sorted(f"aws_security_group.g{i}" for i in range(GROUPS))[:5])  # in the plan's order
    assert f"changed: {GROUPS}: {first}, and {GROUPS - 5} more" in shown.stdout
    assert re.search(rf"risk\.reasons: {GROUPS}: aws_security_group\.g0: .*, and {GROUPS - 5} more", shown.stdout)
    assert "more items in long lists above: --full lists every one" in shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) < 1000  # no list on one endless line
    assert "aws_security_group.g299" not in shown.stdout
    full = run_cli(["audit", "show", str(pid), "--full"], workspace.settings.home, token=people.tokens["dana"])
    lines = full.stdout.splitlines()
    assert all(f"          aws_security_group.g{i}" in lines for i in range(GROUPS))  # every address, a line each
    assert f"        risk.reasons: {GROUPS}" in lines

    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["dana"])
        page = client.get("/audit/events", params={"proposal": pid}).text
    assert f"{GROUPS}: {first}<details" in page and f"<summary>and {GROUPS - 5} more</summary>" in page
    assert "<li>aws_security_group.g299</li>" in page  # the rest is on the page, folded: nothing is cut
    assert f'href="/audit/evidence/{pid}"' in page


def test_audit_list_takes_every_filter_the_api_takes(workspace: Workspace, people: People, tmp_path: Path) -> None:
    pid = run_one_change(workspace, people, tmp_path)
    with workspace.store.session(readonly=True) as session:
        [approval] = session.audit.events(kind="approval")
    until = approval.at  # up to the approval, to the microsecond
    asked = [({"outcome": "refused"}, ["--outcome", "refused"]),
             ({"action": "apply"}, ["--action", "apply"]),
             ({"address": "aws_db_instance.orders"}, ["--address", "aws_db_instance.orders"]),
             ({"address": "aws_db_instance.*"}, ["--address", "aws_db_instance.*"]),
             ({"until": until, "proposal": pid}, ["--until", until, "--proposal", str(pid)]),
             ({"person": "erin", "stack": "data"}, ["--person", "erin", "--stack", "data"]),
             ({"since": until, "action": "apply", "outcome": "succeeded"},
              ["--since", until, "--action", "apply", "--outcome", "succeeded"]),
             ({"after": 3, "limit": 4}, ["--after", "3", "--limit", "4"])]
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        for params, options in asked:
            api = client.get("/api/v1/audit/events", params=params,
                             headers={"Authorization": f"Bearer {people.tokens['dana']}"})
            cli = run_cli(["audit", "list", *options], workspace.settings.home, token=people.tokens["dana"])
            assert cli.returncode == 0, (options, cli.stderr)
            assert [int(line.split()[0]) for line in cli.stdout.splitlines()] == [e["seq"] for e in api.json()], options
            assert api.json(), options  # each filter finds something in one change's story
    paged = run_cli(["audit", "list", "--after", "3", "--limit", "4"], workspace.settings.home,
                    token=people.tokens["dana"])
    assert "4 events shown; more may follow: --after 7" in paged.stderr  # a full page never ends silently
