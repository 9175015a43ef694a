"""Rego policies on a 5,000-change plan: 20 conftest-style rules in 4 packages, through the gateway's evaluator.

Prints the time to start the evaluator processes and load the policy set (once per commit of policies/), the
first and the following evaluations of the plan (masking and the trip to the processes included), with the
queries shared out among the evaluator's processes (one per CPU) and, for comparison, all in one process;
and the same 20 rules written to look at only the resource types they judge (`input.resource_changes`
filtered once per package). Beside each warm figure, the floor measured in the same run: regopy alone, in
this process, handed the same masked input (its own `set_input`) and asked the same queries, split into the
time to hand it the input and the time of each query: that split is what sets the floor. CPU times are the
gateway's process plus its evaluators'; the critical path is the gateway's CPU plus that of its busiest
evaluator (the wall time on idle CPUs, a figure a shared machine cannot distort); the load average is
printed at the start and the end. Not a test.

Goal (issue 25): a warm evaluation of 5,000 changes by 20 rules <= 1 s.
Usage: python benchmarks/rego_policies.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from regopy import Interpreter  # noqa: E402

from gateway.adapters.policy import rego as rego_adapter  # noqa: E402
from gateway.adapters.policy.rego import RegoEvaluator  # noqa: E402
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


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(work, pids: tuple[int, ...] = ()) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """Wall and CPU seconds of `work()` (this process's CPU plus that of the processes `pids`), and its critical
    path: this process's CPU plus that of the busiest of `pids`, the wall time it would take on idle CPUs."""
    wall, cpu = time.perf_counter(), time.process_time()
    before = [process_cpu(pid) for pid in pids]
    work()
    others = [process_cpu(pid) - was for pid, was in zip(pids, before, strict=True)]
    own = time.process_time() - cpu
    return time.perf_counter() - wall, own + sum(others), own + max(others, default=0.0)


def regopy_alone(policies: RegoPolicies, document: dict, queries: list[str]) -> dict[str, float]:
    """The floor: regopy in this process, its own set_input, the same queries; CPU seconds of each step."""
    interpreter = Interpreter()
    for m in policies.modules:
        interpreter.add_module(m.path, m.source)
    masked = masked_input(document, frozenset())
    steps = {"set_input": timed(lambda: interpreter.set_input(masked))[1]}
    for query in queries:
        steps[query] = timed(lambda: interpreter.query(query).ok() or sys.exit(f"{query} failed"))[1]  # noqa: B023
    return steps


def gateway(policies: RegoPolicies, document: dict, queries: list[str], runs: int) -> tuple[float, list]:
    """The first evaluation's wall seconds and the figures of `timed` for each later one, through the gateway."""
    evaluator = RegoEvaluator(policies)
    started = time.perf_counter()
    first = evaluator.evaluate(masked_input(document, frozenset()), queries)
    cold = time.perf_counter() - started
    assert not first.errors and not first.module_errors, (first.errors, first.module_errors)
    pids = tuple(evaluator.pids)  # their CPU counts too
    warm = [timed(lambda: evaluator.evaluate(masked_input(document, frozenset()), queries), pids)
            for _ in range(runs)]
    evaluator.close()
    return cold, warm


def run(by_type: bool, runs: int) -> None:
    policies = RegoPolicies(f"bench-{by_type}", tuple(module(p, by_type) for p in range(PACKAGES)), {})
    queries = policies.queries(None)
    document = plan()
    processes = min(rego_adapter._cpus(), rego_adapter.PROCESSES, len(queries))
    cold, shared = gateway(policies, document, queries, runs)
    default, rego_adapter.PROCESSES = rego_adapter.PROCESSES, 1
    try:
        _, single = gateway(policies, document, queries, runs)
    finally:
        rego_adapter.PROCESSES = default
    floors = [regopy_alone(policies, document, queries) for _ in range(runs)]
    floor_cpu = statistics.median(sum(f.values()) for f in floors)
    steps = {step: statistics.median(f[step] for f in floors) for step in floors[0]}
    label = "rules filtered by type once per package" if by_type else "each rule scans every change"
    print(f"{label} ({len(queries)} queries, {PACKAGES * RULES_PER_PACKAGE} rules, {CHANGES} changes):\n"
          f"  first evaluation (process start + load + evaluate) {cold:5.2f} s wall")
    for name, warm in ((f"{processes} processes", shared), ("1 process", single)):
        wall, cpu, path = (statistics.median(figures[i] for figures in warm) for i in range(3))
        print(f"  later evaluations, {name}, median of {runs}: {wall:5.2f} s wall, {cpu:5.2f} s CPU, "
              f"critical path {path:5.2f} s CPU (goal 1 s: {'met' if wall <= 1 else 'NOT MET'}); "
              f"gateway CPU / floor CPU {cpu / floor_cpu:4.2f}")
    print(f"  floor, regopy alone on the same input: {floor_cpu:5.2f} s CPU = set_input {steps.pop('set_input'):5.2f}"
          + "".join(f" + {query.removeprefix('data.')} {seconds:4.2f}" for query, seconds in steps.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    run(by_type=False, runs=options.runs)
    run(by_type=True, runs=options.runs)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
