"""The agent asks instead of guessing, keeps nothing it lost, and cannot finish broken work.

The real graph and `openai` client against the scripted model server, on real git repos.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from agents.llm import ChatModel
from agents.tools import PreviewReport, RepoTools, explains_cannot_be_met
from gateway.api.app import create_app
from gateway.domain.claims import check_claim
from gateway.domain.errors import BackendError, Conflict
from gateway.domain.plan import load_plan
from gateway.domain.policy import Finding, Severity
from gateway.services.agents.agent_requests import submit_request
from gateway.services.agents.agent_runs import start_agent_run
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, run_cli, sign_in_client
from .fakes import SAMPLE_REPO
from .model_stub import ModelStub, say, tool_call

QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'
QUESTION = "Which retention period do you want for the refunds queue: 4 days (the default) or 14 days?"
OPEN_BUCKET = 'resource "aws_s3_bucket" "exports" {\n  bucket = "orders-exports-staging"\n  tags   = local.tags\n}\n'


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as server:
        yield server


def model(stub: ModelStub) -> ChatModel:
    return ChatModel(stub.base_url, "test-key", "stub-model")


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def answer_then_build(body: dict[str, Any]) -> dict[str, Any]:
    """The script's next move once it has read the person's answer."""
    assert body["messages"][-1] == {"role": "user", "content": "14 days please"}
    return tool_call("write_file", path="stacks/app-staging/queue.tf",
                     content=QUEUE.replace("  tags", "  message_retention_seconds = 1209600\n  tags"))


def asked_then_answered() -> list[Any]:
    return [tool_call("ask_user", question=QUESTION),
            answer_then_build, tool_call("run_preview", stack="app-staging"),
            tool_call("finish", summary="Added aws_sqs_queue.refunds keeping messages for 14 days.")]


def test_a_question_reaches_the_person_and_the_answer_resumes_the_same_conversation(
        workspace: Workspace, people: People, stub: ModelStub) -> None:
    stub.turns = asked_then_answered()
    asked = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    assert asked.question == QUESTION and asked.proposal is None and asked.stopped is None
    with workspace.store.session() as session:
        [waiting] = [e for e in session.audit.events() if e.kind == "agent.request"]
    assert waiting.payload["waiting_for_answer"] == QUESTION  # the waiting state is in the trail

    answered = submit_request(workspace, people.alice, "14 days please", asked.conversation_id, model=model(stub))
    assert answered.proposal is not None and answered.opened and answered.question is None
    history = [m for m in stub.requests[-1]["messages"] if m["role"] in ("user", "assistant")]
    assert {"role": "assistant", "content": f"[ask_user] {QUESTION}"} in history  # it remembers what it asked
    assert [m["content"] for m in history if m["role"] == "user"] == ["Add a refunds queue in staging", "14 days please"]
    queue = workspace.repo.read_file(answered.proposal.head_sha, "stacks/app-staging/queue.tf")
    assert "message_retention_seconds = 1209600" in queue


def test_words_without_a_tool_call_are_a_question_not_thrown_away(workspace: Workspace, people: People,
                                                                  stub: ModelStub) -> None:
    stub.turns = [say("  Do you mean the staging or the production queue?  ")]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue", model=model(stub))
    assert outcome.question == "Do you mean the staging or the production queue?"
    assert outcome.stopped is None and outcome.proposal is None


def test_the_question_and_answer_in_cli_chat(workspace: Workspace, people: People, stub: ModelStub) -> None:
    stub.turns = asked_then_answered()
    result = run_cli(["chat"], workspace.settings.home, token=people.tokens["alice"],
                     stdin="Add a refunds queue in staging\n14 days please\n\n",
                     OPENAI_BASE_URL=stub.base_url, OPENAI_API_KEY="k", GATEWAY_MODEL="stub-model")
    assert result.returncode == 0, result.stderr
    assert f"agent asks: {QUESTION}" in result.stdout
    assert "proposal 1 opened by gateway-agent for alice" in result.stdout  # opened by the answer, not "updated"


def _follow(client: TestClient, run: dict[str, Any], token: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not run["finished"] and time.monotonic() < deadline:
        time.sleep(0.2)
        run = client.get(f"/api/v1/requests/{run['id']}", headers={"Authorization": f"Bearer {token}"}).json()
    return run


def test_the_question_in_the_api_and_on_the_request_page(workspace: Workspace, people: People,
                                                          stub: ModelStub) -> None:
    stub.turns = asked_then_answered()
    workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub-model"
    token = people.tokens["alice"]
    with TestClient(create_app(workspace.settings, workers=1)) as client:  # its job loop runs the turns
        created = client.post("/api/v1/requests", json={"text": "Add a refunds queue in staging"},
                              headers={"Authorization": f"Bearer {token}"})
        run = _follow(client, created.json(), token)
        assert (run["status"], run["question"], run["proposal_id"]) == ("waiting", QUESTION, None)

        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text).group(1)  # type: ignore[union-attr]
        client.post("/login", data={"token": token, "csrf": csrf}, follow_redirects=False)
        page = client.get(f"/requests/{run['id']}").text
        assert QUESTION in page and f'name="conversation" value="{run["conversation_id"]}"' in page

        answered = client.post("/api/v1/requests", json={"text": "14 days please",
                                                         "conversation_id": run["conversation_id"]},
                               headers={"Authorization": f"Bearer {token}"})
        done = _follow(client, answered.json(), token)
    assert done["status"] == "done" and done["proposal_id"] == 1 and done["question"] is None


def test_after_a_stopped_turn_a_follow_up_goes_on_from_its_kept_edits_and_opens_the_right_proposal(
        workspace: Workspace, people: People, stub: ModelStub) -> None:
    workspace.settings.agent_max_steps = 2
    told: list[str] = []

    def go_on(body: dict[str, Any]) -> dict[str, Any]:
        told.append(body["messages"][-2]["content"])
        return tool_call("run_preview", stack="app-staging")

    stub.turns = [tool_call("write_file", path="stacks/app-staging/q.tf", content=QUEUE),
                  tool_call("list_files", path="stacks"),
                  go_on, tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    stopped = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    assert stopped.stopped and stopped.proposal is None
    workspace.settings.agent_max_steps = 20
    follow_up = submit_request(workspace, people.alice, "go on", stopped.conversation_id, model=model(stub))
    assert told == ["[gateway] Your uncommitted edits from the previous turn are still in the working copy: "
                    "stacks/app-staging/q.tf. Go on from them (preview before you finish)."]
    assert follow_up.proposal is not None and follow_up.proposal.changed_paths == ("stacks/app-staging/q.tf",)
    assert follow_up.proposal.plans["app-staging"].counts == {"create": 1}
    stub.turns = [tool_call("finish", summary="That is all.")]
    submit_request(workspace, people.alice, "anything else?", stopped.conversation_id, model=model(stub))
    assert not any(m["content"].startswith("[gateway]") for m in stub.requests[-1]["messages"])  # spent notes go
    assert not any(r.startswith("refs/gateway/wip/") for r in workspace.repo.repo.git.for_each_ref(
        "--format=%(refname)").splitlines())  # committed: nothing is kept any more


def test_edits_before_a_question_are_kept_for_the_answer(workspace: Workspace, people: People,
                                                         stub: ModelStub) -> None:
    stub.turns = [tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("ask_user", question=QUESTION),
                  tool_call("patch_file", path="stacks/app-staging/queue.tf", old="  tags",
                            new="  message_retention_seconds = 1209600\n  tags"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds keeping messages 14 days."),  # unpreviewed
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds keeping messages 14 days.")]
    asked = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    answered = submit_request(workspace, people.alice, "14 days please", asked.conversation_id, model=model(stub))
    assert answered.proposal is not None and answered.proposal.plans["app-staging"].counts == {"create": 1}
    queue = workspace.repo.read_file(answered.proposal.head_sha, "stacks/app-staging/queue.tf")
    assert queue == QUEUE.replace("  tags", "  message_retention_seconds = 1209600\n  tags")


def test_finish_is_refused_until_every_touched_stack_is_previewed_clean(workspace: Workspace, people: People,
                                                                       stub: ModelStub) -> None:
    stub.turns = [
        tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
        tool_call("finish", summary="Added a queue."),  # never previewed
        tool_call("write_file", path="stacks/app-staging/exports.tf", content=OPEN_BUCKET),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Added an exports bucket; I cannot see a problem."),  # denied, not explained
        tool_call("write_file", path="stacks/app-staging/broken.tf", content='resource "aws_sqs_queue" "x" {\n'),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Added a queue and a bucket; it cannot be done without a policy deny."),  # error
        tool_call("write_file", path="stacks/app-staging/broken.tf", content=""),
        tool_call("run_preview", stack="app-staging"),
        tool_call("finish", summary="Added the queue and an encrypted exports bucket; it cannot meet the "
                                    "s3-public-access-block policy as asked (the request wants it public)."),
    ]
    outcome = submit_request(workspace, people.alice, "Add a queue and a public exports bucket", model=model(stub))
    results = tool_results(stub.requests[-1])
    assert results[1] == ("refused: cannot finish yet: stack app-staging changed since its last preview: "
                          "call run_preview for app-staging")
    assert results[4].startswith("refused: cannot finish yet: the last preview of stack app-staging has policy denies")
    assert "s3-public-access-block aws_s3_bucket.exports" in results[4]
    assert results[7].startswith("refused: cannot finish yet: the last preview of stack app-staging failed")
    assert outcome.summary is not None and outcome.summary.startswith("Added the queue")  # the explained finish
    assert outcome.proposal is not None  # the deny is explained, shown to the approver, and blocks approval
    assert "s3-public-access-block" in [f.rule for f in outcome.proposal.findings if f.severity == "deny"]
    assert outcome.claim_issues[0].startswith('the agent claims encryption ("encrypted"), but the plan has policy deny')


@pytest.mark.parametrize(("summary", "explains"), [
    # claims of success that merely mention a policy: the deny stays a blocker
    ("Added bucket b, encrypted; it no longer violates the public-access policy.", False),
    ("Added the bucket; public access is not allowed, so it is blocked.", False),
    ("Added the bucket; nothing here is forbidden or against the policy.", False),
    ("Added an exports bucket; I cannot see a problem.", False),
    ("The deny is from the s3-public-access-block policy.", False),
    ("I cannot make this change.", False),  # refused, but not why
    # a refusal that says why
    ("I cannot make this change: SSH from anywhere is denied by the open-ingress policy.", True),
    ("Added the bucket. It is not encrypted and cannot meet the policy as asked.", True),
    ("A public bucket is denied by policy, so the request cannot be met.", True),
    ("The request is refused because policies/ is a protected path.", True),
    ("This is not possible without a deny: the agent policy forbids IAM changes.", True),
])
def test_only_a_refusal_with_its_reason_explains_a_remaining_deny(summary: str, explains: bool) -> None:
    assert explains_cannot_be_met(summary) is explains


def test_finish_over_a_deny_is_refused_when_the_summary_claims_the_policy_is_met(tmp_path: Path) -> None:
    (tmp_path / "stacks" / "app").mkdir(parents=True)
    tools = RepoTools(tmp_path, (), lambda stack, root: PreviewReport("1 deny", denies=("public-bucket aws_s3_bucket.b",)),
                      {"app": "stacks/app"})
    tools.call("write_file", json.dumps({"path": "stacks/app/b.tf", "content": 'resource "aws_s3_bucket" "b" {}'}))
    tools.call("run_preview", json.dumps({"stack": "app"}))
    claimed = tools.call("finish", json.dumps({"summary": "Added bucket b; it no longer violates the public-access "
                                                          "policy."}))
    assert claimed.startswith("refused: cannot finish yet: the last preview of stack app has policy denies")
    assert tools.summary is None  # nothing committed over the deny
    refused = "I cannot make this change: a public bucket is denied by the public-bucket policy."
    assert not tools.call("finish", json.dumps({"summary": refused})).startswith("refused")
    assert tools.summary == refused


def test_edits_come_back_as_a_diff_and_reads_with_line_numbers(tmp_path: Path) -> None:
    """The agent's file tools on a copy of the sample repo, as a turn calls them (the turn itself, through the model
    and the graph, is the cases around this one)."""
    shutil.copytree(SAMPLE_REPO, tmp_path / "repo")
    tools = RepoTools(tmp_path / "repo", (), lambda stack, root: PreviewReport("not asked"))
    calls = [("read_file", {"path": "stacks/app-staging/main.tf", "start_line": 2, "end_line": 3}),
             ("patch_file", {"path": "stacks/app-staging/main.tf", "old": '"t3.small"', "new": '"t3.medium"'}),
             ("patch_file", {"path": "stacks/app-staging/main.tf", "old": "2| ", "new": ""}),
             ("read_file", {"path": "stacks/app-staging/main.tf", "start_line": 9999, "end_line": None})]
    results = [tools.call(name, json.dumps(arguments)) for name, arguments in calls]
    main = (SAMPLE_REPO / "stacks/app-staging/main.tf").read_text().splitlines()
    assert results[0] == f"2| {main[1]}\n3| {main[2]}"
    assert results[1].startswith("patched stacks/app-staging/main.tf\n--- a/stacks/app-staging/main.tf\n")
    diff = results[1].splitlines()
    assert any(line.startswith("-") and "t3.small" in line for line in diff)
    assert any(line.startswith("+") and "t3.medium" in line for line in diff)
    assert results[2].startswith("refused: `old` occurs 0 times") and "without the line numbers" in results[2]
    assert results[3].startswith("refused: stacks/app-staging/main.tf has") and "past its end" in results[3]


DENIES = [Finding("encryption-at-rest", Severity.DENY, "aws_s3_bucket.exports", "no encryption", "app-staging"),
          Finding("s3-public-access-block", Severity.DENY, "aws_s3_bucket.exports", "no block", "app-staging"),
          Finding("required-tags", Severity.DENY, "aws_s3_bucket.exports", "missing owner", "app-staging")]
BUCKET_PLAN = load_plan({"format_version": "1.2", "resource_changes": [
    {"address": "aws_s3_bucket.exports", "type": "aws_s3_bucket", "name": "exports",
     "change": {"actions": ["create"], "before": None, "after": {"bucket": "exports"}}}]})


@pytest.mark.parametrize(("summary", "denies", "flagged"), [
    ("Added an encrypted bucket with public access blocked, tagged as required.", DENIES,
     ["encryption", "public access", "tags"]),
    ("Added the exports bucket; deletion protection is on and it passes all policies.", DENIES,
     ["policy compliance"]),
    ("Added an encrypted bucket with public access blocked, tagged as required.", [], []),
    ("Added the bucket. It is not encrypted and cannot meet the policy as asked.", DENIES[:1], []),
])
def test_false_security_claims_are_flagged_against_the_findings(summary: str, denies: list[Finding],
                                                                 flagged: list[str]) -> None:
    issues = check_claim(summary, [BUCKET_PLAN], denies)
    assert [i.split(" (")[0].removeprefix("the agent claims ") for i in issues] == flagged
    if flagged:
        assert "but the plan has policy deny finding(s): " in issues[0]


def test_a_second_turn_while_one_runs_is_refused_clearly(workspace: Workspace, people: People,
                                                         stub: ModelStub) -> None:
    stub.turns = [tool_call("ask_user", question=QUESTION)]
    first = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    release, working = threading.Event(), threading.Event()

    def slow(body: dict[str, Any]) -> dict[str, Any]:
        working.set()
        release.wait(60)
        return tool_call("finish", summary="Nothing to change after all.")

    stub.turns = [slow]
    answer = threading.Thread(target=submit_request, args=(workspace, people.alice, "14 days", first.conversation_id),
                              kwargs={"model": model(stub)})
    answer.start()
    try:
        assert working.wait(60)
        with pytest.raises(Conflict, match=f"conversation {first.conversation_id} is busy: the agent is still working"):
            submit_request(workspace, people.alice, "actually 7 days", first.conversation_id, model=model(stub))
        workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub-model"
        with TestClient(create_app(workspace.settings, workers=0)) as client:
            busy = client.post("/api/v1/requests", json={"text": "7 days", "conversation_id": first.conversation_id},
                               headers={"Authorization": f"Bearer {people.tokens['alice']}"})
        assert busy.status_code == 409 and "is busy" in busy.json()["detail"]
    finally:
        release.set()
        answer.join(60)
    stub.turns = [tool_call("finish", summary="Kept it as it is.")]
    later = submit_request(workspace, people.alice, "never mind", first.conversation_id, model=model(stub))
    assert later.summary == "Kept it as it is."  # the turn let go of the conversation when it ended


def test_an_oversized_context_is_trimmed_not_failed(workspace: Workspace, people: People, stub: ModelStub) -> None:
    workspace.settings.agent_prompt_budget = 2500
    read = tool_call("read_file", path="stacks/app-staging/main.tf")
    stub.turns = [read, read, read, read, read,
                  tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    assert outcome.proposal is not None and outcome.stopped is None
    sizes = [len(json.dumps(body["messages"])) // 4 for body in stub.requests]
    assert max(sizes) <= 2500, sizes
    last = tool_results(stub.requests[-1])
    assert last[0].startswith("[an earlier result of read_file") and "removed to fit the prompt budget" in last[0]
    assert "aws_sqs_queue.refunds" in last[-1]  # the newest result, the preview, is whole
    with workspace.store.session() as session:
        trimmed = [e.payload["trimmed_messages"] for e in session.audit.events() if e.kind == "agent.model_call"]
    assert trimmed[0] == 0 and max(trimmed) >= 3


def test_the_prompt_carries_this_repos_conventions(workspace: Workspace, people: People, clone: Clone,
                                                   stub: ModelStub) -> None:
    clone.branch("main").edit("gateway.yaml", "required_tags: [owner, cost-centre]",
                              "required_tags: [owner, cost-centre, team]").push("tag every resource with its team")
    stub.turns = [tool_call("finish", summary="Nothing needed.")]
    submit_request(workspace, people.alice, "Anything", model=model(stub))
    system = stub.requests[0]["messages"][0]["content"]
    assert "the tags `owner`, `cost-centre`, `team`" in system
    assert "app-staging (`stacks/app-staging/`)" in system and "aws_vpc.main (network)" in system
    assert "Approved instance types: db.r6g.large, db.t4g.medium, t3.large, t3.medium, t3.small." in system
    assert "$" not in system  # every convention filled in
    assert all(t["function"]["strict"] and t["function"]["parameters"]["additionalProperties"] is False
               and all(p.get("description") for p in t["function"]["parameters"]["properties"].values())
               for t in stub.requests[0]["tools"])


def test_a_failing_model_endpoint_is_retried_then_reported(workspace: Workspace, people: People,
                                                           stub: ModelStub) -> None:
    stub.turns = [{"status": 503}, tool_call("finish", summary="Nothing needed.")]
    outcome = submit_request(workspace, people.alice, "Anything", model=ChatModel(stub.base_url, "k", "m", 30, 2))
    assert outcome.summary == "Nothing needed." and len(stub.requests) == 2
    stub.turns = [{"status": 503}, {"status": 503}]
    with pytest.raises(BackendError, match="the model endpoint failed: InternalServerError"):
        submit_request(workspace, people.alice, "Anything", model=ChatModel(stub.base_url, "k", "m", 30, 1))


def test_earlier_turns_are_compacted_to_request_summary_and_files(workspace: Workspace, people: People,
                                                                   stub: ModelStub) -> None:
    stub.turns = [tool_call("read_file", path="stacks/app-staging/main.tf"),
                  tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds."),
                  tool_call("finish", summary="Nothing else to do.")]
    first = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    submit_request(workspace, people.alice, "is that all?", first.conversation_id, model=model(stub))
    sent = stub.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == "[finish] Added aws_sqs_queue.refunds. (files edited: stacks/app-staging/queue.tf)"
    assert "orders-web" not in json.dumps(sent)  # the old file read is not carried into the next turn


def test_denies_already_on_main_in_a_stack_it_only_looked_at_do_not_block_finish(
        workspace: Workspace, people: People, clone: Clone, stub: ModelStub) -> None:
    clone.branch("main").write("stacks/app-prod/exports.tf", OPEN_BUCKET).push("an open bucket, before the agent")
    stub.turns = [tool_call("run_preview", stack="app-prod"),
                  tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model(stub))
    assert "policy deny finding(s)" in tool_results(stub.requests[1])[0]  # it saw app-prod's denies
    assert outcome.summary == "Added aws_sqs_queue.refunds." and outcome.proposal is not None


def test_a_conversation_is_held_by_one_turn_and_a_lapsed_hold_is_taken_over(any_workspace: Workspace) -> None:
    """On SQLite and PostgreSQL (migration 13)."""
    ws, alice = any_workspace, add_people(any_workspace).alice
    later = datetime.now(UTC) + timedelta(minutes=10)
    with ws.store.session() as session:
        session.conversations.add("c1", alice, "agent/c1")
        assert session.conversations.hold("c1", "turn-a", later)
        assert not session.conversations.hold("c1", "turn-b", later)  # a second turn
        assert session.conversations.busy("c1")
        assert session.conversations.renew("c1", "turn-a", later + timedelta(minutes=5))  # the holder, still working
        assert session.conversations.release("c1", "turn-a")  # let go
        assert not session.conversations.busy("c1") and session.conversations.hold("c1", "turn-b", later)
        session.conversations.renew("c1", "turn-b", datetime.now(UTC) - timedelta(seconds=1))  # a crashed turn's hold
        assert not session.conversations.busy("c1") and session.conversations.hold("c1", "turn-c", later)


def test_a_turn_whose_hold_lapsed_can_neither_take_it_back_nor_free_the_new_holder(any_workspace: Workspace) -> None:
    """On SQLite and PostgreSQL: the hold has an owner, so two turns never run at once after a lapse."""
    ws, alice = any_workspace, add_people(any_workspace).alice
    later = datetime.now(UTC) + timedelta(minutes=10)
    with ws.store.session() as session:
        session.conversations.add("c1", alice, "agent/c1")
        assert session.conversations.hold("c1", "turn-a", datetime.now(UTC) - timedelta(seconds=1))  # A, lapsed
        assert session.conversations.hold("c1", "turn-b", later)  # B takes over, as designed
        assert not session.conversations.renew("c1", "turn-a", later)  # A's next call cannot take it back
        assert not session.conversations.release("c1", "turn-a")  # and A's end leaves B's hold alone
        assert session.conversations.busy("c1")
        assert not session.conversations.hold("c1", "turn-c", later)  # so C waits for B
        assert session.conversations.get("c1").running_turn == "turn-b"


def test_a_turn_that_lost_its_hold_stops_before_its_next_model_call(any_workspace: Workspace, stub: ModelStub) -> None:
    """Turn A's model call outlasts its hold and turn B takes the conversation over: A stops, commits nothing,
    keeps no work, says why in the trail, and B's hold survives A's end (SQLite and PostgreSQL)."""
    ws, alice = any_workspace, add_people(any_workspace).alice
    ws.settings.agent_turn_hold_seconds = 0.2
    with ws.store.session() as session:
        session.conversations.add("c1", alice, "agent/c1")

    def slow_then_taken_over(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.4)  # A's hold lapses during this model call
        with ws.store.session() as session:
            assert session.conversations.hold("c1", "turn-b", datetime.now(UTC) + timedelta(minutes=10))
        return tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE)

    stub.turns = [slow_then_taken_over, tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    outcome = submit_request(ws, alice, "Add a refunds queue in staging", "c1", model=model(stub))
    assert len(stub.requests) == 1  # no model call after the hold was lost
    assert outcome.stopped is not None and "another turn took it over" in outcome.stopped
    assert outcome.proposal is None and outcome.summary is None
    assert not ws.repo.branch_exists("agent/c1")  # nothing committed or pushed for A
    with ws.store.session(readonly=True) as session:
        assert session.conversations.busy("c1")  # B still holds it
        assert session.conversations.get("c1").running_turn == "turn-b"
        [recorded] = [e for e in session.audit.events() if e.kind == "agent.request"]
    assert recorded.payload["stopped"] == outcome.stopped


def test_after_a_failed_turn_the_follow_up_is_told_its_edits_were_discarded(workspace: Workspace, people: People,
                                                                            stub: ModelStub) -> None:
    told: list[str] = []

    def redo(body: dict[str, Any]) -> dict[str, Any]:
        told.append(json.dumps(body["messages"]))
        return tool_call("write_file", path="stacks/app-staging/q.tf", content=QUEUE)

    stub.turns = [tool_call("ask_user", question="Which name?"),
                  tool_call("write_file", path="stacks/app-staging/q.tf", content=QUEUE), {"status": 503},
                  redo, tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    first = submit_request(workspace, people.alice, "Add a refunds queue", model=model(stub))
    with pytest.raises(BackendError):
        submit_request(workspace, people.alice, "refunds-staging", first.conversation_id,
                       model=ChatModel(stub.base_url, "k", "m", 30, 0))
    again = submit_request(workspace, people.alice, "try again", first.conversation_id, model=model(stub))
    assert "its edits to stacks/app-staging/q.tf were discarded" in told[0]
    assert again.proposal is not None and again.proposal.changed_paths == ("stacks/app-staging/q.tf",)


def test_a_file_it_created_can_be_deleted_and_nothing_is_proposed(workspace: Workspace, people: People,
                                                                   stub: ModelStub) -> None:
    stub.turns = [tool_call("write_file", path="stacks/app-staging/site.tf", content=OPEN_BUCKET),
                  tool_call("delete_file", path="gateway.yaml"),
                  tool_call("delete_file", path="stacks/app-staging/site.tf"),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="I cannot do this: a public bucket is denied by policy.")]
    outcome = submit_request(workspace, people.alice, "Add a public bucket", model=model(stub))
    results = tool_results(stub.requests[-1])
    assert results[1].startswith("refused: gateway.yaml is a protected path")
    assert results[2].startswith("deleted stacks/app-staging/site.tf\n--- a/stacks/app-staging/site.tf")
    assert outcome.proposal is None and outcome.stopped == (
        "the agent's edits left every file as it was: nothing to propose")


# --- a turn whose process died --------------------------------------------------------------------


def _serve(ws: Workspace, stub: ModelStub, port: int) -> subprocess.Popen[bytes]:
    """`gateway serve` in a process of its own (its job loop runs the turns), as an operator starts it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OPENAI_"))}
    env.update({"GATEWAY_HOME": str(ws.settings.home), "GATEWAY_LOCK_TTL_SECONDS": "1.5",
                "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k", "GATEWAY_MODEL": "stub-model"})
    if ws.settings.database_url:
        env["GATEWAY_DATABASE_URL"] = ws.settings.database_url
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _until(what: str, probe: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = probe()
        except httpx.TransportError:  # the server is still starting
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in time")


def test_a_turn_whose_process_was_killed_ends_interrupted_and_the_person_asks_again(
        any_workspace: Workspace, stub: ModelStub) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    bearer = {"Authorization": f"Bearer {people.tokens['alice']}"}
    working, release = threading.Event(), threading.Event()

    def hangs(body: dict[str, Any]) -> dict[str, Any]:  # the model is slow: the turn is mid-flight
        working.set()
        release.wait(120)
        return say("(too late)")

    stub.turns = [hangs]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    process = _serve(ws, stub, port)
    try:
        _until("the server", lambda: httpx.get(f"{base}/api/v1/health").status_code == 200)
        run = httpx.post(f"{base}/api/v1/requests", json={"text": "Add a refunds queue in staging"},
                         headers=bearer, timeout=60).json()  # a loaded machine: the server's first request is slow
        assert working.wait(60), run
        assert httpx.get(f"{base}/api/v1/requests/{run['id']}", headers=bearer, timeout=60).json()["status"] == \
            "running"
        process.send_signal(signal.SIGKILL)  # the API process dies mid-turn
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
        release.set()

    stub.turns = [tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds; nothing is destroyed.")]
    settings = ws.settings.model_copy(update={"lock_ttl_seconds": 1.5, "openai_base_url": stub.base_url,
                                              "model": "stub-model"})
    with TestClient(create_app(settings, workers=1)) as client:  # a surviving process: its worker recovers
        ended = _until("the run to end", lambda: (r := client.get(f"/api/v1/requests/{run['id']}", headers=bearer)
                                                  .json())["status"] not in ("queued", "running") and r)
        assert ended["status"] == "interrupted", ended
        assert "stopped before the agent finished" in ended["message"] and "Ask again" in ended["message"]

        sign_in_client(client, people.tokens["alice"])
        page = client.get(f"/requests/{run['id']}").text
        assert 'http-equiv="refresh"' not in page  # it stopped refreshing
        assert "interrupted" in page and 'id="ask-again"' in page

        again = client.post("/api/v1/requests", headers=bearer,
                            json={"text": "Add a refunds queue in staging", "conversation_id": run["conversation_id"]})
        assert again.status_code == 202, again.text  # the conversation is free at once, not after its hold lapses
        done = _until("the new turn", lambda: (r := client.get(f"/api/v1/requests/{again.json()['id']}",
                                                               headers=bearer).json())["finished"] and r)
    assert done["status"] == "done" and done["proposal_id"] is not None, done
    with ws.store.session(readonly=True) as session:
        kinds = [e.kind for e in session.audit.events()]
    assert "job.interrupted" in kinds and "agent.interrupted" in kinds


def test_a_second_message_while_the_first_waits_for_a_worker_is_refused(workspace: Workspace, people: People,
                                                                        stub: ModelStub) -> None:
    workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub-model"
    first = start_agent_run(workspace, people.alice, "Add a refunds queue in staging")  # no worker runs yet
    assert first.status == "queued" and not first.finished and first.conversation_id
    with pytest.raises(Conflict, match=f"conversation {first.conversation_id} is busy"):
        start_agent_run(workspace, people.alice, "14 days please", first.conversation_id)
