"""`AnthropicModel`: the Anthropic Messages API adapter.

```python
model = AnthropicModel("claude-sonnet-4-5")             # ANTHROPIC_API_KEY from the environment
```

Requests go to `POST {base_url}/v1/messages` with `anthropic-version: 2023-06-01`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import httpx

from chatledger.engine.providers import _anthropic_wire as wire
from chatledger.engine.providers._base import ModelRequest, ModelResponse, PreparedRequest
from chatledger.engine.providers._http import PooledModel, RetryPolicy, Sleep
from chatledger.engine.providers._wire import merge_settings, request_body

__all__ = ["AnthropicModel"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_RESERVED = ("model", "messages", "system", "tools", "tool_choice", "stream")


class AnthropicModel(PooledModel):
    """A model behind the Anthropic Messages API.

    Args:
        model: the model name (`claude-sonnet-4-5`, ...).
        api_key: defaults to `ANTHROPIC_API_KEY`; required for Anthropic's own endpoint.
        base_url: defaults to `ANTHROPIC_BASE_URL`, else `https://api.anthropic.com`.
        client: an `httpx.AsyncClient` to use (never closed by the model).
        max_tokens: the answer's token bound (Anthropic requires one); a
            `max_tokens` setting overrides it.
        timeout: per-request timeout; defaults to the client's, or 600s (connect 10s).
        max_retries: retries of retryable failures (default 2).
        retry: the full retry policy; `max_retries` overrides its bound.
        settings: extra body fields for every request (`temperature`,
            `thinking`, ...); a request's own `settings` override them.
        headers: extra HTTP headers (e.g. `anthropic-beta`).
        sleep: how retries wait (tests inject a fast one).
        rng: the jitter source (tests inject a seeded one).

    Use `async with model:` to pool connections across requests; otherwise
    each request opens and closes its own connection.
    """

    _path = "/v1/messages"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        max_tokens: int = 4096,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        settings: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self._configure(
            provider=wire.PROVIDER,
            label=wire.LABEL,
            key_env="ANTHROPIC_API_KEY",
            base_url_env="ANTHROPIC_BASE_URL",
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
        """Build the exact Messages body. Pure: no I/O."""
        settings = merge_settings(
            {"max_tokens": self.max_tokens},
            self.settings,
            request.settings,
            reserved=_RESERVED,
            provider=wire.PROVIDER,
        )
        system, messages = wire.messages_to_wire(request.messages)
        head: dict[str, Any] = {"model": self.model, "max_tokens": settings.pop("max_tokens")}
        if system:
            head["system"] = system
        head["messages"] = messages
        body = request_body(
            head,
            tools=wire.tools_to_wire(request.tools),
            tool_choice=wire.tool_choice_to_wire(request.tool_choice, request.tools),
            settings=settings,
            stream={"stream": True} if stream else {},
            provider=wire.PROVIDER,
        )
        return PreparedRequest(request=request, body=body, stream=stream)

    def _api_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def _parse_response(self, data: Any) -> ModelResponse:
        return wire.parse_response(data)

    def _new_stream(self) -> wire.AnthropicStream:
        return wire.AnthropicStream()
