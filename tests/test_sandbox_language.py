"""Terraform language the sandbox must read as Terraform does, each case as Terraform's documentation states it.

Found planning public root configurations as committed (HCP Terraform workspaces, terraform-aws-modules):
a `cloud` block, a line break after `in` in a `for` expression, `!= null` on a map holding unknowns, the
provider's `region`, and a local module source that holds no `.tf` files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup
from gateway.adapters.hcl.backend import declared_backend
from gateway.domain.errors import ConfigError
from gateway.domain.plan import ChangeKind, Plan, load_plan
from gateway.domain.preview import build_preview, render_text
from gateway.ports import EnginePlan, StackInputs

from .fakes import FakeSandboxStore


@pytest.fixture
def engine() -> SandboxEngine:
    """The engine over its store in memory: what it plans from the files in a folder, no database."""
    return SandboxEngine(FakeSandboxStore())


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def plan(engine: SandboxEngine, stack: Path) -> tuple[EnginePlan, Plan]:
    result = engine.plan("s", stack, StackInputs())
    return result, load_plan(result.document)


def kinds(p: Plan) -> dict[str, ChangeKind]:
    return {rc.address: rc.kind for rc in p.resource_changes}


CLOUD = '''
terraform {
  cloud {
    organization = "acme"
    workspaces {
      name = "network-prod"
    }
  }
}
resource "aws_sqs_queue" "jobs" {
  name = "jobs"
}
'''


def test_a_cloud_block_is_planned_by_the_sandbox_which_says_whose_state_it_simulates(
        engine: SandboxEngine, tmp_path: Path) -> None:
    # Terraform: `cloud` in `terraform {}` names the HCP Terraform workspace whose state the stack uses
    stack = write(tmp_path / "stack", {"main.tf": CLOUD})
    result, p = plan(engine, stack)
    assert kinds(p) == {"aws_sqs_queue.jobs": ChangeKind.CREATE}
    shown = render_text(build_preview(p))
    assert "stack/main.tf:3: the stack declares a `cloud` block" in shown
    assert "not the cloud workspace's state" in shown
    # where the state lives, like a backend: a branch adding or dropping it moves the state
    assert declared_backend({"main.tf": CLOUD}) == {
        "cloud": {"organization": "acme", "workspaces": [{"name": "network-prod"}]}}


def test_the_terraform_engine_refuses_a_cloud_block_saying_why(tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": CLOUD})
    terraform = TerraformEngine(TerraformSetup(tmp_path / "no-terraform", tmp_path / "rc", tmp_path / "state", 30, {}))
    with pytest.raises(ConfigError) as err:
        terraform.plan("network", stack, StackInputs())
    message = str(err.value)
    assert "stack network: the terraform engine does not plan a stack with a `cloud` block" in message
    assert "HCP Terraform" in message and "declare a `backend` instead" in message


def test_a_line_break_after_in_in_a_for_expression(engine: SandboxEngine, tmp_path: Path) -> None:
    # HCL's grammar allows a newline inside brackets and braces, so also right after `in`
    stack = write(tmp_path / "stack", {"main.tf": '''
locals {
  groups = { for k, v in
    { blue = 2, green = 3 } : k => v if v > 1
  }
  names = [for n in
  ["a", "b"] : upper(n)]
}
resource "null_resource" "g" {
  for_each = local.groups
  triggers = { size = each.value, names = join(",", local.names) }
}
'''})
    _, p = plan(engine, stack)
    assert kinds(p) == {'null_resource.g["blue"]': ChangeKind.CREATE, 'null_resource.g["green"]': ChangeKind.CREATE}
    assert p.find('null_resource.g["green"]').change.after["triggers"] == {"size": 3, "names": "A,B"}


def test_a_for_over_a_set_keys_each_element_by_the_element(engine: SandboxEngine, tmp_path: Path) -> None:
    # Terraform: a set has no positions; `for k, v in toset(xs)` gives the element as k and v, as for_each does
    # (terraform-aws-modules/kms keys its aliases this way: `{ for k, v in toset(var.aliases) : k => {...} }`)
    stack = write(tmp_path / "stack", {"main.tf": '''
variable "aliases" {
  type    = list(string)
  default = ["sqs/jobs", "app"]
}
variable "zones" {
  type    = set(string)
  default = ["b", "a"]
}
locals {
  aliases = { for k, v in toset(var.aliases) : k => { name = v } }
  zones   = { for z in var.zones : z => upper(z) }
  listed  = { for i, v in ["x", "y"] : i => v }
}
resource "aws_kms_alias" "this" {
  for_each = local.aliases
  name     = "alias/${each.value.name}"
}
resource "null_resource" "z" {
  for_each = toset(keys(local.zones))
  triggers = { zone = local.zones[each.key], listed = jsonencode(local.listed) }
}
'''})
    _, p = plan(engine, stack)
    assert kinds(p) == {'aws_kms_alias.this["app"]': ChangeKind.CREATE, 'aws_kms_alias.this["sqs/jobs"]': ChangeKind.CREATE,
                        'null_resource.z["a"]': ChangeKind.CREATE, 'null_resource.z["b"]': ChangeKind.CREATE}
    assert p.find('aws_kms_alias.this["sqs/jobs"]').change.after["name"] == "alias/sqs/jobs"
    assert p.find('null_resource.z["b"]').change.after["triggers"] == {"zone": "B", "listed": '{"0":"x","1":"y"}'}


def test_comparing_with_null_looks_at_the_top_level_only(engine: SandboxEngine, tmp_path: Path) -> None:
    # Terraform: a known map is not null even when values inside it are known only after apply
    module = '''
variable "listeners" {
  default = null
}
resource "aws_lb_listener" "this" {
  for_each = var.listeners != null ? var.listeners : {}
  port     = each.value.port
  arn      = each.value.lb
}
output "is_null" {
  value = var.listeners == null
}
'''
    stack = write(tmp_path / "stack", {
        "main.tf": '''
resource "aws_lb" "main" {
  name = "web"
}
module "alb" {
  source    = "./alb"
  listeners = { http = { port = 80, lb = aws_lb.main.arn }, https = { port = 443, lb = aws_lb.main.arn } }
}
module "none" {
  source = "./alb"
}
output "alb_null" {
  value = module.alb.is_null
}
output "none_null" {
  value = module.none.is_null
}
''',
        "alb/main.tf": module})
    result, p = plan(engine, stack)
    assert kinds(p) == {"aws_lb.main": ChangeKind.CREATE,
                        'module.alb.aws_lb_listener.this["http"]': ChangeKind.CREATE,
                        'module.alb.aws_lb_listener.this["https"]': ChangeKind.CREATE}
    outputs = result.document["output_changes"]
    assert outputs["alb_null"]["after"] is False and outputs["alb_null"]["after_unknown"] is False
    assert outputs["none_null"]["after"] is True


def test_the_provider_region_names_zones_and_arns(engine: SandboxEngine, tmp_path: Path) -> None:
    # the AWS provider's `region` argument; a module gets an aliased configuration through `providers`
    stack = write(tmp_path / "stack", {
        "main.tf": '''
variable "region" {
  default = "us-east-2"
}
provider "aws" {
  region = var.region
}
provider "aws" {
  alias  = "replica"
  region = "ap-southeast-2"
}
data "aws_availability_zones" "here" {}
data "aws_region" "here" {}
resource "aws_sqs_queue" "jobs" {
  name = "jobs"
}
resource "aws_sqs_queue" "copy" {
  provider = aws.replica
  name     = "copy"
}
module "replica" {
  source    = "./m"
  providers = { aws = aws.replica }
}
module "inherits" {
  source = "./m"
}
output "zones" {
  value = data.aws_availability_zones.here.names
}
output "region" {
  value = data.aws_region.here.name
}
''',
        "m/main.tf": '''
data "aws_availability_zones" "here" {}
resource "aws_sqs_queue" "q" {
  name = "q-${data.aws_availability_zones.here.names[0]}"
}
'''})
    result, p = plan(engine, stack)
    outputs = result.document["output_changes"]
    assert outputs["zones"]["after"] == ["us-east-2a", "us-east-2b", "us-east-2c"]
    assert outputs["region"]["after"] == "us-east-2"
    assert p.find("module.replica.aws_sqs_queue.q").change.after["name"] == "q-ap-southeast-2a"
    assert p.find("module.inherits.aws_sqs_queue.q").change.after["name"] == "q-us-east-2a"
    outcome = engine.apply("s", stack, result.document, result.state_serial, StackInputs())
    assert outcome.succeeded, outcome.error
    state = engine.store.read_state("s")
    assert state is not None
    assert state.resources["aws_sqs_queue.jobs"].attributes["arn"] == "arn:aws:sqs:us-east-2:123456789012:jobs"
    assert state.resources["aws_sqs_queue.copy"].attributes["arn"] == "arn:aws:sqs:ap-southeast-2:123456789012:copy"
    assert state.resources["aws_sqs_queue.jobs"].attributes["url"].startswith("https://sqs.us-east-2.")


def test_a_module_folder_without_terraform_files_is_named(engine: SandboxEngine, tmp_path: Path) -> None:
    # Terraform: a module source must be a directory holding the module's .tf files
    repo = write(tmp_path / "repo", {"gateway.yaml": "stacks: {}\n", "stacks/net/main.tf": '''
module "vpc" {
  source = "../../"
  azs    = ["us-east-2a"]
}
''', "stacks/net/README.md": "the network\n"})
    with pytest.raises(ConfigError) as err:
        plan(engine, repo / "stacks" / "net")
    assert str(err.value) == ("no Terraform files in ./ (the repository top) (module vpc, net/main.tf:2; "
                              "source '../../')")


def test_an_attribute_the_provider_computes_inside_a_nested_block(engine: SandboxEngine, tmp_path: Path) -> None:
    # the AWS provider computes vpc_config's cluster_security_group_id: known after apply, as Terraform shows it
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "aws_eks_cluster" "this" {
  name = "main"
  vpc_config {
    subnet_ids = ["subnet-1"]
  }
}
resource "aws_ec2_tag" "primary" {
  resource_id = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  key         = "team"
  value       = "platform"
}
'''})
    result, p = plan(engine, stack)
    assert p.find("aws_ec2_tag.primary").change.after_unknown["resource_id"] is True
    outcome = engine.apply("s", stack, result.document, result.state_serial, StackInputs())
    assert outcome.succeeded, outcome.error
    state = engine.store.read_state("s")
    assert state is not None
    assert state.resources["aws_ec2_tag.primary"].attributes["resource_id"].startswith("cluster_security_group-")
    assert not plan(engine, stack)[1].has_changes


def test_flatten_keeps_a_list_of_objects_known_when_an_attribute_is_not(engine: SandboxEngine, tmp_path: Path) -> None:
    # Terraform: flatten() is unknown only where a nested list is; an object whose attribute is known after apply
    # is one element like any other, so a for_each keyed by known attributes of the flattened list is planned
    # (terraform-aws-modules/alb keys its listener rules this way, each rule naming its listener's ARN)
    stack = write(tmp_path / "stack", {"main.tf": '''
variable "listeners" {
  default = {
    http  = { rules = { static = { priority = 10 }, api = { priority = 20 } } }
    https = { rules = { api = { priority = 30 } } }
  }
}
resource "aws_lb_target_group" "app" {
  for_each = var.listeners
  name     = each.key
}
locals {
  rules = flatten([
    for listener, values in var.listeners : [
      for rule, settings in values.rules : merge(settings, {
        listener = listener
        rule     = rule
        target   = aws_lb_target_group.app[listener].arn
      })
    ]
  ])
}
resource "aws_lb_listener_rule" "this" {
  for_each     = { for v in local.rules : "${v.listener}/${v.rule}" => v }
  priority     = each.value.priority
  listener_arn = each.value.target
}
'''})
    _, p = plan(engine, stack)
    rules = {a for a, kind in kinds(p).items() if a.startswith("aws_lb_listener_rule.")}
    assert rules == {'aws_lb_listener_rule.this["http/api"]', 'aws_lb_listener_rule.this["http/static"]',
                     'aws_lb_listener_rule.this["https/api"]'}
    rule = p.find('aws_lb_listener_rule.this["https/api"]').change
    assert rule.after["priority"] == 30 and rule.after_unknown["listener_arn"] is True
