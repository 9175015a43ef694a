"""The agent graph's state: the conversation in the chat format, and this request's budget."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict


class AgentState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]  # the whole conversation, checkpointed
    steps: int  # model calls in this request
    tokens: int  # tokens in this request
    summary: str | None  # set by the finish tool
    stopped: str | None  # why the request stopped early (a bound was hit)
    question: str | None  # the agent asks the person (ask_user, or words without a tool call): the turn waits
    written: list[str]  # files this turn wrote; lost unless the turn ends in a commit
