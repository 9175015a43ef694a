"""The simulated provider: per resource type, what forces replacement and what is computed.

Force-new attributes follow the AWS provider's schema (`ForceNew`). Computed attributes are
unknown in a plan and filled in by the simulated cloud on apply. A type not listed here is
simulated generically: only `id` is computed and nothing forces replacement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACCOUNT = "123456789012"
REGION = "eu-west-1"

Computer = Callable[[Mapping[str, Any], str], Any]


@dataclass(frozen=True)
class ResourceSchema:
    id_prefix: str | None  # None: the id is an attribute's value (see id_from)
    force_new: frozenset[str] = frozenset()
    computed: Mapping[str, Computer] = field(default_factory=dict)
    sensitive: frozenset[str] = frozenset()
    id_from: str | None = None  # e.g. an S3 bucket's id is its name
    defaults: Mapping[str, Any] = field(default_factory=dict)  # optional+computed with a default

    def make_id(self, attrs: Mapping[str, Any], seed: str) -> str:
        if self.id_from and attrs.get(self.id_from):
            return str(attrs[self.id_from])
        return f"{self.id_prefix or 'id'}-{hashlib.sha256(seed.encode()).hexdigest()[:17]}"


def _arn(service: str, path: str) -> Computer:
    return lambda attrs, rid: f"arn:aws:{service}:{REGION}:{ACCOUNT}:{path.format(id=rid, **_str(attrs))}"


def _global_arn(service: str, path: str) -> Computer:
    return lambda attrs, rid: f"arn:aws:{service}::{ACCOUNT}:{path.format(id=rid, **_str(attrs))}"


def _str(attrs: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in attrs.items() if isinstance(v, (str, int)) and k != "id"}


def _const(value: Any) -> Computer:
    return lambda attrs, rid: value


def _private_ip(attrs: Mapping[str, Any], rid: str) -> str:
    digest = hashlib.sha256(rid.encode()).digest()
    return f"10.0.{digest[0]}.{max(digest[1], 4)}"


SCHEMAS: dict[str, ResourceSchema] = {
    "aws_vpc": ResourceSchema(
        "vpc",
        force_new=frozenset({"cidr_block", "instance_tenancy"}),
        computed={
            "arn": _arn("ec2", "vpc/{id}"),
            "default_security_group_id": lambda a, rid: rid.replace("vpc-", "sg-"),
            "main_route_table_id": lambda a, rid: rid.replace("vpc-", "rtb-"),
            "owner_id": _const(ACCOUNT),
        },
        defaults={"enable_dns_support": True, "enable_dns_hostnames": False, "instance_tenancy": "default"},
    ),
    "aws_subnet": ResourceSchema(
        "subnet",
        force_new=frozenset({"vpc_id", "cidr_block", "availability_zone"}),
        computed={"arn": _arn("ec2", "subnet/{id}"), "owner_id": _const(ACCOUNT)},
        defaults={"map_public_ip_on_launch": False},
    ),
    "aws_security_group": ResourceSchema(
        "sg",
        force_new=frozenset({"name", "name_prefix", "vpc_id", "description"}),
        computed={"arn": _arn("ec2", "security-group/{id}"), "owner_id": _const(ACCOUNT)},
        defaults={"description": "Managed by Terraform"},
    ),
    "aws_security_group_rule": ResourceSchema(
        "sgrule",
        force_new=frozenset({
            "type", "from_port", "to_port", "protocol", "cidr_blocks", "ipv6_cidr_blocks",
            "security_group_id", "source_security_group_id", "self", "prefix_list_ids",
        }),
        computed={"security_group_rule_id": lambda a, rid: rid.replace("sgrule-", "sgr-")},
    ),
    "aws_s3_bucket": ResourceSchema(
        None,
        id_from="bucket",
        force_new=frozenset({"bucket", "bucket_prefix"}),
        computed={
            "arn": lambda a, rid: f"arn:aws:s3:::{rid}",
            "bucket_domain_name": lambda a, rid: f"{rid}.s3.amazonaws.com",
            "bucket_regional_domain_name": lambda a, rid: f"{rid}.s3.{REGION}.amazonaws.com",
            "hosted_zone_id": _const("Z1BKCTXD74EZPE"),
            "region": _const(REGION),
        },
        defaults={"force_destroy": False},
    ),
    "aws_s3_bucket_versioning": ResourceSchema(None, id_from="bucket", force_new=frozenset({"bucket"})),
    "aws_s3_bucket_server_side_encryption_configuration": ResourceSchema(
        None, id_from="bucket", force_new=frozenset({"bucket"})
    ),
    "aws_s3_bucket_public_access_block": ResourceSchema(None, id_from="bucket", force_new=frozenset({"bucket"})),
    "aws_db_instance": ResourceSchema(
        "db",
        force_new=frozenset({
            "identifier", "engine", "db_name", "username", "storage_encrypted", "kms_key_id",
            "availability_zone", "snapshot_identifier", "character_set_name",
        }),
        computed={
            "arn": _arn("rds", "db:{identifier}"),
            "address": lambda a, rid: f"{a.get('identifier', rid)}.c9akciq32.{REGION}.rds.amazonaws.com",
            "endpoint": lambda a, rid: f"{a.get('identifier', rid)}.c9akciq32.{REGION}.rds.amazonaws.com:5432",
            "resource_id": lambda a, rid: "db-" + hashlib.sha256(rid.encode()).hexdigest()[:26].upper(),
            "hosted_zone_id": _const("Z29XKXDKYMONMX"),
        },
        sensitive=frozenset({"password"}),
        defaults={"port": 5432, "storage_encrypted": False, "deletion_protection": False,
                  "backup_retention_period": 0, "multi_az": False, "publicly_accessible": False},
    ),
    "aws_instance": ResourceSchema(
        "i",
        force_new=frozenset({"ami", "subnet_id", "availability_zone", "key_name", "private_ip"}),
        computed={
            "arn": _arn("ec2", "instance/{id}"),
            "private_ip": _private_ip,
            "public_ip": _const(None),
            "primary_network_interface_id": lambda a, rid: rid.replace("i-", "eni-"),
        },
    ),
    "aws_iam_role": ResourceSchema(
        None,
        id_from="name",
        force_new=frozenset({"name", "name_prefix", "path"}),
        computed={
            "arn": _global_arn("iam", "role/{id}"),
            "unique_id": lambda a, rid: "AROA" + hashlib.sha256(rid.encode()).hexdigest()[:17].upper(),
            "create_date": _const("2026-01-01T00:00:00Z"),
        },
        defaults={"path": "/", "max_session_duration": 3600},
    ),
    "aws_eks_cluster": ResourceSchema(
        None,
        id_from="name",
        force_new=frozenset({"name", "role_arn"}),
        computed={
            "arn": _arn("eks", "cluster/{id}"),
            "endpoint": lambda a, rid: f"https://{hashlib.sha256(rid.encode()).hexdigest()[:32].upper()}.gr7.{REGION}.eks.amazonaws.com",
            "platform_version": _const("eks.5"),
            "status": _const("ACTIVE"),
        },
    ),
    "aws_eks_node_group": ResourceSchema(
        None,
        id_from="node_group_name",
        force_new=frozenset({"cluster_name", "node_group_name", "node_role_arn", "subnet_ids", "instance_types"}),
        computed={"arn": _arn("eks", "nodegroup/{id}"), "status": _const("ACTIVE")},
    ),
    "aws_route53_record": ResourceSchema(
        None,
        force_new=frozenset({"zone_id", "name", "type", "set_identifier"}),
        computed={"fqdn": lambda a, rid: str(a.get("name", ""))},
    ),
    "aws_lb": ResourceSchema(
        None,
        force_new=frozenset({"name", "name_prefix", "internal", "load_balancer_type"}),
        computed={
            "arn": _arn("elasticloadbalancing", "loadbalancer/app/{name}/50dc6c495c0c9188"),
            "dns_name": lambda a, rid: f"{a.get('name', 'lb')}-1234567890.{REGION}.elb.amazonaws.com",
            "zone_id": _const("Z32O12XQLNTSW2"),
        },
        defaults={"internal": False, "load_balancer_type": "application"},
    ),
}

GENERIC = ResourceSchema("id")


def schema_for(resource_type: str) -> ResourceSchema:
    return SCHEMAS.get(resource_type, GENERIC)
