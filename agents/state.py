"""The agent graph's state: the conversation in the chat format, and this request's budget."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

HISTORY = "history"  # a pseudo-message whose `messages` replace the conversation so far (a compaction)
GATEWAY_NOTE = "[gateway] "  # how the gateway's own notes to the model begin


def add_messages(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages reducer: new messages are appended; a `history` item replaces everything before it."""
    merged = list(left)
    for message in right:
        if message.get("role") == HISTORY:
            merged = list(message["messages"])
        else:
            merged.append(message)
    return merged


def compact_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier turns as the person's words and what the agent concluded (its summary or question, and the files
    it edited); the reads, previews and intermediate tool calls are dropped."""
    compacted: list[dict[str, Any]] = []
    edited: list[str] = []
    for m in messages:
        if m.get("role") == "user":
            if not str(m.get("content", "")).startswith(GATEWAY_NOTE):  # notes about a past turn are spent
                compacted.append(m)
            edited = []
        elif m.get("role") == "assistant" and not m.get("tool_calls") and m.get("content"):
            compacted.append({"role": "assistant", "content": m["content"]})
        for call in m.get("tool_calls") or [] if m.get("role") == "assistant" else []:
            name, arguments = call["function"]["name"], _arguments(call["function"].get("arguments"))
            if name in ("write_file", "patch_file") and isinstance(arguments.get("path"), str):
                edited.append(arguments["path"])
            elif name in ("finish", "ask_user"):
                said = arguments.get("summary") or arguments.get("question") or ""
                files = f" (files edited: {', '.join(sorted(set(edited)))})" if edited and name == "finish" else ""
                compacted.append({"role": "assistant", "content": f"[{name}] {said}{files}"})
    return compacted


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


class AgentState(TypedDict):
    messages: Annotated[list[dict[str, Any]], add_messages]  # the conversation, checkpointed; earlier turns compacted
    steps: int  # model calls in this request
    tokens: int  # tokens in this request
    summary: str | None  # set by the finish tool
    stopped: str | None  # why the request stopped early (a bound was hit)
    question: str | None  # the agent asks the person (ask_user, or words without a tool call): the turn waits
    written: list[str]  # files this turn wrote; lost unless the turn ends in a commit
