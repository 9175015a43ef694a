"""Auditors get evidence: the change population of a period with every exception kind, built through the real change
path, agrees across the CLI, the API and the page; a reproducible sample's evidence bundles verify offline in a
process that has nothing but the bundle, the public key and the standalone verifier."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.rows import now
from gateway.api.app import create_app
from gateway.domain.change_population import Scope
from gateway.domain.errors import Refused
from gateway.domain.principals import Principal
from gateway.domain.proposal import Decision
from gateway.services.admin import audit as audit_service
from gateway.services.admin.evidence import change_population, resolve_period
from gateway.services.change.main_watch import acknowledge_push, watch_main
from gateway.services.change.proposals import decide, open_proposal, override_finding
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.break_glass import (
    acknowledge_break_glass,
    close_break_glass,
    confirm_break_glass,
    open_break_glass,
    sweep_break_glass,
)
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift import revert_drift
from gateway.services.day_two.drift_records import check_drift
from gateway.services.day_two.rollback import rollback_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace, run_cli, sign_in_client
from .test_change_path import EXTRA_BUCKET
from .test_day_two import on_call

VERIFIER = Path(__file__).resolve().parent.parent / "gateway" / "evidence_verifier.py"


def propose(ws: Workspace, clone: Clone, branch: str, path: str, old: str, new: str, people: People,
            reason: str) -> int:
    clone.repo.git.fetch("-q", "origin")
    clone.branch(branch).edit(path, old, new).push(reason)
    return open_proposal(ws, people.alice, branch, reason).id


def applied(ws: Workspace, people: People, proposal_id: int) -> None:
    report = apply_proposal(ws, people.admin, proposal_id)
    assert report.succeeded, report


def ends_of(today: date) -> dict[str, str]:
    """Yesterday to tomorrow, as the API takes it (`period` is a year, a quarter or a month there)."""
    return {"since": f"{today - timedelta(days=1)}T00:00:00+00:00", "until": f"{today + timedelta(days=2)}T00:00:00+00:00"}


def verify_offline(where: Path, bundle: bytes, key: str) -> subprocess.CompletedProcess[str]:
    """The standalone verifier in a fresh directory holding only it, the bundle and the key, run by an interpreter
    that sees the standard library alone (-I: no environment, no user site; -S: no site-packages, so no gateway)."""
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    shutil.copy(VERIFIER, where / "verify_evidence.py")
    (where / "evidence.json").write_bytes(bundle)
    (where / "gateway-audit.pub").write_text(key)
    return subprocess.run([sys.executable, "-I", "-S", "verify_evidence.py", "evidence.json", "--public-key",
                           "gateway-audit.pub"], cwd=where, capture_output=True, text=True, timeout=60, env={})


def a_period_of_every_exception(ws: Workspace, people: People, tmp_path: Path) -> dict[str, Any]:
    """Changes of every kind an auditor samples first, each through the gateway's own path."""
    clone = Clone(ws, tmp_path / "clone")
    clone.branch("main")
    yaml = clone.read("gateway.yaml")
    for stack, environment in (("app-prod", "production"), ("data", "production"), ("app-staging", "staging")):
        yaml = yaml.replace(f"    path: stacks/{stack}\n", f"    path: stacks/{stack}\n    environment: {environment}\n")
    clone.write("gateway.yaml", yaml + "\nbreak_glass:\n  groups: [oncall]\n  codify_within: 1h\n")
    clone.push("environment tags; on-call may break the glass", author="admin")
    watch_main(ws)
    olga, _ = on_call(ws, people, "olga")
    paul, _ = on_call(ws, people, "paul")
    made: dict[str, Any] = {}

    made["plain"] = propose(ws, clone, "pg", "stacks/data/main.tf", '"16.3"', '"17.2"', people, "PostgreSQL 17")
    decide(ws, people.erin, made["plain"], Decision.APPROVE, "tested on staging")
    applied(ws, people, made["plain"])

    made["override"] = propose(ws, clone, "lb", "stacks/app-prod/main.tf", 'load_balancer_type = "application"',
                               'load_balancer_type = "network"', people, "switch to an NLB")
    override_finding(ws, people.frank, made["override"], "app-prod:protected-resource:aws_lb.web",
                     "NLB migration, change ticket CHG-1042", now() + timedelta(days=1))
    for approver in (people.bob, people.carol):
        decide(ws, approver, made["override"], Decision.APPROVE, "the NLB is ready")
    applied(ws, people, made["override"])

    window = open_break_glass(ws, olga, "app-staging", "incident 7: web tier saturated", timedelta(hours=2))
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.large"})
    close_break_glass(ws, olga, window.id, "load is back to normal")
    made["codify"] = codify_drift(ws, olga, "app-staging").id
    decide(ws, people.bob, made["codify"], Decision.APPROVE, "what incident 7 needed")
    applied(ws, people, made["codify"])
    assert sweep_break_glass(ws) == [f"window {window.id} settled"]
    made["codified_window"] = window.id

    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.medium"})
    check_drift(ws, people.admin, "app-staging")
    revert = revert_drift(ws, people.admin, "app-staging").proposal
    assert revert is not None
    made["revert"] = revert.id
    decide(ws, people.bob, made["revert"], Decision.APPROVE, "back to what main says")
    applied(ws, people, made["revert"])

    made["rollback"] = rollback_proposal(ws, people.alice, made["plain"], "17.2 broke the reporting job").id
    decide(ws, people.erin, made["rollback"], Decision.APPROVE, "roll it back")
    applied(ws, people, made["rollback"])
    return {**made, **outside_the_gateway(ws, people, clone, tmp_path, olga, paul)}


def outside_the_gateway(ws: Workspace, people: People, clone: Clone, tmp_path: Path, olga: Principal,
                        paul: Principal) -> dict[str, Any]:
    """A hotfix pushed to main and acknowledged, a break-glass window left past its deadline, a failed apply."""
    made: dict[str, Any] = {}
    pusher = Clone(ws, tmp_path / "pusher")
    pusher.edit("stacks/network/main.tf", '"cc-1001"', '"cc-1002"')
    pusher.repo.git.add("-A")
    pusher.repo.git.execute(["git", "commit", "-qm", "hotfix the cost centre"], env=committer_env("mallory", "m@x.io"))
    pusher.repo.git.push("-q", "origin", "HEAD:main")
    made["pushed"] = pusher.repo.head.commit.hexsha
    made["after_push"] = propose(ws, clone, "vpc", "stacks/network/main.tf", '"orders-vpc"', '"orders-vpc-eu"', people,
                                 "name the VPC by region")
    decide(ws, people.bob, made["after_push"], Decision.APPROVE, "ok")
    with pytest.raises(Refused, match="pushed to main outside"):
        apply_proposal(ws, people.admin, made["after_push"])
    acknowledge_push(ws, people.bob, made["pushed"][:12], "the cost centre fix is what runs; kept")
    applied(ws, people, made["after_push"])

    clone.repo.git.fetch("-q", "origin")  # a drill: the codify deadline cut to a second, by hand on main
    clone.branch("main").edit("gateway.yaml", "codify_within: 1h", "codify_within: 1s").push("drill", author="admin")
    [drill] = watch_main(ws)
    acknowledge_push(ws, people.bob, drill["sha"][:12], "the break-glass drill's deadline")
    made["drill"] = drill["sha"]
    window = open_break_glass(ws, olga, "app-prod", "incident 8: the load balancer", timedelta(hours=1))
    confirm_break_glass(ws, paul, window.id)
    ws.simulator.edit_object("app-prod", "aws_instance.web[0]", {"instance_type": "t3.xlarge"})
    close_break_glass(ws, olga, window.id, "over")
    time.sleep(1.2)  # past the codify deadline
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]
    acknowledge_break_glass(ws, paul, window.id, "codify ticket OPS-12")
    made["overdue_window"] = window.id

    clone.repo.git.fetch("-q", "origin")
    clone.branch("two").write("stacks/app-staging/extra.tf", EXTRA_BUCKET).push("a bucket with versioning")
    made["partial"] = open_proposal(ws, people.alice, "two", "a bucket with versioning").id
    decide(ws, people.bob, made["partial"], Decision.APPROVE, "ok")
    ws.simulator.inject_fault("app-staging", "aws_s3_bucket_versioning.extra", "AccessDenied")
    assert not apply_proposal(ws, people.admin, made["partial"]).succeeded
    return made


@pytest.fixture(scope="module")
def period(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, People, dict[str, Any]]]:
    """One workspace whose trail holds a period of every exception kind (built once: it takes a while)."""
    tmp_path = tmp_path_factory.mktemp("period")
    ws = make_workspace(tmp_path / "home")
    people = add_people(ws)
    yield ws, people, a_period_of_every_exception(ws, people, tmp_path)
    ws.close()


def test_a_period_with_every_exception_kind_agrees_across_the_cli_the_api_and_the_page(
        period: tuple[Workspace, People, dict[str, Any]]) -> None:
    ws, people, made = period
    today = now().date()
    asked = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
    ends = ends_of(today)  # the same period to the API, which takes a named period or the ends
    population = change_population(ws, people.dana, resolve_period(ws, asked))
    rows = {r.proposal_id: r for r in population.rows}
    changes = ("plain", "override", "codify", "revert", "rollback", "after_push", "partial")
    assert sorted(rows) == sorted(made[k] for k in changes)
    assert [rows[made[k]].flags for k in changes] == [
        (), ("override",), ("break-glass",), ("drift-revert",), ("rollback",), ("pushed-outside",), ("partial",)]
    assert rows[made["partial"]].outcome == "partial" and rows[made["plain"]].outcome == "applied"
    override = rows[made["override"]]
    assert [(o.finding, o.by) for o in override.overrides] == [("app-prod:protected-resource:aws_lb.web", "frank")]
    assert {a.by for a in override.approvals} == {"bob", "carol"} and override.required_approvals == 2
    assert override.approved_commit == override.applied_commit and override.risk == "high"
    assert rows[made["rollback"]].rolls_back == made["plain"]
    assert rows[made["revert"]].requester == "gateway" and rows[made["plain"]].environments == ("production",)

    kinds = [x.kind for x in population.exceptions]
    assert kinds == sorted(kinds, key=["override", "break-glass", "pushed-outside", "drift-revert", "rollback",
                                       "partial-apply"].index)  # exceptions in the order an auditor samples them
    assert set(kinds) == {"override", "break-glass", "pushed-outside", "drift-revert", "rollback", "partial-apply"}
    said = {x.kind: [y.summary for y in population.exceptions if y.kind == x.kind] for x in population.exceptions}
    codified, overdue = sorted(said["break-glass"])  # window ids in order: the codified one was opened first
    assert f"break-glass window {made['codified_window']} on app-staging" in codified
    assert f"codified by proposal {made['codify']}" in codified and "settled at" in codified
    assert f"break-glass window {made['overdue_window']} on app-prod" in overdue and "confirmed by paul" in overdue
    assert "overdue since" in overdue and "acknowledged by paul" in overdue and "codify ticket OPS-12" in overdue
    settings, push, drill = said["pushed-outside"]  # gateway.yaml by hand, a hotfix, a drill's deadline
    assert "by admin" in settings and "NOT acknowledged" in settings
    assert made["pushed"][:12] in push and made["drill"][:12] in drill and "acknowledged by bob" in drill
    assert "by mallory" in push and "acknowledged by bob" in push and "cost centre fix" in push
    assert [c.passed for c in population.checks] == [True, True]
    assert population.checks[0].checked == 7 and population.checks[1].checked == 8  # applies; approvals

    cli = run_cli(["audit", "population", "--period", asked, "--format", "json"], ws.settings.home,
                  token=people.tokens["dana"])
    assert cli.returncode == 0, cli.stderr
    auth = {"Authorization": f"Bearer {people.tokens['dana']}"}
    with TestClient(create_app(ws.settings, workers=0)) as client:
        api = client.get("/api/v1/audit/population", params=ends, headers=auth).json()
        api_csv = client.get("/api/v1/audit/population", params={**ends, "format": "csv"}, headers=auth)
        production = client.get("/api/v1/audit/population", params={**ends, "environment": "production"},
                                headers=auth).json()
        sign_in_client(client, people.tokens["dana"])
        page = client.get("/audit", params={"period": asked}).text
        page_json = client.get("/audit/population.json", params={"period": asked}).json()
        page_csv = client.get("/audit/population.csv", params={"period": asked}).text
    assert json.loads(cli.stdout) == page_json == population.to_json()  # one function, the same numbers
    assert api["period"]["since"] == population.period.since and api["period"]["until"] == population.period.until
    assert {**api, "period": None} == {**page_json, "period": None}  # the API names the period by its ends
    cli_csv = run_cli(["audit", "population", "--period", asked, "--format", "csv"], ws.settings.home,
                      token=people.tokens["dana"])
    assert cli_csv.stdout.splitlines() == api_csv.text.splitlines() == page_csv.splitlines()
    assert len(page_csv.splitlines()) == 8  # a header and a row a change
    assert [c["proposal"] for c in production["changes"]] == sorted(made[k] for k in ("plain", "override", "rollback"))

    # the page opens on the exceptions, in the same words, then the checks, with the same figures
    assert page.index('id="exceptions"') < page.index('id="checks"') < page.index('id="period-form"')
    on_page = [html.unescape(re.sub(r"<[^>]+>", "", s)) for s in
               re.findall(r'<tr class="exception [^"]+"[^>]*>.*?<td>(?:<a [^>]+>\d+</a>)?</td><td>(.*?)</td></tr>', page,
                          re.S)]
    assert on_page == [x.summary for x in population.exceptions]
    assert "<strong>7</strong> change(s)" in page and "7 applies" in page
    assert page.count(">PASS<") == 4  # the verdicts under the heading, and the checks' table


def test_a_sample_is_reproducible_everywhere_and_each_bundle_verifies_offline(
        period: tuple[Workspace, People, dict[str, Any]], tmp_path: Path) -> None:
    ws, people, made = period
    audit_service.sign_checkpoint(ws, people.dana)
    today = now().date()
    asked = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
    out = tmp_path / "evidence"
    cli = run_cli(["audit", "sample", "--period", asked, "--size", "3", "--seed", "soc2-2026-q4", "--out", str(out)],
                  ws.settings.home, token=people.tokens["dana"])
    assert cli.returncode == 0, cli.stderr
    chosen = [int(n) for n in re.search(r"seed 'soc2-2026-q4': ([\d, ]+)", cli.stdout).group(1).split(", ")]
    with TestClient(create_app(ws.settings, workers=0)) as client:
        api = client.post("/api/v1/audit/samples", json={**ends_of(today), "size": 3, "seed": "soc2-2026-q4"},
                          headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        sign_in_client(client, people.tokens["dana"])
        form = client.get("/audit", params={"period": asked}).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)
        page = client.post("/audit/sample", data={"csrf": csrf, "period": asked, "size": "3",
                                                  "seed": "soc2-2026-q4"}).text
        public_key = client.get("/audit/public-key.pem").text
    assert api.status_code == 201 and api.json()["selected"] == chosen
    assert [int(n) for n in re.findall(r'<tr><td>(\d+)</td><td><a href="/audit/evidence/', page)] == chosen
    assert api.json()["population"] == 7 and len(chosen) == 3
    with ws.store.session(readonly=True) as session:
        draws = session.audit.events(kind="audit.sampled")
    assert [(d.actor, d.payload["seed"], d.payload["selected"]) for d in draws] == [("dana", "soc2-2026-q4", chosen)] * 3

    rows = {r.proposal_id: r for r in change_population(ws, people.dana, resolve_period(ws, asked), Scope()).rows}
    for pid in chosen:
        bundle = (out / f"evidence-{pid}.json").read_bytes()
        checked = verify_offline(tmp_path / f"offline-{pid}", bundle, public_key)
        assert checked.returncode == 0, checked.stderr
        assert f"evidence of proposal {pid} " in checked.stdout and "VERIFIED" in checked.stdout
        content = json.loads(bundle)
        assert content["change"] == rows[pid].to_json() and content["sample"]["seed"] == "soc2-2026-q4"
        assert f"Evidence: proposal {pid}" in (out / f"evidence-{pid}.html").read_text()
    # every change of the period has evidence, whatever its kind
    for pid in sorted(set(rows) - set(chosen)):
        answer = run_cli(["audit", "evidence", str(pid)], ws.settings.home, token=people.tokens["dana"])
        assert answer.returncode == 0, answer.stderr
        assert verify_offline(tmp_path / f"offline-{pid}", answer.stdout.encode(), public_key).returncode == 0
    override = json.loads(run_cli(["audit", "evidence", str(made["override"])], ws.settings.home,
                                  token=people.tokens["dana"]).stdout)
    assert [d["by"] for d in override["decisions"]] == ["bob", "carol"]
    assert all(d["counted_for_applies"] for d in override["decisions"])
    assert "policy.override" in [line["kind"] for line in override["story"]]
    assert "DESTROYS aws_lb.web" in override["plans"][0]["preview"] or "aws_lb.web" in override["plans"][0]["preview"]
