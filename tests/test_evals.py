"""The evals mean something: strict scoring, every case passable from its oracle transcript, a do-nothing
agent scoring nothing, and any run recorded and replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from agents.llm import ModelLimits, ModelReply
from evals.run import CaseResult, format_summary, load_cases, run_all, summarise
from evals.scoring import CaseOutcome, Score, score_case
from evals.transcripts import ORACLES, load_transcripts
from gateway.domain.plan import load_plan

from .model_stub import ModelStub, Turn, tool_call

ROOT = Path(__file__).resolve().parent.parent
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'


def evals(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evals.run", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, timeout=600)


def test_there_are_cases_from_easy_to_hard_each_with_an_oracle() -> None:
    cases = load_cases()
    assert len(cases) >= 50 and len({c["id"] for c in cases}) == len(cases)
    assert any(len({e["stack"] for e in c.get("expect", [])}) > 1 for c in cases)  # multi-stack
    assert any(any("previous_address" in e for e in c.get("expect", [])) for c in cases)  # renames via moved
    assert {"follow_up", "expect_question", "setup_files"} <= {k for c in cases for k in c}
    assert all(c.get("explain") for c in cases if c.get("expect_no_change"))  # a refusal must say why
    assert set(load_transcripts(ORACLES)) == {c["id"] for c in cases}


def test_every_case_passes_from_its_oracle_transcript_without_a_model(tmp_path: Path) -> None:
    result = evals("--replay", "--json", str(tmp_path / "report.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["pass_rate"] == 1.0 and report["summary"]["cases"] == len(load_cases())
    assert "pass rate 100%" in result.stdout and "p95" in result.stdout


class DoNothing:
    """The trivial agent: says it is done at once."""
    model = "do-nothing"

    def limits(self) -> ModelLimits:
        return ModelLimits()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        call = {"id": "call_1", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "Done."}'}}
        return ModelReply({"role": "assistant", "content": "", "tool_calls": [call]}, 10)


def test_an_agent_that_does_nothing_scores_zero() -> None:
    cases = load_cases()
    results = run_all(cases, lambda _case: DoNothing())
    passed = [r.id for r in results if r.score.passed]
    assert passed == []  # change cases: no proposal; refusals: "Done." gives no reason
    change = next(r for r in results if r.id == "staging-queue")
    assert change.score.reasons == ("no proposal was opened",)
    refusal = next(r for r in results if r.id == "backups-off")
    assert refusal.score.reasons[0].startswith("the explanation does not give the reason")


class Broken:
    """A model whose client has a bug: anything but a GatewayError."""
    model = "broken"

    def limits(self) -> ModelLimits:
        return ModelLimits()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        raise RuntimeError("a bug in the client")


def test_a_case_that_crashes_is_a_failed_case_and_the_run_goes_on() -> None:
    cases = load_cases(only=["staging-instance-type", "staging-queue"])
    results = run_all(cases, lambda case: Broken() if case["id"] == "staging-instance-type" else DoNothing())
    assert [r.id for r in results] == ["staging-instance-type", "staging-queue"]
    assert results[0].score.reasons == ("error: internal error: RuntimeError: a bug in the client",)
    assert results[1].score.reasons == ("no proposal was opened",)  # the next case ran, and was scored


def test_each_case_is_printed_as_it_ends_and_none_runs_past_its_bound(tmp_path: Path) -> None:
    first_row_seen = threading.Event()
    printed_in_time: list[bool] = []

    def after_the_first_row(body: dict[str, Any]) -> dict[str, Any]:
        printed_in_time.append(first_row_seen.wait(30))  # the second case waits until the first one's line is out
        return tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE)

    turns: list[Turn] = [{"delay": 60},  # staging-instance-type: the server never answers
                         after_the_first_row, tool_call("run_preview", stack="app-staging"),
                         tool_call("finish", summary="Added the refunds-staging queue.")]
    with ModelStub(turns) as stub:
        env = {**os.environ, "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k", "GATEWAY_MODEL": "stub-model",
               "GATEWAY_MODEL_TIMEOUT": "120"}
        run = subprocess.Popen([sys.executable, "-m", "evals.run", "--only", "staging-queue", "staging-instance-type",
                                "--case-seconds", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=ROOT)
        assert run.stdout is not None
        lines = []
        for line in run.stdout:
            lines.append(line)
            if line.startswith("staging-instance-type"):
                first_row_seen.set()
        assert run.wait(120) == 1, "".join(lines) + run.stderr.read()  # type: ignore[union-attr]
    assert printed_in_time == [True]
    row = {line.split()[0]: line for line in lines if line.startswith("staging-")}
    assert row["staging-instance-type"].split()[1] == "FAIL" and row["staging-queue"].split()[1] == "PASS"
    assert "error: CaseTimedOut: the case ran out of its 4 s during a model call" in row["staging-instance-type"]
    assert float(row["staging-instance-type"].split()[4]) < 8


def test_a_run_against_a_model_is_recorded_and_replays_the_same(tmp_path: Path) -> None:
    turns = [  # cases run in file order
        # staging-instance-type: wrong size
        tool_call("patch_file", path="stacks/app-staging/main.tf", old='"t3.small"', new='"t3.large"'),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Resized the staging web instance."),
        # staging-queue: right
        tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Added the refunds-staging queue."),
    ]
    record = tmp_path / "run.json"
    with ModelStub(turns) as stub:
        live = evals("--only", "staging-queue", "staging-instance-type", "--record", str(record),
                     "--json", str(tmp_path / "live.json"),
                     env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k", "GATEWAY_MODEL": "stub-model"})
    assert live.returncode == 1, live.stdout + live.stderr  # one case failed
    row = {line.split()[0]: line for line in live.stdout.splitlines() if line.startswith("staging-")}
    assert row["staging-queue"].split()[1] == "PASS"
    assert row["staging-instance-type"].split()[1] == "FAIL"
    assert "instance_type = 't3.large', expected 't3.medium'" in row["staging-instance-type"]
    total = next(line for line in live.stdout.splitlines() if line.startswith("total"))
    assert total.split()[1] == "1/2" and int(total.split()[2]) == 6  # six model calls in all
    assert "model stub-model, prompt agent-system-v" in live.stdout and "600 tokens" in live.stdout

    replayed = evals("--only", "staging-queue", "staging-instance-type", "--replay", str(record), "--trace",
                     "--compare", str(tmp_path / "live.json"))
    assert replayed.returncode == 1
    again = {line.split()[0]: line.split()[1] for line in replayed.stdout.splitlines() if line.startswith("staging-")}
    assert again == {"staging-queue": "PASS", "staging-instance-type": "FAIL"}
    assert '  1. patch_file {"path": "stacks/app-staging/main.tf", "old": "\\"t3.small\\"", "new": "\\"t3.large\\""}' \
        in replayed.stdout
    assert "pass rate 50% -> 50%" in replayed.stdout


QUEUE_PLAN = {"address": "aws_sqs_queue.q", "type": "aws_sqs_queue", "name": "q",
              "change": {"actions": ["create"], "before": None, "after": {"name": "refunds-staging"}}}
QUEUE_CASE = {"expect": [{"stack": "app-staging", "type": "aws_sqs_queue", "actions": ["create"],
                          "attributes": {"name": "refunds-staging"}}]}


def plan(*changes: dict[str, Any]) -> Any:
    return load_plan({"format_version": "1.2", "resource_changes": list(changes)})


def test_anything_beyond_the_allow_list_fails_a_case() -> None:
    deleted = {"address": "aws_lb.web", "type": "aws_lb", "name": "web",
               "change": {"actions": ["delete"], "before": {}, "after": None}}
    score = score_case(QUEUE_CASE, CaseOutcome({"app-staging": plan(QUEUE_PLAN, deleted)},
                                               ["app-staging:required-tags:aws_sqs_queue.q"]))
    assert score.reasons == ("unexpected change: app-staging aws_lb.web delete",
                             "unexpected delete or replace of aws_lb.web",
                             "policy denies app-staging:required-tags:aws_sqs_queue.q")
    resize = {"address": "aws_instance.web[0]", "type": "aws_instance", "name": "web",
              "change": {"actions": ["update"], "before": {"instance_type": "t3.small", "tags": {"a": "1"}},
                         "after": {"instance_type": "t3.medium", "tags": {"a": "1", "sneaky": "yes"}},
                         "after_unknown": {}}}
    case = {"expect": [{"stack": "app-staging", "address": "aws_instance.web[0]", "actions": ["update"],
                        "attributes": {"instance_type": "t3.medium"}}]}
    assert score_case(case, CaseOutcome({"app-staging": plan(resize)})).reasons == (
        "unexpected attribute change on aws_instance.web[0]: tags.sneaky",)


def test_errors_silence_and_unexplained_refusals_never_pass() -> None:
    refusal = {"expect_no_change": True, "explain": "polic"}
    assert score_case(refusal, CaseOutcome(None, error="BackendError: the model endpoint failed")).reasons == (
        "error: BackendError: the model endpoint failed",)
    assert score_case(refusal, CaseOutcome(None, summary="")).reasons == ("refused without saying why",)
    assert score_case(refusal, CaseOutcome(None, summary="The open-ingress policy denies it.")).passed
    asked = {**QUEUE_CASE, "expect_question": True}
    assert "the request needs a question to the person, and none was asked" in score_case(
        asked, CaseOutcome({"app-staging": plan(QUEUE_PLAN)})).reasons
    assert score_case(QUEUE_CASE, CaseOutcome({"app-staging": plan(QUEUE_PLAN)}, leaks=["a model request"])).reasons == (
        "a secret reached a model request",)


def test_the_summary_counts_pass_hat_k_latency_and_cost() -> None:
    def result(case: str, passed: bool, seconds: float) -> CaseResult:
        return CaseResult(case, Score(passed, ()), 3, 1000, seconds, prompt_tokens=900, completion_tokens=100)

    runs = [result("a", True, 1.0), result("b", True, 2.0), result("a", True, 3.0), result("b", False, 4.0)]
    summary = summarise(runs, "m1", "agent-system-v2", {"m1": {"prompt_per_million": 2.0, "completion_per_million": 8.0}})
    assert (summary["pass_rate"], summary["pass_hat_k"], summary["runs_per_case"]) == (0.75, 0.5, 2)
    assert summary["p50_seconds"] == 2.5 and summary["p95_seconds"] == 3.85
    assert summary["cost_usd"] == round((3600 * 2.0 + 400 * 8.0) / 1e6, 4)
    assert "pass^2 50%" in format_summary(summary)


def test_a_malformed_transcript_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"staging-queue": [{"tool_calls": "finish"}]}))
    result = evals("--replay", str(bad), "--only", "staging-queue")
    assert result.returncode == 1 and result.stdout.strip() == (
        f"error: cannot replay {bad}: {bad}: case staging-queue, turn 1: tool_calls must be a list of "
        "{name, arguments}")
    assert evals("--replay", str(tmp_path / "none.json")).stdout.startswith("error: cannot replay")
