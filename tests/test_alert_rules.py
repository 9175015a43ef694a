"""The alert rules are a file an operator loads as it is: deploy/prometheus/alerts.yml.

Debian's promtool checks it and runs its unit tests (alerts.test.yml fires and clears every rule); the README's
metrics table is checked row by row against it (each alert named in the table with the file's exact expression and
`for`, every rule of the file in the table); and every metric a rule reads is one the gateway exposes from its start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import create_app
from gateway.services.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
TABLE_HEADER = "| metric | what | alert when (`deploy/prometheus/alerts.yml`) | what to do |"
NAMED_ALERT = re.compile(r"`(Gateway\w+)`: `((?:\\`|[^`])+)`(?: for (\w+))?")


def rules() -> dict[str, dict[str, Any]]:
    """Every alerting rule of the file, by name."""
    document = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}


def normalised(expr: str) -> str:
    return " ".join(expr.split())


@pytest.fixture(scope="module")
def promtool() -> str:
    found = "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: CI must check the alert rules (apt-get install prometheus)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def test_promtool_finds_the_rules_valid(promtool: str) -> None:
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_every_rule_fires_and_stays_quiet_when_it_should(promtool: str) -> None:
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                            timeout=120, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_rule_is_tested_firing_and_quiet() -> None:
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    untested = {name: sorted(cases.get(name, set())) for name in rules() if cases.get(name) != {True, False}}
    assert not untested, f"rules without a firing and a quiet case (what each has): {untested}"


def _table_rows() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    assert TABLE_HEADER in readme, "the README's metrics table names the rules file in its header"
    table = readme[readme.index(TABLE_HEADER):].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in table]


def expected_cell(*names: str) -> str:
    """The alert column of a row naming these rules, as the file has them (what a failure asks to paste)."""
    found = rules()
    return "; ".join(f"`{n}`: `{normalised(found[n]['expr']).replace('|', chr(92) + '|')}`"
                     + (f" for {found[n]['for']}" if found[n].get("for") else "") for n in names)


def test_the_readme_table_and_the_rules_file_agree_row_by_row() -> None:
    """Checked, not generated: each row's alert column names its rules with the file's expression and `for`."""
    found, named = rules(), []
    for metric, _, alert, _ in _table_rows():
        in_row = NAMED_ALERT.findall(alert)
        names = [name for name, _, _ in in_row]
        named += names
        for name, expr, duration in in_row:
            assert name in found, f"the README names {name}, which alerts.yml does not have"
            rule = found[name]
            assert normalised(expr.replace("\\|", "|")) == normalised(rule["expr"]) and duration == (
                rule.get("for") or ""), f"the README's row for {metric} should read: {expected_cell(*names)}"
            read = {m.removesuffix("_bucket").removesuffix("_count") for m in re.findall(r"gateway_\w+", rule["expr"])}
            assert any(m in metric for m in read), f"{name} reads {sorted(read)}, none of them the row's {metric}"
    assert sorted(named) == sorted(found), f"rules the README's table does not name: {sorted(set(found) - set(named))}"


def test_every_metric_a_rule_reads_is_exposed_from_the_start(workspace: Workspace) -> None:
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        scraped = client.get("/metrics").text
    exposed = set()
    for family in text_string_to_metric_families(scraped):
        exposed.add(family.name)
        exposed.update(sample.name for sample in family.samples)
    read = {m for rule in rules().values() for m in re.findall(r"gateway_\w+", rule["expr"])}
    assert read <= exposed, f"rules read metrics the gateway does not expose: {sorted(read - exposed)}"
