"""The simulated provider: per resource type, what forces replacement and what is computed.

Force-new attributes follow the AWS provider's schema (`ForceNew`). Computed attributes are
unknown in a plan and filled in by the simulated cloud on apply. A type not listed here is
simulated generically: only `id` is computed and nothing forces replacement. Any attribute a
configuration refers to that is neither set nor computed here is unknown in a plan and gets a
plausible value on apply (`plausible_value`): an ARN for `arn`, an id for `*_id`, and so on.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

ACCOUNT = "123456789012"
DEFAULT_REGION = "eu-west-1"  # where a provider that names no region works
_REGION: contextvars.ContextVar[str] = contextvars.ContextVar("sandbox_region", default=DEFAULT_REGION)


def region() -> str:
    """The region of the provider the instance being planned or applied uses (its ARNs, zones, endpoints)."""
    return _REGION.get()


@contextlib.contextmanager
def in_region(name: str) -> Iterator[None]:
    """Plan or apply one instance in `name`: the values the simulated cloud makes up name that region."""
    token = _REGION.set(name)
    try:
        yield
    finally:
        _REGION.reset(token)

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
    return lambda attrs, rid: f"arn:aws:{service}:{region()}:{ACCOUNT}:{path.format_map(_str(attrs, rid))}"


def _global_arn(service: str, path: str) -> Computer:
    return lambda attrs, rid: f"arn:aws:{service}::{ACCOUNT}:{path.format_map(_str(attrs, rid))}"


class _OrId(dict[str, str]):
    """Attribute values for an ARN's path; one not set (a name from a prefix, say) is the id."""

    def __missing__(self, key: str) -> str:
        return self["id"]


def _str(attrs: Mapping[str, Any], rid: str) -> _OrId:
    return _OrId({k: str(v) for k, v in attrs.items() if isinstance(v, (str, int)) and k != "id"}, id=rid)


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
            "bucket_regional_domain_name": lambda a, rid: f"{rid}.s3.{region()}.amazonaws.com",
            "hosted_zone_id": _const("Z1BKCTXD74EZPE"),
            "region": lambda a, rid: region(),
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
            "address": lambda a, rid: f"{a.get('identifier', rid)}.c9akciq32.{region()}.rds.amazonaws.com",
            "endpoint": lambda a, rid: f"{a.get('identifier', rid)}.c9akciq32.{region()}.rds.amazonaws.com:5432",
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
            "endpoint": lambda a, rid: f"https://{hashlib.sha256(rid.encode()).hexdigest()[:32].upper()}.gr7.{region()}.eks.amazonaws.com",
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
            "dns_name": lambda a, rid: f"{a.get('name', 'lb')}-1234567890.{region()}.elb.amazonaws.com",
            "zone_id": _const("Z32O12XQLNTSW2"),
        },
        defaults={"internal": False, "load_balancer_type": "application"},
    ),
}


def _name_arn(service: str, kind: str, global_: bool = False) -> Computer:
    return lambda a, rid: f"arn:aws:{service}:{'' if global_ else region()}:{ACCOUNT}:{kind}/{a.get('name') or rid}"


def _random_text(length_attr: str, alphabet: str) -> Computer:
    def compute(attrs: Mapping[str, Any], rid: str) -> str:
        digest = hashlib.sha256(rid.encode()).digest() * 4
        return "".join(alphabet[b % len(alphabet)] for b in digest[: int(attrs.get(length_attr) or 16)])
    return compute


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"

SCHEMAS.update({
    "aws_iam_user": ResourceSchema(None, id_from="name", force_new=frozenset({"name"}), computed={
        "arn": _global_arn("iam", "user/{id}"),
        "unique_id": lambda a, rid: "AIDA" + hashlib.sha256(rid.encode()).hexdigest()[:17].upper()},
        defaults={"path": "/", "force_destroy": False}),
    "aws_iam_policy": ResourceSchema(None, force_new=frozenset({"name", "name_prefix", "path"}), computed={
        "arn": lambda a, rid: f"arn:aws:iam::{ACCOUNT}:policy/{a.get('name') or rid}",
        "policy_id": lambda a, rid: "ANPA" + hashlib.sha256(rid.encode()).hexdigest()[:17].upper()},
        defaults={"path": "/"}),
    "aws_iam_instance_profile": ResourceSchema(None, id_from="name", force_new=frozenset({"name", "path"}),
                                               computed={"arn": _global_arn("iam", "instance-profile/{id}"),
                                                         "unique_id": _const("AIPAEXAMPLE")}),
    "aws_iam_role_policy_attachment": ResourceSchema("attach", force_new=frozenset({"role", "policy_arn"})),
    "aws_iam_role_policy": ResourceSchema("rolepolicy", force_new=frozenset({"role", "name"})),
    "aws_kms_key": ResourceSchema("key", computed={
        "arn": _arn("kms", "key/{id}"), "key_id": lambda a, rid: rid},
        defaults={"deletion_window_in_days": 30, "enable_key_rotation": False, "is_enabled": True}),
    "aws_kms_alias": ResourceSchema(None, id_from="name", force_new=frozenset({"name"}),
                                    computed={"arn": _arn("kms", "{id}"), "target_key_arn": _const(None)}),
    "aws_cloudwatch_log_group": ResourceSchema(None, id_from="name", force_new=frozenset({"name", "name_prefix"}),
                                               computed={"arn": _arn("logs", "log-group:{id}")},
                                               defaults={"retention_in_days": 0}),
    "aws_sqs_queue": ResourceSchema(None, force_new=frozenset({"name", "name_prefix", "fifo_queue"}), computed={
        "arn": lambda a, rid: f"arn:aws:sqs:{region()}:{ACCOUNT}:{a.get('name') or rid}",
        "url": lambda a, rid: f"https://sqs.{region()}.amazonaws.com/{ACCOUNT}/{a.get('name') or rid}"}),
    "aws_sns_topic": ResourceSchema(None, force_new=frozenset({"name", "name_prefix", "fifo_topic"}), computed={
        "arn": lambda a, rid: f"arn:aws:sns:{region()}:{ACCOUNT}:{a.get('name') or rid}"}),
    "aws_lambda_function": ResourceSchema(None, id_from="function_name", force_new=frozenset({"function_name"}),
                                          computed={"arn": _arn("lambda", "function:{id}"),
                                                    "invoke_arn": lambda a, rid: f"arn:aws:apigateway:{region()}:lambda:path/2015-03-31/functions/arn:aws:lambda:{region()}:{ACCOUNT}:function:{rid}/invocations",
                                                    "qualified_arn": lambda a, rid: f"arn:aws:lambda:{region()}:{ACCOUNT}:function:{rid}:$LATEST",
                                                    "version": _const("$LATEST"), "last_modified": _const("2026-01-01T00:00:00.000+0000")}),
    "aws_internet_gateway": ResourceSchema("igw", computed={"arn": _arn("ec2", "internet-gateway/{id}"),
                                                            "owner_id": _const(ACCOUNT)}),
    "aws_eip": ResourceSchema("eipalloc", computed={"public_ip": lambda a, rid: _private_ip(a, rid).replace("10.", "54.", 1),
                                                    "allocation_id": lambda a, rid: rid, "public_dns": _const(None)}),
    "aws_nat_gateway": ResourceSchema("nat", force_new=frozenset({"allocation_id", "subnet_id", "connectivity_type"}),
                                      computed={"private_ip": _private_ip, "public_ip": _const(None),
                                                "network_interface_id": lambda a, rid: rid.replace("nat-", "eni-")}),
    "aws_route_table": ResourceSchema("rtb", force_new=frozenset({"vpc_id"}),
                                      computed={"arn": _arn("ec2", "route-table/{id}"), "owner_id": _const(ACCOUNT)}),
    "aws_route_table_association": ResourceSchema("rtbassoc", force_new=frozenset({"subnet_id", "gateway_id"})),
    "aws_route": ResourceSchema("r", force_new=frozenset({"route_table_id", "destination_cidr_block"})),
    "aws_ecr_repository": ResourceSchema(None, id_from="name", force_new=frozenset({"name"}), computed={
        "arn": _arn("ecr", "repository/{id}"), "registry_id": _const(ACCOUNT),
        "repository_url": lambda a, rid: f"{ACCOUNT}.dkr.ecr.{region()}.amazonaws.com/{rid}"}),
    "aws_dynamodb_table": ResourceSchema(None, id_from="name", force_new=frozenset({"name"}), computed={
        "arn": _arn("dynamodb", "table/{id}"), "stream_arn": _const(None)}),
    "aws_lb_target_group": ResourceSchema(None, force_new=frozenset({"name", "name_prefix", "port", "protocol", "vpc_id", "target_type"}),
                                          computed={"arn": _arn("elasticloadbalancing", "targetgroup/{name}/73e2d6bc24d8a067"),
                                                    "arn_suffix": lambda a, rid: f"targetgroup/{a.get('name', 'tg')}/73e2d6bc24d8a067"}),
    "aws_lb_listener": ResourceSchema(None, force_new=frozenset({"load_balancer_arn"}),
                                      computed={"arn": _arn("elasticloadbalancing", "listener/app/lb/50dc6c495c0c9188/f2f7dc8efc522ab2")}),
    "aws_launch_template": ResourceSchema("lt", computed={"arn": _arn("ec2", "launch-template/{id}"),
                                                          "latest_version": _const(1), "default_version": _const(1)}),
    "aws_autoscaling_group": ResourceSchema(None, id_from="name", force_new=frozenset({"name", "name_prefix"}),
                                            computed={"arn": _arn("autoscaling", "autoScalingGroup:{id}")}),
    "aws_key_pair": ResourceSchema(None, id_from="key_name", force_new=frozenset({"key_name", "public_key"}),
                                   computed={"arn": _arn("ec2", "key-pair/{id}"), "fingerprint": _const("d7:ff:a6:63:18:64:9c:57:a1:ee:ca:a4:ad:c2:81:62"),
                                             "key_pair_id": lambda a, rid: "key-" + hashlib.sha256(rid.encode()).hexdigest()[:17]}),
    "aws_ebs_volume": ResourceSchema("vol", force_new=frozenset({"availability_zone", "encrypted", "kms_key_id", "snapshot_id"}),
                                     computed={"arn": _arn("ec2", "volume/{id}")}),
    "aws_s3_bucket_policy": ResourceSchema(None, id_from="bucket", force_new=frozenset({"bucket"})),
    "aws_s3_bucket_acl": ResourceSchema(None, id_from="bucket", force_new=frozenset({"bucket"})),
    "aws_s3_object": ResourceSchema(None, id_from="key", force_new=frozenset({"bucket", "key"}),
                                    computed={"etag": lambda a, rid: hashlib.md5(rid.encode()).hexdigest(),  # noqa: S324 - a plausible ETag, not security
                                              "version_id": _const("")}),
    "aws_cloudwatch_metric_alarm": ResourceSchema(None, id_from="alarm_name", force_new=frozenset({"alarm_name"}),
                                                  computed={"arn": _arn("cloudwatch", "alarm:{id}")}),
    "random_string": ResourceSchema("none", force_new=frozenset({"length", "special", "upper", "lower", "numeric", "keepers"}),
                                    computed={"result": _random_text("length", _ALNUM)}),
    "random_password": ResourceSchema("none", force_new=frozenset({"length", "special", "upper", "lower", "numeric", "keepers"}),
                                      computed={"result": _random_text("length", _ALNUM + "ABCDEFGHIJKLMNOPQRSTUVWXYZ!#$%&*()-_=+[]{}<>:?"),
                                                "bcrypt_hash": _const("$2a$10$simulated")},
                                      sensitive=frozenset({"result", "bcrypt_hash"})),
    "random_id": ResourceSchema("rid", force_new=frozenset({"byte_length", "prefix", "keepers"}), computed={
        "hex": lambda a, rid: hashlib.sha256(rid.encode()).hexdigest()[: 2 * int(a.get("byte_length") or 8)],
        "dec": lambda a, rid: str(int(hashlib.sha256(rid.encode()).hexdigest()[: 2 * int(a.get("byte_length") or 8)], 16)),
        "b64_url": lambda a, rid: hashlib.sha256(rid.encode()).hexdigest()[:11],
        "b64_std": lambda a, rid: hashlib.sha256(rid.encode()).hexdigest()[:11] + "="}),
    "random_pet": ResourceSchema(None, force_new=frozenset({"length", "prefix", "separator", "keepers"}), computed={
        "id": lambda a, rid: "-".join(["sandbox", "simulated", "pet"][: int(a.get("length") or 2)])}),
    "random_integer": ResourceSchema("none", force_new=frozenset({"min", "max", "keepers", "seed"}), computed={
        "result": lambda a, rid: int(a.get("min") or 0) + int(hashlib.sha256(rid.encode()).hexdigest(), 16)
        % max(1, int(a.get("max") or 1) - int(a.get("min") or 0) + 1)}),
    "null_resource": ResourceSchema("none", force_new=frozenset({"triggers"})),
    "terraform_data": ResourceSchema("none", force_new=frozenset({"triggers_replace"}), computed={"output": _const(None)}),
    "time_sleep": ResourceSchema("none", force_new=frozenset({"create_duration", "destroy_duration", "triggers"})),
    "local_file": ResourceSchema("none", force_new=frozenset({"content", "filename", "sensitive_content", "file_permission"}),
                                 computed={"content_md5": lambda a, rid: hashlib.md5(str(a.get("content", "")).encode()).hexdigest()}),  # noqa: S324
    "tls_private_key": ResourceSchema("none", force_new=frozenset({"algorithm", "rsa_bits", "ecdsa_curve"}), computed={
        "private_key_pem": _const("-----BEGIN RSA PRIVATE KEY-----\nSIMULATED\n-----END RSA PRIVATE KEY-----\n"),
        "public_key_openssh": _const("ssh-rsa AAAASIMULATED sandbox\n"),
        "public_key_pem": _const("-----BEGIN PUBLIC KEY-----\nSIMULATED\n-----END PUBLIC KEY-----\n")},
        sensitive=frozenset({"private_key_pem"})),
})

GENERIC = ResourceSchema("id")

# the AWS service in an ARN, where it is not the type's second word
_SERVICES = {"lb": "elasticloadbalancing", "alb": "elasticloadbalancing", "cloudwatch": "logs", "db": "rds",
             "instance": "ec2", "vpc": "ec2", "subnet": "ec2", "security": "ec2", "eip": "ec2", "nat": "ec2",
             "internet": "ec2", "route": "ec2", "network": "ec2", "launch": "ec2", "ebs": "ec2", "key": "ec2",
             "customer": "ec2", "vpn": "ec2", "default": "ec2", "flow": "ec2", "egress": "ec2", "volume": "ec2",
             "placement": "ec2", "spot": "ec2", "main": "ec2", "transit": "ec2", "ami": "ec2", "ec2": "ec2"}
_GLOBAL_SERVICES = frozenset({"iam", "s3", "cloudfront", "route53"})


def plausible_value(resource_type: str, attribute: str, rid: str, attrs: Mapping[str, Any],
                    where: str | None = None) -> Any:
    """A deterministic, realistic value for an attribute the schema table does not know (in region `where`, else
    the current instance's)."""
    where = where or region()
    digest = hashlib.sha256(f"{resource_type}/{rid}/{attribute}".encode()).hexdigest()
    words = resource_type.split("_")
    service = _SERVICES.get(words[1], words[1]) if len(words) > 1 and words[0] == "aws" else words[0]
    name = attrs.get("name") or rid
    if attribute == "arn" or attribute.endswith("_arn"):
        at = "" if service in _GLOBAL_SERVICES else where
        return f"arn:aws:{service}:{at}:{ACCOUNT}:{'_'.join(words[2:]) or words[-1]}/{name}"
    if "cidr" in attribute:
        if "ipv6" in attribute:
            return f"2a05:d018:{int(digest[:4], 16):x}:{int(digest[4:6], 16):x}00::/56"
        return f"10.{int(digest[:2], 16)}.0.0/16"
    if attribute == "id" or attribute.endswith("_id"):
        return f"{attribute.removesuffix('_id') or words[-1]}-{digest[:17]}"
    if attribute.endswith("_ids"):
        return [f"{attribute.removesuffix('_ids')}-{digest[:17]}"]
    if attribute in ("name", "result", "output"):
        return f"{name}" if attribute == "name" else digest[:16]
    if attribute.endswith(("_ip", "_address")) or attribute in ("ip", "address"):
        return _private_ip(attrs, digest)
    if attribute.endswith(("dns_name", "endpoint", "fqdn", "_dns", "_domain", "hostname", "url")):
        host = f"{str(name).replace('_', '-')}-{digest[:8]}.{where}.{service}.amazonaws.com"
        return f"https://{host}" if attribute.endswith("url") else host
    return f"{attribute}-{digest[:12]}"


def schema_for(resource_type: str) -> ResourceSchema:
    return SCHEMAS.get(resource_type, GENERIC)
