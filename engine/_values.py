"""The engine's values: what hooks receive and what a run returns.

They live apart from `engine.agent` so that the run loop (`engine._run`) and
the `Agent` face can both import them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from store import Message, Usage

__all__ = ["Hit", "Result", "RunContext", "Source"]


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
