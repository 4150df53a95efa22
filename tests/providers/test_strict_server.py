"""The strict server itself rejects what the real providers reject (raw bodies, no adapter)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .sdk import validate
from .strict_server import ANTHROPIC_KEY, OPENAI_KEY, StrictServer

USER = {"role": "user", "content": "Hi."}


async def _post(url: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(url, content=json.dumps(body), headers=headers)


async def openai(server: StrictServer, body: Any, key: str | None = OPENAI_KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return await _post(f"{server.openai_url}/chat/completions", body, headers)


async def anthropic(
    server: StrictServer, body: Any, key: str | None = ANTHROPIC_KEY
) -> httpx.Response:
    headers = {"anthropic-version": "2023-06-01"} | ({"x-api-key": key} if key else {})
    return await _post(f"{server.url}/v1/messages", body, headers)


def _openai_call(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]


async def test_openai_rejects_invalid_json_function_arguments(strict_server: StrictServer) -> None:
    ok = await openai(strict_server, {"model": "m", "messages": _openai_call('{"a":1}')})
    bad = await openai(strict_server, {"model": "m", "messages": _openai_call('{"a":')})
    assert ok.status_code == 200
    assert bad.status_code == 400
    assert "valid JSON" in bad.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [{"messages": [USER]}, {"model": "m"}, {"model": "m", "messages": []}],
    ids=["no-model", "no-messages", "empty-messages"],
)
async def test_openai_rejects_missing_required_fields(
    strict_server: StrictServer, body: Any
) -> None:
    assert (await openai(strict_server, body)).status_code == 400


async def test_openai_requires_the_api_key(strict_server: StrictServer) -> None:
    response = await openai(strict_server, {"model": "m", "messages": [USER]}, key=None)
    assert response.status_code == 401
    assert "API key" in response.json()["error"]["message"]


async def test_anthropic_requires_alternating_roles_starting_with_user(
    strict_server: StrictServer,
) -> None:
    base = {"model": "m", "max_tokens": 5}
    twice = await anthropic(strict_server, base | {"messages": [USER, USER]})
    first = await anthropic(
        strict_server, base | {"messages": [{"role": "assistant", "content": "x"}]}
    )
    assert twice.status_code == first.status_code == 400
    assert "alternate" in twice.json()["error"]["message"]
    assert "first message" in first.json()["error"]["message"]


async def test_anthropic_requires_an_object_tool_input(strict_server: StrictServer) -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": '{"a":'}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    messages = [
        USER,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    response = await anthropic(strict_server, {"model": "m", "max_tokens": 5, "messages": messages})
    assert response.status_code == 400


async def test_anthropic_requires_tool_results_first_in_the_next_message(
    strict_server: StrictServer,
) -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    late = [{"type": "text", "text": "first"}, result]
    messages = [USER, {"role": "assistant", "content": [use]}, {"role": "user", "content": late}]
    response = await anthropic(strict_server, {"model": "m", "max_tokens": 5, "messages": messages})
    assert response.status_code == 400
    assert "at the beginning" in response.json()["error"]["message"]


@pytest.mark.parametrize("headers_key", [None, "wrong"], ids=["missing-key", "wrong-key"])
async def test_anthropic_requires_the_api_key(
    strict_server: StrictServer, headers_key: str | None
) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [USER]}
    response = await anthropic(strict_server, body, key=headers_key)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def test_sdk_validation_catches_unknown_fields() -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    with pytest.raises(AssertionError, match="do not know"):
        validate("openai", json.dumps({"model": "m", "messages": [USER], "bogus": 1}).encode())
    with pytest.raises(AssertionError, match="do not know"):
        body = {"model": "m", "max_tokens": 5, "messages": [USER | {"name": "x"}]}
        validate("anthropic", json.dumps(body).encode())
