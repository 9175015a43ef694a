"""The LangGraph graph: the model proposes tool calls, the tools run confined, until `finish`
or a bound on steps or tokens. Nothing here does work at import time."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Checkpointer

from agents.context import estimate_tokens, fit_to_budget
from agents.llm import Model, ModelLimits, ModelReply
from agents.state import AgentState
from agents.tools import TOOL_SCHEMAS, RepoTools
from gateway.domain.errors import ContextTooLong
from gateway.domain.scrubbing import Scrubber

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Limits:
    max_steps: int = 20
    max_tokens: int = 200_000
    prompt_budget: int = 60_000  # tokens in one model request, tool schemas included; old tool results become stubs


Record = Callable[[str, dict[str, Any]], None]


def build_graph(model: Model, tools: RepoTools, system_prompt: str, limits: Limits,
                checkpointer: Checkpointer | None = None, progress: Progress | None = None,
                scrubber: Scrubber | None = None, should_stop: Callable[[], str | None] | None = None,
                record: Record | None = None) -> Any:
    """The agent's graph; `scrubber` cuts known secrets out of tool results and of every model request;
    `should_stop` is asked before each model call (the circuit breaker) and ends the run with its reason;
    `record` hears of every model call and tool call (for the trail: what was called, never the content)."""
    say = progress or (lambda _: None)
    scrub = scrubber or Scrubber()
    note = record or (lambda _kind, _data: None)

    budget = limits.prompt_budget  # lowered for the rest of the run when a server refuses a request as too long

    def ask(messages: list[dict[str, Any]]) -> tuple[ModelReply, int]:
        """One completion, within the budget and the server's context; a refusal for length is trimmed and
        retried once."""
        nonlocal budget
        room = model.limits().prompt_room()
        fitted, trimmed = fit_to_budget(messages, min(budget, room or budget), TOOL_SCHEMAS)
        try:
            return model.complete(fitted, TOOL_SCHEMAS), trimmed
        except ContextTooLong as exc:
            sent = estimate_tokens(fitted, TOOL_SCHEMAS)
            room = model.limits().prompt_room()  # the context the refusal named, if it named one
            budget = min(budget, room or sent, sent * 3 // 4)
            fitted, trimmed = fit_to_budget(messages, budget, TOOL_SCHEMAS)
            try:
                return model.complete(fitted, TOOL_SCHEMAS), trimmed
            except ContextTooLong as again:
                raise ContextTooLong(f"{again}, even trimmed to about {estimate_tokens(fitted, TOOL_SCHEMAS)} "
                                     "tokens: give the server a longer context, or lower GATEWAY_AGENT_PROMPT_BUDGET",
                                     again.limit) from exc

    def call_model(state: AgentState) -> dict[str, Any]:
        stop = should_stop() if should_stop else None
        if stop:
            return {"stopped": stop}
        if state["steps"] >= limits.max_steps:
            return {"stopped": f"step bound reached: {state['steps']} model calls (limit {limits.max_steps})"}
        if state["tokens"] >= limits.max_tokens:
            return {"stopped": f"token bound reached: {state['tokens']} tokens (limit {limits.max_tokens})"}
        say(f"thinking (step {state['steps'] + 1})")
        messages = scrub.scrub_data([{"role": "system", "content": system_prompt}, *state["messages"]])
        started = time.monotonic()
        reply, trimmed = ask(messages)
        calls = reply.message.get("tool_calls") or []
        note("model_call", {"step": state["steps"] + 1, "tokens": reply.tokens, "trimmed_messages": trimmed,
                            "seconds": round(time.monotonic() - started, 3), "finish_reason": reply.finish_reason,
                            "tool_calls": [c["function"]["name"] for c in calls]})
        update: dict[str, Any] = {"steps": state["steps"] + 1, "tokens": state["tokens"] + reply.tokens}
        unfinished = _unfinished(reply, model.limits())
        if unfinished:  # half a sentence is no question, half a tool call no call: neither is kept or run
            return {**update, "stopped": unfinished}
        update["messages"] = [reply.message]
        if not calls and reply.message.get("content", "").strip():
            update["question"] = reply.message["content"].strip()  # words without a tool call are for the person
        return update

    def run_tools(state: AgentState) -> dict[str, Any]:
        results = []
        for call in state["messages"][-1].get("tool_calls") or []:
            name, arguments = call["function"]["name"], call["function"].get("arguments", "{}")
            say(f"{name} {arguments[:80]}")
            started = time.monotonic()
            result = scrub.scrub(tools.call(name, arguments))
            note("tool_call", {"tool": name, "arguments_sha256": hashlib.sha256(arguments.encode()).hexdigest(),
                               "outcome": result.split(":", 1)[0] if result.startswith(("refused:", "error:")) else "ok",
                               "seconds": round(time.monotonic() - started, 3)})
            results.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return {"messages": results, "summary": tools.summary, "question": tools.question,
                "written": sorted(tools.written)}

    def after_model(state: AgentState) -> str:
        last = state["messages"][-1] if state["messages"] else {}
        if state.get("stopped") or last.get("role") != "assistant" or not last.get("tool_calls"):
            return END
        return "tools"

    def after_tools(state: AgentState) -> str:
        return END if state.get("summary") or state.get("question") else "model"

    graph = StateGraph(AgentState)
    graph.add_node("model", call_model)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", after_model, {"tools": "tools", END: END})
    graph.add_conditional_edges("tools", after_tools, {"model": "model", END: END})
    return graph.compile(checkpointer=checkpointer)


def _unfinished(reply: ModelReply, limits: ModelLimits) -> str | None:
    """Why a reply is not a whole one (cut off by the token limit, or withheld), or None."""
    if reply.finish_reason == "length":
        limit = f"GATEWAY_MODEL_MAX_TOKENS={limits.max_tokens}" if limits.max_tokens else "the server's own limit"
        return (f"the model's reply was cut off at the token limit ({limit}) before it said what to do: nothing was "
                "done with it; raise the limit, or ask for smaller steps")
    if reply.finish_reason == "content_filter":
        return "the model endpoint withheld the model's reply (finish_reason content_filter): nothing was done with it"
    return None
