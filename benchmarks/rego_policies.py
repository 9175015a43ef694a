"""Rego policies on a 5,000-change plan: 20 conftest-style rules in 4 packages, through the gateway's evaluator.

Prints the time to start the evaluator process and load the policy set (once per commit of policies/), the
first and the following evaluations of the plan (masking and the trip to the process included), and the
same 20 rules written to look at only the resource types they judge (`input.resource_changes` filtered
once per package). It is not a test.

Usage: python benchmarks/rego_policies.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.adapters.rego import RegoEvaluator  # noqa: E402
from gateway.domain.rego import RegoModule, RegoPolicies, masked_input  # noqa: E402

CHANGES, PACKAGES, RULES_PER_PACKAGE = 5000, 4, 5
TYPES = ["aws_sqs_queue", "aws_s3_bucket", "aws_instance", "aws_security_group", "aws_iam_role"]


def plan() -> dict:
    changes = [{"address": f"{TYPES[i % 5]}.r{i}", "mode": "managed", "type": TYPES[i % 5], "name": f"r{i}",
                "change": {"actions": ["create"], "before": None, "after_unknown": {"arn": True},
                           "after": {"name": f"r{i}", "tags": {"owner": "team"} if i % 3 else {}}}}
               for i in range(CHANGES)]
    return {"format_version": "1.2", "terraform_version": "1.9.0", "resource_changes": changes}


def module(package: int, by_type: bool) -> RegoModule:
    rules = []
    for k in range(RULES_PER_PACKAGE):
        kind = TYPES[(package + k) % 5]
        source = "typed" if by_type else "input.resource_changes"
        rules.append(f'''deny contains finding if {{
	some rc in {source}
	rc.type == "{kind}"
	not rc.change.after.tags["t{k}"]
	rc.change.after.name == "r{k}"
	finding := {{"msg": "missing tag t{k}", "address": rc.address, "id": "p{package}-r{k}"}}
}}''')
    typed = "" if not by_type else ('typed := [rc | some rc in input.resource_changes; rc.type in {'
                                    + ", ".join(f'"{TYPES[(package + k) % 5]}"' for k in range(RULES_PER_PACKAGE))
                                    + "}]\n\n")
    return RegoModule(f"policies/p{package}.rego", f"package bench.p{package}\n\nimport rego.v1\n\n{typed}"
                      + "\n\n".join(rules) + "\n")


def run(by_type: bool) -> None:
    policies = RegoPolicies(f"bench-{by_type}", tuple(module(p, by_type) for p in range(PACKAGES)), {})
    queries = policies.queries(None)
    document = plan()
    evaluator = RegoEvaluator(policies)
    started = time.perf_counter()
    first = evaluator.evaluate(masked_input(document, frozenset()), queries)
    cold = time.perf_counter() - started
    assert not first.errors and not first.module_errors, (first.errors, first.module_errors)
    warm = []
    for _ in range(3):
        started = time.perf_counter()
        evaluator.evaluate(masked_input(document, frozenset()), queries)
        warm.append(time.perf_counter() - started)
    evaluator.close()
    label = "rules filtered by type once per package" if by_type else "each rule scans every change      "
    print(f"{label}: first evaluation (process start + load + evaluate) {cold:5.2f} s; "
          f"later evaluations median {statistics.median(warm):5.2f} s ({len(queries)} queries, "
          f"{PACKAGES * RULES_PER_PACKAGE} rules, {CHANGES} changes)")


if __name__ == "__main__":
    run(by_type=False)
    run(by_type=True)
