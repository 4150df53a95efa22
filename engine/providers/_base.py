"""The Model protocol: how the engine talks to any model.

A model request happens in two steps so that the engine can record the exact
wire body's digest *before* anything is sent:

1. `model.prepare(request, stream=...)` turns a provider-neutral
   `ModelRequest` into a `PreparedRequest` holding the exact bytes that will go
   on the wire (and their sha256 `digest`);
2. `await model.send(prepared, on_delta=...)` sends those bytes (retrying
   retryable failures with the same bytes) and returns a `ModelResponse`.
   With `prepared.stream` true, deltas are passed to `on_delta` as they arrive.

Provider quirks live only in the adapters under `engine/providers/`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from chatledger.store.messages import Message, Usage

__all__ = [
    "Delta",
    "DeltaCallback",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "PreparedRequest",
    "ToolChoice",
    "ToolSpec",
]

ToolChoice = Literal["auto", "none", "required"] | str
"""`auto`, `none`, `required`, or the name of one tool the model must call."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, a description and a JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ModelRequest:
    """One provider-neutral model request.

    `messages` is a repaired history (every tool call answered in the block
    right after its assistant turn) whose first message may be the system
    message carrying the run's instructions.
    """

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedRequest:
    """The exact bytes of one request, ready to send."""

    request: ModelRequest
    body: bytes
    stream: bool = False

    @property
    def digest(self) -> str:
        """The sha256 of `body`, hex-encoded: what `model.requested` records."""
        return hashlib.sha256(self.body).hexdigest()


@dataclass(frozen=True)
class ModelResponse:
    """A model's answer: one assistant message, its usage and why it stopped."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model_name: str | None = None


@dataclass(frozen=True)
class Delta:
    """A streamed fragment of a response.

    `kind` says which field is filled: `text` and `thinking` carry `text`;
    `tool_call` carries the call's `index` in the response, and on its first
    fragment its `tool_call_id` and `tool_name`, then `arguments` fragments.
    """

    kind: Literal["text", "thinking", "tool_call"]
    text: str = ""
    index: int = 0
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: str = ""


DeltaCallback = Callable[[Delta], Awaitable[None] | None]
"""Receives each delta of a streamed response; may be sync or async."""


@runtime_checkable
class Model(Protocol):
    """What the engine needs from a model."""

    @property
    def name(self) -> str:
        """A short name recorded in `run.started` (e.g. `openai:gpt-4o`)."""
        ...

    def prepare(self, request: ModelRequest, *, stream: bool = False) -> PreparedRequest:
        """Build the exact wire body of `request`. Pure: no I/O."""
        ...

    async def send(
        self, prepared: PreparedRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Send `prepared` and return the response.

        Raises a `engine.ModelError` subclass when the request fails for good
        (after the adapter's bounded retries), including a stream cut off
        midway.
        """
        ...
