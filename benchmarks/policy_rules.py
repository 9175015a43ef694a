"""Evaluates every built-in policy rule and the risk level on a generated plan of N changes.

Prints figures; it is not a test. Usage: python benchmarks/policy_rules.py [N]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from gateway.domain.plan import load_plan
from gateway.domain.policy import PolicyContext, PolicySettings, evaluate_plan
from gateway.domain.risk import assess_risk

TAGS = {"owner": "bench", "cost-centre": "cc-0"}


def change(address: str, rtype: str, actions: list[str], before: Any, after: Any) -> dict[str, Any]:
    return {"address": address, "type": rtype, "name": address.split(".", 1)[1], "mode": "managed",
            "change": {"actions": actions, "before": before, "after": after, "after_unknown": {"id": True}}}


def generate_plan(count: int) -> dict[str, Any]:
    """Buckets with companions, security group rules, instances, databases: one fifth each kind."""
    changes = []
    for i in range(count // 5):
        changes += [
            change(f"aws_s3_bucket.b{i}", "aws_s3_bucket", ["create"], None, {"bucket": f"b{i}", "tags": TAGS}),
            change(f"aws_s3_bucket_public_access_block.b{i}", "aws_s3_bucket_public_access_block", ["create"], None,
                   {"bucket": f"b{i}", "block_public_acls": True, "block_public_policy": True,
                    "ignore_public_acls": True, "restrict_public_buckets": i % 7 != 0}),
            change(f"aws_security_group_rule.r{i}", "aws_security_group_rule", ["update"],
                   {"type": "ingress", "from_port": 443, "to_port": 443, "protocol": "tcp", "cidr_blocks": ["10.0.0.0/8"]},
                   {"type": "ingress", "from_port": 22 if i % 11 == 0 else 443, "to_port": 22 if i % 11 == 0 else 443,
                    "protocol": "tcp", "cidr_blocks": ["0.0.0.0/0"]}),
            change(f"aws_instance.i{i}", "aws_instance", ["update"], {"instance_type": "t3.small", "tags": TAGS},
                   {"instance_type": "m5.large" if i % 3 else "t3.small", "tags": TAGS}),
            change(f"aws_db_instance.d{i}", "aws_db_instance", ["delete"] if i % 13 == 0 else ["update"],
                   {"identifier": f"d{i}", "storage_encrypted": True, "deletion_protection": True, "tags": TAGS},
                   None if i % 13 == 0 else {"identifier": f"d{i}", "storage_encrypted": True,
                                              "deletion_protection": i % 2 == 0, "backup_retention_period": 7, "tags": TAGS}),
        ]
    return {"format_version": "1.2", "resource_changes": changes}


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    document = generate_plan(count)
    start = time.perf_counter()
    plan = load_plan(document)
    loaded = time.perf_counter()
    context = PolicyContext("bench", PolicySettings(approved_instance_types=frozenset({"t3.small"})),
                            frozenset({"aws_db_instance.d0"}), proposed_by_agent=True)
    findings = evaluate_plan(plan, context)
    evaluated = time.perf_counter()
    risk = assess_risk(plan)
    done = time.perf_counter()
    print(f"plan: {len(plan.resource_changes)} changes")
    print(f"load plan            {loaded - start:7.3f} s")
    print(f"evaluate all rules   {evaluated - loaded:7.3f} s   ({len(findings)} findings, "
          f"{sum(f.severity == 'deny' for f in findings)} deny)")
    print(f"assess risk          {done - evaluated:7.3f} s   ({risk.level.value})")


if __name__ == "__main__":
    main()
