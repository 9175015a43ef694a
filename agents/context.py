"""Fit what is sent to the model into a per-call budget: old tool results become short stubs first.

The checkpointed conversation keeps everything; only the request is trimmed, oldest results first,
so the model keeps the request, its own reasoning and the newest results. The budget covers all that
is sent: the messages and the tool schemas that go with every call. Tokens are estimated from
characters (about four per token), which errs on the safe side for code, HCL and JSON schemas; a
server that still finds the request too long says so, and the graph trims further once.
"""

from __future__ import annotations

import json
from typing import Any

from agents.llm import CHARS_PER_TOKEN

KEEP_CHARS = 1_000  # the last resort keeps this much of a long message
MESSAGE_CHARS = 16  # a chat template's markers around each message, in characters


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """The tokens a request carries: its messages and its tool schemas."""
    return (sum(len(json.dumps(m)) + MESSAGE_CHARS for m in messages) + len(json.dumps(tools or []))) // CHARS_PER_TOKEN


def fit_to_budget(messages: list[dict[str, Any]], budget: int,
                  tools: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], int]:
    """The messages to send, and how many of them were cut, so that they and `tools` fit `budget` tokens."""
    sizes = [len(json.dumps(m)) + MESSAGE_CHARS for m in messages]
    limit = budget * CHARS_PER_TOKEN - len(json.dumps(tools or []))
    if sum(sizes) <= limit:
        return messages, 0
    fitted = [dict(m) for m in messages]
    total = sum(sizes)
    calls = {c["id"]: c["function"] for m in fitted if m.get("role") == "assistant" for c in m.get("tool_calls") or []}
    results = [i for i, m in enumerate(fitted) if m.get("role") == "tool"]
    cut = 0

    def shorten(i: int, content: str) -> None:
        nonlocal total, cut
        fitted[i]["content"] = content
        size = len(json.dumps(fitted[i])) + MESSAGE_CHARS
        total, sizes[i], cut = total - sizes[i] + size, size, cut + 1

    for i in results[:-1]:  # oldest first; the newest result is what the model is about to read
        stub = _stub(fitted[i], calls)
        if len(stub) < len(fitted[i].get("content") or ""):
            shorten(i, stub)
            if total <= limit:
                return fitted, cut
    for i in range(1, len(fitted) - 1):  # still too big: shorten long messages but the system prompt and the newest
        content = fitted[i].get("content") or ""
        if len(content) > 2 * KEEP_CHARS:
            shorten(i, content[:KEEP_CHARS] + "\n… (cut to fit the prompt budget)")
            if total <= limit:
                break
    return fitted, cut


def _stub(message: dict[str, Any], calls: dict[str, dict[str, Any]]) -> str:
    call = calls.get(message.get("tool_call_id", ""), {})
    arguments = str(call.get("arguments", ""))[:120]
    return (f"[an earlier result of {call.get('name', 'a tool')} {arguments} was removed to fit the prompt budget "
            f"({len(message.get('content') or '')} characters); call the tool again if you still need it]")
