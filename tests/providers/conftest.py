"""Fixtures for the provider tests: the strict server and a sleep that does not wait."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from chatledger.engine.providers import AnthropicModel, OpenAIChatModel

from .strict_server import ANTHROPIC_KEY, OPENAI_KEY, StrictServer


@pytest.fixture
def strict_server() -> Iterator[StrictServer]:
    """A strict OpenAI + Anthropic server on 127.0.0.1, stopped after the test."""
    server = StrictServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.errors, f"the strict server's handlers failed: {server.errors!r}"


class RecordingSleep:
    """Stands in for `asyncio.sleep` in retries: records each delay, yields once, returns."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture
def openai_model(strict_server: StrictServer, sleep: RecordingSleep) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-4o-mini",
        api_key=OPENAI_KEY,
        base_url=strict_server.openai_url,
        sleep=sleep,
        rng=random.Random(7),
    )


@pytest.fixture
def anthropic_model(strict_server: StrictServer, sleep: RecordingSleep) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-5",
        api_key=ANTHROPIC_KEY,
        base_url=strict_server.url,
        max_tokens=256,
        sleep=sleep,
        rng=random.Random(7),
    )
