"""The eval runner scores right and wrong answers correctly, end to end against the model stub."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evals.run import load_cases
from evals.scoring import score_case
from gateway.domain.plan import load_plan

from .model_stub import ModelStub, tool_call

ROOT = Path(__file__).resolve().parent.parent
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'


def test_there_are_at_least_forty_cases_from_easy_to_hard() -> None:
    cases = load_cases()
    assert len(cases) >= 40 and len({c["id"] for c in cases}) == len(cases)
    assert any(len({e["stack"] for e in c.get("expect", [])}) > 1 for c in cases)  # multi-stack
    assert any(any("previous_address" in e for e in c.get("expect", [])) for c in cases)  # renames via moved


def test_the_runner_scores_a_right_and_a_wrong_answer() -> None:
    turns = [  # cases run in file order
        # staging-instance-type: wrong size
        tool_call("patch_file", path="stacks/app-staging/main.tf", old='"t3.small"', new='"t3.large"'),
        tool_call("finish", summary="Resized the staging web instance."),
        # staging-queue: right
        tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
        tool_call("finish", summary="Added the refunds-staging queue."),
    ]
    with ModelStub(turns) as stub:
        env = {**os.environ, "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k", "GATEWAY_MODEL": "stub-model"}
        result = subprocess.run([sys.executable, "-m", "evals.run", "--only", "staging-queue", "staging-instance-type"],
                                capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr  # one case failed
    row = {line.split()[0]: line for line in lines if line.startswith("staging-")}
    assert row["staging-queue"].split()[1] == "PASS"
    assert row["staging-instance-type"].split()[1] == "FAIL"
    assert "instance_type = 't3.large', expected 't3.medium'" in row["staging-instance-type"]
    total = next(line for line in lines if line.startswith("total"))
    assert total.split()[1] == "1/2" and int(total.split()[2]) == 4  # four model calls in all


def test_unexpected_deletes_and_policy_denies_fail_a_case() -> None:
    plan = load_plan({"format_version": "1.2", "resource_changes": [
        {"address": "aws_sqs_queue.q", "type": "aws_sqs_queue", "name": "q",
         "change": {"actions": ["create"], "before": None, "after": {"name": "refunds-staging"}}},
        {"address": "aws_lb.web", "type": "aws_lb", "name": "web", "change": {"actions": ["delete"], "before": {}, "after": None}},
    ]})
    case = {"expect": [{"stack": "app-staging", "type": "aws_sqs_queue", "actions": ["create"],
                        "attributes": {"name": "refunds-staging"}}]}
    score = score_case(case, {"app-staging": plan}, ["app-staging:required-tags:aws_sqs_queue.q"])
    assert not score.passed
    assert score.reasons == ("unexpected delete or replace of aws_lb.web",
                             "policy denies app-staging:required-tags:aws_sqs_queue.q")
    assert score_case({"expect_no_change": True}, None, []).passed
