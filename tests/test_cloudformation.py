"""The cloudformation engine, contract-tested against moto's server mode through boto3 (the code path of real AWS).

moto runs as a real HTTP server on loopback behind a front that answers as AWS does where moto does not
(tests/cloudformation_server.py); boto3 reaches it through AWS_ENDPOINT_URL, as it would reach AWS. Where neither
can say what AWS answers (say which), a response AWS documents (tests/fixtures/cloudformation) checks the mapping.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from gateway.adapters.engines.cloudformation.plan import change_set_plan
from gateway.adapters.engines.cloudformation.template import Resolver, parse_template
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import BackendError, ConfigError, PlanError, Refused, Unavailable
from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.plan import ChangeKind, load_plan
from gateway.domain.policy import PolicyContext, PolicySettings, evaluate_plan
from gateway.domain.preview import AttributeDiff, DriftEntry, build_preview, render_text
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.domain.risk import RiskLevel, assess_risk
from gateway.services.admin.audit import verify_trail
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.jobs import enqueue_job, run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal, open_proposal, proposal_previews
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift_records import check_drift
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, add_people, run_cli, sign_in_client

FIXTURES = Path(__file__).parent / "fixtures" / "cloudformation"
TEMPLATE = "stacks/web/template.yaml"
REGION = "eu-west-1"
STACK = "gateway-sample-web"


@pytest.fixture
def cfn_workspace(aws: str, tmp_path: Path) -> Iterator[Workspace]:
    """The CloudFormation sample, main applied to the emulator."""
    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5), sample="cloudformation")
    bootstrap_simulator(ws)
    yield ws
    ws.close()


def _cloudformation() -> object:
    return boto3.client("cloudformation", region_name=REGION)


def test_the_change_path_with_the_cloudformation_engine(cfn_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = cfn_workspace, add_people(cfn_workspace)
    api_key = stack_secrets(ws.settings, "web")["ApiKey"]
    clone = Clone(ws, tmp_path / "clone").branch("queues")
    template = clone.read(TEMPLATE)
    template = template.replace('"gateway-sample-jobs-${Environment}"', '"gateway-sample-work-${Environment}"')
    template = template.replace("VisibilityTimeout: 30", "VisibilityTimeout: 60")
    start = template.index("  DeadLetters:")
    template = template[:start] + template[template.index("  ApiKeyParameter:"):]
    template = template.replace("Outputs:", '''  Alerts:
    Type: AWS::SNS::Topic
    Properties:
      TopicName: gateway-sample-alerts
      Tags:
        - {Key: owner, Value: web}

Outputs:''')
    clone.write(TEMPLATE, template).push("rename the jobs queue, drop the dead letters, add alerts")

    proposal = open_proposal(ws, people.alice, "queues", "rename the jobs queue")
    plan = proposal.plans["web"]
    assert plan.counts == {"create": 1, "replace-create-first": 1, "delete": 1}
    rendered = render_text(proposal_previews(ws, proposal)["web"])  # what the approver reads
    assert "Plan (cloudformation (change set))" in rendered
    destroys = rendered.index("DESTROYS AND REPLACEMENTS")
    assert rendered.index("AWS::SQS::Queue.Jobs", destroys) < rendered.index("CHANGES")
    assert "`QueueName` forces replacement" in rendered
    assert rendered.index("AWS::SQS::Queue.DeadLetters", destroys) < rendered.index("CHANGES")
    assert api_key not in rendered and api_key not in json.dumps(_document(ws, proposal, "web")["variables"])

    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
    assert done.status == JobStatus.SUCCEEDED, done.error
    after = get_proposal(ws, proposal.id)
    assert after.status == ProposalStatus.APPLIED and after.merge_sha

    cloudformation = _cloudformation()  # the stack now runs the merged template
    deployed = cloudformation.get_template(StackName=STACK)["TemplateBody"]
    assert "gateway-sample-work-${Environment}" in deployed and "DeadLetters" not in deployed
    resources = {r["LogicalResourceId"] for r in cloudformation.list_stack_resources(StackName=STACK)[
        "StackResourceSummaries"]}
    assert resources == {"Assets", "Jobs", "ApiKeyParameter", "Alerts"}
    sqs = boto3.client("sqs", region_name=REGION)
    queues = [url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])]
    assert "gateway-sample-dead-letters-staging" not in queues
    assert [t["TopicArn"].rsplit(":", 1)[1] for t in boto3.client("sns", region_name=REGION).list_topics()["Topics"]] \
        == ["gateway-sample-alerts"]
    count, broken = verify_trail(ws, people.admin)
    assert broken is None and count > 0
    with ws.store.session(readonly=True) as session:
        assert not any(api_key in json.dumps(e.payload) for e in session.audit.iter())


def test_an_apply_is_refused_when_the_stack_moved_since_the_plan(cfn_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = cfn_workspace, add_people(cfn_workspace)
    Clone(ws, tmp_path / "clone").branch("longer").edit(TEMPLATE, "VisibilityTimeout: 30", "VisibilityTimeout: 45") \
        .push("a longer visibility timeout")
    proposal = open_proposal(ws, people.alice, "longer", "longer timeout")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")

    cloudformation = _cloudformation()  # someone updates the stack by hand between the plan and the apply
    body = cloudformation.get_template(StackName=STACK)["TemplateBody"]
    body = body if isinstance(body, str) else json.dumps(body)
    parameters = [{"ParameterKey": p["ParameterKey"], "UsePreviousValue": True}
                  for p in cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]["Parameters"]]
    changed = cloudformation.create_change_set(StackName=STACK, ChangeSetName="by-hand", ChangeSetType="UPDATE",
                                               TemplateBody=body.replace("MessageRetentionPeriod: 1209600",
                                                                         "MessageRetentionPeriod: 86400"),
                                               Parameters=parameters)
    cloudformation.execute_change_set(ChangeSetName=changed["Id"], StackName=STACK)

    done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
    assert done.status != JobStatus.SUCCEEDED
    assert "state of stack web moved since its plan; re-planned" in (done.error or ""), done.error
    assert "decision(s) are now stale" in (done.error or "")  # the approval was of the plan that no longer holds
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.get_queue_url(QueueName="gateway-sample-jobs-staging")["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"][
        "VisibilityTimeout"] == "30"  # the gateway executed nothing
    assert get_proposal(ws, proposal.id).status != ProposalStatus.APPLIED


def test_drift_cloudformation_detects_is_recorded_for_the_stack(cfn_workspace: Workspace) -> None:
    ws, people = cfn_workspace, add_people(cfn_workspace)
    sqs = boto3.client("sqs", region_name=REGION)  # a console edit of the queue
    url = sqs.get_queue_url(QueueName="gateway-sample-jobs-staging")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "90"})
    try:
        _cloudformation().detect_stack_drift(StackName=STACK)
    except Exception as exc:  # noqa: BLE001 - whatever the emulator answers, the reason is printed
        pytest.skip(f"the emulator cannot detect drift (moto 5.2.5 answers DetectStackDrift with 500: {exc!r:.80}); "
                    "test_a_change_set_with_aws_details_maps_to_an_update_and_drift_to_resource_drift checks the "
                    "mapping on a response AWS documents")
    record = check_drift(ws, people.admin, "web").record
    assert record is not None and [e.address for e in record.resources] == ["AWS::SQS::Queue.Jobs"]


def test_a_plan_of_a_stack_moto_cannot_check_for_drift_says_so_first(cfn_workspace: Workspace, tmp_path: Path) -> None:
    # moto 5.2.5 answers DetectStackDrift with 500: the preview says drift was not checked, rather than "no drift"
    ws, people = cfn_workspace, add_people(cfn_workspace)
    Clone(ws, tmp_path / "clone").branch("tags").edit(TEMPLATE, "VisibilityTimeout: 30", "VisibilityTimeout: 31") \
        .push("tune")
    proposal = open_proposal(ws, people.alice, "tags", "tune")
    rendered = render_text(proposal_previews(ws, proposal)["web"])
    assert rendered.index("NOTE: drift was not checked") < rendered.index("CHANGES")


def test_codify_writes_the_drifted_properties_into_the_template(cfn_workspace: Workspace) -> None:
    # drift as DescribeStackResourceDrifts reports it (moto cannot detect it): the queue's timeout was changed by hand
    ws, people = cfn_workspace, add_people(cfn_workspace)
    drifted = DriftEntry("AWS::SQS::Queue.Jobs", "changed outside the gateway", True,
                         (AttributeDiff("VisibilityTimeout", "30", "60"),))
    with ws.store.session() as session:
        session.day_two.add_drift_record("web", [drifted], False, None)
    proposal = codify_drift(ws, people.admin, "web")
    template = ws.repo.read_file(proposal.head_sha, TEMPLATE)
    assert "      VisibilityTimeout: 60\n" in template
    assert template.replace("VisibilityTimeout: 60", "VisibilityTimeout: 30") == ws.repo.read_file(
        ws.repo.resolve("main"), TEMPLATE)  # nothing else moved: comments, tags and layout kept
    assert proposal.plans["web"].counts == {"update": 1}

    renamed = DriftEntry("AWS::SQS::Queue.DeadLetters", "changed outside the gateway", True,
                         (AttributeDiff("QueueName", '"a"', '"b"'),))
    with ws.store.session() as session:
        record = session.day_two.open_drift_record("web")
        session.day_two.update_drift_record(record.id, [renamed], False, None)
    with pytest.raises(Refused) as caught:
        codify_drift(ws, people.admin, "web")
    assert "stacks/web/template.yaml:" in str(caught.value) and "DeadLetters.QueueName is not a literal" in str(caught.value)


def test_init_sample_cloudformation_applies_main_to_the_emulator(aws: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    created = run_cli(["init", "--sample", "cloudformation"], home, **_aws_env(aws))
    assert created.returncode == 0, created.stderr
    assert "CloudFormation" in created.stdout and "4 resources" in created.stdout
    stacks = _cloudformation().describe_stacks(StackName=STACK)["Stacks"]
    assert stacks[0]["StackStatus"] in ("CREATE_COMPLETE", "UPDATE_COMPLETE")

    # nothing changed since: an empty plan (moto says "No updates are to be performed" at CreateChangeSet)
    token = run_cli(["users", "add", "root", "--role", "admin"], home, **_aws_env(aws)).stdout.strip()
    plan = run_cli(["plan", "--stack", "web"], home, token=token, **_aws_env(aws))
    assert plan.returncode == 0, plan.stderr
    assert "No changes" in plan.stdout and "refused" not in plan.stderr


def test_a_template_that_does_not_parse_is_a_one_line_error_naming_file_and_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_template("Resources:\n  A:\n    Type: AWS::S3::Bucket\n    Properties: [unclosed\n", "web/template.yaml")
    message = str(caught.value)
    assert message.startswith("web/template.yaml: not a readable CloudFormation template") and "\n" not in message
    assert "line" in message.lower()


# --- the mapping, checked against responses AWS documents -------------------------------------------

LAMBDA_TEMPLATE = """
Resources:
  function:
    Type: AWS::Lambda::Function
    Properties:
      Handler: index.handler
      MemorySize: 128
      Runtime: nodejs10.x
      Timeout: {timeout}
      Role: arn:aws:iam::123456789012:role/my-functionRole-HIZXMPLEOM9E
"""


def test_a_change_set_with_aws_details_maps_to_an_update_and_drift_to_resource_drift() -> None:
    described = json.loads((FIXTURES / "describe-change-set.json").read_text())
    drifts = json.loads((FIXTURES / "describe-stack-resource-drifts.json").read_text())["StackResourceDrifts"]
    current = Resolver(parse_template(LAMBDA_TEMPLATE.format(timeout=900), "t"), {}, "us-west-2")
    proposed = Resolver(parse_template(LAMBDA_TEMPLATE.format(timeout=30), "t"), {}, "us-west-2")
    document = change_set_plan(described["Changes"], current, proposed, (), lambda _type: frozenset(), drifts)
    plan = load_plan(document)
    [change] = plan.resource_changes
    assert change.address == "AWS::Lambda::Function.function" and change.kind == ChangeKind.UPDATE
    assert (change.change.before["Timeout"], change.change.after["Timeout"]) == (900, 30)
    [drift] = plan.resource_drift
    assert drift.address == "AWS::Lambda::Function.function"
    assert (drift.change.before["MemorySize"], drift.change.after["MemorySize"]) == (128, 256)
    rendered = render_text(build_preview(plan))
    assert "AWS::Lambda::Function.function" in rendered and "MemorySize" in rendered


def test_replacements_removals_and_retained_resources_map_as_terraform_would_show_them() -> None:
    before = """
Parameters:
  Password: {Type: String, NoEcho: true}
Resources:
  Data:
    Type: AWS::S3::Bucket
    DeletionPolicy: Retain
    Properties: {BucketName: data-old}
  Db:
    Type: AWS::RDS::DBInstance
    Properties: {DBInstanceIdentifier: db-1, MasterUserPassword: !Ref Password, DeletionProtection: true,
                 StorageEncrypted: true}
  Scratch:
    Type: AWS::SQS::Queue
"""
    after = """
Parameters:
  Password: {Type: String, NoEcho: true}
Resources:
  Db:
    Type: AWS::RDS::DBInstance
    Properties: {DBInstanceIdentifier: db-2, MasterUserPassword: !Ref Password, DeletionProtection: true,
                 StorageEncrypted: true}
"""
    changes = [  # as moto reports them: no Replacement, no Details
        {"Type": "Resource", "ResourceChange": {"Action": "Remove", "LogicalResourceId": "Data",
                                                "ResourceType": "AWS::S3::Bucket"}},
        {"Type": "Resource", "ResourceChange": {"Action": "Modify", "LogicalResourceId": "Db",
                                                "ResourceType": "AWS::RDS::DBInstance"}},
        {"Type": "Resource", "ResourceChange": {"Action": "Remove", "LogicalResourceId": "Scratch",
                                                "ResourceType": "AWS::SQS::Queue"}},
    ]
    secret = {"Password": "hunter2-but-long"}
    document = change_set_plan(changes, Resolver(parse_template(before, "b"), secret, REGION),
                               Resolver(parse_template(after, "a"), secret, REGION), {"Password"},
                               lambda rtype: frozenset({"DBInstanceIdentifier"}) if rtype == "AWS::RDS::DBInstance"
                               else frozenset())
    plan = load_plan(document)
    kinds = {rc.address: rc.kind for rc in plan.resource_changes}
    assert kinds == {"AWS::S3::Bucket.Data": ChangeKind.FORGET, "AWS::RDS::DBInstance.Db": ChangeKind.REPLACE_CREATE_FIRST,
                     "AWS::SQS::Queue.Scratch": ChangeKind.DELETE}
    db = plan.find("AWS::RDS::DBInstance.Db")
    assert db is not None and db.change.replace_paths == (("DBInstanceIdentifier",),)
    rendered = render_text(build_preview(plan))
    assert db.change.after_sensitive == {"MasterUserPassword": True}  # a NoEcho parameter: secret by origin
    assert "hunter2-but-long" not in rendered
    assert assess_risk(plan).level == RiskLevel.CRITICAL  # a database replaced: its data goes with it


def test_policies_judge_cloudformation_resources_by_the_same_rules() -> None:
    template = """
Resources:
  Open:
    Type: AWS::S3::Bucket
    Properties: {AccessControl: PublicRead}
  Db:
    Type: AWS::RDS::DBInstance
    Properties: {DBInstanceIdentifier: db, Tags: [{Key: owner, Value: data}]}
"""
    changes = [{"Type": "Resource", "ResourceChange": {"Action": "Add", "LogicalResourceId": name,
                                                       "ResourceType": rtype}}
               for name, rtype in (("Open", "AWS::S3::Bucket"), ("Db", "AWS::RDS::DBInstance"))]
    plan = load_plan(change_set_plan(changes, None, Resolver(parse_template(template, "t"), {}, REGION), (),
                                     lambda _: frozenset()))
    findings = {(f.rule, f.address) for f in evaluate_plan(plan, PolicyContext(
        "web", PolicySettings(required_tags=("owner",)), frozenset()))}
    assert findings >= {
        ("s3-public-acl", "AWS::S3::Bucket.Open"), ("s3-public-access-block", "AWS::S3::Bucket.Open"),
        ("encryption-at-rest", "AWS::S3::Bucket.Open"), ("required-tags", "AWS::S3::Bucket.Open"),
        ("db-deletion-protection", "AWS::RDS::DBInstance.Db"), ("encryption-at-rest", "AWS::RDS::DBInstance.Db"),
    }
    assert ("required-tags", "AWS::RDS::DBInstance.Db") not in findings


def _document(ws: Workspace, proposal: object, stack: str) -> dict:
    with ws.store.session(readonly=True) as session:
        return json.loads(session.proposals.plan_document(proposal.plans[stack].plan_id))  # type: ignore[attr-defined]


def _aws_env(url: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION, "PATH": os.environ.get("PATH", "")}


# --- CloudFormation's own answer, the templates where it gives none -----------------------------------------

REPLICA = (FIXTURES / "templates" / "aws-rds-mysql-with-read-replica.yaml").read_text()


def _modify(logical: str, replacement: str | None = None, policy: str | None = None,
            details: list[dict] | None = None) -> dict:
    """A change as DescribeChangeSet gives it (the shape the AWS CLI's describe-change-set example shows)."""
    change = {"Action": "Modify", "LogicalResourceId": logical, "PhysicalResourceId": f"{logical.lower()}-1",
              "ResourceType": "AWS::RDS::DBInstance", "Scope": ["Properties"], "Details": details or []}
    if replacement is not None:
        change["Replacement"] = replacement
    if policy is not None:
        change["PolicyAction"] = policy
    return {"Type": "Resource", "ResourceChange": change}


def _rds_create_only(rtype: str) -> frozenset[str]:
    create_only = frozenset({"DBName", "MasterUsername", "StorageEncrypted"})
    return create_only if rtype == "AWS::RDS::DBInstance" else frozenset()


def _replica_plan(changes: list[dict], after: str) -> dict:
    parameters = {"DBUser": "admin"}
    return change_set_plan(changes, Resolver(parse_template(REPLICA, "before.yaml"), parameters, REGION),
                           Resolver(parse_template(after, "after.yaml"), parameters, REGION), (), _rds_create_only)


def test_cloudformations_replacement_answer_wins_over_the_resource_schema() -> None:
    renamed = REPLICA.replace("DBName: !Ref DBName", "DBName: Orders")  # DBName is create-only in the schema
    static = {"Target": {"Attribute": "Properties", "Name": "DBName", "RequiresRecreation": "Always",
                         "BeforeValue": "MyDatabase", "AfterValue": "Orders"},
              "Evaluation": "Static", "ChangeSource": "DirectModification"}
    dynamic = {"Target": {"Attribute": "Properties", "Name": "AllocatedStorage", "RequiresRecreation": "Conditionally"},
               "Evaluation": "Dynamic", "ChangeSource": "ParameterReference", "CausingEntity": "DBAllocatedStorage"}
    said_false = load_plan(_replica_plan([_modify("MainDB", "False", details=[])], renamed))
    assert said_false.find("AWS::RDS::DBInstance.MainDB").kind == ChangeKind.UPDATE  # type: ignore[union-attr]

    said_true = _replica_plan([_modify("MainDB", "True", "ReplaceAndSnapshot", [static])], renamed)
    plan = load_plan(said_true)
    main = plan.find("AWS::RDS::DBInstance.MainDB")
    assert main is not None and main.kind == ChangeKind.REPLACE_CREATE_FIRST
    assert main.change.replace_paths == (("DBName",),)
    rendered = render_text(build_preview(plan))
    assert "`DBName` forces replacement" in rendered
    [entry] = said_true["resource_changes"][:1]
    assert entry["gateway_cloudformation"] == {
        "action": "Modify", "replacement": "True", "policy_action": "ReplaceAndSnapshot", "scope": ["Properties"],
        "details": [{"attribute": "Properties", "name": "DBName", "requires_recreation": "Always",
                     "evaluation": "Static", "change_source": "DirectModification"}]}  # never Before/AfterValue

    conditional = _replica_plan([_modify("MainDB", "Conditional", details=[dynamic])], REPLICA)
    plan = load_plan(conditional)
    rendered = render_text(build_preview(plan))
    assert "`AllocatedStorage` may force replacement (the engine decides when it runs)" in rendered
    [entry] = conditional["resource_changes"][:1]
    assert entry["gateway_cloudformation"]["replacement"] == "Conditional"
    assert entry["gateway_cloudformation"]["details"] == [{
        "attribute": "Properties", "name": "AllocatedStorage", "requires_recreation": "Conditionally",
        "evaluation": "Dynamic", "change_source": "ParameterReference", "causing_entity": "DBAllocatedStorage"}]


def test_policy_action_decides_what_becomes_of_the_old_object() -> None:
    no_replica = REPLICA.replace("  ReplicaDB:\n", "  ReplicaGone:\n")
    no_replica = no_replica.replace("ReplicaDB.Endpoint", "ReplicaGone.Endpoint")
    removed = {"Type": "Resource", "ResourceChange": {"Action": "Remove", "LogicalResourceId": "ReplicaDB",
                                                       "ResourceType": "AWS::RDS::DBInstance"}}
    kept = _replica_plan([{**removed, "ResourceChange": {**removed["ResourceChange"], "PolicyAction": "Retain"}}],
                         no_replica)
    deleted = _replica_plan([{**removed, "ResourceChange": {**removed["ResourceChange"], "PolicyAction": "Delete"}}],
                            no_replica)
    assert [rc["change"]["actions"] for rc in kept["resource_changes"] if rc["name"] == "ReplicaDB"] == [["forget"]]
    # the template says Retain; CloudFormation's word (a Delete) is what happens
    assert [rc["change"]["actions"] for rc in deleted["resource_changes"] if rc["name"] == "ReplicaDB"] == [["delete"]]
    retained = _replica_plan([_modify("MainDB", "True", "ReplaceAndRetain", [
        {"Target": {"Attribute": "Properties", "Name": "DBName", "RequiresRecreation": "Always"}}])],
        REPLICA.replace("DBName: !Ref DBName", "DBName: Orders"))
    plan = load_plan(retained)
    main = plan.find("AWS::RDS::DBInstance.MainDB")
    assert main is not None and main.kind == ChangeKind.CREATE_FORGET
    preview = build_preview(plan)
    assert [e.address for e in preview.danger] == ["AWS::RDS::DBInstance.MainDB"]
    assert "`DBName` forces replacement" in render_text(preview)
    assert assess_risk(plan).level == RiskLevel.HIGH


def test_a_create_without_properties_and_a_forget_show_no_empty_line() -> None:
    before = ("Resources:\n  Old:\n    Type: AWS::S3::Bucket\n    DeletionPolicy: Retain\n"
              "    Properties: {BucketName: old}\n")
    after = "Resources:\n  Work:\n    Type: AWS::SQS::Queue\n"
    changes = [{"Type": "Resource", "ResourceChange": {"Action": "Add", "LogicalResourceId": "Work",
                                                       "ResourceType": "AWS::SQS::Queue"}},
               {"Type": "Resource", "ResourceChange": {"Action": "Remove", "LogicalResourceId": "Old",
                                                       "ResourceType": "AWS::S3::Bucket"}}]
    plan = load_plan(change_set_plan(changes, Resolver(parse_template(before, "b"), {}, REGION),
                                     Resolver(parse_template(after, "a"), {}, REGION), (), lambda _: frozenset()))
    rendered = render_text(build_preview(plan))
    assert "+ AWS::SQS::Queue.Work  (create)" in rendered and ". AWS::S3::Bucket.Old" in rendered
    assert " = {}" not in rendered and "-> (removed)" not in rendered


TRACED = """
Parameters:
  Pw: {Type: String, NoEcho: true}
  Name: {Type: String}
Conditions:
  HasSnapshot: !Equals [!Ref Name, snapshot]
  Unknowable: !Equals [!ImportValue shared-flag, "yes"]
Mappings:
  Ports: {app: {db: 5432}}
Resources:
  Db:
    Type: AWS::SSM::Parameter
    Properties:
      If: !If [HasSnapshot, !Ref AWS::NoValue, !Ref Pw]
      Join: !Join ["", ["user:", !Ref Pw]]
      SubMap: !Sub ["${P}@${Port}", {P: !Ref Pw, Port: !FindInMap [Ports, app, db]}]
      SubText: "!Sub-free ${Pw} stays text"
      Sub: !Sub "${Name}:${Pw}"
      Select: !Select [1, !Split [":", !Sub "${Name}:${Pw}"]]
      Base64: !Base64 {"Fn::Join": ["-", [!Ref Pw, x]]}
      FindInMap: !FindInMap [Ports, !Ref Pw, db]
      ToJson: {"Fn::ToJsonString": {password: !Ref Pw}}
      Either: !If [Unknowable, !Ref Pw, plain]
      Dynamic: "{{resolve:secretsmanager:prod/db:SecretString:password}}"
      Tags: [{Key: owner, Value: !Ref Name}, {Key: pw, Value: !Ref Pw}]
      Plain: !Sub "${Name}-db"
"""


def test_a_secret_is_traced_through_every_intrinsic_function_and_what_cannot_be_traced_is_secret() -> None:
    password = "traced-pw-0b5e7a91"
    resolver = Resolver(parse_template(TRACED, "t.yaml"), {"Pw": password, "Name": "app"}, REGION)
    add = [{"Type": "Resource", "ResourceChange": {"Action": "Add", "LogicalResourceId": "Db",
                                                   "ResourceType": "AWS::SSM::Parameter"}}]
    document = change_set_plan(add, None, resolver, (), lambda _: frozenset())
    [change] = [rc["change"] for rc in document["resource_changes"]]
    assert change["after_sensitive"] == {
        "If": True, "Join": True, "SubMap": True, "Sub": True, "Select": True, "Base64": True, "FindInMap": True,
        "ToJson": True, "Either": True, "Dynamic": True, "Tags": [False, {"Value": True}]}
    assert change["after"]["Plain"] == "app-db" and change["after"]["SubText"] == "!Sub-free ${Pw} stays text"
    assert change["after"]["Tags"][0] == {"Key": "owner", "Value": "app"}
    rendered = render_text(build_preview(load_plan(document)))
    assert password not in rendered and "Join = (sensitive)" in rendered and 'Plain = "app-db"' in rendered


def test_aws_errors_reach_the_person_as_the_gateways_own_by_their_codes(cfn_workspace: Workspace, front: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.services.change.planning import plan_stack

    ws = cfn_workspace
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries are not what is tested
    front.fail("DescribeStacks", 400, "Throttling", "Rate exceeded")
    with pytest.raises(Unavailable) as throttled:
        plan_stack(ws, "web", "main")
    assert "DescribeStacks: AWS cannot serve it now (Throttling: Rate exceeded)" in str(throttled.value)

    front.fail("DescribeStacks", 403, "AccessDenied", "User: arn:aws:iam::123456789012:user/ci is not authorized")
    with pytest.raises(BackendError) as denied:
        plan_stack(ws, "web", "main")
    assert not isinstance(denied.value, Unavailable)
    assert "AWS refused the worker's credentials (AccessDenied: User: arn:aws" in str(denied.value)

    front.reset()
    front.fail("CreateChangeSet", 400, "InsufficientCapabilitiesException", "Requires capabilities : [CAPABILITY_IAM]")
    with pytest.raises(PlanError) as refused:
        plan_stack(ws, "web", "main")
    assert str(refused.value) == ("CloudFormation refused the change set for stack gateway-sample-web: "
                                  "InsufficientCapabilitiesException: Requires capabilities : [CAPABILITY_IAM]")

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s.getsockname()[1]}")
    with pytest.raises(Unavailable) as unreachable:
        plan_stack(ws, "web", "main")
    assert "CloudFormation DescribeStacks: AWS cannot be reached" in str(unreachable.value)

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3 keeps the credentials it found for the process
    with pytest.raises(BackendError) as no_credentials:
        plan_stack(ws, "web", "main")
    assert "the worker has no usable AWS credentials or region (Unable to locate credentials)" in str(
        no_credentials.value)


# --- reads never reach an engine or a cloud (rule 10) ------------------------------------------------------


def test_a_read_of_a_proposal_asks_no_cloud_and_shows_what_a_worker_found_moved(
        aws: str, tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from gateway.api.app import create_app
    from gateway.services.change.jobs import enqueue_moved_proposals

    settings = Settings(home=tmp_path / "home", database_url=database_url, lock_wait_seconds=5)
    ws = create_workspace(settings, sample="cloudformation")
    try:
        bootstrap_simulator(ws)
        people = add_people(ws)
        Clone(ws, tmp_path / "clone").branch("longer").edit(TEMPLATE, "VisibilityTimeout: 30",
                                                            "VisibilityTimeout: 45").push("a longer timeout")
        proposal = open_proposal(ws, people.alice, "longer", "longer timeout")
        _update_by_hand()  # the stack moves outside the gateway; a worker's scan finds it and records it
        assert enqueue_moved_proposals(ws)

        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # no credentials, no endpoint that answers
            monkeypatch.delenv(name)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s.getsockname()[1]}")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)

        shown = run_cli(["show", str(proposal.id)], ws.settings.home, people.tokens["bob"], database_url)
        assert shown.returncode == 0, shown.stderr
        assert "note: state of stack web moved since its plan" in shown.stdout
        assert "AWS::SQS::Queue.Jobs" in shown.stdout and "credentials" not in shown.stderr

        with TestClient(create_app(ws.settings)) as client:
            read = client.get(f"/api/v1/proposals/{proposal.id}",
                              headers={"Authorization": f"Bearer {people.tokens['bob']}"})
            assert read.status_code == 200, read.text
            assert read.json()["pending"] == ["state of stack web moved since its plan"]
            sign_in_client(client, people.tokens["bob"])
            page = client.get(f"/proposals/{proposal.id}")
            assert page.status_code == 200 and "state of stack web moved since its plan" in page.text
    finally:
        ws.close()


def _update_by_hand() -> None:
    cloudformation = _cloudformation()
    body = cloudformation.get_template(StackName=STACK)["TemplateBody"]
    body = body if isinstance(body, str) else json.dumps(body)
    parameters = [{"ParameterKey": p["ParameterKey"], "UsePreviousValue": True}
                  for p in cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]["Parameters"]]
    changed = cloudformation.create_change_set(StackName=STACK, ChangeSetName="by-hand", ChangeSetType="UPDATE",
                                               TemplateBody=body.replace("MessageRetentionPeriod: 1209600",
                                                                         "MessageRetentionPeriod: 86400"),
                                               Parameters=parameters)
    cloudformation.execute_change_set(ChangeSetName=changed["Id"], StackName=STACK)
