"""The model: any OpenAI-compatible endpoint, through the `openai` SDK's HTTP client.

What is sent, and what is taken back, is decided here and nowhere else:
- every completion offers the tools with `tool_choice: "auto"` (a server may read a missing value as "none")
  and bounds the reply with `max_tokens` (without it a server generates until its context is full; servers
  ignore `max_completion_tokens`, which is sent instead only to an API that refuses `max_tokens` by name);
- one deadline covers a whole call: the retries (timeouts, no connection, 408/409/429, 5xx; backoff with
  jitter, Retry-After honoured) happen inside it, each attempt waiting at most the time left;
- the answer is parsed into strict models: a shape the gateway cannot use is a `ModelReplyError` saying what
  was wrong, a refusal for length a `ContextTooLong`; `finish_reason` is kept (a reply cut off by the token
  limit is not a reply), tool arguments sent as a JSON object are taken as the JSON text they stand for;
- the context the server runs with is asked where the server says it (vLLM's `max_model_len` in /v1/models,
  llama.cpp's /props), so the prompt budget leaves room for the reply.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import openai
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.domain.errors import BackendError, ContextTooLong, ModelReplyError, NotConfigured, Unavailable

NOT_CONFIGURED = ("no model is configured: set OPENAI_BASE_URL, OPENAI_API_KEY and GATEWAY_MODEL "
                  "to an OpenAI-compatible endpoint")
CHARS_PER_TOKEN = 4  # the estimate used wherever a server does not count (see agents/context.py)
RETRIED = {408, 409, 429}  # and every 5xx
# where /v1/models says a model's context: vLLM, and others that follow it
_CONTEXT_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length", "loaded_context_length")
_LIMIT_SAID = re.compile(r"(?:maximum context length|context (?:window|length|size)|n_ctx)\D{0,20}(\d{3,})", re.I)
_WANTS_SUCCESSOR = re.compile(r"\bmax_tokens\b.*\bmax_completion_tokens\b", re.I | re.S)
_TOO_LONG = re.compile(r"context[_ ](?:length|window|size)|maximum context|exceeds? the (?:available )?context|"
                       r"prompt is too long|too many tokens", re.I)


@dataclass(frozen=True)
class ModelReply:
    message: dict[str, Any]  # an assistant message in the chat format, tool calls included (arguments as JSON text)
    tokens: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "length": cut off by the token limit, not a whole reply


@dataclass(frozen=True)
class ModelLimits:
    """What bounds one request on an endpoint: its context in tokens (None: it does not say) and `max_tokens`."""
    context: int | None = None
    max_tokens: int | None = None

    def prompt_room(self) -> int | None:
        """Tokens the prompt (messages and tools) may take and still leave the reply its room."""
        return None if self.context is None else max(0, self.context - (self.max_tokens or 0))


class Model(Protocol):
    """What the graph needs of a model: its name, its limits, and one completion (a real endpoint, or a replayed
    transcript)."""
    model: str

    def limits(self) -> ModelLimits: ...

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply: ...


class ChatModel:
    """One model on one endpoint; `complete` is the only call the graph makes."""

    def __init__(self, base_url: str | None, api_key: str | None, model: str | None, timeout: float = 120,
                 retries: int = 3, max_tokens: int = 4096):
        if not base_url or not model:
            raise NotConfigured(NOT_CONFIGURED)
        self.model = model
        self.timeout, self.retries, self.max_tokens = timeout, retries, max_tokens
        self.deadline: float | None = None  # a monotonic time no call runs past, whatever its timeout (an eval case's)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "unset", timeout=timeout, max_retries=0)
        self.limit_parameter = "max_tokens"  # what servers honour; max_completion_tokens where an API refuses it
        self._context: int | None = None
        self._asked = False

    def limits(self) -> ModelLimits:
        if not self._asked:
            self._asked, self._context = True, _smallest(self._context, self._ask_context())
        return ModelLimits(self._context, self.max_tokens)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply:
        deadline = time.monotonic() + self.timeout
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        try:
            response = self._post(self._body(messages, tools), deadline)
        except BackendError as exc:  # OpenAI's reasoning models refuse max_tokens and name its successor
            if type(exc) is not BackendError or self.limit_parameter != "max_tokens" or not _WANTS_SUCCESSOR.search(
                    str(exc)):
                raise
            self.limit_parameter = "max_completion_tokens"
            response = self._post(self._body(messages, tools), deadline)
        try:
            data = response.json()
        except ValueError:
            said = f"the model endpoint's answer is not JSON ({response.text[:80]!r})"
            raise ModelReplyError(_unusable(said)) from None
        return parse_reply(data, sent_chars=len(json.dumps(messages)) + len(json.dumps(tools)))

    def _body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, self.limit_parameter: self.max_tokens}
        if tools:
            body |= {"tools": tools, "tool_choice": "auto"}
        return body

    def _post(self, body: dict[str, Any], deadline: float) -> httpx.Response:
        """One call, retried until `deadline`; the last failure when the deadline or the retries run out."""
        failure: BackendError | None = None
        for attempt in range(self.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return self.client.post("/chat/completions", body=body, cast_to=httpx.Response,
                                        options={"timeout": left})
            except openai.APIStatusError as exc:
                failure = self._refusal(exc)
            except openai.APITimeoutError:
                failure = None  # said below: it did not answer in time
            except openai.APIConnectionError as exc:
                failure = Unavailable(f"the model endpoint failed: {exc.__class__.__name__}: {exc}")
            if failure is not None and not isinstance(failure, Unavailable):
                raise failure
            pause = _backoff(attempt, failure.retry_after if isinstance(failure, Unavailable) else None)
            if attempt == self.retries or time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
        if failure is not None:
            raise failure
        raise Unavailable(f"the model endpoint did not answer within GATEWAY_MODEL_TIMEOUT ({self.timeout:g} s); "
                          f"a call and its retries share that time")

    def _refusal(self, exc: openai.APIStatusError) -> BackendError:
        """A status the endpoint answered, as the gateway's error: worth a retry (Unavailable), or final."""
        said = f"the model endpoint failed: {exc.__class__.__name__}: {exc}"
        status = exc.status_code
        if status in RETRIED or status >= 500:
            retry_after = exc.response.headers.get("retry-after", "")
            return Unavailable(said, float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None)
        if status in (400, 413, 422) and (exc.code == "context_length_exceeded" or _TOO_LONG.search(str(exc))):
            limit = _limit_said(exc)
            self._context = _smallest(self._context, limit)
            context = f" ({limit} tokens)" if limit else ""
            return ContextTooLong(f"the model endpoint refused the request: it is longer than the model's "
                                  f"context{context}", limit)
        return BackendError(said)

    def _ask_context(self) -> int | None:
        """The context the server runs this model with, where it says it; None where it does not."""
        said: list[int | None] = []
        models = self._get("models")
        entries = models.get("data") if isinstance(models, dict) else None
        entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        for entry in entries:
            if entry.get("id") == self.model or len(entries) == 1:
                said += [_count(entry.get(key)) for key in _CONTEXT_KEYS]
        if _smallest(*said) is None:  # llama.cpp's server: the context it was started with
            props = self._get(str(self.client.base_url.copy_with(raw_path=b"/props")))
            settings = props.get("default_generation_settings") if isinstance(props, dict) else None
            said.append(_count(settings.get("n_ctx")) if isinstance(settings, dict) else None)
        return _smallest(*said)

    def _get(self, path: str) -> Any:
        try:
            response = self.client.get(path, cast_to=httpx.Response, options={"timeout": min(5.0, self.timeout)})
            return response.json()
        except (openai.APIError, ValueError):
            return None  # the server does not say: the budget is the configured one


def _backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return retry_after
    return min(8.0, 0.5 * 2 ** attempt) * random.uniform(0.75, 1.0)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _smallest(*values: int | None) -> int | None:
    known = [v for v in values if v]
    return min(known) if known else None


def _limit_said(exc: openai.APIStatusError) -> int | None:
    """The context a refusal for length names: llama.cpp's `n_ctx` field, or the number in the message."""
    body = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
    if isinstance(body, dict) and _count(body.get("n_ctx")):
        return int(body["n_ctx"])
    found = _LIMIT_SAID.search(str(exc))
    return int(found.group(1)) if found else None


# --- the answer, parsed at the boundary ------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Function(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCall(_Strict):
    id: str | None = None
    function: _Function


class _Part(_Strict):
    text: str = ""


class _Message(_Strict):
    content: str | list[_Part] | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(_Strict):
    message: _Message
    finish_reason: str | None = None


class _Usage(_Strict):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None


class _Completion(_Strict):
    choices: list[_Choice]
    usage: _Usage | None = Field(default=None)


def parse_reply(data: Any, sent_chars: int = 0) -> ModelReply:
    """A chat completion as the assistant message the graph reads, or a `ModelReplyError` saying what is wrong."""
    try:
        completion = _Completion.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'the answer'}: {e['msg']}"
                             for e in exc.errors()[:3])
        raise ModelReplyError(_unusable(problems)) from None
    if not completion.choices:
        raise ModelReplyError(_unusable("the model endpoint sent no choices"))
    choice = completion.choices[0]
    content = choice.message.content
    text = "".join(p.text for p in content) if isinstance(content, list) else content or ""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if choice.message.tool_calls:
        message["tool_calls"] = [
            {"id": c.id or f"call_{n}", "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments
                          if isinstance(c.function.arguments, str) else json.dumps(c.function.arguments)}}
            for n, c in enumerate(choice.message.tool_calls, 1)]
    usage = completion.usage
    if usage is None:  # counted as the prompt budget counts, so the token bound still holds
        completion_tokens = len(json.dumps(message)) // CHARS_PER_TOKEN
        prompt_tokens = sent_chars // CHARS_PER_TOKEN
        return ModelReply(message, prompt_tokens + completion_tokens, prompt_tokens, completion_tokens,
                          choice.finish_reason)
    total = usage.total_tokens if usage.total_tokens is not None else usage.prompt_tokens + usage.completion_tokens
    return ModelReply(message, total, usage.prompt_tokens, usage.completion_tokens, choice.finish_reason)


def _unusable(why: str) -> str:
    return f"the model endpoint's reply cannot be used: {why}"
