"""The agent's overhead without a model: what one turn costs the gateway, and what the prompt budget costs.

1. Replays every eval case from its oracle transcript (the real graph, tools, previews, proposals on the
   simulator; no model) and prints p50/p95 seconds per case and per model call.
2. Fits a long conversation (N file reads of ~8 KB each) into a 60,000-token prompt budget and prints
   how long `fit_to_budget` takes and how much it keeps.

It is not a test. Usage: python benchmarks/agent_turns.py [READS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.context import estimate_tokens, fit_to_budget  # noqa: E402
from evals.run import load_cases, replay_models, run_all  # noqa: E402
from evals.transcripts import ORACLES  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402


def replay() -> None:
    cases = load_cases()
    started = time.perf_counter()
    results = run_all(cases, replay_models(ORACLES))
    wall = time.perf_counter() - started
    seconds = sorted(r.seconds for r in results)
    per_call = sorted(r.seconds / r.model_calls for r in results if r.model_calls)
    q = statistics.quantiles
    print(f"oracle replay: {len(results)} cases, {sum(r.score.passed for r in results)} passed, {wall:.1f}s wall "
          f"(template workspace included)")
    print(f"  per case: p50 {q(seconds, n=100)[49]:.2f}s  p95 {q(seconds, n=100)[94]:.2f}s  max {seconds[-1]:.2f}s")
    print(f"  per model call (tools, previews, commit, proposal): p50 {q(per_call, n=100)[49]:.3f}s  "
          f"p95 {q(per_call, n=100)[94]:.3f}s")


def budget(reads: int) -> None:
    body = "\n".join(f'{n}| resource "aws_sqs_queue" "q{n}" {{ name = "queue-{n}" }}' for n in range(160))
    messages = [{"role": "system", "content": "x" * 6000}, {"role": "user", "content": "add a queue"}]
    for n in range(reads):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{n}.tf"})}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{n}", "content": body}]
    runs = []
    for _ in range(20):
        started = time.perf_counter()
        fitted, cut = fit_to_budget(messages, 60_000)
        runs.append(time.perf_counter() - started)
    print(f"prompt budget: {reads} reads, {estimate_tokens(messages)} tokens -> {estimate_tokens(fitted)} tokens "
          f"({cut} results stubbed) in p50 {statistics.median(runs) * 1000:.1f} ms")


if __name__ == "__main__":
    configure_logging()
    budget(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
    replay()
