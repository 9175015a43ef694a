"""The model: any OpenAI-compatible endpoint, through the `openai` SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import openai

from gateway.domain.errors import BackendError, NotConfigured

NOT_CONFIGURED = ("no model is configured: set OPENAI_BASE_URL, OPENAI_API_KEY and GATEWAY_MODEL "
                  "to an OpenAI-compatible endpoint")


@dataclass(frozen=True)
class ModelReply:
    message: dict[str, Any]  # an assistant message in the chat format, tool calls included
    tokens: int
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Model(Protocol):
    """What the graph needs of a model: its name, and one completion (a real endpoint, or a replayed transcript)."""
    model: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply: ...


class ChatModel:
    """One model on one endpoint; `complete` is the only call the graph makes."""

    def __init__(self, base_url: str | None, api_key: str | None, model: str | None, timeout: float = 120,
                 retries: int = 3):
        if not base_url or not model:
            raise NotConfigured(NOT_CONFIGURED)
        self.model = model
        # the SDK retries timeouts, connection errors, 408/409/429 and 5xx with exponential backoff and jitter
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "unset", timeout=timeout, max_retries=retries)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages, tools=tools)
        except openai.APIError as exc:
            raise BackendError(f"the model endpoint failed: {exc.__class__.__name__}: {exc}") from exc
        choice = response.choices[0].message
        message: dict[str, Any] = {"role": "assistant", "content": choice.content or ""}
        if choice.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in choice.tool_calls
            ]
        usage = response.usage
        if usage is None:
            return ModelReply(message, 0)
        return ModelReply(message, usage.total_tokens, usage.prompt_tokens, usage.completion_tokens)
