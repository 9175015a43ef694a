"""Data sources the simulated cloud answers at plan time, with deterministic, plausible values.

Each reader takes a data block's evaluated arguments (nested blocks as lists of objects) and
returns the object Terraform's AWS provider would: the region, account and zones are the
simulated cloud's; an AMI or a default VPC gets a stable id derived from what was asked.
`aws_iam_policy_document` computes its JSON as the provider does. A type not listed here is
not simulated: its values are unknown until apply.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from gateway.adapters.engines.sandbox.schema import ACCOUNT, plausible_value, region
from gateway.adapters.engines.sandbox.values import Secret

Lookup = Callable[[str, str], "dict[str, Any] | None"]
Reader = Callable[[Mapping[str, Any], Lookup], dict[str, Any]]

ZONES = ("a", "b", "c")
POLICY_VERSION = "2012-10-17"


def _digest(args: Mapping[str, Any], size: int = 17) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()[:size]


def _availability_zones(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    here = region()
    excluded = set(args.get("exclude_names") or [])
    names = [f"{here}{z}" for z in ZONES if f"{here}{z}" not in excluded]
    prefix = "".join(part[0] for part in here.split("-")[:-1]) + here.split("-")[-1]  # eu-west-1 -> ew1
    short = here.split("-")[0] + prefix[1:]  # euw1
    return {**args, "id": here, "names": names, "zone_ids": [f"{short}-az{i + 1}" for i in range(len(names))],
            "group_names": [here], "state": args.get("state")}


def _caller_identity(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    return {"id": ACCOUNT, "account_id": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/gateway-sandbox",
            "user_id": "AIDA" + _digest({"user": "gateway-sandbox"}).upper()}


def _region(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    name = args.get("name") or region()
    return {"id": name, "name": name, "region": name, "description": f"Simulated region {name}",
            "endpoint": f"ec2.{name}.amazonaws.com"}


def _partition(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    return {"id": "aws", "partition": "aws", "dns_suffix": "amazonaws.com", "reverse_dns_prefix": "com.amazonaws"}


def _ami(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    image = "ami-" + _digest(args)
    names = [v for f in args.get("filter") or [] if f.get("name") == "name" for v in f.get("values") or []]
    owners = [o for o in args.get("owners") or [] if str(o).isdigit()]
    return {**args, "id": image, "image_id": image, "arn": f"arn:aws:ec2:{region()}::image/{image}",
            "name": (names[0] if names else "simulated-image-*").replace("*", "20260101"),
            "architecture": "x86_64", "owner_id": owners[0] if owners else ACCOUNT, "state": "available",
            "root_device_name": "/dev/xvda", "root_device_type": "ebs", "virtualization_type": "hvm",
            "image_type": "machine", "platform_details": "Linux/UNIX", "creation_date": "2026-01-01T00:00:00.000Z",
            "description": "an image of the simulated cloud", "hypervisor": "xen", "public": True}


def _vpc(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    if args.get("id") and (live := lookup("aws_vpc", str(args["id"]))) is not None:
        return {**live, **args}
    vpc = "vpc-" + _digest({k: v for k, v in args.items() if k != "tags"})
    return {**args, "id": vpc, "arn": f"arn:aws:ec2:{region()}:{ACCOUNT}:vpc/{vpc}", "cidr_block": "172.31.0.0/16",
            "default": bool(args.get("default", True)), "owner_id": ACCOUNT, "instance_tenancy": "default",
            "enable_dns_support": True, "enable_dns_hostnames": True, "state": "available",
            "main_route_table_id": vpc.replace("vpc-", "rtb-"), "dhcp_options_id": vpc.replace("vpc-", "dopt-"),
            "default_security_group_id": vpc.replace("vpc-", "sg-"), "tags": args.get("tags") or {}}


def _subnets(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    seed = _digest(args)
    return {**args, "id": region(), "ids": [f"subnet-{_digest({'seed': seed, 'zone': z})}" for z in ZONES]}


def _subnet(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    if args.get("id") and (live := lookup("aws_subnet", str(args["id"]))) is not None:
        return {**live, **args}
    subnet = str(args.get("id") or "subnet-" + _digest(args))
    return {**args, "id": subnet, "arn": f"arn:aws:ec2:{region()}:{ACCOUNT}:subnet/{subnet}",
            "vpc_id": args.get("vpc_id") or "vpc-" + _digest({}), "cidr_block": "172.31.0.0/20",
            "availability_zone": args.get("availability_zone") or f"{region()}a", "owner_id": ACCOUNT,
            "map_public_ip_on_launch": True, "state": "available"}


def _one_or_many(values: list[Any]) -> Any:
    """The provider writes a set of one as a plain string."""
    return values[0] if len(values) == 1 else values


def _statement(block: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if block.get("sid"):
        out["Sid"] = block["sid"]
    out["Effect"] = block.get("effect") or "Allow"
    for arg, key in (("actions", "Action"), ("not_actions", "NotAction"),
                     ("resources", "Resource"), ("not_resources", "NotResource")):
        values = block.get(arg)
        if values:
            out[key] = _one_or_many(sorted({str(v) for v in values}, reverse=True))
    for arg, key in (("principals", "Principal"), ("not_principals", "NotPrincipal")):
        principals: dict[str, list[str]] = {}
        for p in block.get(arg) or []:
            principals.setdefault(str(p.get("type")), []).extend(str(i) for i in p.get("identifiers") or [])
        if principals:
            if set(principals) == {"*"}:
                out[key] = "*"
            else:
                out[key] = {t: _one_or_many(sorted(set(ids), reverse=True)) for t, ids in principals.items()}
    conditions: dict[str, dict[str, Any]] = {}
    for c in block.get("condition") or []:
        values = [str(v) for v in c.get("values") or []]
        conditions.setdefault(str(c.get("test")), {})[str(c.get("variable"))] = _one_or_many(values)
    if conditions:
        out["Condition"] = conditions
    return out


def _merge_statements(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Statements of `extra` replace those of `base` with the same Sid; the others are appended."""
    merged = list(base)
    for statement in extra:
        sid = statement.get("Sid")
        at = next((i for i, s in enumerate(merged) if sid and s.get("Sid") == sid), None)
        if at is None:
            merged.append(statement)
        else:
            merged[at] = statement
    return merged


def _policy_statements(text: Any) -> list[dict[str, Any]]:
    try:
        document = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        raise ValueError("aws_iam_policy_document: a source or override document is not JSON") from None
    statements = document.get("Statement", []) if isinstance(document, dict) else []
    return [statements] if isinstance(statements, dict) else list(statements)


def _policy_document(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    statements: list[dict[str, Any]] = []
    for source in args.get("source_policy_documents") or []:
        statements = _merge_statements(statements, _policy_statements(source))
    statements = _merge_statements(statements, [_statement(b) for b in args.get("statement") or []])
    for override in args.get("override_policy_documents") or []:
        statements = _merge_statements(statements, _policy_statements(override))
    document: dict[str, Any] = {"Version": args.get("version") or POLICY_VERSION}
    if args.get("policy_id"):
        document["Id"] = args["policy_id"]
    document["Statement"] = statements
    text = json.dumps(document, indent=2)
    digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return {**args, "id": str(digest), "json": text, "minified_json": json.dumps(document, separators=(",", ":"))}


def _security_group(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    if args.get("id") and (live := lookup("aws_security_group", str(args["id"]))) is not None:
        return {**live, **args}
    group = str(args.get("id") or "sg-" + _digest(args))
    return {**args, "id": group, "arn": f"arn:aws:ec2:{region()}:{ACCOUNT}:security-group/{group}",
            "name": args.get("name") or "default", "description": "a security group of the simulated cloud",
            "vpc_id": args.get("vpc_id") or "vpc-" + _digest({}), "tags": args.get("tags") or {}}


def _canonical_user_id(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    return {"id": hashlib.sha256(f"canonical/{ACCOUNT}".encode()).hexdigest(), "display_name": "gateway-sandbox"}


def _cloudfront_log_delivery(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    # the canonical user CloudFront writes access logs as, in the commercial regions
    return {**args, "id": "c4c1ede66af53448b93c283ce9448c4ba468c9432aa01d700d3878632f77d2d0"}


def _elb_service_account(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    account = "156460612806"  # Elastic Load Balancing's account in eu-west-1, which logs are written as
    return {**args, "id": account, "arn": f"arn:aws:iam::{account}:root"}


def _session_context(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    arn = str(args.get("arn") or "")
    return {**args, "id": arn, "issuer_arn": arn, "issuer_id": "AROA" + _digest(args).upper(),
            "issuer_name": arn.rsplit("/", 1)[-1], "session_name": ""}


def _route53_zone(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    zone = str(args.get("zone_id") or "Z" + _digest(args, 13).upper())
    name = str(args.get("name") or "example.com").rstrip(".")
    return {**args, "id": zone, "zone_id": zone, "name": name, "arn": f"arn:aws:route53:::hostedzone/{zone}",
            "private_zone": bool(args.get("private_zone", False)), "comment": "",
            "name_servers": [f"ns-{i}.awsdns-{i:02d}.{tld}" for i, tld in enumerate(("com", "net", "org", "co.uk"))]}


def _iam_role(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    name = str(args.get("name") or "role")
    return {**args, "id": name, "name": name, "arn": f"arn:aws:iam::{ACCOUNT}:role/{name}", "path": "/",
            "unique_id": "AROA" + _digest(args).upper(), "assume_role_policy": "{}", "max_session_duration": 3600}


def _iam_policy(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    name = str(args.get("name") or str(args.get("arn") or "policy").rsplit("/", 1)[-1])
    arn = str(args.get("arn") or f"arn:aws:iam::{ACCOUNT}:policy/{name}")
    return {**args, "id": arn, "arn": arn, "name": name, "path": "/", "policy": "{}",
            "policy_id": "ANPA" + _digest(args).upper()}


def _kms_key(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    key = str(args.get("key_id") or "")
    if not key or key.startswith(("alias/", "arn:")):
        key = "-".join(_digest({"key": key}, 32)[i:j] for i, j in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
    return {**args, "id": key, "arn": f"arn:aws:kms:{region()}:{ACCOUNT}:key/{key}", "enabled": True,
            "key_state": "Enabled", "key_manager": "CUSTOMER", "key_usage": "ENCRYPT_DECRYPT"}


def _kms_alias(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    key = _kms_key({"key_id": args.get("name")}, lookup)
    name = str(args.get("name") or "alias/aws/s3")
    return {**args, "id": f"arn:aws:kms:{region()}:{ACCOUNT}:{name}", "arn": f"arn:aws:kms:{region()}:{ACCOUNT}:{name}",
            "target_key_id": key["id"], "target_key_arn": key["arn"]}


def _s3_bucket(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    bucket = str(args.get("bucket") or "bucket")
    if (live := lookup("aws_s3_bucket", bucket)) is not None:
        return {**live, **args}
    return {**args, "id": bucket, "bucket": bucket, "arn": f"arn:aws:s3:::{bucket}", "region": region(),
            "bucket_domain_name": f"{bucket}.s3.amazonaws.com",
            "bucket_regional_domain_name": f"{bucket}.s3.{region()}.amazonaws.com", "hosted_zone_id": "Z1BKCTXD74EZPE"}


def _ssm_parameter(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    name = str(args.get("name") or "parameter")
    return {**args, "id": name, "name": name, "arn": f"arn:aws:ssm:{region()}:{ACCOUNT}:parameter/{name.lstrip('/')}",
            "type": "String", "version": 1, "value": Secret(f"simulated-{_digest(args, 12)}"),
            "insecure_value": None}


def _credentials(args: Mapping[str, Any]) -> dict[str, Any]:
    """What a secret usually holds: database credentials (JSON, as the console's secret types write it)."""
    return {"username": "admin", "password": f"simulated-{_digest(args, 16)}", "engine": "mysql",
            "host": f"db.{region()}.rds.amazonaws.com", "port": 3306, "dbname": "app"}


def _secret_version(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    secret = str(args.get("secret_id") or "secret")
    arn = secret if secret.startswith("arn:") else f"arn:aws:secretsmanager:{region()}:{ACCOUNT}:secret:{secret}-AbCdEf"
    return {**args, "id": f"{arn}|AWSCURRENT", "arn": arn, "version_id": _digest(args, 32),
            "version_stages": ["AWSCURRENT"], "secret_string": Secret(json.dumps(_credentials(args))),
            "secret_binary": Secret("")}


def _eks_cluster(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    name = str(args.get("name") or "cluster")
    return {**args, "id": name, "name": name, "arn": f"arn:aws:eks:{region()}:{ACCOUNT}:cluster/{name}",
            "endpoint": f"https://{_digest(args, 32).upper()}.gr7.{region()}.eks.amazonaws.com",
            "certificate_authority": [{"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}], "version": "1.31",
            "status": "ACTIVE", "platform_version": "eks.5"}


def _token(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    return {**args, "id": str(args.get("name") or region()), "token": Secret("k8s-aws-v1." + _digest(args, 40)),
            "authorization_token": Secret("QVdTOnNpbXVsYXRlZA=="), "user_name": "AWS", "password": Secret("simulated"),
            "proxy_endpoint": f"https://{ACCOUNT}.dkr.ecr.{region()}.amazonaws.com"}


class _Outputs(dict[str, Any]):
    """Another configuration's outputs: the sandbox cannot know their names, so each one read has a plausible value."""

    def __init__(self, seed: str):
        super().__init__()
        self.seed = seed

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> Any:
        return plausible_value("terraform_remote_state", name, self.seed, {})


def _remote_state(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    return {**args, "id": _digest(args), "outputs": _Outputs(_digest(args))}


def _external(args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    """The `external` data source: its program is never run; each key of its result has a plausible value."""
    return {**args, "id": "-", "result": _Outputs(_digest(args))}


READERS: dict[str, Reader] = {
    "terraform_remote_state": _remote_state,
    "external": _external,
    "aws_security_group": _security_group,
    "aws_canonical_user_id": _canonical_user_id,
    "aws_cloudfront_log_delivery_canonical_user_id": _cloudfront_log_delivery,
    "aws_elb_service_account": _elb_service_account,
    "aws_iam_session_context": _session_context,
    "aws_route53_zone": _route53_zone,
    "aws_iam_role": _iam_role,
    "aws_iam_policy": _iam_policy,
    "aws_kms_key": _kms_key,
    "aws_kms_alias": _kms_alias,
    "aws_s3_bucket": _s3_bucket,
    "aws_ssm_parameter": _ssm_parameter,
    "aws_secretsmanager_secret_version": _secret_version,
    "aws_eks_cluster": _eks_cluster,
    "aws_eks_cluster_auth": _token,
    "aws_ecr_authorization_token": _token,
    "aws_availability_zones": _availability_zones,
    "aws_caller_identity": _caller_identity,
    "aws_region": _region,
    "aws_partition": _partition,
    "aws_ami": _ami,
    "aws_vpc": _vpc,
    "aws_subnets": _subnets,
    "aws_subnet": _subnet,
    "aws_iam_policy_document": _policy_document,
}


def read_data(data_type: str, args: Mapping[str, Any], lookup: Lookup) -> dict[str, Any] | None:
    """The data source's object, or None when the sandbox does not simulate the type."""
    reader = READERS.get(data_type)
    return reader(args, lookup) if reader else None


def data_object_id(args: Mapping[str, Any]) -> str:
    """Which read of an unsimulated data source this is: the same arguments read the same object."""
    return _digest(args, 32)


def unsimulated_data(data_type: str, args: Mapping[str, Any], referenced: set[str]) -> dict[str, Any]:
    """Once read by an apply, a data source the sandbox does not simulate: referenced attributes get plausible values."""
    seed = f"data.{data_type}/{_digest(args)}"
    return {**args, **{name: plausible_value(data_type, name, seed, args) for name in referenced if name not in args}}
