"""The sandbox engine on the sample repo: it must plan like Terraform. Each case plans through plan_stack on the
sample's files with the engine's store in memory (tests/fakes.py's sandbox_workspace); the bootstrap of a real
workspace (git, SQLite) is checked first."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from gateway.domain.errors import ConfigError, PlanError
from gateway.domain.plan import ChangeKind, Plan
from gateway.domain.preview import RENDERERS, render_text
from gateway.ports import ApplyOutcome
from gateway.services.change.planning import StackPlanResult, plan_stack
from gateway.services.workspace import Workspace, stack_secrets

from .fakes import FakeClone

STAGING = "stacks/app-staging/main.tf"


def plan_branch(ws: Workspace, stack: str, ref: str = "main") -> StackPlanResult:
    return plan_stack(ws, stack, ref)


def apply_result(ws: Workspace, result: StackPlanResult) -> ApplyOutcome:
    path = ws.repo_settings().stacks[result.stack].path
    with tempfile.TemporaryDirectory() as tmp:
        directory = ws.repo.export(result.sha, path, Path(tmp) / result.stack)
        return ws.engine.apply(result.stack, directory, result.engine_plan.document, result.engine_plan.state_serial,
                               ws.stack_inputs(result.stack))


def kinds(plan: Plan) -> dict[str, ChangeKind]:
    return {rc.address: rc.kind for rc in plan.changes}


def test_main_matches_the_simulated_cloud_after_bootstrap(workspace: Workspace) -> None:
    for stack in workspace.repo_settings().stacks:
        result = plan_branch(workspace, stack)
        assert not result.plan.has_changes, stack
        assert render_text(result.preview()).startswith("No changes")


def test_create_with_computed_values_unknown_until_apply(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("logs").write("stacks/app-staging/logs.tf", '''
resource "aws_s3_bucket" "logs" {
  bucket = "orders-logs-${local.env}"
  tags   = local.tags
}
resource "aws_s3_bucket_public_access_block" "logs" {
  bucket                  = aws_s3_bucket.logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}
''').push()
    result = plan_branch(ws, "app-staging", "logs")
    assert kinds(result.plan) == {"aws_s3_bucket.logs": ChangeKind.CREATE,
                                  "aws_s3_bucket_public_access_block.logs": ChangeKind.CREATE}
    bucket = result.plan.find("aws_s3_bucket.logs").change
    assert bucket.after["bucket"] == "orders-logs-staging"
    assert bucket.after_unknown["arn"] is True and bucket.after_unknown["id"] is True
    block = result.plan.find("aws_s3_bucket_public_access_block.logs").change
    assert block.after_unknown["bucket"] is True  # depends on an id known only after apply
    assert "bucket = (known after apply)" in render_text(result.preview())
    outcome = apply_result(ws, result)
    assert outcome.succeeded
    assert outcome.applied.index("aws_s3_bucket.logs") < outcome.applied.index("aws_s3_bucket_public_access_block.logs")
    state = ws.simulator.read_state("app-staging")
    assert state.resources["aws_s3_bucket_public_access_block.logs"].attributes["bucket"] == "orders-logs-staging"
    assert state.resources["aws_s3_bucket.logs"].attributes["arn"] == "arn:aws:s3:::orders-logs-staging"


def test_in_place_update(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    result = plan_branch(ws, "app-staging", "bigger")
    assert kinds(result.plan) == {"aws_instance.web[0]": ChangeKind.UPDATE}
    assert 'instance_type: "t3.small" -> "t3.medium"' in render_text(result.preview())


def test_force_new_attribute_replaces_destroy_first_with_replace_paths(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("ami").edit(STAGING, "ami-0c1c30571d2dae5c9", "ami-0d5eff06f840b45e9").push()
    rc = plan_branch(ws, "app-staging", "ami").plan.find("aws_instance.web[0]")
    assert rc.change.actions == ("delete", "create")
    assert rc.change.replace_paths == (("ami",),)
    assert rc.action_reason == "replace_because_cannot_update"
    assert rc.change.after_unknown["id"] is True


def test_create_before_destroy_replaces_create_first(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("cbd").edit(STAGING, 'name               = "orders-web-${local.env}"',
                             'name               = "orders-web2-${local.env}"\n  lifecycle {\n    create_before_destroy = true\n  }').push()
    result = plan_branch(ws, "app-staging", "cbd")
    rc = result.plan.find("aws_lb.web")
    assert rc.change.actions == ("create", "delete")
    assert rc.change.replace_paths == (("name",),)
    assert "aws_lb.web  replace (create, then destroy): `name` forces replacement" in render_text(result.preview())
    assert apply_result(ws, result).succeeded
    assert not plan_branch(ws, "app-staging", "cbd").plan.has_changes


def test_removed_resource_is_deleted_with_its_reason(ws: Workspace, checkout: FakeClone) -> None:
    text = checkout.branch("no-dns").read(STAGING)
    checkout.write(STAGING, text[: text.index('resource "aws_route53_record" "web"')]).push()
    result = plan_branch(ws, "app-staging", "no-dns")
    rc = result.plan.find("aws_route53_record.web")
    assert rc.kind == ChangeKind.DELETE and rc.action_reason == "delete_because_no_resource_config"
    assert "aws_route53_record.web  delete: removed from the configuration" in render_text(result.preview())


def test_lower_count_deletes_the_extra_index(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("fewer").edit("stacks/app-prod/main.tf", "default = 2", "default = 1").push()
    plan = plan_branch(ws, "app-prod", "fewer").plan
    assert kinds(plan) == {"aws_instance.web[1]": ChangeKind.DELETE}
    assert plan.find("aws_instance.web[1]").action_reason == "delete_because_count_index"


def test_prevent_destroy_refuses_the_plan_naming_the_resource(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("rename-db").edit("stacks/data/main.tf", '"orders-prod"', '"orders-prod-v2"').push()
    with pytest.raises(PlanError, match=r"aws_db_instance\.orders has lifecycle\.prevent_destroy.*identifier"):
        plan_branch(ws, "data", "rename-db")


def test_moved_block_renames_without_destroying(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("rename").edit(STAGING, 'resource "aws_lb" "web"', 'resource "aws_lb" "frontend"') \
        .edit(STAGING, "aws_lb.web.dns_name", "aws_lb.frontend.dns_name") \
        .write("stacks/app-staging/moved.tf", 'moved {\n  from = aws_lb.web\n  to   = aws_lb.frontend\n}\n').push()
    result = plan_branch(ws, "app-staging", "rename")
    rc = result.plan.find("aws_lb.frontend")
    assert rc.kind == ChangeKind.NO_OP and rc.previous_address == "aws_lb.web"
    assert result.plan.find("aws_lb.web") is None
    assert not result.plan.destructive
    assert apply_result(ws, result).succeeded
    assert "aws_lb.frontend" in ws.simulator.read_state("app-staging").resources


def test_import_block_adopts_an_existing_object(ws: Workspace, checkout: FakeClone) -> None:
    ws.simulator.put_object("aws_s3_bucket", "legacy-exports", {
        "id": "legacy-exports", "bucket": "legacy-exports", "arn": "arn:aws:s3:::legacy-exports",
        "force_destroy": False, "tags": {"owner": "app-team", "cost-centre": "cc-3003", "stack": "app-staging"}})
    checkout.branch("import").write("stacks/app-staging/legacy.tf", '''
import {
  to = aws_s3_bucket.legacy
  id = "legacy-exports"
}
resource "aws_s3_bucket" "legacy" {
  bucket = "legacy-exports"
  tags   = merge(local.tags, { imported = "true" })
}
''').push()
    result = plan_branch(ws, "app-staging", "import")
    rc = result.plan.find("aws_s3_bucket.legacy")
    assert rc.kind == ChangeKind.UPDATE  # imported, then its new tag applied in place
    assert rc.change.importing == {"id": "legacy-exports"}
    assert "[importing id legacy-exports]" in render_text(result.preview())
    assert apply_result(ws, result).succeeded
    state = ws.simulator.read_state("app-staging")
    assert state.resources["aws_s3_bucket.legacy"].id == "legacy-exports"
    assert ws.simulator.get_object("aws_s3_bucket", "legacy-exports")["tags"]["imported"] == "true"


def test_out_of_band_edit_shows_as_drift_the_apply_would_revert(ws: Workspace) -> None:
    ws.simulator.edit_object("network", "aws_security_group_rule.internal_ingress", {"cidr_blocks": ["0.0.0.0/0"]})
    result = plan_branch(ws, "network")
    drift = result.plan.resource_drift
    assert [d.address for d in drift] == ["aws_security_group_rule.internal_ingress"]
    assert result.plan.find("aws_security_group_rule.internal_ingress").kind == ChangeKind.REPLACE
    text = render_text(result.preview())
    assert "aws_security_group_rule.internal_ingress: changed outside the gateway; this apply would revert it" in text
    assert 'cidr_blocks[0]: "10.20.0.0/16" (recorded) -> "0.0.0.0/0" (now)' in text
    assert text.index("DRIFT") < text.index("CHANGES")


def test_drift_on_an_ignored_attribute_is_kept(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("ignore").edit("stacks/network/main.tf", "prevent_destroy = true",
                                "prevent_destroy = true\n    ignore_changes  = [tags]").push()
    ws.simulator.edit_object("network", "aws_vpc.main", {"tags": {"Name": "renamed-in-console"}})
    result = plan_branch(ws, "network", "ignore")
    assert result.plan.find("aws_vpc.main").kind == ChangeKind.NO_OP
    assert "aws_vpc.main: changed outside the gateway; this apply keeps it" in render_text(result.preview())


def test_object_deleted_out_of_band_is_recreated(ws: Workspace) -> None:
    ws.simulator.delete_object("app-staging", "aws_route53_record.web")
    result = plan_branch(ws, "app-staging")
    assert kinds(result.plan) == {"aws_route53_record.web": ChangeKind.CREATE}
    assert "deleted outside the gateway; this apply creates it again" in render_text(result.preview())


def test_half_done_apply_keeps_what_was_done_and_the_next_plan_shows_the_rest(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("three").write("stacks/app-staging/reports.tf", '''
resource "aws_s3_bucket" "reports" {
  bucket = "reports-staging"
  tags   = local.tags
}
resource "aws_s3_bucket_versioning" "reports" {
  bucket = aws_s3_bucket.reports.id
  versioning_configuration {
    status = "Enabled"
  }
}
resource "aws_s3_bucket_server_side_encryption_configuration" "reports" {
  bucket = aws_s3_bucket.reports.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
  }
}
''').push()
    result = plan_branch(ws, "app-staging", "three")
    serial_before = result.engine_plan.state_serial
    ws.simulator.inject_fault("app-staging", "aws_s3_bucket_versioning.reports", "AccessDenied: s3:PutBucketVersioning")
    outcome = apply_result(ws, result)
    assert not outcome.succeeded
    assert outcome.failed_address == "aws_s3_bucket_versioning.reports"
    assert "AccessDenied" in outcome.error
    state = ws.simulator.read_state("app-staging")
    assert "aws_s3_bucket.reports" in state.resources
    assert "aws_s3_bucket_versioning.reports" not in state.resources
    assert state.serial > serial_before
    follow_up = plan_branch(ws, "app-staging", "three").plan
    assert set(kinds(follow_up)) == {"aws_s3_bucket_versioning.reports",
                                     "aws_s3_bucket_server_side_encryption_configuration.reports"}


def test_apply_follows_dependency_order_and_deletes_in_reverse(ws: Workspace, checkout: FakeClone) -> None:
    text = checkout.branch("teardown").read(STAGING)
    start = text.index('resource "aws_security_group" "web"')
    checkout.write(STAGING, text[:start]).push()
    result = plan_branch(ws, "app-staging", "teardown")
    outcome = apply_result(ws, result)
    assert outcome.succeeded
    order = list(outcome.applied)
    assert order.index("aws_route53_record.web") < order.index("aws_lb.web") < order.index("aws_security_group.web")
    assert order.index("aws_security_group_rule.https") < order.index("aws_security_group.web")


def test_state_has_serial_and_lineage(ws: Workspace, checkout: FakeClone) -> None:
    before = ws.simulator.read_state("app-staging")
    checkout.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    assert apply_result(ws, plan_branch(ws, "app-staging", "bigger")).succeeded
    after = ws.simulator.read_state("app-staging")
    assert after.lineage == before.lineage
    assert after.serial == before.serial + 1


def test_sensitive_variable_is_marked_and_never_rendered(ws: Workspace, checkout: FakeClone) -> None:
    password = stack_secrets(ws.settings, "data")["db_password"]
    checkout.branch("pg17").edit("stacks/data/main.tf", '"16.3"', '"17.2"').push()
    result = plan_branch(ws, "data", "pg17")
    rc = result.plan.find("aws_db_instance.orders")
    assert rc.kind == ChangeKind.UPDATE
    assert rc.change.after_sensitive["password"] is True
    assert password in json.dumps(result.engine_plan.document)  # the saved plan holds it, as Terraform's does
    for fmt in ("text", "markdown", "json"):
        output = RENDERERS[fmt](result.preview())
        assert password not in output
    assert result.plan.output_changes["db_password"].after_sensitive is True


def test_for_each_and_interpolation(ws: Workspace, checkout: FakeClone) -> None:
    checkout.branch("queues").write("stacks/app-staging/queues.tf", '''
variable "queues" {
  default = { orders = 30, refunds = 60 }
}
resource "aws_sqs_queue" "q" {
  for_each                   = var.queues
  name                       = "${local.env}-${each.key}"
  visibility_timeout_seconds = each.value * 2
  tags                       = { for k, v in local.tags : k => upper(v) if k != "stack" }
}
''').push()
    plan = plan_branch(ws, "app-staging", "queues").plan
    rc = plan.find('aws_sqs_queue.q["refunds"]')
    assert rc.kind == ChangeKind.CREATE and rc.index == "refunds"
    assert rc.change.after["name"] == "staging-refunds"
    assert rc.change.after["visibility_timeout_seconds"] == 120
    assert rc.change.after["tags"] == {"owner": "APP-TEAM", "cost-centre": "CC-3003"}


@pytest.mark.parametrize("content,message", [
    ('resource "aws_s3_bucket" "x" {\n  bucket = \n}\n', r"broken\.tf:\d+:\d+: malformed HCL"),
    ('resource "aws_s3_bucket" "x" {\n  bucket = var.nope\n}\n', "undeclared variable var.nope"),
    ('resource "aws_s3_bucket" "x" {\n  bucket = aws_s3_bucket.y.id\n}\n', "undeclared resource aws_s3_bucket.y"),
    ('resource "aws_s3_bucket" "x" {\n  bucket = nofunc(1)\n}\n', "function `nofunc` is not available"),
])
def test_bad_declarations_get_precise_errors(ws: Workspace, checkout: FakeClone, content: str, message: str) -> None:
    checkout.branch("broken").write("stacks/app-staging/broken.tf", content).push()
    with pytest.raises(ConfigError, match=message):
        plan_branch(ws, "app-staging", "broken")


@pytest.mark.parametrize("expression", ["tonumber(var.db_password)", '{ a = 1 }[var.db_password]',
                                        "cidrsubnet(var.db_password, 8, 1)"])
def test_errors_never_quote_a_sensitive_value(ws: Workspace, checkout: FakeClone, expression: str) -> None:
    password = stack_secrets(ws.settings, "data")["db_password"]
    checkout.branch("oops").write("stacks/data/oops.tf", f'resource "aws_sqs_queue" "q" {{\n  name = {expression}\n}}\n').push()
    with pytest.raises(ConfigError) as error:
        plan_branch(ws, "data", "oops")
    assert password not in str(error.value)
    assert "sensitive" in str(error.value)
