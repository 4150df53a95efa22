"""`OpenAIChatModel`: the Chat Completions adapter (OpenAI and compatible servers).

```python
model = OpenAIChatModel("gpt-4o")                      # OPENAI_API_KEY from the environment
local = OpenAIChatModel("llama3", base_url="http://localhost:11434/v1")   # Ollama, no key
```

Serves any server that speaks `POST {base_url}/chat/completions`: OpenAI,
vLLM, llama.cpp server, Ollama, LiteLLM.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from chatledger import __version__
from chatledger.engine.providers import _openai_wire as wire
from chatledger.engine.providers._base import (
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    PreparedRequest,
)
from chatledger.engine.providers._http import (
    PooledModel,
    RetryPolicy,
    Sleep,
    SSEEvent,
    load_json,
    malformed_event,
)
from chatledger.engine.providers._wire import emit, encode_body, merge_settings

__all__ = ["OpenAIChatModel"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RESERVED = ("model", "messages", "tools", "tool_choice", "stream", "stream_options")


class OpenAIChatModel(PooledModel):
    """A model behind the Chat Completions API.

    Args:
        model: the model name the server knows (`gpt-4o`, `llama3.1:8b`, ...).
        api_key: defaults to `OPENAI_API_KEY`; required only for OpenAI's own endpoint.
        base_url: defaults to `OPENAI_BASE_URL`, else `https://api.openai.com/v1`.
        client: an `httpx.AsyncClient` to use (never closed by the model).
        timeout: per-request timeout; defaults to the client's, or 600s (connect 10s).
        max_retries: retries of retryable failures (default 2).
        retry: the full retry policy; `max_retries` overrides its bound.
        settings: extra body fields for every request (`temperature`, `max_tokens`,
            ...); a request's own `settings` override them.
        headers: extra HTTP headers (e.g. `OpenAI-Organization`).
        stream_usage: ask for usage in streams (`stream_options.include_usage`);
            turn off for an old server that rejects `stream_options`.
        sleep: how retries wait (tests inject a fast one).
        rng: the jitter source (tests inject a seeded one).

    Use `async with model:` to pool connections across requests; otherwise
    each request opens and closes its own connection.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        settings: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        stream_usage: bool = True,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.model = model
        self.stream_usage = stream_usage
        self._configure(
            provider=wire.PROVIDER,
            label=wire.LABEL,
            key_env="OPENAI_API_KEY",
            base_url_env="OPENAI_BASE_URL",
            default_base_url=DEFAULT_BASE_URL,
            reserved=_RESERVED,
            api_key=api_key,
            base_url=base_url,
            client=client,
            timeout=timeout,
            max_retries=max_retries,
            retry=retry,
            settings=settings,
            headers=headers,
            sleep=sleep,
            rng=rng,
        )

    @property
    def name(self) -> str:
        """`openai:<model>`."""
        return f"openai:{self.model}"

    @property
    def url(self) -> str:
        """The endpoint requests go to."""
        return f"{self.base_url}/chat/completions"

    def prepare(self, request: ModelRequest, *, stream: bool = False) -> PreparedRequest:
        """Build the exact Chat Completions body. Pure: no I/O."""
        settings = merge_settings(
            self.settings, request.settings, reserved=_RESERVED, provider=wire.PROVIDER
        )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire.messages_to_wire(request.messages),
        }
        if request.tools:
            body["tools"] = wire.tools_to_wire(request.tools)
        choice = wire.tool_choice_to_wire(request.tool_choice, request.tools)
        if choice is not None:
            body["tool_choice"] = choice
        body.update(settings)
        if stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return PreparedRequest(
            request=request, body=encode_body(body, provider=wire.PROVIDER), stream=stream
        )

    async def send(
        self, prepared: PreparedRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Send the prepared bytes (retrying retryable failures) and parse the answer."""
        headers = self._request_headers(stream=prepared.stream)
        if not prepared.stream:
            data = await self._transport.post_json(self.url, headers, prepared.body)
            return wire.parse_response(data)

        async def consume(events: AsyncIterator[SSEEvent]) -> ModelResponse:
            state = wire.OpenAIStream()
            async for event in events:
                if event.data.strip() == "[DONE]":
                    state.done = True
                    break
                chunk = load_json(
                    event.data,
                    provider=wire.PROVIDER,
                    label=wire.LABEL,
                    what="stream chunk",
                    stream=True,
                )
                try:
                    deltas = state.feed(chunk)
                except (KeyError, TypeError, AttributeError, ValueError) as exc:
                    raise malformed_event(wire.PROVIDER, wire.LABEL, event, exc) from exc
                for delta in deltas:
                    await emit(on_delta, delta)
            return state.result()

        result: ModelResponse = await self._transport.post_stream(
            self.url, headers, prepared.body, consume
        )
        return result

    def _request_headers(self, *, stream: bool) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "user-agent": f"chatledger/{__version__}",
        }
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        headers.update(self._headers)
        return headers

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.model!r}, base_url={self.base_url!r})"
