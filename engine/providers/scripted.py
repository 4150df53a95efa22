"""`ScriptedModel`: a deterministic offline model for tests and demos.

```python
model = ScriptedModel([
    Message(role="assistant", tool_calls=[ToolCall(id="c1", name="lookup", arguments={"q": "x"})]),
    "The answer is 42.",              # plain text becomes an assistant message
    ModelHTTPError(...),              # an exception instance is raised instead of answering
])
model = ScriptedModel(lambda request: f"echo: {request.messages[-1].text}")
```

Its wire body is the canonical JSON of the request (sorted keys, compact),
so tests can compare requests byte for byte and pin golden digests. Every
prepared request it is sent is kept in `.requests`.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TypeAlias

from chatledger.engine.providers._base import (
    Delta,
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    PreparedRequest,
)
from chatledger.engine.providers._errors import ModelError, ModelResponseError
from chatledger.engine.providers._wire import emit
from chatledger.store.messages import Message, ThinkingPart, Usage

__all__ = ["ScriptFunction", "ScriptItem", "ScriptedModel"]

PROVIDER = "scripted"

ScriptItem: TypeAlias = Message | str | ModelResponse | BaseException
"""One scripted answer: a message, assistant text, a full response, or an error to raise."""

ScriptFunction: TypeAlias = Callable[
    [ModelRequest], Message | str | ModelResponse | Awaitable[Message | str | ModelResponse]
]
"""Computes the answer to a request (sync or async)."""


class ScriptedModel:
    """Answers requests from a script, in order, without any I/O.

    Args:
        script: the answers in order, or a function computing each answer.
        name: the model's short name; `name` reports `scripted:<name>`.

    Attributes:
        requests: every `PreparedRequest` passed to `send`, in order.
    """

    def __init__(
        self, script: Sequence[ScriptItem] | ScriptFunction, *, name: str = "default"
    ) -> None:
        self._function: ScriptFunction | None = None
        self._items: list[ScriptItem] = []
        if callable(script):
            self._function = script
        else:
            self._items = list(script)
        self._model = name
        self._next = 0
        self.requests: list[PreparedRequest] = []

    @property
    def name(self) -> str:
        """`scripted:<name>`."""
        return f"scripted:{self._model}"

    @property
    def remaining(self) -> int:
        """Scripted answers not used yet (0 for a function script)."""
        return len(self._items) - self._next

    def prepare(self, request: ModelRequest, *, stream: bool = False) -> PreparedRequest:
        """Canonical JSON of the request: sorted keys, compact, defaults left out."""
        body = {
            "messages": [
                m.model_dump(mode="json", exclude_defaults=True) for m in request.messages
            ],
            "settings": request.settings,
            "stream": stream,
            "tool_choice": request.tool_choice,
            "tools": [asdict(t) for t in request.tools],
        }
        encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return PreparedRequest(request=request, body=encoded.encode("utf-8"), stream=stream)

    async def send(
        self, prepared: PreparedRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Answer with the next scripted item (or raise it, if it is an exception)."""
        self.requests.append(prepared)
        item = await self._answer(prepared.request)
        if isinstance(item, BaseException):
            raise item
        response = self._response(item, prepared)
        if prepared.stream:
            for delta in stream_deltas(response.message):
                await emit(on_delta, delta)
        return response

    async def _answer(self, request: ModelRequest) -> ScriptItem:
        if self._function is not None:
            result = self._function(request)
            if inspect.isawaitable(result):
                return await result
            return result
        if self._next >= len(self._items):
            raise ModelError(
                f"ScriptedModel {self._model!r} received request {len(self.requests)}, but its "
                f"script holds only {len(self._items)} answer(s). Add answers to the script, "
                f"or check why the run made more model requests than expected.",
                provider=PROVIDER,
            )
        item = self._items[self._next]
        self._next += 1
        return item

    def _response(
        self, item: Message | str | ModelResponse, prepared: PreparedRequest
    ) -> ModelResponse:
        if isinstance(item, ModelResponse):
            return item
        message = Message(role="assistant", content=item) if isinstance(item, str) else item
        if message.role != "assistant":
            raise ModelResponseError(
                f"ScriptedModel {self._model!r} was scripted to answer with a {message.role} "
                f"message; a model answers with an assistant message. Fix the script.",
                provider=PROVIDER,
            )
        return ModelResponse(
            message=message,
            usage=estimate_usage(prepared.body, message),
            finish_reason="tool_calls" if message.tool_calls else "stop",
            model_name=self.name,
        )


def _tokens(chars: int) -> int:
    # The usual rough rule: about four characters per token.
    return math.ceil(chars / 4)


def estimate_usage(body: bytes, message: Message) -> Usage:
    """A deterministic usage estimate: request and answer characters / 4."""
    answer = len(message.text) + sum(
        len(p.text) for p in message.parts if isinstance(p, ThinkingPart)
    )
    answer += sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
    return Usage(input_tokens=_tokens(len(body)), output_tokens=_tokens(answer))


def _split(text: str, pieces: int) -> Iterator[str]:
    size = max(1, math.ceil(len(text) / pieces))
    for start in range(0, len(text), size):
        yield text[start : start + size]


def stream_deltas(message: Message) -> list[Delta]:
    """The deltas a streamed `message` arrives as: thinking, text in ~3 pieces, then calls."""
    deltas: list[Delta] = []
    for part in message.parts:
        if isinstance(part, ThinkingPart) and part.text:
            deltas.extend(Delta(kind="thinking", text=t) for t in _split(part.text, 2))
    deltas.extend(Delta(kind="text", text=t) for t in _split(message.text, 3))
    for index, call in enumerate(message.tool_calls):
        pieces = list(_split(call.arguments, 2)) or [""]
        deltas.append(
            Delta(
                kind="tool_call",
                index=index,
                tool_call_id=call.id,
                tool_name=call.name,
                arguments=pieces[0],
            )
        )
        deltas.extend(Delta(kind="tool_call", index=index, arguments=p) for p in pieces[1:])
    return deltas
