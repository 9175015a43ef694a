"""The sandbox plans Terraform written for Terraform, not for it: data sources, modules (local and
installed by `terraform init`), dynamic blocks, provisioners, variable files, resource types it has
no schema for, and Terraform's `configuration` section in its plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.domain.errors import ConfigError, PlanError
from gateway.domain.plan import ChangeKind, Plan, load_plan
from gateway.domain.policy import PolicyContext, PolicySettings, evaluate_plan
from gateway.domain.preview import build_preview, render_text
from gateway.ports import EnginePlan, StackInputs
from gateway.services.change.planning import plan_stack
from gateway.services.workspace import Workspace

from .conftest import Clone
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


def plan(engine: SandboxEngine, stack: Path, inputs: StackInputs | None = None) -> tuple[EnginePlan, Plan]:
    result = engine.plan("s", stack, inputs or StackInputs())
    return result, load_plan(result.document)


def apply_and_replan(engine: SandboxEngine, stack: Path, result: EnginePlan) -> Plan:
    outcome = engine.apply("s", stack, result.document, result.state_serial, StackInputs())
    assert outcome.succeeded, outcome.error
    return plan(engine, stack)[1]


def kinds(p: Plan) -> dict[str, ChangeKind]:
    return {rc.address: rc.kind for rc in p.resource_changes}


def after(p: Plan, address: str) -> dict:
    return dict(next(rc for rc in p.resource_changes if rc.address == address).change.after or {})


# --- data sources ----------------------------------------------------------------------------

DATA = '''
data "aws_availability_zones" "available" {
  state = "available"
}
data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}
data "aws_ami" "ubuntu" {
  most_recent = true
  owners      = ["099720109477"]
  filter {
    name   = "name"
    values = ["ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"]
  }
}
data "aws_vpc" "default" {
  default = true
}
data "aws_subnets" "default" {
  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default.id]
  }
}
data "aws_iam_policy_document" "assume" {
  statement {
    sid     = "EC2Assume"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}
resource "aws_subnet" "private" {
  count             = length(data.aws_availability_zones.available.names)
  vpc_id            = data.aws_vpc.default.id
  availability_zone = data.aws_availability_zones.available.names[count.index]
  cidr_block        = cidrsubnet(data.aws_vpc.default.cidr_block, 4, count.index)
}
resource "aws_instance" "web" {
  ami           = data.aws_ami.ubuntu.id
  instance_type = "t3.micro"
  subnet_id     = data.aws_subnets.default.ids[0]
}
resource "aws_iam_role" "app" {
  name               = "app-${data.aws_region.current.name}"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  path               = "/${data.aws_partition.current.partition}/"
}
'''


def test_common_aws_data_sources_are_read_at_plan_time(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": DATA})
    result, p = plan(engine, stack)
    assert kinds(p) == {"aws_subnet.private[0]": ChangeKind.CREATE, "aws_subnet.private[1]": ChangeKind.CREATE,
                        "aws_subnet.private[2]": ChangeKind.CREATE, "aws_instance.web": ChangeKind.CREATE,
                        "aws_iam_role.app": ChangeKind.CREATE}
    assert [after(p, f"aws_subnet.private[{i}]")["availability_zone"] for i in range(3)] == \
        ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    assert after(p, "aws_subnet.private[1]")["cidr_block"] == "172.31.16.0/20"
    assert after(p, "aws_instance.web")["ami"].startswith("ami-")
    assert after(p, "aws_instance.web")["subnet_id"].startswith("subnet-")
    role = after(p, "aws_iam_role.app")
    assert role["name"] == "app-eu-west-1" and role["path"] == "/aws/"
    assert json.loads(role["assume_role_policy"]) == {
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "EC2Assume", "Effect": "Allow", "Action": "sts:AssumeRole",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
        }],
    }
    # as Terraform writes them: data read during the plan are in prior_state, not resource_changes
    prior = result.document["prior_state"]["values"]["root_module"]["resources"]
    assert {r["address"] for r in prior if r["mode"] == "data"} >= {
        "data.aws_ami.ubuntu", "data.aws_vpc.default", "data.aws_iam_policy_document.assume"}
    assert not [rc for rc in p.resource_changes if rc.mode == "data"]
    # the same values again on apply: the re-plan has nothing to do
    assert not apply_and_replan(engine, stack, result).has_changes


def test_policy_document_merges_sources_and_overrides_by_sid(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
data "aws_iam_policy_document" "base" {
  statement {
    sid       = "Read"
    actions   = ["s3:GetObject", "s3:ListBucket"]
    resources = ["*"]
  }
}
data "aws_iam_policy_document" "combined" {
  source_policy_documents = [data.aws_iam_policy_document.base.json]
  statement {
    sid       = "Write"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["arn:aws:s3:::b/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
  }
  override_policy_documents = [jsonencode({Statement = [{Sid = "Read", Effect = "Allow", Action = "s3:GetObject", Resource = "arn:aws:s3:::b"}]})]
}
resource "aws_iam_policy" "p" {
  name   = "p"
  policy = data.aws_iam_policy_document.combined.json
}
'''})
    _, p = plan(engine, stack)
    statements = json.loads(after(p, "aws_iam_policy.p")["policy"])["Statement"]
    assert statements == [
        {"Sid": "Read", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b"},
        {"Sid": "Write", "Effect": "Deny", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/*", "Principal": "*"},
    ]


def test_data_waiting_on_a_new_resource_is_read_during_apply(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "aws_s3_bucket" "b" {
  bucket = "reports"
}
data "aws_iam_policy_document" "read" {
  statement {
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.b.arn}/*"]
  }
}
resource "aws_s3_bucket_policy" "b" {
  bucket = aws_s3_bucket.b.id
  policy = data.aws_iam_policy_document.read.json
}
'''})
    result, p = plan(engine, stack)
    read = next(rc for rc in p.resource_changes if rc.mode == "data")
    assert (read.address, read.kind) == ("data.aws_iam_policy_document.read", ChangeKind.READ)
    assert read.action_reason == "read_because_config_unknown"
    policy_change = next(rc for rc in p.resource_changes if rc.address == "aws_s3_bucket_policy.b")
    assert policy_change.change.after_unknown["policy"] is True
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None
    policy = json.loads(state.resources["aws_s3_bucket_policy.b"].attributes["policy"])
    assert policy["Statement"][0]["Resource"] == "arn:aws:s3:::reports/*"


def test_unsimulated_data_source_is_unknown_not_an_error(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
data "aws_organizations_organization" "org" {}

resource "aws_ssm_parameter" "p" {
  name  = "copy"
  type  = "String"
  value = data.aws_organizations_organization.org.master_account_id
}
'''})
    result, p = plan(engine, stack)
    assert kinds(p)["aws_ssm_parameter.p"] == ChangeKind.CREATE
    param = next(rc for rc in p.resource_changes if rc.address == "aws_ssm_parameter.p")
    assert param.change.after_unknown["value"] is True
    assert not apply_and_replan(engine, stack, result).has_changes


def test_count_decided_by_an_unsimulated_data_source_names_it(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
data "aws_ec2_instance_type_offerings" "t" {}

resource "aws_instance" "a" {
  count         = length(data.aws_ec2_instance_type_offerings.t.instance_types)
  ami           = "ami-1"
  instance_type = "t3.micro"
}
'''})
    with pytest.raises(PlanError) as err:
        plan(engine, stack)
    assert "stack/main.tf:4: aws_instance.a: count depends on values known only after apply" in str(err.value)
    assert "data.aws_ec2_instance_type_offerings.t" in str(err.value)


# --- modules ---------------------------------------------------------------------------------

SUBNETS_MODULE = {
    "modules/subnets/variables.tf": '''
variable "vpc_id" {
  type = string
}
variable "cidrs" {
  type    = list(string)
  default = []
}
variable "name" {
  type = string
}
''',
    "modules/subnets/main.tf": '''
resource "aws_subnet" "this" {
  count      = length(var.cidrs)
  vpc_id     = var.vpc_id
  cidr_block = var.cidrs[count.index]
  tags       = { Name = "${var.name}-${count.index}" }
}
module "label" {
  source = "../label"
  name   = var.name
}
''',
    "modules/subnets/outputs.tf": '''
output "ids" {
  value = aws_subnet.this[*].id
}
output "label" {
  value = module.label.id
}
''',
    "modules/label/main.tf": '''
variable "name" {}
resource "random_id" "suffix" {
  byte_length = 2
}
output "id" {
  value = "${var.name}-${random_id.suffix.hex}"
}
''',
}

ROOT_WITH_MODULES = '''
resource "aws_vpc" "main" {
  cidr_block = "10.0.0.0/16"
}
module "net" {
  source   = "./modules/subnets"
  for_each = { a = ["10.0.1.0/24", "10.0.2.0/24"], b = ["10.0.3.0/24"] }
  vpc_id   = aws_vpc.main.id
  cidrs    = each.value
  name     = "net-${each.key}"
}
module "extra" {
  source = "./modules/subnets"
  count  = 1
  vpc_id = aws_vpc.main.id
  name   = "extra"
}
resource "aws_security_group" "app" {
  name   = module.net["a"].label
  vpc_id = aws_vpc.main.id
}
output "subnet_ids" {
  value = module.net["a"].ids
}
'''


def test_local_modules_with_for_each_count_and_nesting(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": ROOT_WITH_MODULES, **SUBNETS_MODULE})
    result, p = plan(engine, stack)
    assert sorted(kinds(p)) == [
        "aws_security_group.app", "aws_vpc.main",
        'module.extra[0].module.label.random_id.suffix',
        'module.net["a"].aws_subnet.this[0]', 'module.net["a"].aws_subnet.this[1]',
        'module.net["a"].module.label.random_id.suffix',
        'module.net["b"].aws_subnet.this[0]', 'module.net["b"].module.label.random_id.suffix',
    ]
    subnet = next(c for c in result.document["resource_changes"] if c["address"] == 'module.net["b"].aws_subnet.this[0]')
    assert subnet["module_address"] == 'module.net["b"]' and subnet["index"] == 0 and subnet["name"] == "this"
    assert subnet["change"]["after"]["cidr_block"] == "10.0.3.0/24"
    assert subnet["change"]["after"]["tags"] == {"Name": "net-b-0"}
    assert subnet["change"]["after_unknown"]["vpc_id"] is True
    assert p.resource_changes[0].change.after_unknown["name"] is True  # a module output known after apply
    children = result.document["planned_values"]["root_module"]["child_modules"]
    assert {c["address"] for c in children} == {'module.extra[0]', 'module.net["a"]', 'module.net["b"]'}

    after_apply = apply_and_replan(engine, stack, result)
    assert not after_apply.has_changes
    state = engine.store.read_state("s")
    assert state is not None
    sg = state.resources["aws_security_group.app"].attributes
    assert sg["name"].startswith("net-a-") and len(sg["name"]) == len("net-a-") + 4
    assert state.outputs["subnet_ids"]["value"][0].startswith("subnet-")
    assert state.resources['module.net["a"].aws_subnet.this[1]'].module == 'module.net["a"]'

    # a for_each key gone: its module instance's resources are deleted, as Terraform says why
    (stack / "main.tf").write_text(ROOT_WITH_MODULES.replace(', b = ["10.0.3.0/24"]', ""))
    _, shrunk = plan(engine, stack)
    deleted = {rc.address: rc.action_reason for rc in shrunk.resource_changes if rc.kind == ChangeKind.DELETE}
    assert deleted == {'module.net["b"].aws_subnet.this[0]': "delete_because_no_module",
                       'module.net["b"].module.label.random_id.suffix': "delete_because_no_module"}


def test_module_errors_name_the_call_the_source_and_the_line(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
module "vpc" {
  source  = "terraform-aws-modules/vpc/aws"
  version = "5.0.0"
  name    = "main"
}
'''})
    with pytest.raises(ConfigError) as err:
        plan(engine, stack)
    assert 'stack/main.tf:2: module "vpc": source \'terraform-aws-modules/vpc/aws\' is not installed' in str(err.value)
    write(stack, {"main.tf": 'module "a" {\n  source = "./missing"\n}\n'})
    with pytest.raises(ConfigError, match=r'stack/main.tf:1: module "a": source \'./missing\' is not a directory'):
        plan(engine, stack)
    write(stack, {"main.tf": 'module "a" {\n  source = "./m"\n  colour = "red"\n}\n', "m/main.tf": 'variable "size" {}\n'})
    with pytest.raises(ConfigError, match=r'main.tf:1: module "a": the module declares no variable `colour`'):
        plan(engine, stack)


def test_registry_module_installed_by_terraform_init_is_planned(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {
        "main.tf": '''
module "bucket" {
  source  = "terraform-aws-modules/s3-bucket/aws"
  version = "~> 4.0"
  bucket  = "logs"
}
output "arn" {
  value = module.bucket.arn
}
''',
        ".terraform/modules/modules.json": json.dumps({"Modules": [
            {"Key": "", "Source": "", "Dir": "."},
            {"Key": "bucket", "Source": "registry.terraform.io/terraform-aws-modules/s3-bucket/aws",
             "Version": "4.1.0", "Dir": ".terraform/modules/bucket"}]}),
        ".terraform/modules/bucket/main.tf": '''
variable "bucket" {}
variable "create" {
  default = true
}
resource "aws_s3_bucket" "this" {
  count  = var.create ? 1 : 0
  bucket = var.bucket
}
output "arn" {
  value = try(aws_s3_bucket.this[0].arn, "")
}
''',
    })
    result, p = plan(engine, stack)
    assert kinds(p) == {"module.bucket.aws_s3_bucket.this[0]": ChangeKind.CREATE}
    calls = result.document["configuration"]["root_module"]["module_calls"]
    assert calls["bucket"]["source"] == "terraform-aws-modules/s3-bucket/aws"
    assert calls["bucket"]["version_constraint"] == "~> 4.0"
    assert calls["bucket"]["module"]["resources"][0]["address"] == "aws_s3_bucket.this"
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None and state.outputs["arn"]["value"] == "arn:aws:s3:::logs"


# --- blocks ----------------------------------------------------------------------------------


def test_dynamic_blocks_provisioners_and_terraform_settings(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
terraform {
  required_version = ">= 1.0"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
  backend "s3" {
    bucket = "state"
    key    = "app.tfstate"
  }
  provider_meta "aws" {
    module_name = "app"
  }
}
provider "aws" {
  region = "eu-west-1"
}
provider "aws" {
  alias  = "us"
  region = "us-east-1"
}
locals {
  rules = {
    https = { port = 443, cidrs = ["10.0.0.0/8"] }
    ssh   = { port = 22, cidrs = ["10.1.0.0/16", "10.2.0.0/16"] }
  }
}
resource "aws_security_group" "web" {
  provider = aws.us
  name     = "web"
  dynamic "ingress" {
    for_each = local.rules
    iterator = rule
    content {
      description = rule.key
      from_port   = rule.value.port
      to_port     = rule.value.port
      protocol    = "tcp"
      dynamic "cidr" {
        for_each = rule.value.cidrs
        content {
          block = cidr.value
        }
      }
    }
  }
  provisioner "local-exec" {
    command = "echo ${self.id}"
  }
  connection {
    type = "ssh"
    host = self.id
  }
}
'''})
    result, p = plan(engine, stack)
    ingress = after(p, "aws_security_group.web")["ingress"]
    assert ingress == [
        {"description": "https", "from_port": 443, "to_port": 443, "protocol": "tcp", "cidr": [{"block": "10.0.0.0/8"}]},
        {"description": "ssh", "from_port": 22, "to_port": 22, "protocol": "tcp",
         "cidr": [{"block": "10.1.0.0/16"}, {"block": "10.2.0.0/16"}]},
    ]
    assert "provisioner" not in after(p, "aws_security_group.web")
    configuration = result.document["configuration"]
    assert set(configuration["provider_config"]) == {"aws", "aws.us"}
    resource = configuration["root_module"]["resources"][0]
    assert resource["provider_config_key"] == "aws.us"
    assert resource["provisioners"][0]["type"] == "local-exec"
    assert not apply_and_replan(engine, stack, result).has_changes


def test_variable_files_load_in_terraform_order_and_workspace_values_win(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {
        "main.tf": '''
variable "a" {}
variable "b" {}
variable "c" {}
variable "d" {}
variable "e" {
  default = "default"
}
resource "null_resource" "n" {
  triggers = { a = var.a, b = var.b, c = var.c, d = var.d, e = var.e }
}
''',
        "terraform.tfvars": 'a = "tfvars"\nb = "tfvars"\nc = "tfvars"\nd = "tfvars"\n',
        "terraform.tfvars.json": '{"b": "tfvars.json", "c": "tfvars.json", "d": "tfvars.json"}',
        "a.auto.tfvars": 'c = "a.auto"\nd = "a.auto"\n',
        "b.auto.tfvars.json": '{"d": "b.auto.json"}',
    })
    _, p = plan(engine, stack)
    assert after(p, "null_resource.n")["triggers"] == {"a": "tfvars", "b": "tfvars.json", "c": "a.auto",
                                                       "d": "b.auto.json", "e": "default"}
    _, p = plan(engine, stack, StackInputs(values={"d": "workspace"}))
    assert after(p, "null_resource.n")["triggers"]["d"] == "workspace"
    assert p.resource_changes[0].change.after_sensitive == {"triggers": {"d": True}}  # a workspace value stays secret


def test_attributes_of_types_without_a_schema_are_known_after_apply(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "aws_iam_user" "ci" {
  name = "ci"
}
resource "aws_appconfig_application" "app" {
  name = "app"
}
resource "aws_ssm_parameter" "p" {
  name  = "refs"
  type  = "String"
  value = jsonencode([aws_iam_user.ci.arn, aws_appconfig_application.app.arn, aws_appconfig_application.app.application_id])
}
'''})
    result, p = plan(engine, stack)
    assert after(p, "aws_appconfig_application.app") == {"name": "app"}
    assert p.resource_changes[0].change.after_unknown == {"arn": True, "application_id": True, "id": True}
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None
    arns = json.loads(state.resources["aws_ssm_parameter.p"].attributes["value"])
    assert arns[0] == "arn:aws:iam::123456789012:user/ci"
    assert arns[1].startswith("arn:aws:appconfig:eu-west-1:123456789012:") and arns[2].startswith("application-")


def test_errors_name_the_file_and_line(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": 'resource "aws_vpc" "a" {\n  cidr_block = "10.0.0.0/16"\n}\n',
                                       "net.tf": '\n\nresource "aws_subnet" "b" {\n  vpc_id = var.missing\n}\n'})
    with pytest.raises(ConfigError, match=r"stack/net.tf:4: reference to undeclared variable var.missing"):
        plan(engine, stack)
    write(stack, {"net.tf": 'resource "aws_subnet" "b" {\n  vpc_id = aws_vpc.a.id\n  vpc_id = "x"\n}\n'})
    with pytest.raises(ConfigError, match=r"stack/net.tf:3: attribute `vpc_id` is set twice"):
        plan(engine, stack)
    write(stack, {"net.tf": 'resource "aws_vpc" "a" {\n}\n'})
    with pytest.raises(ConfigError, match=r"stack/net.tf:1: aws_vpc.a: defined twice \(also at stack/main.tf:1"):
        plan(engine, stack)
    write(stack, {"net.tf": 'resource "aws_vpc" "b" {\n  cidr_block = aws_vpc.a.id\n}\n',
                  "main.tf": 'resource "aws_vpc" "a" {\n  cidr_block = aws_vpc.b.id\n}\n'})
    with pytest.raises(ConfigError, match=r"cycle between aws_vpc.\w \(stack/\w+.tf:1\), aws_vpc.\w \(stack/\w+.tf:1\)"):
        plan(engine, stack)
    write(stack, {"main.tf": "", "net.tf": 'module "m" {\n  source = "./m"\n  count  = "two"\n}\n',
                  "m/main.tf": 'output "x" {\n  value = 1\n}\n'})
    with pytest.raises(ConfigError, match=r"stack/net.tf:1: module.m: count must be a whole number"):
        plan(engine, stack)  # a module without resources is expanded all the same
    write(stack, {"main.tf": 'resource "aws_vpc" "a" {\n  cidr_block = "10.0.0.0/16"\n\n  tags = { n = 1 + "x" }\n}\n',
                  "net.tf": ""})
    with pytest.raises(ConfigError, match=r"stack/main.tf:4: aws_vpc.a: "):  # the attribute's line, not the block's
        plan(engine, stack)


# --- configuration and policy ----------------------------------------------------------------


def test_policy_follows_configuration_references_not_local_names(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "aws_s3_bucket" "reports" {
  bucket = "reports-${random_id.s.hex}"
  tags   = { owner = "team", "cost-centre" = "cc-1" }
}
resource "random_id" "s" {
  byte_length = 2
}
resource "aws_s3_bucket_public_access_block" "reports_pab" {
  bucket                  = aws_s3_bucket.reports.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}
resource "aws_s3_bucket_server_side_encryption_configuration" "reports_sse" {
  bucket = aws_s3_bucket.reports.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
  }
}
resource "aws_s3_bucket" "other" {
  bucket = "other-${random_id.s.hex}"
  tags   = { owner = "team", "cost-centre" = "cc-1" }
}
'''})
    result, p = plan(engine, stack)
    refs = result.document["configuration"]["root_module"]["resources"][2]["expressions"]["bucket"]["references"]
    assert refs == ["aws_s3_bucket.reports.id", "aws_s3_bucket.reports"]
    context = PolicyContext("s", PolicySettings())
    denied = {(f.rule, f.address) for f in evaluate_plan(p, context) if f.rule in ("s3-public-access-block", "encryption-at-rest")}
    assert denied == {("s3-public-access-block", "aws_s3_bucket.other"), ("encryption-at-rest", "aws_s3_bucket.other")}


def test_configuration_shows_no_constant_known_only_at_apply_or_masked(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "null_resource" "always" {
  triggers = { at = timestamp(), id = uuid() }
}
resource "aws_ssm_parameter" "p" {
  name  = upper("motd")
  value = sensitive("hunter2")
}
'''})
    result, _ = plan(engine, stack)
    document = json.loads(json.dumps(result.document))  # what policy and storage read: plain JSON
    resources = {r["address"]: r["expressions"] for r in document["configuration"]["root_module"]["resources"]}
    assert resources["null_resource.always"]["triggers"] == {}
    assert resources["aws_ssm_parameter.p"] == {"name": {"constant_value": "MOTD"}, "value": {}}
    assert "hunter2" not in json.dumps(document["configuration"])


# --- the sandbox against Terraform ----------------------------------------------------------

TERRAFORM = Path(__file__).resolve().parent.parent / ".tools" / "terraform"
DIFFERENTIAL_MODULE = {
    "modules/svc/main.tf": '''
variable "name" {}
variable "replicas" {
  default = 1
}
resource "null_resource" "replica" {
  count    = var.replicas
  triggers = { name = var.name, index = count.index }
}
module "sidecar" {
  source = "../sidecar"
  owner  = var.name
}
output "ids" {
  value = null_resource.replica[*].id
}
''',
    "modules/sidecar/main.tf": '''
variable "owner" {}
resource "null_resource" "this" {
  triggers = { owner = var.owner }
}
''',
}
DIFFERENTIAL_ROOT = '''
variable "services" {
  type = map(number)
}
variable "release" {}
locals {
  names = keys(var.services)
}
module "svc" {
  source   = "./modules/svc"
  for_each = var.services
  name     = each.key
  replicas = each.value
}
resource "null_resource" "release" {
  triggers = { release = var.release, first = local.names[0] }
}
resource "null_resource" "watch" {
  for_each = toset(local.names)
  triggers = { service = each.key }
}
'''


def _terraform_engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup

    return TerraformEngine(TerraformSetup(TERRAFORM / "bin" / "terraform", TERRAFORM / "terraformrc",
                                          tmp_path / "tf-state", 300, {}))


@pytest.mark.skipif(not (TERRAFORM / "bin" / "terraform").exists(),
                    reason="Terraform is not installed here: run `make terraform` to compare the engines")
def test_the_sandbox_plans_the_same_actions_as_terraform(engine: SandboxEngine, tmp_path: Path) -> None:
    terraform = _terraform_engine(tmp_path)
    versions = [
        {"terraform.tfvars": 'services = { api = 2, web = 1 }\nrelease = "1"\n'},
        # a replica more, a trigger changed (replace), a service gone (its module instance deleted)
        {"terraform.tfvars": 'services = { api = 3 }\nrelease = "1"\n', "release.auto.tfvars": 'release = "2"\n'},
    ]
    for run, tfvars in enumerate(versions):
        compared = {}
        for name, subject in (("sandbox", engine), ("terraform", terraform)):
            stack = write(tmp_path / f"{name}{run}", {"main.tf": DIFFERENTIAL_ROOT, **DIFFERENTIAL_MODULE, **tfvars})
            planned = subject.plan("s", stack, StackInputs())
            compared[name] = kinds(load_plan(planned.document))
            outcome = subject.apply("s", stack, planned.document, planned.state_serial, StackInputs(), planned.artifact)
            assert outcome.succeeded, outcome.error
        assert compared["sandbox"] == compared["terraform"], run
    assert compared["sandbox"]['module.svc["web"].module.sidecar.null_resource.this'] == ChangeKind.DELETE
    assert compared["sandbox"]["null_resource.release"] == ChangeKind.REPLACE


def test_null_module_inputs_follow_nullable(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {
        "main.tf": 'module "m" {\n  source = "./m"\n  strict = null\n  loose = null\n}\n',
        "m/main.tf": '''
variable "strict" {
  default  = "fallback"
  nullable = false
}
variable "loose" {
  default = "unused"
}
resource "null_resource" "n" {
  triggers = { strict = var.strict, loose = var.loose == null ? "null" : var.loose }
}
'''})
    _, p = plan(engine, stack)
    assert after(p, "module.m.null_resource.n")["triggers"] == {"strict": "fallback", "loose": "null"}


def test_the_parse_cache_is_capped_by_bytes() -> None:
    from gateway.adapters.hcl.reading import _ParseCache, parse_hcl

    cache = _ParseCache(max_bytes=100)
    trees = {name: parse_hcl(f"{name}.tf", f'{name} = "{"x" * 30}"\n') for name in ("a", "b", "c", "d")}
    for name, tree in trees.items():
        cache.put(f"digest-{name}", tree, 40)
    assert cache.size == 80  # two of 40 bytes fit in 100: the oldest went first
    assert cache.get("digest-a") is None and cache.get("digest-b") is None
    assert cache.get("digest-d") is trees["d"]
    cache.put("digest-huge", trees["a"], 101)
    assert cache.get("digest-huge") is None and cache.size == 80


def test_any_attribute_of_any_instance_can_be_read(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
resource "aws_customer_gateway" "this" {
  for_each   = { a = 65000, b = 65001 }
  bgp_asn    = each.value
  ip_address = "1.2.3.4"
  type       = "ipsec.1"
}
resource "aws_vpc" "v6" {
  cidr_block                       = "10.0.0.0/16"
  assign_generated_ipv6_cidr_block = true
  ipv6_cidr_block                  = null
}
resource "aws_subnet" "v6" {
  vpc_id          = aws_vpc.v6.id
  cidr_block      = "10.0.1.0/24"
  ipv6_cidr_block = cidrsubnet(aws_vpc.v6.ipv6_cidr_block, 8, 1)
}
output "gateway_arns" {
  value = [for k, v in aws_customer_gateway.this : v.arn]
}
'''})
    result, p = plan(engine, stack)
    assert p.output_changes["gateway_arns"].after_unknown == [True, True]
    assert p.find("aws_vpc.v6").change.after_unknown["ipv6_cidr_block"] is True  # null in config, computed
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None
    assert [a.startswith("arn:aws:ec2:eu-west-1:123456789012:") for a in state.outputs["gateway_arns"]["value"]] == [True, True]
    assert state.resources["aws_subnet.v6"].attributes["ipv6_cidr_block"].endswith("::/64")


def test_secrets_read_from_data_sources_stay_masked(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
data "aws_secretsmanager_secret_version" "db" {
  secret_id = "prod/db"
}
resource "aws_ssm_parameter" "p" {
  name  = "copy"
  type  = "SecureString"
  value = nonsensitive(data.aws_secretsmanager_secret_version.db.secret_string)
}
'''})
    result, p = plan(engine, stack)
    change = p.find("aws_ssm_parameter.p").change
    assert change.after_sensitive == {"value": True}  # the provider marks it sensitive: nonsensitive() cannot unmask
    prior = result.document["prior_state"]["values"]["root_module"]["resources"][0]
    assert prior["sensitive_values"]["secret_string"] is True
    secret = json.loads(prior["values"]["secret_string"])  # as in Terraform's JSON: masks say what is secret
    assert secret["password"] not in render_text(build_preview(p))


def test_modules_elsewhere_in_the_repository_and_remote_state(engine: SandboxEngine, tmp_path: Path) -> None:
    repo = write(tmp_path / "repo", {
        "modules/web/main.tf": '''
variable "db_state_key" {}
data "terraform_remote_state" "db" {
  backend = "s3"
  config  = { bucket = "states", key = var.db_state_key, region = "eu-west-1" }
}
resource "aws_instance" "web" {
  ami           = "ami-1"
  instance_type = "t3.micro"
  user_data     = "DB=${data.terraform_remote_state.db.outputs.address}:${data.terraform_remote_state.db.outputs.port}"
}
''',
        "live/stage/web/main.tf": 'module "web" {\n  source       = "../../../modules/web"\n  db_state_key = "stage/db"\n}\n',
    })
    (repo / ".git").mkdir()
    stack = repo / "live" / "stage" / "web"
    result, p = plan(engine, stack)
    assert kinds(p) == {"module.web.aws_instance.web": ChangeKind.CREATE}
    assert after(p, "module.web.aws_instance.web")["user_data"].startswith("DB=10.")  # read at plan time
    assert not apply_and_replan(engine, stack, result).has_changes
    write(stack, {"main.tf": 'module "web" {\n  source = "../../../../elsewhere"\n}\n'})
    with pytest.raises(ConfigError, match=r'web/main.tf:1: module "web": source \'../../../../elsewhere\' is outside'):
        plan(engine, stack)


def test_file_functions_in_a_module_read_the_module_s_files(engine: SandboxEngine, tmp_path: Path) -> None:
    repo = write(tmp_path / "repo", {
        "modules/web/main.tf": '''
variable "port" {}
resource "aws_instance" "web" {
  ami           = "ami-1"
  instance_type = "t3.micro"
  user_data     = templatefile("${path.module}/user-data.sh", { port = var.port })
  tags = {
    version = trimspace(file("${path.module}/VERSION"))
    found   = fileexists("${path.module}/VERSION")
    module  = path.module
  }
}
''',
        "modules/web/user-data.sh": "#!/bin/sh\nserve --port ${port}\n",
        "modules/web/VERSION": "2.0.1\n",
        "live/web/main.tf": 'module "web" {\n  source = "../../modules/web"\n  port   = 8080\n}\n'
                            'module "motd" {\n  source = "./motd"\n}\n',
        "live/web/motd/main.tf": 'resource "aws_ssm_parameter" "m" {\n  name  = "motd"\n'
                                 '  value = templatefile("${path.module}/motd.tpl", { who = "ops" })\n}\n',
        "live/web/motd/motd.tpl": "hello ${who}",
        "secrets.env": "AWS_SECRET=hunter2\n",
    })
    (repo / ".git").mkdir()
    stack = repo / "live" / "web"
    result, p = plan(engine, stack)
    web = after(p, "module.web.aws_instance.web")
    assert web["user_data"] == "#!/bin/sh\nserve --port 8080\n"
    assert web["tags"] == {"version": "2.0.1", "found": True, "module": "../../modules/web"}  # as Terraform's path.module
    assert after(p, "module.motd.aws_ssm_parameter.m")["value"] == "hello ops"
    assert not apply_and_replan(engine, stack, result).has_changes
    write(repo, {"modules/web/main.tf": 'variable "port" {}\nresource "aws_ssm_parameter" "leak" {\n  name  = "x"\n'
                                        '  value = file("${path.module}/../../../secrets.env")\n}\n'})
    (tmp_path / "secrets.env").write_text("AWS_SECRET=hunter2\n")
    with pytest.raises(ConfigError, match=r"modules/web/main.tf:4: module.web.aws_ssm_parameter.leak: .* is outside "
                                          r"the repository holding stack s") as caught:
        plan(engine, stack)
    assert "hunter2" not in str(caught.value)


def test_credentials_from_secrets_manager_and_external_programs_never_run(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {"main.tf": '''
data "aws_secretsmanager_secret_version" "creds" {
  secret_id = "db-creds"
}
data "external" "tag" {
  program = ["bash", "-c", "touch ${path.module}/ran"]
  query   = { foo = "bar" }
}
locals {
  db_creds = jsondecode(data.aws_secretsmanager_secret_version.creds.secret_string)
}
resource "aws_db_instance" "example" {
  identifier_prefix = "app"
  engine            = "mysql"
  instance_class    = "db.t3.micro"
  username          = local.db_creds.username
  password          = local.db_creds.password
  tags              = { build = data.external.tag.result.foo }
}
'''})
    result, p = plan(engine, stack)
    change = p.find("aws_db_instance.example").change
    assert change.after_sensitive == {"username": True, "password": True}
    assert change.after["tags"]["build"].startswith("foo-")
    assert not (stack / "ran").exists()
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None
    assert state.resources["aws_db_instance.example"].attributes["arn"].startswith("arn:aws:rds:eu-west-1:123456789012:db:db-")


def test_a_stack_calling_a_module_at_the_repository_root_plans_through_the_gateway(workspace: Workspace,
                                                                                      clone: Clone) -> None:
    clone.branch("shared-module").write("modules/queue/main.tf", '''
variable "name" {}
resource "aws_sqs_queue" "this" {
  name = var.name
}
output "arn" {
  value = aws_sqs_queue.this.arn
}
''').write("stacks/app-staging/queue.tf", '''
module "orders" {
  source = "../../modules/queue"
  name   = "orders-staging"
}
''').push()
    result = plan_stack(workspace, "app-staging", "shared-module")
    changes = {a: k for a, k in kinds(result.plan).items() if k != ChangeKind.NO_OP}
    assert changes == {"module.orders.aws_sqs_queue.this": ChangeKind.CREATE}
    assert "module.orders.aws_sqs_queue.this" in render_text(result.preview())


def test_variables_take_their_declared_types(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {
        "main.tf": '''
module "m" {
  source = "./m"
  queues = { orders = { retention = "3600" }, audit = { fifo = true } }
  ports  = ["80", "443"]
}
variable "replicas" {
  type = number
}
resource "null_resource" "root" {
  count = var.replicas
}
''',
        "terraform.tfvars": 'replicas = "2"\n',
        "m/main.tf": '''
variable "queues" {
  type = map(object({
    retention = optional(number, 345600)
    fifo      = optional(bool)
    dlq       = optional(object({ max_receives = optional(number, 5) }), {})
  }))
}
variable "ports" {
  type = list(number)
}
resource "aws_sqs_queue" "q" {
  for_each                  = var.queues
  name                      = each.key
  message_retention_seconds = each.value.retention
  fifo_queue                = each.value.fifo
  max_receive_count         = each.value.dlq.max_receives
  port_sum                  = var.ports[0] + var.ports[1]
}
''',
    })
    _, p = plan(engine, stack)
    assert {a for a, k in kinds(p).items() if k == ChangeKind.CREATE} >= {"null_resource.root[0]", "null_resource.root[1]"}
    orders, audit = after(p, 'module.m.aws_sqs_queue.q["orders"]'), after(p, 'module.m.aws_sqs_queue.q["audit"]')
    assert (orders["message_retention_seconds"], orders["max_receive_count"], orders["port_sum"]) == (3600, 5, 523)
    assert (audit["message_retention_seconds"], audit["fifo_queue"]) == (345600, True)
    write(stack, {"terraform.tfvars": 'replicas = "two"\n'})
    with pytest.raises(ConfigError, match=r"stack/main.tf:7: var.replicas: a string does not fit the variable's type"):
        plan(engine, stack)


def test_moved_blocks_inside_a_module_move_every_instance(engine: SandboxEngine, tmp_path: Path) -> None:
    root = 'module "m" {\n  source   = "./m"\n  for_each = toset(["a", "b"])\n}\n'
    stack = write(tmp_path / "stack", {"main.tf": root, "m/main.tf": 'resource "null_resource" "old" {}\n'})
    result, _ = plan(engine, stack)
    assert not apply_and_replan(engine, stack, result).has_changes
    write(stack, {"m/main.tf": 'resource "null_resource" "new" {}\nmoved {\n  from = null_resource.old\n  to   = null_resource.new\n}\n'})
    result, p = plan(engine, stack)
    moves = {rc.address: (rc.previous_address, rc.kind) for rc in p.resource_changes}
    assert moves == {'module.m["a"].null_resource.new': ('module.m["a"].null_resource.old', ChangeKind.NO_OP),
                     'module.m["b"].null_resource.new': ('module.m["b"].null_resource.old', ChangeKind.NO_OP)}
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None and state.resources['module.m["a"].null_resource.new'].name == "new"


def test_linked_variable_and_module_files_are_refused_by_their_own_names(engine: SandboxEngine, tmp_path: Path) -> None:
    outside = write(tmp_path / "outside", {"secret.txt": 'password = "hunter2"\n'}) / "secret.txt"
    stack = write(tmp_path / "stack", {"main.tf": 'module "m" {\n  source = "./m"\n}\n', "m/ok.tf": ""})
    (stack / "terraform.tfvars").symlink_to(outside)
    with pytest.raises(ConfigError) as err:
        plan(engine, stack)
    assert str(err.value) == "stack/terraform.tfvars: symlinks are not read; commit the file itself"
    (stack / "terraform.tfvars").unlink()
    (stack / "m" / "main.tf").symlink_to(outside)
    with pytest.raises(ConfigError) as err:
        plan(engine, stack)
    assert str(err.value) == "stack/m/main.tf: symlinks are not read; commit the file itself"


def test_a_whole_module_can_be_an_output(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write(tmp_path / "stack", {
        "main.tf": 'module "m" {\n  source = "./m"\n  count  = 2\n}\noutput "all" {\n  value = module.m\n}\n',
        "m/main.tf": 'resource "null_resource" "n" {}\noutput "id" {\n  value = null_resource.n.id\n}\n'
                     'output "fixed" {\n  value = "x"\n}\n',
    })
    result, p = plan(engine, stack)
    assert p.output_changes["all"].after == [{"fixed": "x"}, {"fixed": "x"}]  # ids known after apply
    assert p.output_changes["all"].after_unknown == [{"id": True}, {"id": True}]
    assert not apply_and_replan(engine, stack, result).has_changes
    state = engine.store.read_state("s")
    assert state is not None and [o["fixed"] for o in state.outputs["all"]["value"]] == ["x", "x"]
