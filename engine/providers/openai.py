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
from collections.abc import Mapping
from typing import Any

import httpx

from chatledger.engine.providers import _openai_wire as wire
from chatledger.engine.providers._base import ModelRequest, ModelResponse, PreparedRequest
from chatledger.engine.providers._http import PooledModel, RetryPolicy, Sleep
from chatledger.engine.providers._wire import merge_settings, request_body

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

    _path = "/chat/completions"

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

    def prepare(self, request: ModelRequest, *, stream: bool = False) -> PreparedRequest:
        """Build the exact Chat Completions body. Pure: no I/O."""
        settings = merge_settings(
            self.settings, request.settings, reserved=_RESERVED, provider=wire.PROVIDER
        )
        stream_fields: dict[str, Any] = {"stream": True} if stream else {}
        if stream and self.stream_usage:
            stream_fields["stream_options"] = {"include_usage": True}
        body = request_body(
            {"model": self.model, "messages": wire.messages_to_wire(request.messages)},
            tools=wire.tools_to_wire(request.tools),
            tool_choice=wire.tool_choice_to_wire(request.tool_choice, request.tools),
            settings=settings,
            stream=stream_fields,
            provider=wire.PROVIDER,
        )
        return PreparedRequest(request=request, body=body, stream=stream)

    def _api_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _parse_response(self, data: Any) -> ModelResponse:
        return wire.parse_response(data)

    def _new_stream(self) -> wire.OpenAIStream:
        return wire.OpenAIStream()
