"""Runs the eval cases against the configured OpenAI-compatible endpoint and prints a table.

    python -m evals.run [--cases evals/cases.yaml] [--only ID ...]

Each case gets a fresh workspace with the sample repo; the agent works as it would for a person.
Not part of the test run: it needs a model.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents.llm import NOT_CONFIGURED, ChatModel
from evals.scoring import Score, score_case
from gateway.config import Settings
from gateway.domain.errors import GatewayError
from gateway.domain.plan import Plan, load_plan
from gateway.domain.principals import Role
from gateway.services.agent_requests import model_from_settings, submit_request
from gateway.services.bootstrap import bootstrap_simulator
from gateway.services.users import add_principal
from gateway.services.workspace import create_workspace

CASES = Path(__file__).with_name("cases.yaml")


@dataclass
class CaseResult:
    id: str
    score: Score
    model_calls: int
    tokens: int
    seconds: float


def load_cases(path: Path = CASES, only: Sequence[str] = ()) -> list[dict[str, Any]]:
    cases = yaml.safe_load(path.read_text())
    return [c for c in cases if not only or c["id"] in only]


def run_case(case: dict[str, Any], model_factory: Callable[[Any], ChatModel], base: Path) -> CaseResult:
    started = time.perf_counter()
    ws = create_workspace(Settings(home=base / case["id"], database_url=None, token=None))
    try:
        bootstrap_simulator(ws)
        person, _ = add_principal(ws, None, "requester", frozenset({Role.REQUESTER}), frozenset({"app"}))
        calls = tokens = 0
        try:
            outcome = submit_request(ws, person, case["request"], model=model_factory(ws))
            calls, tokens = outcome.steps, outcome.tokens
            plans, denies = _plans(ws, outcome.proposal) if outcome.proposal else (None, [])
        except GatewayError as exc:
            if case.get("expect_no_change"):
                plans, denies = None, []
            else:
                return CaseResult(case["id"], Score(False, (f"error: {exc}",)), calls, tokens,
                                  time.perf_counter() - started)
        return CaseResult(case["id"], score_case(case, plans, denies), calls, tokens, time.perf_counter() - started)
    finally:
        ws.close()


def _plans(ws: Any, proposal: Any) -> tuple[dict[str, Plan], list[str]]:
    with ws.store.session() as session:
        plans = {s: load_plan(json.loads(session.plan_document(p.plan_id))) for s, p in proposal.plans.items()}
    return plans, [f.key for f in proposal.findings if f.severity == "deny"]


def run_all(cases: list[dict[str, Any]], model_factory: Callable[[Any], ChatModel]) -> list[CaseResult]:
    with tempfile.TemporaryDirectory(prefix="gw-evals-") as tmp:
        return [run_case(case, model_factory, Path(tmp)) for case in cases]


def format_table(results: list[CaseResult]) -> str:
    width = max([len(r.id) for r in results] + [4])
    lines = [f"{'case':{width}}  result  calls  tokens  seconds  why", "-" * (width + 44)]
    for r in results:
        why = "; ".join(r.score.reasons)[:100]
        lines.append(f"{r.id:{width}}  {'PASS' if r.score.passed else 'FAIL':6}  {r.model_calls:5}  {r.tokens:6}  "
                     f"{r.seconds:7.1f}  {why}")
    passed = sum(r.score.passed for r in results)
    lines.append("-" * (width + 44))
    lines.append(f"{'total':{width}}  {passed}/{len(results):<4}  {sum(r.model_calls for r in results):5}  "
                 f"{sum(r.tokens for r in results):6}  {sum(r.seconds for r in results):7.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--only", nargs="*", default=())
    args = parser.parse_args(argv)
    settings = Settings()
    if not settings.openai_base_url or not settings.model:
        print(f"error: {NOT_CONFIGURED}")
        return 1
    results = run_all(load_cases(args.cases, args.only), model_from_settings)
    print(format_table(results))
    return 0 if all(r.score.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
