"""Guardrails evaluated on every plan, in Terraform's JSON plan format (sandbox and real alike).

Each rule reads the plan's post-apply values of what the plan creates, updates or replaces (and,
for companions such as an S3 bucket's public access block, the whole planned set), and yields
findings: a rule id, deny or warn, the resource address and a sentence saying what to fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from gateway.domain.plan import ChangeKind, Plan, ResourceChange


class Severity(StrEnum):
    DENY = "deny"
    WARN = "warn"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    address: str
    message: str
    stack: str = ""

    @property
    def key(self) -> str:
        """What an override names: the rule and the resource it fired on."""
        return f"{self.stack}:{self.rule}:{self.address}"

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity.value, "address": self.address,
                "message": self.message, "stack": self.stack}

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> Finding:
        return cls(data["rule"], Severity(data["severity"]), data["address"], data["message"], data.get("stack", ""))


@dataclass(frozen=True)
class PolicySettings:
    required_tags: tuple[str, ...] = ("owner", "cost-centre")
    approved_instance_types: frozenset[str] = frozenset()  # empty: no instance-type rule
    max_deletes: int = 10
    agent_capacity_growth_percent: int = 50
    owner_groups: frozenset[str] = frozenset()  # people who may override a finding
    checkov: str = "warn"  # off | warn | deny: how checkov's failed checks count, where it is installed


@dataclass(frozen=True)
class PolicyContext:
    """What a plan is judged with besides itself."""

    stack: str
    settings: PolicySettings
    protected: frozenset[str] = frozenset()
    proposed_by_agent: bool = False
    requester: str = ""  # who asked for the change (for policies that judge by it)
    changed_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Override:
    finding_key: str
    by: str
    reason: str
    expires_at: datetime

    def active(self, now: datetime) -> bool:
        return now < self.expires_at


PUBLIC_ACLS = frozenset({"public-read", "public-read-write", "authenticated-read"})
OPEN_CIDRS = frozenset({"0.0.0.0/0", "::/0"})
WEB_PORTS = frozenset({80, 443})
PUBLIC_ACCESS_FLAGS = ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets")
TAGGABLE = frozenset({
    "aws_vpc", "aws_subnet", "aws_security_group", "aws_s3_bucket", "aws_db_instance", "aws_rds_cluster",
    "aws_instance", "aws_ebs_volume", "aws_iam_role", "aws_eks_cluster", "aws_eks_node_group", "aws_lb",
    "aws_autoscaling_group", "aws_sqs_queue", "aws_sns_topic", "aws_dynamodb_table", "aws_kms_key",
    "aws_lambda_function", "aws_ecs_service", "aws_elasticache_cluster",
})
# CloudFormation's resource types the same rules judge (a plan of the cloudformation engine names them so)
CFN_TAGGABLE = frozenset({
    "AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::SecurityGroup", "AWS::S3::Bucket", "AWS::RDS::DBInstance",
    "AWS::RDS::DBCluster", "AWS::EC2::Instance", "AWS::EC2::Volume", "AWS::IAM::Role", "AWS::EKS::Cluster",
    "AWS::ElasticLoadBalancingV2::LoadBalancer", "AWS::AutoScaling::AutoScalingGroup", "AWS::SQS::Queue",
    "AWS::SNS::Topic", "AWS::DynamoDB::Table", "AWS::KMS::Key", "AWS::Lambda::Function", "AWS::ECS::Service",
})
CFN_PUBLIC_ACLS = frozenset({"PublicRead", "PublicReadWrite", "AuthenticatedRead"})
CFN_PUBLIC_ACCESS_FLAGS = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
CFN_DATABASES = ("AWS::RDS::DBInstance", "AWS::RDS::DBCluster")
# counted capacity: (resource type, path to the number)
CAPACITY_PATHS: tuple[tuple[str, tuple[str | int, ...]], ...] = (
    ("aws_autoscaling_group", ("desired_capacity",)),
    ("aws_autoscaling_group", ("max_size",)),
    ("aws_eks_node_group", ("scaling_config", 0, "desired_size")),
    ("aws_eks_node_group", ("scaling_config", 0, "max_size")),
    ("aws_ecs_service", ("desired_count",)),
    ("aws_rds_cluster", ("cluster_members",)),
    ("aws_elasticache_cluster", ("num_cache_nodes",)),
)
INSTANCE_TYPE_ATTRS = {"aws_instance": "instance_type", "aws_db_instance": "instance_class",
                       "aws_launch_template": "instance_type"}

Rule = Callable[[Plan, PolicyContext], Iterator[Finding]]


def evaluate_plan(plan: Plan, context: PolicyContext) -> list[Finding]:
    """Every finding of every built-in rule, in a stable order."""
    findings = [f for rule in RULES for f in rule(plan, context)]
    return sorted({f.key: f for f in findings}.values(), key=lambda f: (f.severity != Severity.DENY, f.address, f.rule))


def unresolved_denies(findings: list[Finding], overrides: list[Override], now: datetime) -> list[Finding]:
    active = {o.finding_key for o in overrides if o.active(now)}
    return [f for f in findings if f.severity == Severity.DENY and f.key not in active]


# --- helpers -----------------------------------------------------------------------------------


def _changing(plan: Plan) -> Iterator[ResourceChange]:
    """Managed resources the plan creates, updates or replaces (their `after` is what will exist), and those it
    adopts unchanged: an import, or drift the declaration now takes (a codify). What the declaration says is
    judged, not only the diff, so break-glass plus codify is no way around a guardrail."""
    adopted = {d.address for d in plan.resource_drift}
    for rc in plan.resource_changes:
        if rc.mode != "managed" or rc.change.after is None or rc.kind in (
                ChangeKind.READ, ChangeKind.DELETE, ChangeKind.FORGET):
            continue
        if rc.kind != ChangeKind.NO_OP or rc.change.importing is not None or rc.address in adopted:
            yield rc


def _after(rc: ResourceChange) -> Mapping[str, Any]:
    return rc.change.after if isinstance(rc.change.after, Mapping) else {}


def _unknown(rc: ResourceChange, name: str) -> bool:
    unknown = rc.change.after_unknown
    return unknown is True or (isinstance(unknown, Mapping) and unknown.get(name) is True)


def _finding(ctx: PolicyContext, rule: str, rc: ResourceChange, message: str, severity: Severity = Severity.DENY) -> Finding:
    return Finding(rule, severity, rc.address, message, ctx.stack)


class _Companions:
    """Companion resources of S3 buckets (public access block, encryption), indexed once per plan."""

    def __init__(self, plan: Plan, companion_type: str):
        self.plan = plan
        self.by_name: dict[Any, list[ResourceChange]] = {}
        self.unresolved: list[ResourceChange] = []  # bucket known only after apply
        for rc in plan.resource_changes:
            if rc.type != companion_type or rc.change.after is None:
                continue
            if _unknown(rc, "bucket"):
                self.unresolved.append(rc)
            else:
                self.by_name.setdefault(_after(rc).get("bucket"), []).append(rc)

    def of(self, bucket: ResourceChange) -> list[ResourceChange]:
        """Same bucket name, or (name unknown) a configuration reference to it.

        Only a plan without a `configuration` section falls back on matching local names.
        """
        found = list(self.by_name.get(_after(bucket).get("bucket"), [])) if _after(bucket).get("bucket") else []
        if "configuration" not in self.plan.raw:
            return found + [rc for rc in self.unresolved if rc.name == bucket.name]
        found += [rc for rc in self.unresolved if _refers_to(self.plan, rc, "bucket", bucket)]
        return found


def _refers_to(plan: Plan, rc: ResourceChange, attribute: str, target: ResourceChange) -> bool:
    """Whether `rc`'s attribute refers to `target`, in the same module or through module inputs to the root."""
    key = f"{target.type}.{target.name}"
    if not target.module_address and key in configured_references(plan, rc, attribute):
        return True
    return (rc.module_address or "") == (target.module_address or "") and key in _module_references(plan, rc, attribute)


def _module_references(plan: Plan, rc: ResourceChange, attribute: str) -> set[str]:
    """An attribute's references within its own module, per the plan's `configuration`."""
    node = plan.raw.get("configuration", {}).get("root_module", {})
    for name in [p for p in (rc.module_address or "").split(".") if p and p != "module"]:
        node = node.get("module_calls", {}).get(name.split("[", 1)[0], {}).get("module", {})
    resource = next((r for r in node.get("resources", []) if r.get("address") == f"{rc.type}.{rc.name}"), {})
    return {".".join(r.split(".")[:2]) for r in resource.get("expressions", {}).get(attribute, {}).get("references", [])}


def configured_references(plan: Plan, rc: ResourceChange, attribute: str) -> set[str]:
    """Resource addresses an attribute refers to per the plan's `configuration`, through module inputs.

    A reference to `var.x` is followed to the module call's input `x`; a reference to a local (whose
    expression the format does not record) is over-approximated by all of the module's inputs.
    """
    modules = [part for part in (rc.module_address or "").split(".") if part and part != "module"]
    nodes = [plan.raw.get("configuration", {}).get("root_module", {})]
    calls = []
    for name in modules:
        call = nodes[-1].get("module_calls", {}).get(name.split("[", 1)[0], {})
        calls.append(call)
        nodes.append(call.get("module", {}))
    local = f"{rc.type}.{rc.name}"
    resource = next((r for r in nodes[-1].get("resources", []) if r.get("address") == local), {})
    refs = list(resource.get("expressions", {}).get(attribute, {}).get("references", []))
    for depth in range(len(calls) - 1, -1, -1):  # climb from the innermost module to the root
        inputs = calls[depth].get("expressions", {})
        lifted = []
        for ref in refs:
            if ref.startswith("var."):
                lifted += inputs.get(ref[4:].split(".", 1)[0], {}).get("references", [])
            elif ref.startswith("local."):
                lifted += [r for expr in inputs.values() for r in expr.get("references", [])]
        refs = lifted
    return {".".join(r.split(".")[:2]) for r in refs if not r.startswith(("var.", "local.", "module."))}


def _blocks(value: Any) -> list[Mapping[str, Any]]:
    return [b for b in value if isinstance(b, Mapping)] if isinstance(value, list) else []


# --- rules -------------------------------------------------------------------------------------


def public_buckets(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    blocks = _Companions(plan, "aws_s3_bucket_public_access_block")
    for rc in _changing(plan):
        after = _after(rc)
        if rc.type in ("aws_s3_bucket", "aws_s3_bucket_acl") and after.get("acl") in PUBLIC_ACLS:
            yield _finding(ctx, "s3-public-acl", rc, f"ACL {after['acl']!r} makes the bucket public; use private")
        if rc.type == "aws_s3_bucket_public_access_block":
            off = [flag for flag in PUBLIC_ACCESS_FLAGS if after.get(flag) is not True and not _unknown(rc, flag)]
            if off:
                yield _finding(ctx, "s3-public-access-block", rc, f"public access block leaves {', '.join(off)} off; set all four to true")
        if rc.type == "aws_s3_bucket" and rc.kind in (ChangeKind.CREATE, ChangeKind.REPLACE, ChangeKind.REPLACE_CREATE_FIRST):
            if not blocks.of(rc):
                yield _finding(ctx, "s3-public-access-block", rc, "bucket has no aws_s3_bucket_public_access_block; add one with all four flags true")
        if rc.type == "AWS::S3::Bucket":
            if after.get("AccessControl") in CFN_PUBLIC_ACLS:
                yield _finding(ctx, "s3-public-acl", rc, f"AccessControl {after['AccessControl']!r} makes the bucket "
                               "public; use Private")
            block = after.get("PublicAccessBlockConfiguration")
            off = [flag for flag in CFN_PUBLIC_ACCESS_FLAGS
                   if not isinstance(block, Mapping) or block.get(flag) not in (True, "true")]
            if off and not _unknown(rc, "PublicAccessBlockConfiguration"):
                yield _finding(ctx, "s3-public-access-block", rc, f"PublicAccessBlockConfiguration leaves "
                               f"{', '.join(off)} off; set all four to true")


def unencrypted_storage(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    encryption = _Companions(plan, "aws_s3_bucket_server_side_encryption_configuration")
    for rc in _changing(plan):
        after = _after(rc)
        if rc.type == "aws_s3_bucket" and rc.kind in (ChangeKind.CREATE, ChangeKind.REPLACE, ChangeKind.REPLACE_CREATE_FIRST):
            inline = _blocks(after.get("server_side_encryption_configuration"))
            if not inline and not encryption.of(rc):
                yield _finding(ctx, "encryption-at-rest", rc, "bucket has no server-side encryption configuration")
        elif rc.type == "aws_ebs_volume" and after.get("encrypted") is not True and not _unknown(rc, "encrypted"):
            yield _finding(ctx, "encryption-at-rest", rc, "EBS volume is not encrypted; set encrypted = true")
        elif rc.type == "aws_instance":
            for block in ("root_block_device", "ebs_block_device"):
                if any(b.get("encrypted") is False for b in _blocks(after.get(block))):
                    yield _finding(ctx, "encryption-at-rest", rc, f"{block} is not encrypted; set encrypted = true")
        elif rc.type in ("aws_db_instance", "aws_rds_cluster") and after.get("storage_encrypted") is not True \
                and not _unknown(rc, "storage_encrypted"):
            yield _finding(ctx, "encryption-at-rest", rc, "database storage is not encrypted; set storage_encrypted = true")
        elif rc.type == "AWS::S3::Bucket" and rc.kind in (ChangeKind.CREATE, ChangeKind.REPLACE,
                                                          ChangeKind.REPLACE_CREATE_FIRST) \
                and not after.get("BucketEncryption") and not _unknown(rc, "BucketEncryption"):
            yield _finding(ctx, "encryption-at-rest", rc, "bucket has no BucketEncryption")
        elif rc.type == "AWS::EC2::Volume" and after.get("Encrypted") not in (True, "true") \
                and not _unknown(rc, "Encrypted"):
            yield _finding(ctx, "encryption-at-rest", rc, "EBS volume is not encrypted; set Encrypted: true")
        elif rc.type in CFN_DATABASES and after.get("StorageEncrypted") not in (True, "true") \
                and not _unknown(rc, "StorageEncrypted"):
            yield _finding(ctx, "encryption-at-rest", rc, "database storage is not encrypted; set StorageEncrypted: true")


def _open_ports(from_port: Any, to_port: Any, protocol: Any) -> bool:
    """True when the range opens anything besides 80 and 443."""
    if str(protocol) in ("-1", "all"):
        return True
    try:
        low, high = int(from_port), int(to_port)
    except (TypeError, ValueError):
        return True
    return not (low == high and low in WEB_PORTS)


def open_security_groups(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    for rc in _changing(plan):
        after = _after(rc)
        rules: list[Mapping[str, Any]] = []
        if rc.type == "aws_security_group":
            rules = _blocks(after.get("ingress"))
        elif rc.type == "aws_security_group_rule" and after.get("type") == "ingress":
            rules = [after]
        elif rc.type == "aws_vpc_security_group_ingress_rule":
            rules = [{**after, "cidr_blocks": [after.get("cidr_ipv4")], "ipv6_cidr_blocks": [after.get("cidr_ipv6")],
                      "protocol": after.get("ip_protocol")}]
        for rule in rules:
            cidrs = set(rule.get("cidr_blocks") or []) | set(rule.get("ipv6_cidr_blocks") or [])
            if cidrs & OPEN_CIDRS and _open_ports(rule.get("from_port"), rule.get("to_port"), rule.get("protocol")):
                ports = f"{rule.get('from_port')}-{rule.get('to_port')}/{rule.get('protocol')}"
                yield _finding(ctx, "open-ingress", rc, f"ingress from {', '.join(sorted(cidrs & OPEN_CIDRS))} on {ports}; "
                               "only 80 and 443 may be open to the internet")


def required_tags(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    for rc in _changing(plan):
        after = _after(rc)
        if rc.type in CFN_TAGGABLE:  # CloudFormation's Tags: a list of Key and Value
            if _unknown(rc, "Tags"):
                continue
            tags = {str(t.get("Key")): t.get("Value") for t in _blocks(after.get("Tags"))}
        elif rc.type not in TAGGABLE or _unknown(rc, "tags"):
            continue
        else:
            tags = {**(after.get("tags_all") or {}), **(after.get("tags") or {})}
        missing = [t for t in ctx.settings.required_tags if not tags.get(t)]
        if missing:
            yield _finding(ctx, "required-tags", rc, f"missing tag(s) {', '.join(missing)}")


def database_safety(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    for rc in _changing(plan):
        after = _after(rc)
        if rc.type in CFN_DATABASES:
            if after.get("DeletionProtection") not in (True, "true") and not _unknown(rc, "DeletionProtection"):
                yield _finding(ctx, "db-deletion-protection", rc, "database has no deletion protection; set "
                               "DeletionProtection: true")
            if str(after.get("BackupRetentionPeriod", "")) == "0":
                yield _finding(ctx, "db-backups", rc, "backups are off (BackupRetentionPeriod: 0)")
            continue
        if rc.type not in ("aws_db_instance", "aws_rds_cluster"):
            continue
        if after.get("deletion_protection") is not True and not _unknown(rc, "deletion_protection"):
            yield _finding(ctx, "db-deletion-protection", rc, "database has no deletion protection; set deletion_protection = true")
        retention = after.get("backup_retention_period")
        if retention is not None and not _unknown(rc, "backup_retention_period") and int(retention) == 0:
            yield _finding(ctx, "db-backups", rc, "backups are off (backup_retention_period = 0)")


def instance_types(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    approved = ctx.settings.approved_instance_types
    if not approved:
        return
    for rc in _changing(plan):
        attr = INSTANCE_TYPE_ATTRS.get(rc.type)
        value = _after(rc).get(attr) if attr else None
        if value and value not in approved:
            yield _finding(ctx, "instance-type", rc, f"{attr} {value!r} is not in the approved set", Severity.WARN)


def destruction(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    destroyed = [rc for rc in plan.resource_changes if rc.change.is_destructive]
    for rc in destroyed:
        if rc.address in ctx.protected or rc.address.split("[", 1)[0] in ctx.protected:
            yield _finding(ctx, "protected-resource", rc, f"{rc.address} is protected and this plan would "
                           f"{'replace' if 'create' in rc.change.actions else 'delete'} it")
    if len(destroyed) > ctx.settings.max_deletes:
        first = destroyed[0]
        yield Finding("blast-radius", Severity.DENY, first.address,
                      f"the plan deletes or replaces {len(destroyed)} resources at once (limit {ctx.settings.max_deletes})",
                      ctx.stack)


def agent_capacity_growth(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    if not ctx.proposed_by_agent:
        return
    limit = ctx.settings.agent_capacity_growth_percent
    for rc in plan.resource_changes:
        for rtype, path in CAPACITY_PATHS:
            if rc.type != rtype:
                continue
            before, after = number_at(rc.change.before, path), number_at(rc.change.after, path)
            if before and after is not None and (after - before) * 100 > before * limit:
                yield _finding(ctx, "agent-capacity-growth", rc, f"{'.'.join(map(str, path))} grows {before} -> {after}, "
                               f"more than {limit}% in one agent change")
    counts: dict[str, list[int]] = {}  # instances per resource: before, after
    for rc in plan.resource_changes:
        if rc.type in ("aws_instance", "aws_eks_node_group", "aws_db_instance"):
            tally = counts.setdefault(rc.address.split("[", 1)[0], [0, 0])
            tally[0] += rc.change.before is not None
            tally[1] += rc.change.after is not None or rc.change.after_unknown not in (False, None)
    for address, (before, after) in counts.items():
        if before and (after - before) * 100 > before * limit:
            yield Finding("agent-capacity-growth", Severity.DENY, address,
                          f"instance count grows {before} -> {after}, more than {limit}% in one agent change", ctx.stack)


def imports_with_changes(plan: Plan, ctx: PolicyContext) -> Iterator[Finding]:
    """An import is acceptable only with zero diff: the plan adopts the object and changes nothing of it."""
    for rc in plan.resource_changes:
        if rc.change.importing is None or rc.kind == ChangeKind.NO_OP:
            continue
        before = rc.change.before if isinstance(rc.change.before, Mapping) else {}
        differing = sorted(k for k in set(before) | set(_after(rc)) if before.get(k) != _after(rc).get(k))
        yield _finding(ctx, "import-zero-diff", rc, f"the import would also {rc.kind.value} the object"
                       + (f" (changing {', '.join(differing)})" if differing else "")
                       + "; the declaration must match it as it is")


def number_at(value: Any, path: tuple[str | int, ...]) -> float | None:
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, Mapping):
            value = value.get(step)
        else:
            return None
    if isinstance(value, list):
        return float(len(value))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


RULES: tuple[Rule, ...] = (
    public_buckets, unencrypted_storage, open_security_groups, required_tags, database_safety,
    instance_types, destruction, agent_capacity_growth, imports_with_changes,
)
