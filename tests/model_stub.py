"""An OpenAI-compatible model server in a thread that plays scripted turns, tool calls included.

The real `openai` client and the real graph talk to it over HTTP; every request body is kept,
so tests can scan what was sent to the model.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def tool_calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def say(text: str) -> dict[str, Any]:
    return {"content": text}


class ModelStub:
    def __init__(self, turns: list[Turn] | None = None, tokens_per_turn: int = 100):
        self.turns: list[Turn] = list(turns or [])
        self.requests: list[dict[str, Any]] = []
        self.tokens_per_turn = tokens_per_turn
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                completion = stub._completion(body)
                status = int(completion.pop("status", 200))  # a scripted failure: {"status": 503}
                self._send(status, completion if status == 200 else {"error": {"message": f"scripted {status}"}})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        turn = self.turns.pop(0) if self.turns else say("(the script has no more turns)")
        if callable(turn):
            turn = turn(body)
        if "status" in turn:
            return {"status": turn["status"]}
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
        if turn.get("tool_calls"):
            message["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in turn["tool_calls"]]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "stub"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if turn.get("tool_calls") else "stop"}],
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
