"""How risky a plan is, from what it does; gateway.yaml maps each level to a number of approvers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.domain.plan import ChangeKind, Plan, ResourceChange, iter_leaves


class RiskLevel(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(RiskLevel).index(self)


STATEFUL = frozenset({
    "aws_db_instance", "aws_rds_cluster", "aws_s3_bucket", "aws_ebs_volume", "aws_dynamodb_table",
    "aws_efs_file_system", "aws_elasticache_cluster", "aws_elasticache_replication_group", "aws_kms_key",
    "AWS::RDS::DBInstance", "AWS::RDS::DBCluster", "AWS::S3::Bucket", "AWS::EC2::Volume", "AWS::DynamoDB::Table",
    "AWS::EFS::FileSystem", "AWS::ElastiCache::CacheCluster", "AWS::ElastiCache::ReplicationGroup", "AWS::KMS::Key",
})
NETWORK_ACCESS = frozenset({
    "aws_security_group", "aws_security_group_rule", "aws_vpc_security_group_ingress_rule",
    "aws_vpc_security_group_egress_rule", "aws_network_acl", "aws_network_acl_rule", "aws_route",
    "aws_lb_listener", "aws_s3_bucket_public_access_block", "aws_s3_bucket_policy", "aws_s3_bucket_acl",
    "AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress",
    "AWS::EC2::NetworkAcl", "AWS::EC2::NetworkAclEntry", "AWS::EC2::Route", "AWS::S3::BucketPolicy",
    "AWS::ElasticLoadBalancingV2::Listener",
})
TAG_ATTRIBUTES = frozenset({"tags", "tags_all", "Tags"})


@dataclass(frozen=True)
class Risk:
    level: RiskLevel
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level.value, "reasons": list(self.reasons)}


def assess_risk(plan: Plan) -> Risk:
    """The highest level any change reaches, with the changes that put it there."""
    level, reasons = RiskLevel.LOW, []
    for rc in plan.changes:
        rc_level, why = _change_risk(rc)
        if rc_level.rank > level.rank:
            level, reasons = rc_level, []
        if rc_level == level and why:
            reasons.append(f"{rc.address}: {why}")
    return Risk(level, tuple(reasons))  # every one: a reader summarises a long list, never the record


def _change_risk(rc: ResourceChange) -> tuple[RiskLevel, str]:
    if rc.change.is_destructive:
        if rc.type in STATEFUL:
            return RiskLevel.CRITICAL, "destroys a stateful resource (data is lost)"
        return RiskLevel.HIGH, "destroys a resource"
    if rc.kind == ChangeKind.CREATE_FORGET and rc.type in STATEFUL:
        return RiskLevel.HIGH, "replaces a stateful resource with a new, empty one (the old one is kept, unmanaged)"
    iam = rc.type.startswith(("aws_iam_", "AWS::IAM::"))
    if rc.type in NETWORK_ACCESS or iam:
        if rc.kind == ChangeKind.UPDATE and _only_tags(rc):
            return RiskLevel.LOW, "tag-only update"
        if _widens(rc):
            return RiskLevel.HIGH, "widens network or IAM access"
        if iam:
            return RiskLevel.HIGH, "changes IAM access"
        return RiskLevel.MEDIUM, "changes network access"
    if rc.kind == ChangeKind.UPDATE and _only_tags(rc):
        return RiskLevel.LOW, "tag-only update"
    return RiskLevel.MEDIUM, f"{rc.kind.value}"


def _only_tags(rc: ResourceChange) -> bool:
    before = rc.change.before if isinstance(rc.change.before, Mapping) else {}
    after = rc.change.after if isinstance(rc.change.after, Mapping) else {}
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    unknown = rc.change.after_unknown if isinstance(rc.change.after_unknown, Mapping) else {}
    changed |= {k for k, v in unknown.items()
                if k not in TAG_ATTRIBUTES and any(leaf is True for _, leaf in iter_leaves(v))}
    return bool(changed) and changed <= TAG_ATTRIBUTES


def _widens(rc: ResourceChange) -> bool:
    """New CIDRs, ports or principals appear in the after value that the before did not have."""
    def values(side: Any) -> set[str]:
        return {str(v) for path, v in iter_leaves(side) if path and str(path[-1]) not in TAG_ATTRIBUTES
                and (("cidr" in str(path[0])) or "port" in str(path[0]) or path[0] in ("policy", "assume_role_policy"))}
    return bool(values(rc.change.after) - values(rc.change.before))
