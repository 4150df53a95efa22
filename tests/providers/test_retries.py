"""Retries, backoff and error translation, for both adapters, against the strict server."""

from __future__ import annotations

import email.utils
import random
import socket
from collections.abc import AsyncIterator

import pytest

from chatledger.engine.providers import (
    AnthropicModel,
    Model,
    ModelConfigError,
    ModelConnectionError,
    ModelHTTPError,
    OpenAIChatModel,
    RetryPolicy,
)
from chatledger.engine.providers._http import SSEEvent, iter_sse, parse_retry_after

from . import histories as h
from .conftest import RecordingSleep
from .strict_server import ANTHROPIC_KEY, OPENAI_KEY, Fail, Reply, StrictServer

ADAPTERS = ["openai", "anthropic"]


def make_model(
    kind: str, server: StrictServer, sleep: RecordingSleep, **options: object
) -> OpenAIChatModel | AnthropicModel:
    if kind == "openai":
        return OpenAIChatModel(
            "gpt-4o-mini",
            api_key=OPENAI_KEY,
            base_url=server.openai_url,
            sleep=sleep,
            rng=random.Random(3),
            **options,  # type: ignore[arg-type]
        )
    return AnthropicModel(
        "claude-sonnet-4-5",
        api_key=ANTHROPIC_KEY,
        base_url=server.url,
        sleep=sleep,
        rng=random.Random(3),
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ADAPTERS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_429_with_retry_after_is_retried_with_the_identical_body(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str, stream: bool
) -> None:
    model = make_model(kind, strict_server, sleep)
    strict_server.enqueue(Fail(429, retry_after="0.25"), Reply(text="after the wait"))
    prepared = model.prepare(h.request(h.plain()), stream=stream)
    response = await model.send(prepared)
    assert response.message.content == "after the wait"
    assert [r.sha256 for r in strict_server.requests] == [prepared.digest, prepared.digest]
    assert strict_server.requests[0].body == strict_server.requests[1].body == prepared.body
    assert sleep.delays == [0.25]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_persistent_500_fails_after_the_retry_bound(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str
) -> None:
    model = make_model(kind, strict_server, sleep, max_retries=2)
    strict_server.enqueue(*[Fail(500, message="boom")] * 3)
    prepared = model.prepare(h.request(h.plain()))
    with pytest.raises(ModelHTTPError) as caught:
        await model.send(prepared)
    error = caught.value
    assert (error.status, error.retry_after, error.attempts) == (500, None, 3)
    assert "boom" in error.body
    assert error.provider == kind
    assert "after 3 attempt(s)" in str(error)
    assert len(strict_server.requests) == 3
    assert {r.sha256 for r in strict_server.requests} == {prepared.digest}
    # Full jitter: each wait is within its exponential ceiling.
    policy = RetryPolicy()
    assert len(sleep.delays) == 2
    for retry, delay in enumerate(sleep.delays, start=1):
        assert 0.0 <= delay <= policy.initial_delay * 2 ** (retry - 1)


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_500_then_success_is_retried(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str
) -> None:
    model = make_model(kind, strict_server, sleep)
    strict_server.enqueue(Fail(503), Reply(text="fine"))
    response = await model.send(model.prepare(h.request(h.plain())))
    assert response.message.content == "fine"
    assert len(strict_server.requests) == 2


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_retry_after_beyond_the_bound_is_raised_at_once(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str
) -> None:
    model = make_model(kind, strict_server, sleep, retry=RetryPolicy(max_retry_after=5.0))
    strict_server.enqueue(Fail(429, retry_after="120"))
    with pytest.raises(ModelHTTPError, match="rate limiting") as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert (caught.value.status, caught.value.retry_after) == (429, 120.0)
    assert len(strict_server.requests) == 1
    assert sleep.delays == []


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_zero_max_retries_disables_retrying(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str
) -> None:
    model = make_model(kind, strict_server, sleep, max_retries=0)
    strict_server.enqueue(Fail(500))
    with pytest.raises(ModelHTTPError):
        await model.send(model.prepare(h.request(h.plain())))
    assert len(strict_server.requests) == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_stalled_server_times_out_into_a_connection_error(
    strict_server: StrictServer, sleep: RecordingSleep, kind: str
) -> None:
    model = make_model(kind, strict_server, sleep, timeout=0.2, max_retries=1)
    strict_server.enqueue(Reply(stall=30), Reply(stall=30))
    with pytest.raises(ModelConnectionError, match="timed out") as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert caught.value.attempts == 2
    assert len(sleep.delays) == 1


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_refused_connection_is_retried_then_reported(
    sleep: RecordingSleep, kind: str
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    model: Model = (
        OpenAIChatModel("m", api_key="k", base_url=url + "/v1", sleep=sleep, max_retries=2)
        if kind == "openai"
        else AnthropicModel("m", api_key="k", base_url=url, sleep=sleep, max_retries=2)
    )
    with pytest.raises(ModelConnectionError, match="after 3 attempt") as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert caught.value.url.startswith(url)
    assert len(sleep.delays) == 2


def test_retry_after_reads_seconds_milliseconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30.0)
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_backoff_is_full_jitter_under_a_growing_capped_ceiling() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=4.0)
    rng = random.Random(0)
    for retry, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (9, 4.0)]:
        delays = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # spread over the whole range


async def _lines(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def test_sse_parsing_follows_the_spec() -> None:
    lines = _lines(
        ": a comment",
        "event: message_start",
        "data: {",
        'data:"a":1}',
        "",
        "",
        "data: [DONE]",
        "",
        "data: half an event without its blank line",
    )
    events = [e async for e in iter_sse(lines)]
    assert events == [
        SSEEvent("message_start", '{\n"a":1}'),
        SSEEvent("message", "[DONE]"),
    ]


async def test_a_base_url_without_http_is_a_config_error(sleep: RecordingSleep) -> None:
    model = OpenAIChatModel("m", api_key="k", base_url="ftp://127.0.0.1/v1", sleep=sleep)
    with pytest.raises(ModelConfigError, match="http://"):
        await model.send(model.prepare(h.request(h.plain())))
    assert sleep.delays == []
