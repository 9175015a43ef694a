"""Public CloudFormation templates (tests/fixtures/cloudformation/templates, SOURCES.md) planned and applied on moto's
server behind the front that answers as AWS does where moto does not (tests/cloudformation_server.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.composition import create_workspace, sample_repo_path
from gateway.config import Settings
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.preview import render_text
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.domain.risk import RiskLevel
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.jobs import enqueue_job, run_now_or_follow
from gateway.services.change.proposals import (
    decide,
    get_proposal,
    open_proposal,
    override_finding,
    proposal_previews,
)
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people

TEMPLATES = Path(__file__).parent / "fixtures" / "cloudformation" / "templates"
GATEWAY_YAML = """engine: cloudformation
approvals:
  required: 1
  protected_required: 2
  auto_apply: false
  config_approvers: [platform, security]
stacks:
{stacks}
protected_paths: [gateway.yaml, policies/]
policy:
  owners: [security]
  required_tags: []
  checkov: "off"
"""
STACK_YAML = """  {name}:
    path: stacks/{name}
    approvers: [platform, app]
    cloudformation: {{stack_name: gateway-test-{name}, region: eu-west-1}}
"""


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def for_moto(text: str) -> str:
    """moto 5.2.5 knows RDS engine names in lower case only (AWS takes `MySQL` as well)."""
    return text.replace("Engine: MySQL", "Engine: mysql")


def workspace_of(tmp_path: Path, stacks: Mapping[str, tuple[str, Mapping[str, str]]],
                 secrets: Mapping[str, Mapping[str, str]] | None = None) -> Workspace:
    """A gateway whose declaration repo holds `stacks` (name -> template, parameters) on main."""
    content = tmp_path / "content"
    shutil.copytree(sample_repo_path("cloudformation"), content)
    shutil.rmtree(content / "stacks")
    (content / "gateway.yaml").write_text(GATEWAY_YAML.format(
        stacks="".join(STACK_YAML.format(name=name) for name in stacks)))
    for name, (text, parameters) in stacks.items():
        (content / "stacks" / name).mkdir(parents=True)
        (content / "stacks" / name / "template.yaml").write_text(text)
        (content / "stacks" / name / "parameters.json").write_text(json.dumps(parameters))
    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5), content)
    for name, values in (secrets or {}).items():
        (ws.settings.secrets_path / f"{name}.tfvars.json").write_text(json.dumps(values))
    return ws


@pytest.fixture
def made(aws: str) -> Iterator[list[Workspace]]:
    kept: list[Workspace] = []
    yield kept
    for ws in kept:
        ws.close()


def stored_document(ws: Workspace, plan_id: int) -> str:
    with ws.store.session(readonly=True) as session:
        return session.proposals.plan_document(plan_id)


def shown(ws: Workspace, proposal: Any, stack: str) -> str:
    """Everything a person, a log reader or a model may see of a plan: the preview as rendered and as stored, the
    plan's variables and the trail (the plan document itself holds values in clear, sealed at rest, with marks)."""
    with ws.store.session(readonly=True) as session:
        preview = session.proposals.plan_preview(proposal.plans[stack].plan_id) or ""
        trail = "".join(json.dumps(e.payload) for e in session.audit.iter())
    variables = json.dumps(json.loads(stored_document(ws, proposal.plans[stack].plan_id))["variables"])
    return "\n".join([render_text(proposal_previews(ws, proposal)[stack]), preview, variables, trail])


def propose(ws: Workspace, people: People, tmp_path: Path, branch: str, edits: Mapping[str, str]) -> Any:
    clone = Clone(ws, tmp_path / f"clone-{branch}").branch(branch)
    for path, text in edits.items():
        clone.write(path, text)
    clone.push(branch)
    return open_proposal(ws, people.alice, branch, branch)


def apply(ws: Workspace, people: People, proposal_id: int) -> Any:
    """Approve (a policy owner lifting the deny findings of these sample templates) and apply."""
    for plan in get_proposal(ws, proposal_id).plans.values():
        for finding in plan.findings:
            if finding.severity == "deny":
                override_finding(ws, people.frank, proposal_id, finding.key, "a test of the engine",
                                 datetime.now(UTC) + timedelta(hours=1))
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    return run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal_id), "test", lambda _: None)


# --- rule 6: a NoEcho value is secret whatever function it flows through ---------------------------------


def test_a_noecho_password_through_fn_if_is_masked_in_widdix_rds_postgres(made: list[Workspace],
                                                                          tmp_path: Path) -> None:
    # the password comes from the stack's parameters, not the gateway's secrets: no last-line scrubber knows it
    password = "widdix-pw-4f7d1c9b2e"
    parameters = {"ParentVPCStack": "vpc", "ParentClientStack": "client", "EngineVersion": "15.3",
                  "DBName": "app", "DBMasterUserPassword": password}
    ws = workspace_of(tmp_path, {"db": ("AWSTemplateFormatVersion: '2010-09-09'\nResources:\n"
                                        "  Placeholder: {Type: AWS::SQS::Queue}\n", {})})
    made.append(ws)
    people = add_people(ws)
    proposal = propose(ws, people, tmp_path, "postgres", {
        "stacks/db/template.yaml": template("widdix-state-rds-postgres.yaml"),
        "stacks/db/parameters.json": json.dumps(parameters)})
    plan = proposal.plans["db"]
    rendered = render_text(proposal_previews(ws, proposal)["db"])
    document = stored_document(ws, plan.plan_id)
    assert password in document and password not in shown(ws, proposal, "db")
    db = next(rc for rc in json.loads(document)["resource_changes"] if rc["name"] == "DBInstance")
    assert db["change"]["after_sensitive"]["MasterUserPassword"] is True
    assert db["change"]["after"]["Engine"] == "postgres" and db["change"]["after"]["DBName"] == "app"
    assert "MasterUserPassword = (sensitive)" in rendered


def test_a_noecho_value_through_fn_join_and_a_sub_variable_map_is_masked(made: list[Workspace],
                                                                         tmp_path: Path) -> None:
    password = "join-sub-pw-8a0e55d3c1"
    ws = workspace_of(tmp_path, {"app": (template("noecho-join-sub.yaml"),
                                         {"Environment": "staging", "DBPassword": password})})
    made.append(ws)
    people = add_people(ws)
    proposal = propose(ws, people, tmp_path, "rotate", {
        "stacks/app/template.yaml": template("noecho-join-sub.yaml").replace("Port: 5432", "Port: 6432")})
    plan = proposal.plans["app"]
    document = stored_document(ws, plan.plan_id)
    assert password in document and password not in shown(ws, proposal, "app")
    changes = {rc["name"]: rc["change"] for rc in json.loads(document)["resource_changes"]}
    assert changes["Credentials"]["after_sensitive"] == {"SecretString": True}
    assert changes["ConnectionString"]["after_sensitive"] == {"Value": True}
    assert changes["ConnectionString"]["after"]["Name"] == "/app/staging/database-url"  # what is not secret shows


# --- replacements: CloudFormation's own answer, and what DescribeStacks hides ---------------------------


def replica_workspace(made: list[Workspace], tmp_path: Path, main: str) -> tuple[Workspace, People]:
    ws = workspace_of(tmp_path, {"db": (main, {"DBUser": "admin"})})
    made.append(ws)
    bootstrap_simulator(ws)
    return ws, add_people(ws)


def test_an_update_of_a_template_with_a_noecho_master_username_is_not_a_replacement(made: list[Workspace],
                                                                                    tmp_path: Path) -> None:
    # DescribeStacks answers `****` for the NoEcho DBUser: the deployed MasterUsername is not known to differ
    main = for_moto(template("aws-rds-mysql-with-read-replica.yaml"))
    ws, people = replica_workspace(made, tmp_path, main)
    proposal = propose(ws, people, tmp_path, "backups", {
        "stacks/db/template.yaml": main.replace("BackupRetentionPeriod: 7", "BackupRetentionPeriod: 14")})
    plan = proposal.plans["db"]
    assert plan.counts == {"update": 1}, plan.counts
    assert plan.risk != RiskLevel.CRITICAL
    rendered = render_text(proposal_previews(ws, proposal)["db"])
    assert "DESTROYS AND REPLACEMENTS" not in rendered and "forces replacement" not in rendered


def test_a_replacement_under_update_replace_policy_retain_is_listed_first_naming_its_attribute(
        made: list[Workspace], tmp_path: Path) -> None:
    # the sample's main database kept on replacement, as its replica is: a new, empty one would take its place
    main = for_moto(template("aws-rds-mysql-with-read-replica.yaml")).replace("""  MainDB:
    DeletionPolicy: Snapshot
    UpdateReplacePolicy: Snapshot""", """  MainDB:
    DeletionPolicy: Snapshot
    UpdateReplacePolicy: Retain""")
    ws, people = replica_workspace(made, tmp_path, main)
    renamed = main.replace("DBName: !Ref DBName", "DBName: Orders")
    proposal = propose(ws, people, tmp_path, "rename", {"stacks/db/template.yaml": renamed})
    rendered = render_text(proposal_previews(ws, proposal)["db"])
    destroys, changes = rendered.index("DESTROYS AND REPLACEMENTS"), rendered.index("CHANGES")
    assert destroys < rendered.index("AWS::RDS::DBInstance.MainDB", destroys) < changes
    assert "`DBName` forces replacement" in rendered
    assert proposal.plans["db"].risk == RiskLevel.HIGH  # a new, empty database; the old one kept, unmanaged


# --- Fn::ForEach: the processed template, and what the loop retains -------------------------------------


def processed_buckets(identifiers: list[str]) -> dict[str, Any]:
    """fn-foreach-s3-outputs.yaml as CloudFormation processes it, for the loop over `identifiers`."""
    whole = json.loads((TEMPLATES / "aws-fn-foreach-s3-outputs.processed.json").read_text())
    whole["Resources"] = {k: v for k, v in whole["Resources"].items() if k.removeprefix("S3Bucket") in identifiers}
    whole["Outputs"] = {k: v for k, v in whole["Outputs"].items()
                        if k.removeprefix("S3Bucket").removesuffix("Arn") in identifiers}
    return whole


def test_fn_foreach_plans_an_update_and_forgets_what_the_loop_retains(front: Any, made: list[Workspace],
                                                                      tmp_path: Path) -> None:
    main = template("aws-fn-foreach-s3-outputs.yaml")
    front.process(main, processed_buckets(["A", "B", "C"]))
    ws = workspace_of(tmp_path, {"buckets": (main, {})})
    made.append(ws)
    bootstrap_simulator(ws)
    people = add_people(ws)
    fewer = main.replace("      - B\n      - C\n    - S3Bucket", "      - B\n    - S3Bucket")
    fewer = fewer.replace("      - B\n      - C\n    - Fn::ForEach::GetAttLoop",
                          "      - B\n    - Fn::ForEach::GetAttLoop")
    assert fewer.count("- C") == 0
    front.process(fewer, processed_buckets(["A", "B"]))
    proposal = propose(ws, people, tmp_path, "fewer", {"stacks/buckets/template.yaml": fewer})
    plan = proposal.plans["buckets"]
    assert plan.counts == {"forget": 1}, plan.counts
    document = json.loads(stored_document(ws, plan.plan_id))
    kinds = {rc["name"]: rc["change"]["actions"] for rc in document["resource_changes"]}
    assert kinds == {"S3BucketC": ["forget"], "S3BucketA": ["no-op"], "S3BucketB": ["no-op"]}
    rendered = render_text(proposal_previews(ws, proposal)["buckets"])
    assert "DESTROYS AND REPLACEMENTS" not in rendered

    done = apply(ws, people, proposal.id)  # moto deletes what AWS would keep: what the gateway ran is checked
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert get_proposal(ws, proposal.id).status == ProposalStatus.APPLIED


# --- applies CloudFormation refuses, and plans with nothing to do ---------------------------------------


def test_a_change_set_cloudformation_refuses_at_execution_is_a_failure_with_its_reason(made: list[Workspace],
                                                                                     tmp_path: Path) -> None:
    ws = workspace_of(tmp_path, {"db": ("AWSTemplateFormatVersion: '2010-09-09'\nResources:\n"
                                        "  Placeholder: {Type: AWS::SQS::Queue}\n", {})})
    made.append(ws)
    bootstrap_simulator(ws)
    people = add_people(ws)
    # moto refuses the engine name `MySQL` when the change set runs, as CloudFormation refuses what it cannot run
    proposal = propose(ws, people, tmp_path, "mysql", {
        "stacks/db/template.yaml": template("aws-rds-with-dbparametergroup.yaml"),
        "stacks/db/parameters.json": json.dumps({"DBUser": "admin"})})
    done = apply(ws, people, proposal.id)
    assert done.status != JobStatus.SUCCEEDED
    assert "InvalidParameterValue" in (done.error or "") and "MySQL" in (done.error or ""), done.error
    with ws.store.session(readonly=True) as session:
        kinds = [e.kind for e in session.audit.iter() if e.proposal_id == proposal.id]
        [record] = session.proposals.applies_of(proposal.id)
    assert "apply.failed" in kinds and "apply.crashed" not in kinds, kinds
    assert record.status == "failed" and "InvalidParameterValue" in (record.error or "")
    assert "Traceback" not in (record.error or "")
    assert get_proposal(ws, proposal.id).status != ProposalStatus.APPLIED


def test_a_stack_with_nothing_to_change_plans_empty_however_cloudformation_says_so(made: list[Workspace],
                                                                                  tmp_path: Path) -> None:
    queue = "AWSTemplateFormatVersion: '2010-09-09'\nResources:\n  Work: {Type: AWS::SQS::Queue}\n"
    ws = workspace_of(tmp_path, {"plain": (queue, {}), "withparams": (
        "AWSTemplateFormatVersion: '2010-09-09'\nParameters:\n  Name: {Type: String}\nResources:\n"
        "  Work:\n    Type: AWS::SQS::Queue\n    Properties: {QueueName: !Ref Name}\n", {"Name": "work"})})
    made.append(ws)
    bootstrap_simulator(ws)
    from gateway.services.change.planning import plan_stack

    for stack in ("plain", "withparams"):  # moto: a FAILED change set's reason, and a ValidationError at creation
        result = plan_stack(ws, stack, "main")
        assert not result.plan.has_changes, stack
        assert "No changes" in render_text(result.preview())
