"""An OpenAI-compatible model server in a thread that plays scripted turns, tool calls included.

The real `openai` client and the real graph talk to it over HTTP; every request body is kept,
so tests can scan what was sent to the model. A turn may also script what a real server can send
that a well-behaved one would not: a failure status with its error body, a delay, a finish reason,
or a raw body (`choices: []`, arguments as an object, not JSON at all).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def tool_calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def say(text: str) -> dict[str, Any]:
    return {"content": text}


def context_exceeded(limit: int) -> dict[str, Any]:
    """The 400 OpenAI, vLLM and llama-cpp-python send for a prompt longer than the model's context."""
    return {"status": 400, "error": {
        "message": f"This model's maximum context length is {limit} tokens. However, you requested {limit + 900} "
                   "tokens. Please reduce the length of the messages or completion.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a scripted delay must not hold the test's teardown

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client gave up on a delayed answer: that is what the test wanted


class ModelStub:
    def __init__(self, turns: Sequence[Turn] | None = None, tokens_per_turn: int = 100):
        self.turns: list[Turn] = list(turns or [])
        self.requests: list[dict[str, Any]] = []
        self.tokens_per_turn = tokens_per_turn
        # GET answers: /v1/models as vLLM or llama.cpp say it, /props as llama.cpp's server does (None: 404)
        self.models: dict[str, Any] = {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}
        self.props: dict[str, Any] | None = None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.endswith("/models"):
                    self._send(200, json.dumps(stub.models).encode())
                elif self.path.endswith("/props") and stub.props is not None:
                    self._send(200, json.dumps(stub.props).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                if not self.path.endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                status, data = stub._answer(body)
                self._send(status, data)

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ModelStub:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, body: dict[str, Any]) -> tuple[int, bytes]:
        turn = self.turns.pop(0) if self.turns else say("(the script has no more turns)")
        if callable(turn):
            turn = turn(body)
        time.sleep(float(turn.get("delay", 0)))
        if "raw" in turn:  # exactly these bytes (or this JSON), whatever they are
            raw = turn["raw"]
            return 200, raw.encode() if isinstance(raw, str) else json.dumps(raw).encode()
        if "status" in turn:
            error = turn.get("error") or {"message": f"scripted {turn['status']}"}
            return int(turn["status"]), json.dumps({"error": error}).encode()
        return 200, json.dumps(self._completion(body, turn)).encode()

    def _completion(self, body: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
        if turn.get("tool_calls"):
            message["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in turn["tool_calls"]]
        finish = turn.get("finish_reason") or ("tool_calls" if turn.get("tool_calls") else "stop")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "stub"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": self.tokens_per_turn - 10, "completion_tokens": 10,
                      "total_tokens": self.tokens_per_turn},
        }

    def tool_results(self) -> list[str]:
        """Every tool result the graph sent back to the model, in order."""
        seen: list[str] = []
        last = self.requests[-1]["messages"] if self.requests else []
        for m in last:
            if m.get("role") == "tool":
                seen.append(m["content"])
        return seen
