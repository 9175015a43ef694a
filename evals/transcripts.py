"""Record a run's model replies, and replay them later without a model.

A transcript is, per case, the model's replies in order: `{"tool_calls": [{"name", "arguments"}]}` or
`{"content": "..."}`, with the tokens each cost. The oracle transcripts (evals/oracles.yaml) are written
in the same form by hand: one right way through each case, so every case is shown passable.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agents.llm import Model, ModelLimits, ModelReply
from gateway.domain.errors import BackendError

ORACLES = Path(__file__).with_name("oracles.yaml")


class TranscriptEnded(BackendError):
    """The replayed transcript has no reply left for this call (the run went another way than the recording)."""


def reply_of(turn: Mapping[str, Any]) -> ModelReply:
    """A transcript turn as the assistant message the graph expects."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or ""}
    if turn.get("tool_calls"):
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {})}}
            for c in turn["tool_calls"]]
    tokens = turn.get("tokens") or {}
    return ModelReply(message, int(tokens.get("total", 0)), int(tokens.get("prompt", 0)),
                      int(tokens.get("completion", 0)), turn.get("finish_reason"))


def turn_of(reply: ModelReply) -> dict[str, Any]:
    """A model reply as a transcript turn (the call ids are not kept: they are made anew on replay)."""
    turn: dict[str, Any] = {}
    if reply.message.get("content"):
        turn["content"] = reply.message["content"]
    calls = reply.message.get("tool_calls") or []
    if calls:
        turn["tool_calls"] = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                              for c in calls]
    if reply.finish_reason not in (None, "stop", "tool_calls"):  # a reply cut off replays as one
        turn["finish_reason"] = reply.finish_reason
    turn["tokens"] = {"total": reply.tokens, "prompt": reply.prompt_tokens, "completion": reply.completion_tokens}
    return turn


def _arguments(raw: str | None) -> Any:
    try:
        return json.loads(raw or "{}")
    except json.JSONDecodeError:
        return raw  # kept as the model sent it, so the replay meets the same tool error


class ReplayModel:
    """Plays one case's recorded turns in order, as if a model had sent them."""

    def __init__(self, turns: Sequence[Mapping[str, Any]], model: str = "replay"):
        self.turns = list(turns)
        self.model = model

    def limits(self) -> ModelLimits:
        return ModelLimits()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        if not self.turns:
            raise TranscriptEnded("the transcript has no more replies: this run went another way than the recording")
        return reply_of(self.turns.pop(0))


class RecordingModel:
    """Wraps any model and keeps what was sent to it and what it answered (for traces, records and checks)."""

    def __init__(self, inner: Model):
        self.inner = inner
        self.model = inner.model
        self.sent: list[list[dict[str, Any]]] = []
        self.replies: list[ModelReply] = []

    def limits(self) -> ModelLimits:
        return self.inner.limits()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        self.sent.append(messages)
        reply = self.inner.complete(messages, tools)
        self.replies.append(reply)
        return reply

    def transcript(self) -> list[dict[str, Any]]:
        return [turn_of(r) for r in self.replies]


def load_transcripts(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Per case id, its turns: from an oracle file (YAML) or a recorded run (JSON, with its `cases`)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such transcript file")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a transcript file maps case ids to their turns")
    cases = data["cases"] if "cases" in data else data
    transcripts = {}
    for case, turns in cases.items():
        if not isinstance(turns, list) or not all(isinstance(t, Mapping) for t in turns):
            raise ValueError(f"{path}: case {case}: a transcript is a list of turns")
        transcripts[str(case)] = [_checked(path, case, n, _normal(t)) for n, t in enumerate(turns, 1)]
    return transcripts


def _checked(path: Path, case: str, n: int, turn: dict[str, Any]) -> dict[str, Any]:
    calls = turn.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in calls):
        raise ValueError(f"{path}: case {case}, turn {n}: tool_calls must be a list of {{name, arguments}}")
    if not calls and not isinstance(turn.get("content"), str):
        raise ValueError(f"{path}: case {case}, turn {n}: a turn has tool_calls or content")
    return turn


def _normal(turn: Mapping[str, Any]) -> dict[str, Any]:
    """Oracles may write a turn short: `{tool: name, args: {...}}` or `{say: text}`."""
    if "tool" in turn:
        return {"tool_calls": [{"name": turn["tool"], "arguments": turn.get("args") or {}}]}
    if "say" in turn:
        return {"content": turn["say"]}
    return dict(turn)


def save_transcripts(path: Path, transcripts: Mapping[str, list[dict[str, Any]]], model: str, prompt_version: str) -> None:
    path.write_text(json.dumps({"model": model, "prompt_version": prompt_version, "cases": dict(transcripts)},
                               indent=1), encoding="utf-8")
