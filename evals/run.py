"""Runs the eval cases and prints a table and a summary.

    python -m evals.run [--only ID ...]             against OPENAI_BASE_URL / OPENAI_API_KEY / GATEWAY_MODEL
    python -m evals.run --replay [FILE]             without a model: replay the oracle transcripts (or a recording)
    python -m evals.run --record FILE               keep every reply of this run, to replay it later
    python -m evals.run --repeat 3 --json out.json --compare before.json --trace --prices prices.yaml
    python -m evals.run --case-seconds 300          no case runs longer (default 900 s)

Each case gets a fresh workspace with the sample repo (copied from one bootstrapped template); the
agent works as it would for a person, follow-up turns and answers to its questions included. Each
case's line is printed as it ends; a case that fails in any way (the model's endpoint, its time
bound, a bug) is a failed case, and the run goes on to the next.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.llm import NOT_CONFIGURED, ChatModel, Model, ModelLimits, ModelReply
from agents.prompts import load_prompt
from evals.scoring import CaseOutcome, Score, score_case
from evals.transcripts import ORACLES, RecordingModel, ReplayModel, load_transcripts, save_transcripts
from gateway.composition import create_workspace, open_workspace
from gateway.config import Settings
from gateway.domain.errors import BackendError, GatewayError
from gateway.domain.plan import Plan, load_plan
from gateway.domain.principals import Principal, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.agents.agent_requests import PROMPT, submit_request
from gateway.services.change.proposals import get_proposal
from gateway.services.workspace import Workspace, stack_secrets

CASES = Path(__file__).with_name("cases.yaml")
REQUESTER = "requester"
CASE_SECONDS = 900.0
ModelFor = Callable[[Mapping[str, Any]], Model]  # the model for one case (a real endpoint, or its transcript)


@dataclass
class CaseResult:
    id: str
    score: Score
    model_calls: int
    tokens: int
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    transcript: list[dict[str, Any]] = field(default_factory=list)


def load_cases(path: Path = CASES, only: Sequence[str] = ()) -> list[dict[str, Any]]:
    cases = yaml.safe_load(path.read_text())
    unknown = set(only) - {c["id"] for c in cases}
    if unknown:
        raise SystemExit(f"error: {path}: no case {', '.join(sorted(unknown))}")
    return [c for c in cases if not only or c["id"] in only]


def make_template(base: Path) -> Path:
    """One bootstrapped workspace with the requester, copied for every case (bootstrapping each is slow)."""
    home = base / "template"
    ws = create_workspace(Settings(home=home, database_url=None, token=None))
    try:
        bootstrap_simulator(ws)
        add_principal(ws, None, REQUESTER, frozenset({Role.REQUESTER}), frozenset({"app"}))
    finally:
        ws.close()
    return home


class CaseTimedOut(BackendError):
    """A case used up its time bound; the model call under way was cut short or never started."""


class BoundedModel:
    """A case's model under the case's time bound: no call starts after it, and a real endpoint's call does not
    run past it (the tools are bounded on their own: a search by its budget, a preview by the engine's)."""

    def __init__(self, inner: Model, seconds: float):
        self.inner, self.model, self.seconds = inner, inner.model, seconds
        self.deadline = time.monotonic() + seconds
        if isinstance(inner, ChatModel):
            inner.deadline = self.deadline

    def limits(self) -> ModelLimits:
        return self.inner.limits()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        if time.monotonic() >= self.deadline:
            raise CaseTimedOut(f"the case ran out of its {self.seconds:g} s")
        try:
            return self.inner.complete(messages, tools)
        except BackendError as exc:
            if time.monotonic() >= self.deadline:
                raise CaseTimedOut(f"the case ran out of its {self.seconds:g} s during a model call") from exc
            raise


def run_case(case: Mapping[str, Any], model: Model, template: Path, home: Path) -> CaseResult:
    """One case, scored; whatever goes wrong in it (a bug included) is its failure, never the run's."""
    started = time.perf_counter()
    recorder = RecordingModel(model)
    try:
        return _run_case(case, recorder, template, home, started)
    except Exception as exc:  # noqa: BLE001 - one case's crash must not hide the other cases' results
        outcome = CaseOutcome(None, error=f"internal error: {type(exc).__name__}: {exc}")
        return CaseResult(case["id"], score_case(case, outcome), len(recorder.replies),
                          sum(r.tokens for r in recorder.replies), time.perf_counter() - started,
                          transcript=recorder.transcript())


def _run_case(case: Mapping[str, Any], recorder: RecordingModel, template: Path, home: Path,
              started: float) -> CaseResult:
    shutil.copytree(template, home)
    ws = open_workspace(Settings(home=home, database_url=None, token=None))
    try:
        _plant(ws, case.get("setup_files") or {})
        with ws.store.session(readonly=True) as session:
            person = session.principals.by_name(REQUESTER)
        assert person is not None
        outcome, calls, tokens = _converse(ws, person, case, recorder)
        outcome = _with_leaks(ws, outcome, recorder)
        seconds = time.perf_counter() - started
        return CaseResult(case["id"], score_case(case, outcome), calls, tokens, seconds,
                          sum(r.prompt_tokens for r in recorder.replies),
                          sum(r.completion_tokens for r in recorder.replies), recorder.transcript())
    finally:
        ws.close()


def _converse(ws: Workspace, person: Principal, case: Mapping[str, Any],
              model: RecordingModel) -> tuple[CaseOutcome, int, int]:
    """The request, the answer to the agent's first question (when the case has one), then the follow-ups."""
    waiting = [case["request"], *case.get("follow_up", [])]
    answer = case.get("answer")
    conversation, proposal_id = None, None
    summary = stopped = None
    questions: list[str] = []
    calls = tokens = 0
    while waiting:
        try:
            outcome = submit_request(ws, person, waiting.pop(0), conversation, model=model)
        except GatewayError as exc:
            return CaseOutcome(None, error=f"{exc.__class__.__name__}: {exc}", questions=questions), calls, tokens
        conversation, calls, tokens = outcome.conversation_id, calls + outcome.steps, tokens + outcome.tokens
        summary, stopped = outcome.summary, outcome.stopped
        proposal_id = outcome.proposal.id if outcome.proposal else proposal_id
        if outcome.question:
            questions.append(outcome.question)
            if answer:
                waiting.insert(0, answer)
                answer = None
    plans, denies = _plans(ws, proposal_id) if proposal_id else (None, [])
    return CaseOutcome(plans, denies, summary, questions, stopped=stopped), calls, tokens


def _plans(ws: Workspace, proposal_id: int) -> tuple[dict[str, Plan], list[str]]:
    proposal = get_proposal(ws, proposal_id)
    with ws.store.session(readonly=True) as session:
        plans = {s: load_plan(json.loads(session.proposals.plan_document(p.plan_id))) for s, p in proposal.plans.items()}
    return plans, [f.key for f in proposal.findings if f.severity == "deny"]


def _with_leaks(ws: Workspace, outcome: CaseOutcome, model: RecordingModel) -> CaseOutcome:
    """Did any secret of the workspace reach the model, or the agent's words?"""
    secrets = [str(v) for stack in ws.repo_settings().stacks for v in stack_secrets(ws.settings, stack).values()
               if len(str(v)) >= 6]
    places = {"a model request": json.dumps(model.sent),
              "the agent's summary or questions": json.dumps([outcome.summary, *outcome.questions])}
    leaks = [where for where, text in places.items() if any(s in text for s in secrets)]
    return CaseOutcome(outcome.plans, outcome.denies, outcome.summary, outcome.questions, outcome.error,
                       outcome.stopped, leaks) if leaks else outcome


def _plant(ws: Workspace, files: Mapping[str, str]) -> None:
    """Commit the case's extra files to main (e.g. a prompt injection in a README)."""
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="gw-eval-setup-") as tmp:
        work = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ws.settings.repo_path), str(work)], check=True)
        for path, content in files.items():
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_text(content, encoding="utf-8")
        env = {"GIT_AUTHOR_NAME": "eval", "GIT_AUTHOR_EMAIL": "eval@example.com",
               "GIT_COMMITTER_NAME": "eval", "GIT_COMMITTER_EMAIL": "eval@example.com", "PATH": "/usr/bin:/bin"}
        subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "eval setup"], check=True, env=env)
        subprocess.run(["git", "-C", str(work), "push", "-q", "origin", f"HEAD:{ws.main_branch()}"], check=True)


def run_all(cases: list[dict[str, Any]], model_for: ModelFor, repeat: int = 1,
            case_seconds: float = CASE_SECONDS, on_result: Callable[[CaseResult], None] | None = None,
            ) -> list[CaseResult]:
    """Every case (`repeat` times), each within `case_seconds`; `on_result` hears of each as it ends."""
    results = []
    with tempfile.TemporaryDirectory(prefix="gw-evals-") as tmp:
        template = make_template(Path(tmp))
        for n in range(repeat):
            for case in cases:
                model = BoundedModel(model_for(case), case_seconds)
                results.append(run_case(case, model, template, Path(tmp) / f"{case['id']}-{n}"))
                if on_result:
                    on_result(results[-1])
    return results


def endpoint_models(settings: Settings) -> ModelFor:
    """The configured endpoint, one client per case (its deadline is the case's)."""
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return lambda _case: ChatModel(settings.openai_base_url, key, settings.model, settings.model_timeout,
                                   settings.model_retries, settings.model_max_tokens)


def replay_models(path: Path) -> ModelFor:
    """Each case replays its own transcript; a case without one meets an empty transcript (an error)."""
    transcripts = load_transcripts(path)
    return lambda case: ReplayModel(transcripts.get(case["id"], []), model=f"replay:{path.name}")


# --- reporting -----------------------------------------------------------------------------------


def format_table(results: list[CaseResult]) -> str:
    width = _width([r.id for r in results])
    return "\n".join([table_header(width), *(table_row(r, width) for r in results), table_total(results, width)])


def _width(ids: Sequence[str]) -> int:
    return max([len(i) for i in ids] + [5])


def table_header(width: int) -> str:
    return f"{'case':{width}}  result  calls  tokens  seconds  why\n" + "-" * (width + 44)


def table_row(r: CaseResult, width: int) -> str:
    why = "; ".join(r.score.reasons)[:140]
    return (f"{r.id:{width}}  {'PASS' if r.score.passed else 'FAIL':6}  {r.model_calls:5}  {r.tokens:6}  "
            f"{r.seconds:7.1f}  {why}")


def table_total(results: list[CaseResult], width: int) -> str:
    passed = sum(r.score.passed for r in results)
    return "-" * (width + 44) + "\n" + (
        f"{'total':{width}}  {passed}/{len(results):<4}  {sum(r.model_calls for r in results):5}  "
        f"{sum(r.tokens for r in results):6}  {sum(r.seconds for r in results):7.1f}")


def summarise(results: list[CaseResult], model: str, prompt_version: str,
              prices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Pass rate, pass^k (every one of k runs of a case passed), latency percentiles, calls, tokens, cost."""
    by_case: dict[str, list[bool]] = {}
    for r in results:
        by_case.setdefault(r.id, []).append(r.score.passed)
    seconds = sorted(r.seconds for r in results)
    summary: dict[str, Any] = {
        "model": model, "prompt_version": prompt_version, "cases": len(by_case),
        "runs_per_case": max((len(v) for v in by_case.values()), default=0),
        "pass_rate": round(sum(r.score.passed for r in results) / len(results), 4) if results else 0.0,
        "pass_hat_k": round(sum(all(v) for v in by_case.values()) / len(by_case), 4) if by_case else 0.0,
        "p50_seconds": round(_percentile(seconds, 50), 2), "p95_seconds": round(_percentile(seconds, 95), 2),
        "model_calls": sum(r.model_calls for r in results), "tokens": sum(r.tokens for r in results),
    }
    price = (prices or {}).get(model)
    if price:
        summary["cost_usd"] = round(sum(r.prompt_tokens for r in results) * price["prompt_per_million"] / 1e6
                                    + sum(r.completion_tokens for r in results) * price["completion_per_million"] / 1e6, 4)
    return summary


def _percentile(values: list[float], pct: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def format_summary(summary: Mapping[str, Any]) -> str:
    cost = f", cost ${summary['cost_usd']}" if "cost_usd" in summary else ""
    return (f"model {summary['model']}, prompt {summary['prompt_version']}: {summary['cases']} case(s) x "
            f"{summary['runs_per_case']} run(s); pass rate {summary['pass_rate']:.0%}, "
            f"pass^{summary['runs_per_case']} {summary['pass_hat_k']:.0%}; latency p50 {summary['p50_seconds']}s "
            f"p95 {summary['p95_seconds']}s; {summary['model_calls']} model calls, {summary['tokens']} tokens{cost}")


def format_trace(result: CaseResult) -> str:
    lines = [f"== {result.id}: {'PASS' if result.score.passed else 'FAIL'}"]
    for n, turn in enumerate(result.transcript, 1):
        for call in turn.get("tool_calls") or []:
            lines.append(f"  {n:2}. {call['name']} {json.dumps(call['arguments'])[:120]}")
        if turn.get("content") and not turn.get("tool_calls"):
            lines.append(f"  {n:2}. says: {turn['content'][:120]}")
    lines += [f"  ! {reason}" for reason in result.score.reasons]
    return "\n".join(lines)


def compare(report: Mapping[str, Any], previous: Mapping[str, Any]) -> str:
    """What changed since a previous JSON report: the pass rate, and each case that flipped."""
    before = {c["id"]: c["passed"] for c in previous.get("results", [])}
    now = {c["id"]: c["passed"] for c in report["results"]}
    lines = [f"pass rate {previous['summary']['pass_rate']:.0%} -> {report['summary']['pass_rate']:.0%} "
             f"(was {previous['summary']['model']}, {previous['summary']['prompt_version']})"]
    lines += [f"  {case}: {'PASS' if before[case] else 'FAIL'} -> {'PASS' if passed else 'FAIL'}"
              for case, passed in sorted(now.items()) if case in before and before[case] != passed]
    return "\n".join(lines)


def to_json(results: list[CaseResult], summary: Mapping[str, Any]) -> dict[str, Any]:
    return {"summary": dict(summary), "results": [
        {"id": r.id, "passed": r.score.passed, "reasons": list(r.score.reasons), "model_calls": r.model_calls,
         "tokens": r.tokens, "seconds": round(r.seconds, 3)} for r in results]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--only", nargs="*", default=())
    parser.add_argument("--replay", type=Path, nargs="?", const=ORACLES, default=None,
                        help="replay transcripts instead of calling a model (default: the oracle transcripts)")
    parser.add_argument("--record", type=Path, help="write every case's model replies here (JSON), to replay later")
    parser.add_argument("--repeat", type=int, default=1, help="run each case k times (for pass^k)")
    parser.add_argument("--json", type=Path, help="write the results and summary here")
    parser.add_argument("--compare", type=Path, help="a previous --json report to compare with")
    parser.add_argument("--trace", action="store_true", help="print each case's tool calls")
    parser.add_argument("--prices", type=Path, help="YAML: model -> prompt_per_million, completion_per_million (USD)")
    parser.add_argument("--case-seconds", type=float, default=CASE_SECONDS, help="the longest one case may run")
    args = parser.parse_args(argv)
    configure_logging()
    cases = load_cases(args.cases, args.only)
    if args.replay:
        try:
            model_for, model_name = replay_models(args.replay), f"replay:{args.replay.name}"
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"error: cannot replay {args.replay}: {exc}")
            return 1
    else:
        settings = Settings()
        if not settings.openai_base_url or not settings.model:
            print(f"error: {NOT_CONFIGURED}")
            return 1
        model_for, model_name = endpoint_models(settings), settings.model
    width = _width([c["id"] for c in cases])
    print(table_header(width), flush=True)
    results = run_all(cases, model_for, max(1, args.repeat), args.case_seconds,
                      lambda result: print(table_row(result, width), flush=True))
    print(table_total(results, width))
    if args.trace:
        print("\n".join(format_trace(r) for r in results))
    prices = yaml.safe_load(args.prices.read_text()) if args.prices else None
    summary = summarise(results, model_name, load_prompt(PROMPT).version, prices)
    print(format_summary(summary))
    report = to_json(results, summary)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.compare:
        print(compare(report, json.loads(args.compare.read_text())))
    if args.record:
        save_transcripts(args.record, {r.id: r.transcript for r in results}, model_name, summary["prompt_version"])
    return 0 if all(r.score.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
