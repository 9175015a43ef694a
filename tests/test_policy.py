"""Guardrails on every plan: each rule fires where it should and stays quiet where it should,
on plans the sandbox engine makes and on real AWS plans from public repositories."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.policy import checkov as checkov_adapter
from gateway.adapters.policy.checkov import parse_checkov_report, run_checkov
from gateway.adapters.store.rows import now
from gateway.domain.errors import Refused
from gateway.domain.plan import Plan, decode_plan_bytes, load_plan
from gateway.domain.policy import Finding, PolicyContext, PolicySettings, Severity, evaluate_plan
from gateway.domain.principals import Role
from gateway.domain.proposal import Decision
from gateway.domain.risk import RiskLevel, assess_risk
from gateway.ports import StackInputs
from gateway.services.change.proposals import decide, open_proposal, override_finding
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace

from .conftest import FIXTURES, People
from .fakes import FakeClone, FakeSandboxStore, person, sandbox_workspace

TAGS = 'tags = { owner = "team", "cost-centre" = "cc-1" }'
SETTINGS = PolicySettings(approved_instance_types=frozenset({"t3.small", "t3.medium"}), max_deletes=3)


@pytest.fixture
def engine() -> SandboxEngine:
    return SandboxEngine(FakeSandboxStore())  # its store in memory: the rules judge what it plans


def sandbox_plan(engine: SandboxEngine, tmp_path: Path, hcl: str) -> Plan:
    stack = tmp_path / "stack"
    stack.mkdir(exist_ok=True)
    (stack / "main.tf").write_text(hcl)
    return load_plan(engine.plan("s", stack, StackInputs()).document)


def findings(plan: Plan, agent: bool = False, protected: frozenset[str] = frozenset()) -> list[tuple[str, str, str]]:
    return [(f.severity.value, f.rule, f.address)
            for f in evaluate_plan(plan, PolicyContext("s", SETTINGS, protected, agent))]


def rules_fired(plan: Plan, **kwargs: Any) -> set[str]:
    return {rule for _, rule, _ in findings(plan, **kwargs)}


def fixture_plan(name: str) -> Plan:
    return load_plan(decode_plan_bytes((FIXTURES / "tfplan" / name).read_bytes()))


GOOD_BUCKET = f'''
resource "aws_s3_bucket" "b" {{
  bucket = "b"
  {TAGS}
}}
resource "aws_s3_bucket_public_access_block" "b" {{
  bucket                  = aws_s3_bucket.b.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = {{restrict}}
}}
resource "aws_s3_bucket_server_side_encryption_configuration" "b" {{
  bucket = aws_s3_bucket.b.id
  rule {{
    apply_server_side_encryption_by_default {{
      sse_algorithm = "aws:kms"
    }}
  }}
}}
'''


def test_a_compliant_bucket_is_quiet(engine: SandboxEngine, tmp_path: Path) -> None:
    assert findings(sandbox_plan(engine, tmp_path, GOOD_BUCKET.replace("{restrict}", "true"))) == []


def test_public_bucket_rules_fire(engine: SandboxEngine, tmp_path: Path) -> None:
    plan = sandbox_plan(engine, tmp_path, GOOD_BUCKET.replace("{restrict}", "false").replace(
        'bucket = "b"\n', 'bucket = "b"\n  acl = "public-read"\n'))
    assert ("deny", "s3-public-acl", "aws_s3_bucket.b") in findings(plan)
    assert ("deny", "s3-public-access-block", "aws_s3_bucket_public_access_block.b") in findings(plan)
    missing = sandbox_plan(engine, tmp_path, f'resource "aws_s3_bucket" "c" {{\n  bucket = "c"\n  {TAGS}\n}}\n')
    assert ("deny", "s3-public-access-block", "aws_s3_bucket.c") in findings(missing)


def test_unencrypted_storage_fires_for_buckets_volumes_and_databases(engine: SandboxEngine, tmp_path: Path) -> None:
    plan = sandbox_plan(engine, tmp_path, f'''
resource "aws_s3_bucket" "c" {{
  bucket = "c"
  {TAGS}
}}
resource "aws_ebs_volume" "v" {{
  availability_zone = "eu-west-1a"
  size              = 10
  {TAGS}
}}
resource "aws_ebs_volume" "ok" {{
  availability_zone = "eu-west-1a"
  size              = 10
  encrypted         = true
  {TAGS}
}}
resource "aws_db_instance" "d" {{
  identifier              = "d"
  engine                  = "postgres"
  instance_class          = "db.t4g.medium"
  deletion_protection     = true
  backup_retention_period = 7
  {TAGS}
}}
''')
    fired = [(rule, address) for _, rule, address in findings(plan) if rule == "encryption-at-rest"]
    assert sorted(fired) == [("encryption-at-rest", "aws_db_instance.d"), ("encryption-at-rest", "aws_ebs_volume.v"),
                             ("encryption-at-rest", "aws_s3_bucket.c")]


@pytest.mark.parametrize("cidr,ports,fires", [
    ("0.0.0.0/0", (22, 22), True),
    ("::/0", (0, 65535), True),
    ("0.0.0.0/0", (443, 443), False),
    ("0.0.0.0/0", (80, 80), False),
    ("10.0.0.0/8", (22, 22), False),
])
def test_open_ingress(engine: SandboxEngine, tmp_path: Path, cidr: str, ports: tuple[int, int], fires: bool) -> None:
    field = "ipv6_cidr_blocks" if ":" in cidr else "cidr_blocks"
    plan = sandbox_plan(engine, tmp_path, f'''
resource "aws_security_group_rule" "r" {{
  type              = "ingress"
  from_port         = {ports[0]}
  to_port           = {ports[1]}
  protocol          = "tcp"
  {field}       = ["{cidr}"]
  security_group_id = "sg-1"
}}
resource "aws_security_group" "g" {{
  name = "g"
  {TAGS}
  ingress {{
    from_port   = {ports[0]}
    to_port     = {ports[1]}
    protocol    = "tcp"
    {field} = ["{cidr}"]
  }}
}}
''')
    fired = {a for _, rule, a in findings(plan) if rule == "open-ingress"}
    assert fired == ({"aws_security_group_rule.r", "aws_security_group.g"} if fires else set())


def test_required_tags_fire_on_taggable_resources_only(engine: SandboxEngine, tmp_path: Path) -> None:
    plan = sandbox_plan(engine, tmp_path, '''
resource "aws_vpc" "v" {
  cidr_block = "10.0.0.0/16"
  tags       = { owner = "team" }
}
resource "aws_route53_record" "r" {
  zone_id = "Z1"
  name    = "x.example.com"
  type    = "A"
}
''')
    assert findings(plan) == [("deny", "required-tags", "aws_vpc.v")]
    custom = evaluate_plan(plan, PolicyContext("s", PolicySettings(required_tags=("owner",))))
    assert custom == []


def test_database_safety(engine: SandboxEngine, tmp_path: Path) -> None:
    plan = sandbox_plan(engine, tmp_path, f'''
resource "aws_db_instance" "d" {{
  identifier              = "d"
  engine                  = "postgres"
  instance_class          = "db.t4g.medium"
  storage_encrypted       = true
  backup_retention_period = 0
  {TAGS}
}}
''')
    assert rules_fired(plan) == {"db-deletion-protection", "db-backups", "instance-type"}


def test_instance_type_outside_the_approved_set_warns(engine: SandboxEngine, tmp_path: Path) -> None:
    hcl = f'resource "aws_instance" "i" {{\n  ami = "ami-1"\n  instance_type = "{{t}}"\n  {TAGS}\n}}\n'
    assert findings(sandbox_plan(engine, tmp_path, hcl.replace("{t}", "p5.48xlarge"))) == [
        ("warn", "instance-type", "aws_instance.i")]
    assert findings(sandbox_plan(engine, tmp_path, hcl.replace("{t}", "t3.small"))) == []


def _plan_with(changes: list[dict[str, Any]]) -> Plan:
    return load_plan({"format_version": "1.2", "resource_changes": changes})


def _rc(address: str, rtype: str, actions: list[str], before: Any, after: Any) -> dict[str, Any]:
    return {"address": address, "type": rtype, "name": address.split(".")[1].split("[")[0], "mode": "managed",
            "change": {"actions": actions, "before": before, "after": after}}


def test_protected_resource_and_blast_radius() -> None:
    plan = fixture_plan("opentofu_show-json_requires-replace.json")
    assert ("deny", "protected-resource", "test_instance.test") in findings(plan, protected=frozenset({"test_instance.test"}))
    assert findings(plan) == []
    many = _plan_with([_rc(f"aws_sqs_queue.q{i}", "aws_sqs_queue", ["delete"], {"name": f"q{i}"}, None) for i in range(4)])
    assert ("deny", "blast-radius", "aws_sqs_queue.q0") in findings(many)
    assert "blast-radius" not in rules_fired(_plan_with(many.raw["resource_changes"][:3]))


@pytest.mark.parametrize("before,after,agent,fires", [
    (2, 4, True, True), (2, 3, True, False), (2, 4, False, False), (4, 2, True, False),
])
def test_agent_capacity_circuit_breaker(before: int, after: int, agent: bool, fires: bool) -> None:
    plan = _plan_with([_rc("aws_autoscaling_group.web", "aws_autoscaling_group", ["update"],
                           {"desired_capacity": before, "max_size": 10, "tags": []},
                           {"desired_capacity": after, "max_size": 10, "tags": []})])
    assert ("agent-capacity-growth" in rules_fired(plan, agent=agent)) is fires


def test_agent_instance_count_growth(engine: SandboxEngine, tmp_path: Path) -> None:
    hcl = f'resource "aws_instance" "w" {{\n  count = {{n}}\n  ami = "ami-1"\n  instance_type = "t3.small"\n  {TAGS}\n}}\n'
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "main.tf").write_text(hcl.replace("{n}", "2"))
    first = engine.plan("s", stack, StackInputs())
    assert engine.apply("s", stack, first.document, first.state_serial, StackInputs()).succeeded
    (stack / "main.tf").write_text(hcl.replace("{n}", "4"))
    plan = load_plan(engine.plan("s", stack, StackInputs()).document)
    assert ("deny", "agent-capacity-growth", "aws_instance.w") in findings(plan, agent=True)
    assert findings(plan, agent=False) == []


def test_real_aws_plans() -> None:
    graph = fixture_plan("checkov_plan_and_tf_combine_graph.tfplan.json")
    fired = findings(graph)
    # the public access blocks live in nested modules; the configuration ties them to the buckets
    assert not any(rule == "s3-public-access-block" for _, rule, _ in fired)
    assert ("deny", "encryption-at-rest", "aws_s3_bucket.example") in fired
    assert ("deny", "required-tags", "aws_s3_bucket.example_2") in fired
    # rules from another security group, not a CIDR: quiet
    assert findings(fixture_plan("checkov_plan_change_keys.tfplan.json")) == []


def test_risk_levels() -> None:
    assert assess_risk(fixture_plan("tf-plan-format_update.tfplan.json")).level == RiskLevel.MEDIUM
    assert assess_risk(fixture_plan("opentofu_show-json_requires-replace.json")).level == RiskLevel.HIGH
    db_delete = _plan_with([_rc("aws_db_instance.d", "aws_db_instance", ["delete"], {"identifier": "d"}, None)])
    assert assess_risk(db_delete).level == RiskLevel.CRITICAL
    tags_only = _plan_with([_rc("aws_vpc.v", "aws_vpc", ["update"], {"cidr_block": "10.0.0.0/16", "tags": {"a": "1"}},
                                {"cidr_block": "10.0.0.0/16", "tags": {"a": "2"}})])
    assert assess_risk(tags_only).level == RiskLevel.LOW
    widen = _plan_with([_rc("aws_security_group_rule.r", "aws_security_group_rule", ["update"],
                            {"cidr_blocks": ["10.0.0.0/8"]}, {"cidr_blocks": ["10.0.0.0/8", "0.0.0.0/0"]})])
    assert assess_risk(widen).level == RiskLevel.HIGH


def test_checkov_report_becomes_findings_and_is_optional() -> None:
    report = '{"check_type": "terraform_plan", "results": {"failed_checks": [{"check_id": "CKV_AWS_24", ' \
             '"check_name": "Ensure no security groups allow ingress from 0.0.0.0:0 to port 22", ' \
             '"resource": "aws_security_group.g"}]}, "summary": {"failed": 1}}'
    [finding] = parse_checkov_report(report, "s", Severity.WARN)
    assert finding == Finding("checkov:CKV_AWS_24", Severity.WARN, "aws_security_group.g",
                              "Ensure no security groups allow ingress from 0.0.0.0:0 to port 22", "s")
    assert parse_checkov_report("not json", "s", Severity.WARN) is None
    off = PolicyContext("s", PolicySettings(checkov="off"))
    assert run_checkov({"format_version": "1.2"}, off, executable="/bin/false") == []
    warn = PolicyContext("s", PolicySettings(checkov="warn"))
    assert run_checkov({"format_version": "1.2"}, warn, executable="/bin/echo") == []  # unreadable: warn adds nothing


def test_checkov_deny_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deny = PolicyContext("s", PolicySettings(checkov="deny"))
    [unreadable] = run_checkov({"format_version": "1.2"}, deny, executable="/bin/echo")
    assert (unreadable.rule, unreadable.severity) == ("checkov-unavailable", Severity.DENY)
    assert "could not be read" in unreadable.message
    [missing] = run_checkov({"format_version": "1.2"}, deny, executable=str(tmp_path / "no-checkov"))
    assert "did not finish" in missing.message
    slow = tmp_path / "slow-checkov"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    monkeypatch.setattr(checkov_adapter, "TIMEOUT_SECONDS", 0.5)
    [timed_out] = run_checkov({"format_version": "1.2"}, deny, executable=str(slow))
    assert "TimeoutExpired" in timed_out.message


# --- in the flow: the sample repo in memory (conftest's ws, team, checkout: the real engine, checks and runner) ---


PUBLIC_BUCKET = f'resource "aws_s3_bucket" "open" {{\n  bucket = "open-staging"\n  acl = "public-read"\n  {TAGS}\n}}\n'


def test_deny_blocks_approval_and_apply_until_overridden(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("open").write("stacks/app-staging/open.tf", PUBLIC_BUCKET).push()
    proposal = open_proposal(ws, team.alice, "open", "public bucket for the website")
    keys = {f.key for f in proposal.blocking_findings(now())}
    assert "app-staging:s3-public-acl:aws_s3_bucket.open" in keys
    with pytest.raises(Refused, match="policy denies app-staging:s3-public-acl:aws_s3_bucket.open"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    with pytest.raises(Refused, match="alice requested or proposed this change and cannot override"):
        override_finding(ws, team.alice, proposal.id, "app-staging:s3-public-acl:aws_s3_bucket.open",
                         "I need it", now() + timedelta(days=1))
    with pytest.raises(Refused, match="bob is not a policy owner"):
        override_finding(ws, team.bob, proposal.id, "app-staging:s3-public-acl:aws_s3_bucket.open",
                         "fine", now() + timedelta(days=1))
    for key in sorted(keys):
        override_finding(ws, team.frank, proposal.id, key, "static website, reviewed", now() + timedelta(days=1))
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    assert apply_proposal(ws, team.alice, proposal.id).succeeded
    with ws.store.session() as session:
        events = [e for e in session.audit.events(proposal_id=proposal.id) if e.kind == "policy.override"]
    assert {e.payload["finding"] for e in events} == keys and all(e.actor == "frank" for e in events)


def test_risk_sets_how_many_approvers(ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    low = open_proposal(ws, team.alice, "tags", "cost centre moved")
    assert low.risk == RiskLevel.LOW
    decide(ws, team.bob, low.id, Decision.APPROVE, "")
    assert apply_proposal(ws, team.alice, low.id).succeeded
    checkout.branch("ami").edit("stacks/app-staging/main.tf", "ami-0c1c30571d2dae5c9", "ami-0d5eff06f840b45e9").push()
    high = open_proposal(ws, team.alice, "ami", "patched AMI")
    assert high.risk == RiskLevel.HIGH
    decide(ws, team.bob, high.id, Decision.APPROVE, "")
    with pytest.raises(Refused, match=r"needs 2 approval\(s\).*\(risk high\)"):
        apply_proposal(ws, team.alice, high.id)
    decide(ws, team.carol, high.id, Decision.APPROVE, "")
    assert apply_proposal(ws, team.alice, high.id).succeeded


def test_a_change_to_the_policy_config_is_itself_a_proposal(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("looser").edit("gateway.yaml", "max_deletes: 10", "max_deletes: 50").push()
    proposal = open_proposal(ws, team.alice, "looser", "allow bigger teardowns")
    assert proposal.stacks == () and proposal.changed_paths == ("gateway.yaml",)
    with pytest.raises(Refused, match="erin is not in a group allowed to approve changes to protected paths"):
        decide(ws, team.erin, proposal.id, Decision.APPROVE, "")
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    assert ws.repo_settings().policy.max_deletes == 10  # nothing changes before apply
    assert apply_proposal(ws, team.alice, proposal.id).succeeded
    assert ws.repo_settings().policy.max_deletes == 50


def test_a_literal_secret_in_the_configuration_is_denied_without_quoting_it(tmp_path: Path) -> None:
    ws = sandbox_workspace(tmp_path / "home")  # the sample in memory: the check reads the files it plans
    alice = person("alice", Role.REQUESTER, groups=["app"], store=ws.store)
    clone = FakeClone(ws.repo)  # type: ignore[arg-type]
    literal = "Hunter2-not-from-a-secret-store"
    clone.branch("literal").edit("stacks/data/main.tf", "password                = var.db_password",
                                 f'password                = "{literal}"').push()
    proposal = open_proposal(ws, alice, "literal", "simpler password handling")
    [finding] = [f for f in proposal.findings if f.rule == "literal-secret"]
    assert finding.severity == Severity.DENY and finding.address == "aws_db_instance.orders"
    assert finding.message.startswith("password is set from a literal")
    assert literal not in json.dumps([f.to_json() for f in proposal.findings])
    clone.branch("from-var").edit("stacks/data/main.tf", '"16.3"', '"17.2"').push()
    assert not [f for f in open_proposal(ws, alice, "from-var", "pg 17").findings
                if f.rule == "literal-secret"]
