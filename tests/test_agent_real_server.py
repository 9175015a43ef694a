"""The agent against a real OpenAI-compatible server: llama-cpp-python's, with Gemma 3 270M, on loopback.

These tests check the protocol and the outcomes, not the 270M model's quality: the tools offered on every call
(and read by the server), `max_tokens` sent and honoured, one deadline held, a cut-off reply never shown as a
question, a refusal for length trimmed and retried once, never a traceback, nothing secret sent. What a real
server cannot be made to send (`choices: []`, a 503) is in tests/test_agent_protocol.py, against the stub.
They skip, saying so, where the server is not installed (tools/install_model_server.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.context import estimate_tokens
from agents.llm import ChatModel
from agents.tools import TOOL_SCHEMAS
from gateway.domain.errors import ContextTooLong, Unavailable
from gateway.services.agents.agent_requests import submit_request
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import People, add_people, make_workspace, run_cli
from .model_server import (
    NOT_INSTALLED,
    ROOT,
    SMALL,
    SMALL_CONTEXT,
    TEMPLATE,
    TOOLS,
    LlamaServers,
    RecordingProxy,
    installed,
)

pytestmark = pytest.mark.skipif(not installed(), reason=NOT_INSTALLED)
TOOL_NAMES = sorted(t["function"]["name"] for t in TOOL_SCHEMAS)
TIMEOUT = 600  # generous: on a loaded machine a call can take minutes; the deadline has its own test below
LONG_ANSWER = "Explain in detail, in at least five long paragraphs, what each stack of this repository is for."


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServers]:
    running = LlamaServers(tmp_path_factory.mktemp("llama"))
    yield running
    running.close()


@pytest.fixture
def record(servers: LlamaServers) -> Iterator[Callable[[str], RecordingProxy]]:
    """A recording proxy in front of the server of one model name."""
    with ExitStack() as stack:
        yield lambda alias: stack.enter_context(RecordingProxy(servers.url(alias)))


def outcomes(stdout: str, stderr: str) -> list[str]:
    """The lines by which `gateway request` says how a turn ended."""
    said = [line for line in stdout.splitlines() + stderr.splitlines()
            if line.startswith(("stopped: ", "agent asks: ", "agent: ", "error: ")) or " opened by " in line]
    return said


def assert_protocol(requests: list[dict[str, Any]], max_tokens: int) -> None:
    assert requests, "no completion reached the server"
    for body in requests:  # the tools offered, explicitly, and the reply bounded, on every call
        assert body["tool_choice"] == "auto" and body["max_tokens"] == max_tokens
        assert sorted(t["function"]["name"] for t in body["tools"]) == TOOL_NAMES


def test_the_server_reads_the_tools_because_tool_choice_is_sent(record: Callable[[str], RecordingProxy]) -> None:
    proxy = record(TOOLS)
    messages = [{"role": "system", "content": "You change infrastructure declarations."},
                {"role": "user", "content": "List the files of the repository."}]
    bare = httpx.post(f"{proxy.url}/chat/completions", timeout=300, json={
        "model": TOOLS, "messages": messages, "tools": TOOL_SCHEMAS, "max_tokens": 16}).json()
    model = ChatModel(proxy.url, "k", TOOLS, timeout=300, max_tokens=16)
    model.complete(messages, TOOL_SCHEMAS)
    with_auto = proxy.answers()[-1]
    # without tool_choice this server leaves the tools out of the prompt: the model could never call one
    offered = with_auto["usage"]["prompt_tokens"] - bare["usage"]["prompt_tokens"]
    assert offered > 500, (bare["usage"], with_auto["usage"])
    assert estimate_tokens([], TOOL_SCHEMAS) >= offered  # the prompt budget counts them on the safe side

    templated = record(TEMPLATE)
    model = ChatModel(templated.url, "k", TEMPLATE, timeout=300, max_tokens=16)
    model.complete(messages, [])
    model.complete(messages, TOOL_SCHEMAS)
    without, with_tools = templated.answers()
    assert with_tools["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"] > 500


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_gateway_request_against_the_real_server(record: Callable[[str], RecordingProxy], tmp_path: Path,
                                                 database: str, request: pytest.FixtureRequest) -> None:
    proxy = record(TOOLS)
    url = None if database == "sqlite" else str(request.getfixturevalue("postgres_url"))
    ws = make_workspace(tmp_path / "home", url)
    try:
        people = add_people(ws)
        secret = stack_secrets(ws.settings, "data")["db_password"]
        started = time.monotonic()
        result = run_cli(["request", f"Call list_files, then read_file, then add an SQS queue named refunds to "
                                     f"stacks/app-staging; the reports password is {secret}"], ws.settings.home,
                         token=people.tokens["alice"], database_url=url, timeout=1800, OPENAI_BASE_URL=proxy.url,
                         OPENAI_API_KEY="k", GATEWAY_MODEL=TOOLS, GATEWAY_MODEL_MAX_TOKENS="96",
                         GATEWAY_MODEL_TIMEOUT=str(TIMEOUT), GATEWAY_AGENT_MAX_STEPS="3")
        seconds = time.monotonic() - started
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr
        ended = outcomes(result.stdout, result.stderr)
        assert len(ended) == 1, result.stdout + result.stderr  # one clear ending
        requests = proxy.requests()
        assert_protocol(requests, 96)
        assert proxy.answers()[0]["choices"][0]["message"]["tool_calls"]  # a real tool call: the turn went on
        assert 2 <= len(requests) <= 3 * 2  # three steps, each at most once more for a refusal for length
        assert seconds < TIMEOUT * len(requests) + 60
        assert not any(secret in json.dumps(body) for body in proxy.sent)  # nothing secret sent
        last = proxy.answers()[-1]
        if isinstance(last, dict) and last.get("choices") and last["choices"][0]["finish_reason"] == "length":
            assert ended[0].startswith("stopped: the model's reply was cut off at the token limit")
        with ws.store.session(readonly=True) as session:
            [turn] = [e.payload for e in session.audit.events() if e.kind == "agent.request"]
        assert turn["model"] == TOOLS and turn["steps"] >= 1
    finally:
        ws.close()


def test_a_reply_cut_off_by_the_real_server_is_not_a_question(record: Callable[[str], RecordingProxy],
                                                              workspace: Workspace, people: People) -> None:
    proxy = record(TEMPLATE)
    model = ChatModel(proxy.url, "k", TEMPLATE, timeout=300, max_tokens=8)
    outcome = submit_request(workspace, people.alice, LONG_ANSWER, model=model)
    [answer] = proxy.answers()
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] <= 8
    assert outcome.question is None and outcome.proposal is None
    assert outcome.stopped is not None and outcome.stopped.startswith(
        "the model's reply was cut off at the token limit (GATEWAY_MODEL_MAX_TOKENS=8)")


def test_one_deadline_holds_against_the_real_server(record: Callable[[str], RecordingProxy]) -> None:
    proxy = record(TEMPLATE)  # the server goes on with the abandoned request: no later test uses this one
    model = ChatModel(proxy.url, "k", TEMPLATE, timeout=1.0, retries=3, max_tokens=160)
    messages = [{"role": "system", "content": f"Session {uuid.uuid4().hex}: nothing of this is cached."},
                {"role": "user", "content": LONG_ANSWER}]
    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"did not answer within GATEWAY_MODEL_TIMEOUT \(1 s\)"):
        model.complete(messages, TOOL_SCHEMAS)
    assert time.monotonic() - started < 2.0
    assert len(proxy.requests()) == 1  # no retry piled up on a server still working on the first


def test_a_request_longer_than_the_servers_context_is_trimmed_once_then_reported(
        record: Callable[[str], RecordingProxy], workspace: Workspace, people: People) -> None:
    proxy = record(SMALL)
    model = ChatModel(proxy.url, "k", SMALL, timeout=300, max_tokens=64)
    with pytest.raises(ContextTooLong, match=f"longer than the model's context \\({SMALL_CONTEXT} tokens\\), even "
                                             "trimmed to about"):
        submit_request(workspace, people.alice, "Add a refunds queue in staging", model=model)
    assert model.limits().context == SMALL_CONTEXT  # learnt from the server's refusal
    refused = proxy.answers()
    assert len(refused) == 2 and all(a["error"]["code"] == "context_length_exceeded" for a in refused)
    with workspace.store.session(readonly=True) as session:
        [turn] = [e.payload for e in session.audit.events() if e.kind == "agent.request"]
    assert turn["failed"].startswith("the model endpoint refused the request: it is longer than the model's context")


def test_evals_against_the_real_server_print_each_case_and_finish(record: Callable[[str], RecordingProxy]) -> None:
    proxy = record(TOOLS)
    env = {"OPENAI_BASE_URL": proxy.url, "OPENAI_API_KEY": "k", "GATEWAY_MODEL": TOOLS,
           "GATEWAY_MODEL_MAX_TOKENS": "96", "GATEWAY_MODEL_TIMEOUT": "120", "GATEWAY_AGENT_MAX_STEPS": "2"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "evals.run", "--only", "staging-queue", "staging-instance-type",
                          "--case-seconds", "60"], capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**_environment(), **env})
    assert "Traceback" not in run.stderr and run.returncode in (0, 1), run.stderr[-3000:]
    rows = [line.split()[0] for line in run.stdout.splitlines() if line.startswith("staging-")]
    assert rows == ["staging-instance-type", "staging-queue"], run.stdout
    assert any(line.startswith("total") for line in run.stdout.splitlines())
    assert f"model {TOOLS}, prompt agent-system-v" in run.stdout
    assert time.monotonic() - started < 2 * 60 + 120  # each case within its bound, and the workspace's making
    assert_protocol(proxy.requests(), 96)


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
