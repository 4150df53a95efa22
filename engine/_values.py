"""The engine's values: what hooks receive, what a run returns, what a request holds.

They live apart from `engine.agent` so that the run loop (`engine._run`), the
`Agent` face and the audit (`engine.audit`) can all import them without
importing each other. Two small pure rules live here too, because the run
and the audit must apply them alike: `context_block` (how retrieval hits
read in the system message) and `model_request` (what an agent adds to a
request's messages).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from engine.providers import ModelRequest
from engine.tools import Tool
from store import Message, Usage

__all__ = [
    "Guard",
    "Hit",
    "Instructions",
    "RequestOptions",
    "Result",
    "Retriever",
    "RunContext",
    "Source",
    "context_block",
    "model_request",
]


@dataclass(frozen=True)
class RunContext:
    """What dynamic instructions and hooks may know about the run."""

    run_id: str
    conversation_id: str
    prompt: str


@dataclass(frozen=True)
class Hit:
    """A retrieval hit: evidence a retrieval hook found for the current prompt."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    """Evidence a result rests on: a tool result or a retrieval hit of this run.

    Content that came in as history is never a source.
    """

    kind: Literal["tool", "retrieval"]
    ref: str
    name: str | None = None
    failed: bool = False


@dataclass(frozen=True)
class Result:
    """A completed run.

    Attributes:
        messages: the whole conversation after the run, repaired.
        new_messages: what the run added (prompt, model turns, tool results).
        output: the final assistant text.
    """

    run_id: str
    conversation_id: str
    messages: list[Message]
    new_messages: list[Message]
    output: str
    usage: Usage
    sources: list[Source]
    request_count: int
    tool_count: int


Instructions = Callable[[RunContext], str | Awaitable[str]]
"""Dynamic instructions: resolved once per run from what the run is about."""

Guard = Callable[[str], Awaitable[None] | None]
"""Screens a prompt before anything is written; raising rejects it."""

Retriever = Callable[[str], Iterable[Hit] | Awaitable[Iterable[Hit]]]
"""Finds evidence for a prompt; the hits become context and sources."""


def context_block(hits: Sequence[Hit]) -> str:
    """The text retrieval hits add to the system message after the instructions.

    `""` when there are none, so a run without hits sends no block.
    """
    hits = list(hits)  # a generator is truthy even when empty
    if not hits:
        return ""
    lines = [f"[{h.id}] {h.text}" for h in hits]
    return "Context retrieved for this request:\n" + "\n".join(lines)


class RequestOptions(Protocol):
    """What an agent adds to every request's messages (an `Agent` is one)."""

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def tool_choice(self) -> str | None: ...

    @property
    def settings(self) -> dict[str, Any]: ...


def model_request(options: RequestOptions, messages: Sequence[Message]) -> ModelRequest:
    """The provider-neutral request of `messages` with the agent's tools and settings.

    The tool choice goes only with tools: without tools there is nothing to choose.
    """
    specs = [t.spec for t in options.tools.values()]
    return ModelRequest(
        messages=list(messages),
        tools=specs,
        tool_choice=options.tool_choice if specs else None,
        settings=options.settings,
    )
