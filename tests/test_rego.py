"""Rego policies from the declaration repo's policies/, judged by a real Rego interpreter (regopy) on the
plans of real proposals: deny, warn, overrides, namespaces per stack, data, failing closed, agent-only
rules, a branch that changes a policy, masked secrets, and the `gateway policy` commands.

The proposals are the sample repo's in memory (tests/fakes.py's sandbox_workspace: the real engine, HCL reader and
Rego interpreter over a fake store and repo); a branch that changes a policy, merged through git, and the commands
run on a real workspace."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.adapters.policy import rego as rego_adapter
from gateway.adapters.store.rows import now
from gateway.domain.errors import Refused
from gateway.domain.policy import Severity
from gateway.domain.proposal import Decision, Proposal
from gateway.domain.rego import masked_input
from gateway.services.change.proposals import decide, open_proposal, override_finding
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import FIXTURES, Clone, People, run_cli
from .fakes import FakeClone

BUCKET = '''resource "aws_s3_bucket" "exports" {
  bucket = "orders-exports"
  tags   = merge(local.tags, { "data-classification" = "LEVEL" })
}

resource "aws_s3_bucket_public_access_block" "exports" {
  bucket                  = aws_s3_bucket.exports.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "exports" {
  bucket = aws_s3_bucket.exports.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
  }
}
'''
ROLE = '''resource "aws_iam_role" "ci" {
  name               = "orders-ci"
  assume_role_policy = "{}"
  tags               = local.tags
}
'''


def on_main(ws: Workspace, tmp_path: Path, files: dict[str, str]) -> None:
    """An admin changes main directly (policies are main's, and so in force at once)."""
    clone = Clone(ws, tmp_path / f"main-{len(list(tmp_path.iterdir()))}")
    for path, text in files.items():
        clone.write(path, text)
    clone.push("policy change", author="admin")


def on_fake_main(ws: Workspace, files: dict[str, str]) -> None:
    """on_main, on the sample in memory."""
    clone = FakeClone(ws.repo)  # type: ignore[arg-type]
    for path, text in files.items():
        clone.write(path, text)
    clone.push("policy change", author="admin")


def rego(proposal: Proposal) -> list[tuple[str, str, str]]:
    rules = {"s3-data-classification", "agent-iam", "policy-error"}
    return sorted((f.rule, f.severity.value, f.address) for f in proposal.findings
                  if f.rule in rules or f.rule.startswith("terraform."))


def test_the_sample_policies_warn_with_data_and_an_agent_only_rule_denies_until_overridden(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("exports").write("stacks/app-staging/exports.tf", BUCKET.replace("LEVEL", "top-secret")).push()
    proposal = open_proposal(ws, team.alice, "exports", "an exports bucket")
    assert rego(proposal) == [("s3-data-classification", "warn", "aws_s3_bucket.exports")], proposal.findings
    [warning] = [f for f in proposal.findings if f.rule == "s3-data-classification"]
    assert warning.message.endswith("one of: public, internal, confidential, restricted")  # policies/data
    checkout.branch("internal").write("stacks/app-staging/exports.tf", BUCKET.replace("LEVEL", "internal")).push()
    assert rego(open_proposal(ws, team.alice, "internal", "classified")) == []

    checkout.branch("ci-role").write("stacks/platform/ci.tf", ROLE).push()
    by_person = open_proposal(ws, team.alice, "ci-role", "a role for CI")
    assert rego(by_person) == []  # a person may propose IAM changes
    checkout.branch("agent-role").write("stacks/platform/ci.tf", ROLE).push()
    by_agent = open_proposal(ws, team.agent, "agent-role", "a role for CI", requester=team.alice)
    assert by_agent.proposer.name == "infra-agent" and by_agent.requester.name == "alice"
    assert rego(by_agent) == [("agent-iam", "deny", "aws_iam_role.ci")]
    key = "platform:agent-iam:aws_iam_role.ci"
    with pytest.raises(Refused, match=f"policy denies {key}"):
        decide(ws, team.bob, by_agent.id, Decision.APPROVE, "")
    override_finding(ws, team.frank, by_agent.id, key, "CI role reviewed by security", now() + timedelta(days=1))
    decide(ws, team.bob, by_agent.id, Decision.APPROVE, "")
    decide(ws, team.carol, by_agent.id, Decision.APPROVE, "")  # IAM: high risk, two approvers
    assert apply_proposal(ws, team.alice, by_agent.id).succeeded


def test_a_stack_runs_only_the_packages_gateway_yaml_chooses(ws: Workspace, team: People,
                                                             checkout: FakeClone) -> None:
    yaml = checkout.read("gateway.yaml").replace("    path: stacks/app-staging\n",
                                                 "    path: stacks/app-staging\n    policies: [terraform.agent]\n")
    on_fake_main(ws, {"gateway.yaml": yaml})
    checkout.branch("exports").write("stacks/app-staging/exports.tf", BUCKET.replace("LEVEL", "nope")).push()
    assert rego(open_proposal(ws, team.alice, "exports", "unclassified, but not judged by s3")) == []
    checkout.branch("prod").write("stacks/app-prod/exports.tf", BUCKET.replace("LEVEL", "nope")).push()
    assert rego(open_proposal(ws, team.alice, "prod", "judged by every package")) == [
        ("s3-data-classification", "warn", "aws_s3_bucket.exports")]


def test_a_policy_that_does_not_parse_or_cannot_finish_fails_closed(ws: Workspace, team: People,
                                                                    checkout: FakeClone,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    on_fake_main(ws, {"policies/broken.rego": "package broken\nimport rego.v1\n\ndeny contains m if {\n  m := \n}\n"})
    checkout.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(ws, team.alice, "tags", "cost centre moved")
    [error] = [f for f in proposal.findings if f.rule == "policy-error"]
    assert error.severity == Severity.DENY and error.address == "policies/broken.rego"
    assert "Invalid assignment operator" in error.message and "broken.rego:5" in error.message
    with pytest.raises(Refused, match="policy denies app-staging:policy-error:policies/broken.rego"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "")

    monkeypatch.setattr(rego_adapter, "TIMEOUT_SECONDS", 1.0)
    on_fake_main(ws, {"policies/broken.rego": "package slow\nimport rego.v1\n\n"
                                  "deny contains n if {\n  n := count(numbers.range(1, 2000000000))\n}\n"})
    checkout.branch("tags2").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3005"').push()
    slow = open_proposal(ws, team.alice, "tags2", "cost centre moved again")
    stopped = {f.address: f.message for f in slow.findings if f.rule == "policy-error"}
    assert "the Rego interpreter stopped (signal 9)" in stopped["slow.deny"]  # and so is every rule it was asked
    assert "policies/broken.rego:4" in stopped["slow.deny"]  # the crash names no file: the finding does


def test_a_branch_that_changes_a_policy_is_not_judged_by_it_and_needs_config_approvers(
        workspace: Workspace, people: People, clone: Clone) -> None:
    lenient = clone.read("policies/s3.rego").replace('action in {"create", "update"}', 'action in {"nothing"}')
    clone.branch("lenient").write("policies/s3.rego", lenient) \
        .write("stacks/app-staging/exports.tf", BUCKET.replace("LEVEL", "nope")).push()
    proposal = open_proposal(workspace, people.alice, "lenient", "quieter bucket policy, and a bucket")
    assert rego(proposal) == [("s3-data-classification", "warn", "aws_s3_bucket.exports")]  # main's policy
    with pytest.raises(Refused, match="erin is not in a group allowed to approve changes to protected paths"):
        decide(workspace, people.erin, proposal.id, Decision.APPROVE, "")
    decide(workspace, people.bob, proposal.id, Decision.APPROVE, "")
    assert apply_proposal(workspace, people.alice, proposal.id).succeeded
    clone.repo.git.pull("-q", "origin", "main")
    clone.branch("second").write("stacks/app-staging/more.tf", BUCKET.replace("exports", "more").replace(
        "LEVEL", "nope")).push()
    assert rego(open_proposal(workspace, people.alice, "second", "judged by the merged policy")) == []


def test_secrets_are_masked_in_what_policies_see(ws: Workspace, team: People, checkout: FakeClone) -> None:
    on_fake_main(ws, {"policies/leak.rego": (
        "package leak\nimport rego.v1\n\nwarn contains m if {\n  some rc in input.resource_changes\n"
        "  rc.type == \"aws_db_instance\"\n  m := sprintf(\"password %v, variables %v\", "
        "[rc.change.after.password, input.variables])\n}\n")})
    checkout.branch("db").edit("stacks/data/main.tf", "db.t4g.medium", "db.r6g.large").push()
    proposal = open_proposal(ws, team.alice, "db", "a bigger database")
    [leak] = [f for f in proposal.findings if f.rule == "leak.warn"]
    password = stack_secrets(ws.settings, "data")["db_password"]
    assert "password (sensitive)" in leak.message and password not in json.dumps([f.to_json() for f in proposal.findings])


def test_policy_commands_run_the_tests_and_judge_any_plan(workspace: Workspace, people: People, tmp_path: Path) -> None:
    home, token = workspace.settings.home, people.tokens["alice"]
    tested = run_cli(["policy", "test"], home, token)
    assert tested.returncode == 0, tested.stderr
    assert "PASS terraform.s3.test_an_unclassified_bucket_warns" in tested.stdout and "6/6 passed" in tested.stdout
    only = run_cli(["policy", "test", "--stack", "app-staging"], home, token)
    assert "6/6 passed" in only.stdout

    on_main(workspace, tmp_path, {"policies/wrong_test.rego": "package terraform.s3\nimport rego.v1\n\n"
                                  "test_wrong if {\n  count(warn) == 5 with input.resource_changes as []\n}\n"})
    failing = run_cli(["policy", "test"], home, token)
    assert failing.returncode == 1 and "FAIL terraform.s3.test_wrong" in failing.stdout

    plan = {"format_version": "1.2", "terraform_version": "1.9.0", "resource_changes": [
        {"address": "aws_iam_role.x", "mode": "managed", "type": "aws_iam_role", "name": "x",
         "change": {"actions": ["create"], "before": None, "after": {"name": "x"}, "after_unknown": {}}}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    as_agent = run_cli(["policy", "eval", str(path), "--stack", "platform", "--agent"], home, token)
    assert as_agent.returncode == 0, as_agent.stderr
    assert "DENY agent-iam aws_iam_role.x: an agent may not change IAM resources" in as_agent.stdout
    as_person = run_cli(["policy", "eval", str(path), "--stack", "platform"], home, token)
    assert "0 finding(s)" in as_person.stdout


def test_what_policies_see_of_a_real_plan_has_every_sensitive_value_masked() -> None:
    document = json.loads((FIXTURES / "tfplan" / "tf-plan-format_sensitive.tfplan.json").read_text())
    seen = json.dumps(masked_input(document, frozenset()))
    assert "hxk5iA==" in json.dumps(document) and "87193988" in json.dumps(document)
    assert "hxk5iA==" not in seen and "87193988" not in seen  # prior_state keeps them one level down


def test_conftest_rule_names_count_and_a_missing_package_fails_closed(ws: Workspace, team: People,
                                                                      checkout: FakeClone) -> None:
    yaml = checkout.read("gateway.yaml").replace("    path: stacks/app-prod\n",
                                                 "    path: stacks/app-prod\n    policies: [terraform.nowhere]\n")
    on_fake_main(ws, {"gateway.yaml": yaml, "policies/named.rego": (
        "package terraform.named\nimport rego.v1\n\n  deny_every_queue contains m if {\n"
        "    some rc in input.resource_changes\n    rc.type == \"aws_sqs_queue\"\n"
        "    m := {\"msg\": \"no queues\", \"address\": rc.address}\n  }\n")})
    queue = 'resource "aws_sqs_queue" "q" {\n  name = "q"\n  tags = local.tags\n}\n'
    checkout.branch("q").write("stacks/app-staging/q.tf", queue).push()
    denied = open_proposal(ws, team.alice, "q", "a queue")
    assert ("terraform.named.deny_every_queue", "deny", "aws_sqs_queue.q") in [
        (f.rule, f.severity.value, f.address) for f in denied.findings]
    checkout.branch("prod-q").write("stacks/app-prod/q.tf", queue).push()
    missing = open_proposal(ws, team.alice, "prod-q", "a queue in prod")
    [error] = [f for f in missing.findings if f.rule == "policy-error"]
    assert "no Rego package terraform.nowhere on main" in error.message


def test_a_policy_that_fails_while_evaluated_names_its_file_and_line(ws: Workspace, team: People,
                                                                    checkout: FakeClone) -> None:
    # two values for one complete rule: the interpreter says only "evaluation failed", with no location
    on_fake_main(ws, {"policies/conflict.rego": "package conflict\nimport rego.v1\n\n"
                                  "warn := \"one\" if { true }\n\nwarn := \"two\" if { true }\n"})
    checkout.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(ws, team.alice, "tags", "cost centre moved")
    [error] = [f for f in proposal.findings if f.rule == "policy-error"]
    assert error.severity == Severity.DENY and error.address == "conflict.warn"
    assert "policies/conflict.rego:4" in error.message and "policies/conflict.rego:6" in error.message, error.message
    with pytest.raises(Refused, match="policy denies app-staging:policy-error:conflict.warn"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "")


@pytest.mark.parametrize(("query", "error", "says"), [
    ("data.p.deny", "evaluation failed", "evaluation failed (rule p.deny at policies/p.rego:3, policies/q.rego:2)"),
    ("data.p.warn", "", "evaluation failed (rule p.warn at policies/p.rego, policies/q.rego)"),
    ("data.p.deny", "bad thing\n-- policies/p.rego:3:5", "bad thing\n-- policies/p.rego:3:5"),  # located already
    ("data.gone.deny", "the Rego interpreter stopped (signal 9)",
     "the Rego interpreter stopped (signal 9) (rule gone.deny at no module of its package)"),
])
def test_an_evaluation_error_is_located_at_the_rule(query: str, error: str, says: str) -> None:
    from gateway.domain.rego import RegoModule, RegoPolicies

    policies = RegoPolicies("tree", (RegoModule("policies/p.rego", "package p\n\ndeny contains 1 if { true }\n"),
                                     RegoModule("policies/q.rego", "package p\n  deny contains 2 if { true }\n")), {})
    assert policies.located(query, error) == says


def test_a_policy_sees_the_plan_exactly_as_decoded_every_json_type_included() -> None:
    from gateway.domain.rego import RegoModule, RegoPolicies

    document = {"resource_changes": [{"address": "aws_s3_bucket.é", "change": {
        "actions": ["create"], "before": None, "after": {"count": 3, "big": 10**20, "ratio": 0.25, "on": True,
                                                         "off": False, "tags": {}, "list": [], "name": "naïve ✓"}}}],
        "format_version": "1.2", "variables": {"n": {"value": -(2**63)}}}
    policies = RegoPolicies("echo", (RegoModule("policies/echo.rego", "package echo\n\nseen := input\n"),), {})
    evaluator = rego_adapter.RegoEvaluator(policies)
    try:
        first = evaluator.evaluate(document, ["data.echo.seen"])
        again = evaluator.evaluate({"resource_changes": []}, ["data.echo.seen"])  # the input is replaced, not merged
    finally:
        evaluator.close()
    assert first.errors == {} and first.module_errors == {}
    expected = json.loads(json.dumps(document))
    expected["resource_changes"][0]["change"]["after"]["big"] = float(10**20)  # beyond 64 bits: a JSON number
    assert first.results["data.echo.seen"] == expected
    assert again.results["data.echo.seen"] == {"resource_changes": []}


def test_queries_shared_out_among_processes_each_see_every_module_and_the_whole_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.domain.rego import RegoModule, RegoPolicies

    monkeypatch.setattr(rego_adapter, "_cpus", lambda: 2)
    monkeypatch.setattr(rego_adapter, "SHARE_FROM_BYTES", 0)
    monkeypatch.setattr(rego_adapter, "TIMEOUT_SECONDS", 3.0)
    modules = (RegoModule("policies/lib.rego", "package lib\nimport rego.v1\n\n"
                          "names contains rc.address if {\n  some rc in input.resource_changes\n}\n"),
               RegoModule("policies/a.rego", "package a\nimport rego.v1\n\n"
                          "deny contains m if {\n  some n in data.lib.names\n  m := sprintf(\"a saw %s\", [n])\n}\n"),
               RegoModule("policies/b.rego", "package b\nimport rego.v1\n\n"
                          "deny contains n if {\n  input.slow\n  n := count(numbers.range(1, 2000000000))\n}\n"),
               RegoModule("policies/c.rego", "package c\nimport rego.v1\n\n"
                          "warn contains m if {\n  m := sprintf(\"c saw %d\", [count(input.resource_changes)])\n}\n"))
    policies = RegoPolicies("shared", modules, {})
    queries = policies.queries(None)
    evaluator = rego_adapter.RegoEvaluator(policies)
    try:
        two = {"resource_changes": [{"address": "x.one"}, {"address": "x.two"}]}
        fast = evaluator.evaluate(two, queries)
        assert len(evaluator.pids) == 2
        slow = evaluator.evaluate({"slow": True, "resource_changes": [{"address": "x.three"}]}, queries)
    finally:
        evaluator.close()
    assert fast.errors == {} and fast.results == {"data.a.deny": ["a saw x.one", "a saw x.two"],
                                                  "data.b.deny": [], "data.c.warn": ["c saw 2"]}
    assert set(slow.results) | set(slow.errors) == set(queries)  # every query answered or failed: none forgotten
    assert "the Rego interpreter stopped (signal 9)" in slow.errors["data.b.deny"]
    assert slow.results == {"data.a.deny": ["a saw x.three"], "data.c.warn": ["c saw 1"]}  # the other process's


def test_a_small_plan_is_answered_by_one_evaluator_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.domain.rego import RegoModule, RegoPolicies

    monkeypatch.setattr(rego_adapter, "_cpus", lambda: 2)
    modules = tuple(RegoModule(f"policies/{name}.rego", f"package {name}\nimport rego.v1\n\n"
                               "deny contains rc.address if {\n  some rc in input.resource_changes\n}\n")
                    for name in ("a", "b"))
    policies = RegoPolicies("small", modules, {})
    evaluator = rego_adapter.RegoEvaluator(policies)
    try:
        answer = evaluator.evaluate({"resource_changes": [{"address": "x.one"}]}, policies.queries(None))
        assert len(evaluator.pids) == 1
    finally:
        evaluator.close()
    assert answer.results == {"data.a.deny": ["x.one"], "data.b.deny": ["x.one"]}
