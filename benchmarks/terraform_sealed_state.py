"""What sealing the terraform engine's local state costs.

1. One run's cycle around Terraform (take the stack's lock, seal any leftover, open the sealed state into the
   live file; at the end seal it back and delete it) for states of N resources (Terraform 1.0's state format).
2. A read of the state between runs (what the serial check of pages does): p50 and p95.
3. With `make terraform` done: a real plan of a small stack, sealed and unsealed, to set (1) against a run.

It is not a test. Usage: python benchmarks/terraform_sealed_state.py [N ...]   (default: 100 1000 10000)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup
from gateway.adapters.engines.terraform.state import SealedLocalState
from gateway.adapters.sealing import UNSEALED, Sealer
from gateway.logs import configure_logging
from gateway.ports import StackInputs

INSTALLED = Path(__file__).resolve().parent.parent / ".tools" / "terraform"


def state_of(count: int) -> bytes:
    """A Terraform 1.0 state of `count` resources, each with a handful of attributes."""
    resources = [{"mode": "managed", "type": "sim_object", "name": f"r{i}",
                  "provider": 'provider["example.local/gateway/sim"]',
                  "instances": [{"schema_version": 0, "attributes": {
                      "id": f"{i:016x}", "name": f"object-{i}", "content": "x" * 120, "secret": f"secret-{i}"},
                      "sensitive_attributes": []}]} for i in range(count)]
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": 7, "lineage": "bench",
                       "outputs": {}, "resources": resources}, indent=2).encode()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cycle_and_reads(root: Path, count: int) -> None:
    sealer = Sealer.from_key_file(root / "data.key")
    local = SealedLocalState(root / f"s{count}", sealer, "s")
    with local.in_use(0):
        local.live.write_bytes(state_of(count))
    size = len(state_of(count))
    cycles, reads = [], []
    for _ in range(20):
        started = time.perf_counter()
        with local.in_use(0):
            pass
        cycles.append(time.perf_counter() - started)
    for _ in range(100):
        started = time.perf_counter()
        local.read()
        reads.append(time.perf_counter() - started)
    print(f"{count:>6} resources ({size / 1e6:6.2f} MB state): run cycle p50 {statistics.median(cycles) * 1e3:7.1f} ms"
          f", p95 {percentile(cycles, 0.95) * 1e3:7.1f} ms; read p50 {statistics.median(reads) * 1e3:7.1f} ms, "
          f"p95 {percentile(reads, 0.95) * 1e3:7.1f} ms")


def real_plans(root: Path, repeats: int = 3) -> None:
    hcl = ('terraform {\n  required_providers {\n    null = {\n      source  = "hashicorp/null"\n'
           '      version = "2.1.2"\n    }\n  }\n}\n'
           + "".join(f'resource "null_resource" "n{i}" {{\n  triggers = {{ k = "v" }}\n}}\n' for i in range(20)))
    for label, sealer in (("unsealed", UNSEALED), ("sealed", Sealer.from_key_file(root / "data.key"))):
        engine = TerraformEngine(TerraformSetup(INSTALLED / "bin" / "terraform", INSTALLED / "terraformrc",
                                                root / f"state-{label}", 300), sealer)
        stack = root / f"stack-{label}"
        stack.mkdir()
        (stack / "main.tf").write_text(hcl)
        planned = engine.plan("s", stack, StackInputs())
        assert engine.apply("s", stack, planned.document, planned.state_serial, StackInputs(),
                            planned.artifact).succeeded
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            engine.plan("s", stack, StackInputs())
            times.append(time.perf_counter() - started)
        print(f"real plan of 20 null_resource, state {label:>8}: median {statistics.median(times):.2f} s "
              f"over {repeats}")


def main() -> None:
    configure_logging("WARNING")
    counts = [int(a) for a in sys.argv[1:]] or [100, 1000, 10000]
    with tempfile.TemporaryDirectory(prefix="gw-bench-sealed-") as tmp:
        root = Path(tmp)
        for count in counts:
            cycle_and_reads(root, count)
        if (INSTALLED / "bin" / "terraform").exists():
            real_plans(root)
        else:
            print("real plans skipped: run `make terraform`")


if __name__ == "__main__":
    main()
