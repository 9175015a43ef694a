"""What the agent sends a model server and what it makes of every answer a real server can give.

The real `openai` client and the real graph against the scripted server (tests/model_stub.py), which can
send what the real one (tests/test_agent_real_server.py) cannot be made to: `choices: []`, a 503, a delay.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from agents.llm import ChatModel
from agents.tools import TOOL_SCHEMAS, RepoTools
from gateway.domain.errors import BackendError, GatewayError
from gateway.services.agents.agent_requests import model_from_settings, submit_request
from gateway.services.workspace import Workspace

from .conftest import People, run_cli
from .model_stub import ModelStub, context_exceeded, say, tool_call

QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'
HALF_A_QUESTION = "Which retention period do you want for the refunds queue: 4 days (the default), or"
TOOLS = sorted(t["function"]["name"] for t in TOOL_SCHEMAS)


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as server:
        yield server


def configure(ws: Workspace, stub: ModelStub, **settings: Any) -> ChatModel:
    """The workspace's model is the stub, with these GATEWAY_* settings; the model the gateway builds from them."""
    ws.settings.openai_base_url, ws.settings.model, ws.settings.openai_api_key = (
        stub.base_url, "stub-model", SecretStr("k"))
    for name, value in settings.items():
        setattr(ws.settings, name, value)
    return model_from_settings(ws)


def sent_tokens(body: dict[str, Any]) -> int:
    """What a request carries, estimated as the gateway does (four characters a token): messages and tools."""
    return (len(json.dumps(body["messages"])) + len(json.dumps(body.get("tools") or []))) // 4


def reading_then_queue() -> list[Any]:
    read = tool_call("read_file", path="stacks/app-staging/main.tf")
    return [read, read, read, read, read,
            tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
            tool_call("run_preview", stack="app-staging"),
            tool_call("finish", summary="Added aws_sqs_queue.refunds.")]


def requests_recorded(ws: Workspace) -> list[dict[str, Any]]:
    with ws.store.session(readonly=True) as session:
        return [dict(e.payload) for e in session.audit.events() if e.kind == "agent.request"]


# --- what is sent ----------------------------------------------------------------------------------


def test_every_completion_offers_the_tools_explicitly_and_bounds_the_reply(workspace: Workspace, people: People,
                                                                          stub: ModelStub) -> None:
    stub.turns = reading_then_queue()
    model = configure(workspace, stub, model_max_tokens=512)
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model)
    assert outcome.proposal is not None and len(stub.requests) == 8
    for body in stub.requests:  # a server that reads a missing tool_choice as "none" would hide the tools
        assert body["tool_choice"] == "auto" and body["max_tokens"] == 512
        assert sorted(t["function"]["name"] for t in body["tools"]) == TOOLS
        assert "max_completion_tokens" not in body  # servers ignore it silently


def test_an_api_that_refuses_max_tokens_by_name_gets_max_completion_tokens(workspace: Workspace, people: People,
                                                                          stub: ModelStub) -> None:
    stub.turns = [{"status": 400, "error": {  # as OpenAI answers for its reasoning models
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                   "'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens",
        "code": "unsupported_parameter"}},
        tool_call("read_file", path="stacks/app-staging/main.tf"), tool_call("finish", summary="Nothing needed.")]
    model = configure(workspace, stub, model_max_tokens=700)
    outcome = submit_request(workspace, people.alice, "Is staging tagged?", model=model)
    assert outcome.summary == "Nothing needed."
    assert [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in stub.requests] == [
        (700, None), (None, 700), (None, 700)]


def test_the_prompt_budget_counts_the_tool_schemas_too(workspace: Workspace, people: People, stub: ModelStub) -> None:
    stub.turns = reading_then_queue()
    model = configure(workspace, stub, agent_prompt_budget=3500)
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model)
    assert outcome.proposal is not None
    sizes = [sent_tokens(body) for body in stub.requests]
    assert max(sizes) <= 3500, sizes  # the tool schemas alone are about 1,300 tokens of it


@pytest.mark.parametrize("where", ["vllm", "llama.cpp"])
def test_the_servers_own_context_limit_is_asked_and_kept(workspace: Workspace, people: People, stub: ModelStub,
                                                          where: str) -> None:
    if where == "vllm":  # vLLM: /v1/models says max_model_len
        stub.models = {"object": "list", "data": [{"id": "stub-model", "object": "model", "max_model_len": 4500}]}
    else:  # llama.cpp's server: /props says the context it was started with
        stub.props = {"default_generation_settings": {"n_ctx": 4500}}
    stub.turns = reading_then_queue()
    model = configure(workspace, stub, model_max_tokens=1000)  # prompt budget left at its default, 60,000
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model)
    assert outcome.proposal is not None
    sizes = [sent_tokens(body) for body in stub.requests]
    assert max(sizes) <= 4500 - 1000, sizes  # room left for the reply


def test_context_length_exceeded_is_trimmed_and_retried_once(workspace: Workspace, people: People,
                                                             stub: ModelStub) -> None:
    read = tool_call("read_file", path="stacks/app-staging/main.tf")
    stub.turns = [read, read, read, read, context_exceeded(4000), read,
                  tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    model = configure(workspace, stub, model_max_tokens=500)
    outcome = submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model)
    assert outcome.proposal is not None and outcome.stopped is None
    refused, retried = stub.requests[4], stub.requests[5]
    assert sent_tokens(retried) < sent_tokens(refused) and sent_tokens(retried) <= 4000 - 500
    assert all(sent_tokens(body) <= 3500 for body in stub.requests[5:])  # the limit it said is kept for the turn
    with workspace.store.session(readonly=True) as session:
        calls = [e.payload for e in session.audit.events() if e.kind == "agent.model_call"]
    assert calls[4]["trimmed_messages"] > 0

    stub.turns = [read, context_exceeded(4000), context_exceeded(4000)]  # still too long: said, not looped
    with pytest.raises(BackendError, match="it is longer than the model's context"):
        submit_request(workspace, people.alice, "Read main.tf", model=configure(workspace, stub, model_max_tokens=500,
                                                                                  agent_prompt_budget=60_000))
    assert len(stub.requests) == 9 + 3
    assert requests_recorded(workspace)[-1]["failed"].startswith("the model endpoint refused the request")


# --- one deadline ----------------------------------------------------------------------------------


def test_one_deadline_bounds_the_whole_call_retries_included(workspace: Workspace, people: People,
                                                             stub: ModelStub) -> None:
    stub.turns = [{"delay": 30} for _ in range(8)]  # a server that never answers in time
    model = configure(workspace, stub, model_timeout=2.0, model_retries=3)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"the model endpoint did not answer within GATEWAY_MODEL_TIMEOUT \(2 s\)"):
        submit_request(workspace, people.alice, "Add a refunds queue", model=model)
    assert time.monotonic() - started < 4  # per attempt it was 4 x 2 s and the backoff between

    stub.turns = [{"status": 503} for _ in range(30)]  # answers at once, always failing: retried until the deadline
    model = configure(workspace, stub, model_timeout=2.0, model_retries=10)
    started = time.monotonic()
    with pytest.raises(BackendError, match="the model endpoint failed: InternalServerError"):
        submit_request(workspace, people.alice, "Add a refunds queue", model=model)
    assert time.monotonic() - started < 4


# --- every answer a server can give ------------------------------------------------------------------


def test_a_reply_cut_off_by_the_token_limit_is_not_a_question(workspace: Workspace, people: People,
                                                              stub: ModelStub) -> None:
    stub.turns = [{"content": HALF_A_QUESTION, "finish_reason": "length"}]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert outcome.question is None and outcome.proposal is None
    assert outcome.stopped == ("the model's reply was cut off at the token limit (GATEWAY_MODEL_MAX_TOKENS=4096) "
                               "before it said what to do: nothing was done with it; raise the limit, or ask for "
                               "smaller steps")
    assert requests_recorded(workspace)[-1]["waiting_for_answer"] is None

    cut_call = {"raw": completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "write_file", "arguments": '{"path": "stacks/app-staging/queue.tf", "content": "res'}}]},
        "length")}
    stub.turns = [cut_call]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert outcome.stopped is not None and "cut off at the token limit" in outcome.stopped
    assert outcome.changed_files == []  # the half-written call was not run


def test_the_command_never_shows_a_cut_off_reply_as_a_question(workspace: Workspace, people: People,
                                                              stub: ModelStub) -> None:
    stub.turns = [{"content": HALF_A_QUESTION, "finish_reason": "length"}]
    result = run_cli(["request", "Add a refunds queue"], workspace.settings.home, token=people.tokens["alice"],
                     OPENAI_BASE_URL=stub.base_url, OPENAI_API_KEY="k", GATEWAY_MODEL="stub-model",
                     GATEWAY_MODEL_MAX_TOKENS="300")
    assert result.returncode == 0, result.stderr
    assert "agent asks" not in result.stdout
    assert "stopped: the model's reply was cut off at the token limit (GATEWAY_MODEL_MAX_TOKENS=300)" in result.stdout


def completion(message: dict[str, Any], finish_reason: str | None = "stop", **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "stub-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}], **extra}


@pytest.mark.parametrize(("body", "said"), [
    ({"id": "x", "object": "chat.completion", "choices": []}, "the model endpoint sent no choices"),
    ({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}, "choices.0.message: Field required"),
    ({"error": "overloaded"}, "choices: Field required"),
    ("<html>502 Bad Gateway</html>", "the model endpoint's answer is not JSON"),
    (completion({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                       "function": {"arguments": "{}"}}]}),
     "choices.0.message.tool_calls.0.function.name: Field required"),
    (completion({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                      "function": {"name": "finish", "arguments": 42}}]}),
     "choices.0.message.tool_calls.0.function.arguments"),
])
def test_a_reply_of_an_unexpected_shape_is_a_recorded_error_not_a_crash(workspace: Workspace, people: People,
                                                                        stub: ModelStub, body: Any, said: str) -> None:
    stub.turns = [{"raw": body}]
    with pytest.raises(BackendError) as raised:
        submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert str(raised.value).startswith("the model endpoint's reply cannot be used: ") and said in str(raised.value)
    [recorded] = requests_recorded(workspace)
    assert recorded["request"] == "Add a refunds queue" and recorded["failed"] == str(raised.value)


def test_tool_arguments_sent_as_an_object_are_taken_as_the_call(workspace: Workspace, people: People,
                                                                stub: ModelStub) -> None:
    def as_object(name: str, **arguments: Any) -> dict[str, Any]:
        return {"raw": completion({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}]},
            "tool_calls")}

    stub.turns = [as_object("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  as_object("run_preview", stack="app-staging"),
                  as_object("finish", summary="Added aws_sqs_queue.refunds.")]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert outcome.proposal is not None and outcome.changed_files == ["stacks/app-staging/queue.tf"]
    assert stub.requests[1]["messages"][-1]["content"].startswith("created stacks/app-staging/queue.tf")


def test_a_reply_without_usage_still_counts_against_the_token_bound(workspace: Workspace, people: People,
                                                                    stub: ModelStub) -> None:
    read = {"raw": completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "read_file", "arguments": '{"path": "stacks/app-staging/main.tf"}'}}]}, "tool_calls")}
    stub.turns = [read for _ in range(20)]
    model = configure(workspace, stub, agent_max_tokens=5000)
    outcome = submit_request(workspace, people.alice, "Read staging", model=model)
    assert outcome.stopped is not None and outcome.stopped.startswith("token bound reached")
    assert outcome.tokens >= 5000 and outcome.steps < 20


def test_the_command_reports_an_empty_reply_in_one_line(workspace: Workspace, people: People, stub: ModelStub) -> None:
    stub.turns = [{"raw": {"id": "x", "object": "chat.completion", "choices": []}}]
    result = run_cli(["request", "Add a refunds queue"], workspace.settings.home, token=people.tokens["alice"],
                     OPENAI_BASE_URL=stub.base_url, OPENAI_API_KEY="k", GATEWAY_MODEL="stub-model")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the model endpoint's reply cannot be used: the model endpoint sent no choices")


# --- what is recorded ----------------------------------------------------------------------------------


def test_a_failed_turn_still_records_its_request_in_the_changes_story(workspace: Workspace, people: People,
                                                                      stub: ModelStub) -> None:
    stub.turns = [tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                  tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.refunds.")]
    first = submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert first.proposal is not None
    stub.turns = [tool_call("read_file", path="stacks/app-staging/queue.tf"), {"status": 503}]
    with pytest.raises(BackendError, match="the model endpoint failed: InternalServerError"):
        submit_request(workspace, people.alice, "Keep messages for 14 days", first.conversation_id,
                       model=configure(workspace, stub, model_retries=0))
    failed = requests_recorded(workspace)[-1]
    assert failed["request"] == "Keep messages for 14 days" and failed["steps"] == 1 and failed["tokens"] == 100
    assert failed["failed"].startswith("the model endpoint failed: InternalServerError")
    story = run_cli(["audit", "show", str(first.proposal.id)], workspace.settings.home, token=people.tokens["dana"])
    assert story.returncode == 0, story.stderr
    assert "Keep messages for 14 days" in story.stdout


def test_writing_or_deleting_an_empty_file_says_what_happened(tmp_path: Path) -> None:
    tools = RepoTools(tmp_path, (), lambda _stack, _root: None)  # type: ignore[arg-type,return-value]
    created = tools.call("write_file", json.dumps({"path": "stacks/app/.keep", "content": ""}))
    assert created == "created stacks/app/.keep (0 characters)\n(an empty file)"
    assert tools.call("write_file", json.dumps({"path": "stacks/app/.keep", "content": ""})) == (
        "wrote stacks/app/.keep (0 characters)\n(no change: the file already had this content)")
    assert tools.call("delete_file", json.dumps({"path": "stacks/app/.keep"})) == (
        "deleted stacks/app/.keep\n(it was empty)")
    assert not (tmp_path / "stacks/app/.keep").exists()


def test_a_model_that_says_nothing_ends_the_turn_clearly(workspace: Workspace, people: People,
                                                         stub: ModelStub) -> None:
    stub.turns = [say("")]
    outcome = submit_request(workspace, people.alice, "Add a refunds queue", model=configure(workspace, stub))
    assert outcome.stopped == "the model stopped without calling finish" and outcome.question is None


def test_an_unconfigured_limit_is_refused_by_name(workspace: Workspace) -> None:
    with pytest.raises(GatewayError, match="model_max_tokens"):
        type(workspace.settings)(model_max_tokens=0)
