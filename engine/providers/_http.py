"""HTTP plumbing shared by the adapters: client ownership, retries, SSE parsing.

This is the one place where httpx errors become `ModelError`s. A request is
retried, with the *same* body bytes, on connection failures, timeouts, 408,
409, 429 and 5xx answers, up to `RetryPolicy.max_retries` times. The wait
before a retry is the provider's `Retry-After` (seconds or an HTTP date) when
it sends one, else exponential backoff with full jitter. A stream that has
begun (a 2xx status arrived) is never retried: its deltas already reached the
caller, and a retry would deliver them twice.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, ClassVar, Protocol, Self

import httpx

from chatledger import __version__
from chatledger.engine.providers._base import (
    Delta,
    DeltaCallback,
    ModelResponse,
    PreparedRequest,
)
from chatledger.engine.providers._errors import (
    ModelConfigError,
    ModelConnectionError,
    ModelHTTPError,
    ModelResponseError,
    ModelStreamError,
)
from chatledger.engine.providers._wire import emit, merge_settings, resolve_api_key

__all__ = [
    "DEFAULT_TIMEOUT",
    "HttpTransport",
    "PooledModel",
    "RetryPolicy",
    "SSEEvent",
    "Sleep",
    "WireStream",
    "iter_sse",
    "load_json",
    "malformed_event",
    "parse_retry_after",
    "retry_policy",
]

Sleep = Callable[[float], Awaitable[None]]
"""Waits the given seconds; `asyncio.sleep` unless a test injects another."""

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""Generous: a long answer can take minutes. For streams it bounds each read."""

_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_BODY_LIMIT = 10_000


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is retried.

    Attributes:
        max_retries: retries after the first attempt (0 disables retrying).
        initial_delay: the backoff ceiling of the first retry, in seconds.
        max_delay: the backoff ceiling never grows past this.
        max_retry_after: a `Retry-After` longer than this is not waited for:
            the error is raised at once, carrying `retry_after`, so the caller
            can schedule the retry instead of blocking.
    """

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max_delay, initial_delay * 2**(retry-1))]."""
        ceiling = min(self.max_delay, self.initial_delay * 2 ** max(retry - 1, 0))
        return rng.uniform(0.0, ceiling)


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event: its `event` name (`message` by default) and `data`."""

    event: str
    data: str


async def iter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SSEEvent]:
    """Parse server-sent events from lines (without their line endings).

    An event is dispatched at the blank line that ends it; an event left
    unterminated when the lines run out is discarded, as the SSE spec says
    (it is most likely the half of a cut-off stream).
    """
    name = ""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield SSEEvent(name or "message", "\n".join(data))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)


def load_json(
    text: str | bytes, *, provider: str, label: str, what: str, stream: bool = False
) -> Any:
    """Parse a provider's JSON payload, or raise `ModelResponseError`/`ModelStreamError`."""
    try:
        return json.loads(text)
    except ValueError as exc:
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        kind = ModelStreamError if stream else ModelResponseError
        raise kind(
            f"The {what} from {label} is not valid JSON ({exc}). The server may not speak "
            f"this API; check the base URL.",
            provider=provider,
            body=shown[:_BODY_LIMIT],
        ) from exc


def malformed_event(provider: str, label: str, event: SSEEvent, exc: Exception) -> ModelStreamError:
    """The error for a stream event of an unexpected shape."""
    return ModelStreamError(
        f"{_capital(label)} sent a {event.event!r} stream event of an unexpected shape "
        f"({type(exc).__name__}: {exc}). The server may not implement this API's streaming; "
        f"check the base URL.",
        provider=provider,
        body=event.data[:_BODY_LIMIT],
    )


def _error_detail(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300] or "no error body"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:300]
    if isinstance(error, str):
        return error[:300]
    return body.strip()[:300]


def _advice(status: int, detail: str, api_key_env: str | None, retry_after: float | None) -> str:
    if status in (401, 403):
        where = f"the api_key argument or {api_key_env}" if api_key_env else "the api_key argument"
        return f"Check the API key ({where}) and its permissions."
    if status == 404:
        return "Check the model name and the base URL."
    if status == 429:
        wait = f" (the provider asked for {retry_after:g}s)" if retry_after is not None else ""
        return f"The provider is rate limiting{wait}; retry later, lower the request rate, or raise max_retries."
    if status >= 500 or status in _RETRYABLE_STATUSES:
        return "The provider failed to answer; retry later or raise max_retries."
    if "tool" in detail.lower():
        return (
            "The provider rejected the request's tool calls or results; send a repaired "
            "history (store.normalize_history pairs every call with its result)."
        )
    return "The provider rejected the request as invalid; its message says which field to fix."


class _Closing:
    """Leaving `async with` calls `aclose()` (each subclass says what entering opens)."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class HttpTransport(_Closing):
    """Sends prepared bodies over an owned or injected `httpx.AsyncClient`.

    An injected client is used as is and never closed here. Without one, each
    request opens and closes its own client, unless the transport is entered
    (`async with`), which keeps one pooled client until exit: a client is
    bound to the event loop that created it, and sync wrappers run each call
    on a fresh loop.
    """

    def __init__(
        self,
        *,
        provider: str,
        label: str,
        api_key_env: str | None,
        client: httpx.AsyncClient | None,
        timeout: float | httpx.Timeout | None,
        retry: RetryPolicy,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.provider = provider
        self.label = label
        self.retry = retry
        self._api_key_env = api_key_env
        self._injected = client
        self._owned: httpx.AsyncClient | None = None
        self._timeout = timeout
        self._sleep: Sleep = sleep or asyncio.sleep
        self._rng = rng or random.Random()

    async def __aenter__(self) -> Self:
        if self._injected is None and self._owned is None:
            self._owned = httpx.AsyncClient(timeout=self._timeout or DEFAULT_TIMEOUT)
        return self

    async def aclose(self) -> None:
        """Close the pooled client this transport owns, if any."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.aclose()

    async def post_json(self, url: str, headers: Mapping[str, str], body: bytes) -> Any:
        """POST `body`, retrying as the policy says, and return the parsed JSON answer."""
        async with self._client() as client:
            response = await self._send(client, url, headers, body, stream=False)
        return load_json(
            response.content, provider=self.provider, label=self.label, what="response"
        )

    async def post_stream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        handle: Callable[[AsyncIterator[SSEEvent]], Awaitable[Any]],
    ) -> Any:
        """POST `body` for a streamed answer and pass its events to `handle`.

        Connection errors and retryable statuses before the stream begins are
        retried; after that a broken stream raises `ModelStreamError`.
        """
        async with self._client() as client:
            response = await self._send(client, url, headers, body, stream=True)
            events = self._events(response, url)
            try:
                return await handle(events)
            finally:
                await events.aclose()
                await response.aclose()

    async def _events(self, response: httpx.Response, url: str) -> AsyncGenerator[SSEEvent, None]:
        try:
            async for event in iter_sse(response.aiter_lines()):
                yield event
        except httpx.HTTPError as exc:
            raise ModelStreamError(
                f"The stream from {self.label} at {url} broke off midway ({_describe(exc)}). "
                f"The deltas received so far were delivered; send the request again.",
                provider=self.provider,
            ) from exc

    def _client(self) -> _ClientScope:
        return _ClientScope(self._injected or self._owned, self._timeout)

    async def _send(
        self,
        client: httpx.AsyncClient,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        stream: bool,
    ) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            extra: dict[str, Any] = {} if self._timeout is None else {"timeout": self._timeout}
            try:
                request = client.build_request("POST", url, content=body, headers=headers, **extra)
                response = await client.send(request, stream=True)
                if not stream or not response.is_success:
                    try:
                        await response.aread()
                    finally:
                        await response.aclose()
            except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
                raise ModelConfigError(
                    f"The URL {url} for {self.label} is not usable ({exc}). Set a base URL "
                    f"that starts with http:// or https://.",
                    provider=self.provider,
                ) from exc
            except httpx.DecodingError as exc:
                raise ModelResponseError(
                    f"The response from {self.label} at {url} could not be decoded ({exc}). "
                    f"A proxy may be mangling it; check the base URL.",
                    provider=self.provider,
                ) from exc
            except httpx.TransportError as exc:
                if attempt > self.retry.max_retries:
                    raise ModelConnectionError(
                        f"Could not get an answer from {self.label} at {url} after "
                        f"{attempt} attempt(s): {_describe(exc)}. Check the base URL and the "
                        f"network, or raise the timeout or max_retries.",
                        provider=self.provider,
                        url=url,
                        attempts=attempt,
                    ) from exc
                await self._sleep(self.retry.backoff(attempt, self._rng))
                continue
            if response.is_success:
                return response
            retry_after = parse_retry_after(response.headers)
            if not self._should_retry(response, attempt, retry_after):
                raise self._http_error(response, url, attempt, retry_after)
            await self._sleep(
                retry_after if retry_after is not None else self.retry.backoff(attempt, self._rng)
            )

    def _should_retry(
        self, response: httpx.Response, attempt: int, retry_after: float | None
    ) -> bool:
        if attempt > self.retry.max_retries:
            return False
        if retry_after is not None and retry_after > self.retry.max_retry_after:
            return False
        # Both OpenAI and Anthropic say explicitly whether a retry can help.
        hint: str | None = response.headers.get("x-should-retry")
        if hint in ("true", "false"):
            return hint == "true"
        status: int = response.status_code
        return status in _RETRYABLE_STATUSES or status >= 500

    def _http_error(
        self, response: httpx.Response, url: str, attempts: int, retry_after: float | None
    ) -> ModelHTTPError:
        body = response.content.decode("utf-8", "replace")
        status = response.status_code
        detail = _error_detail(body).rstrip(". ")
        return ModelHTTPError(
            f"{_capital(self.label)} answered {status} to POST {url} after {attempts} attempt(s): "
            f"{detail}. {_advice(status, detail, self._api_key_env, retry_after)}",
            provider=self.provider,
            status=status,
            body=body[:_BODY_LIMIT],
            retry_after=retry_after,
            url=url,
            attempts=attempts,
        )


def retry_policy(retry: RetryPolicy | None, max_retries: int | None) -> RetryPolicy:
    """`retry` (or the default policy) with `max_retries` applied when given."""
    policy = retry or RetryPolicy()
    return policy if max_retries is None else replace(policy, max_retries=max_retries)


class WireStream(Protocol):
    """A streamed answer being assembled from its server-sent events, as a wire
    module reads them (`AnthropicStream`, `OpenAIStream`).

    Attributes:
        item: what one event's data is called in an error (`stream event`).
        end: the data of the event that ends the stream, for an API that sends
            one (Chat Completions' `[DONE]`), else None.
        done: whether the stream said it is complete.
    """

    item: ClassVar[str]
    end: ClassVar[str | None]
    done: bool

    def feed(self, event: str, data: Any) -> list[Delta]:
        """Take one event's name and JSON data; return the deltas it carries."""
        ...

    def result(self) -> ModelResponse:
        """The assembled response; `ModelStreamError` if the stream never finished."""
        ...


class PooledModel(_Closing):
    """What the HTTP adapters share: their configuration, sending a prepared
    request and reading its answer, streamed or not, and, with `async with
    model:`, a pooled connection over an `HttpTransport`.

    A subclass sets `model` and `_path` (its endpoint under the base URL), and
    says which headers carry its credentials (`_api_headers`) and how its wire
    module reads an answer (`_parse_response`) and a stream (`_new_stream`).
    """

    model: str
    _path: ClassVar[str]
    _transport: HttpTransport

    def _configure(
        self,
        *,
        provider: str,
        label: str,
        key_env: str,
        base_url_env: str,
        default_base_url: str,
        reserved: Iterable[str],
        api_key: str | None,
        base_url: str | None,
        client: httpx.AsyncClient | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int | None,
        retry: RetryPolicy | None,
        settings: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        sleep: Sleep | None,
        rng: random.Random | None,
    ) -> None:
        """Resolve the base URL and key (arguments, then the environment) and
        set up settings, headers and the transport."""
        base = base_url or os.environ.get(base_url_env) or default_base_url
        self.base_url = base.rstrip("/")
        self.api_key = resolve_api_key(
            api_key,
            env=key_env,
            base_url=self.base_url,
            default_base_url=default_base_url,
            provider=provider,
        )
        self.settings = dict(settings or {})
        merge_settings(self.settings, reserved=reserved, provider=provider)
        self._headers = dict(headers or {})
        self._transport = HttpTransport(
            provider=provider,
            label=label,
            api_key_env=key_env,
            client=client,
            timeout=timeout,
            retry=retry_policy(retry, max_retries),
            sleep=sleep,
            rng=rng,
        )

    @property
    def name(self) -> str:
        """`<provider>:<model>`, e.g. `openai:gpt-4o`."""
        return f"{self._transport.provider}:{self.model}"

    @property
    def url(self) -> str:
        """The endpoint requests go to."""
        return f"{self.base_url}{self._path}"

    async def send(
        self, prepared: PreparedRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Send the prepared bytes (retrying retryable failures) and parse the answer."""
        transport = self._transport
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if prepared.stream else "application/json",
            "user-agent": f"chatledger/{__version__}",
            **self._api_headers(),
            **self._headers,
        }
        if not prepared.stream:
            data = await transport.post_json(self.url, headers, prepared.body)
            return self._parse_response(data)

        async def consume(events: AsyncIterator[SSEEvent]) -> ModelResponse:
            state = self._new_stream()
            async for event in events:
                if state.end is not None and event.data.strip() == state.end:
                    state.done = True
                    break
                data = load_json(
                    event.data,
                    provider=transport.provider,
                    label=transport.label,
                    what=state.item,
                    stream=True,
                )
                try:
                    deltas = state.feed(event.event, data)
                except (KeyError, TypeError, AttributeError, ValueError) as exc:
                    raise malformed_event(transport.provider, transport.label, event, exc) from exc
                for delta in deltas:
                    await emit(on_delta, delta)
                if state.done:
                    break
            return state.result()

        result: ModelResponse = await transport.post_stream(
            self.url, headers, prepared.body, consume
        )
        return result

    def _api_headers(self) -> dict[str, str]:
        """The provider's own headers: its credentials, its API version."""
        raise NotImplementedError

    def _parse_response(self, data: Any) -> ModelResponse:
        """A non-streamed answer, as the wire module reads it."""
        raise NotImplementedError

    def _new_stream(self) -> WireStream:
        """The wire module's assembler of a streamed answer."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the pooled connection opened by `async with`, if any."""
        await self._transport.aclose()

    async def __aenter__(self) -> Self:
        await self._transport.__aenter__()
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"


class _ClientScope:
    """Yields the shared client, or a fresh one closed on exit."""

    def __init__(self, shared: httpx.AsyncClient | None, timeout: float | httpx.Timeout | None):
        self._shared = shared
        self._timeout = timeout
        self._fresh: httpx.AsyncClient | None = None

    async def __aenter__(self) -> httpx.AsyncClient:
        if self._shared is not None:
            return self._shared
        self._fresh = httpx.AsyncClient(timeout=self._timeout or DEFAULT_TIMEOUT)
        return self._fresh

    async def __aexit__(self, *exc_info: object) -> None:
        if self._fresh is not None:
            await self._fresh.aclose()


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({text})"
    return text
