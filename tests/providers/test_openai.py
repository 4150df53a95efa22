"""OpenAIChatModel against the strict server: wire shape, responses, streams, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from chatledger.engine.providers import (
    Delta,
    ModelConfigError,
    ModelHTTPError,
    ModelRequestError,
    ModelStreamError,
    OpenAIChatModel,
    ToolSpec,
)
from chatledger.store import DataPart, Message, TextPart, ThinkingPart, ToolCall, UrlPart, Usage

from . import histories as h
from .sdk import validate
from .strict_server import OPENAI_KEY, Call, Reply, StrictServer

pytest.importorskip("openai")


async def test_the_server_receives_exactly_the_prepared_bytes(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    prepared = openai_model.prepare(h.request(h.plain()))
    response = await openai_model.send(prepared)
    (received,) = strict_server.requests
    assert received.body == prepared.body
    assert received.sha256 == prepared.digest
    assert response.message == Message(role="assistant", content="ok")
    assert response.finish_reason == "stop"
    assert response.model_name == "gpt-4o-mini"


async def test_a_plain_request_is_a_valid_sdk_request(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    await openai_model.send(openai_model.prepare(h.request(h.plain())))
    body = validate("openai", strict_server.requests[0].body)
    assert body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say ok."},
        ],
    }
    assert strict_server.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"


async def test_truncated_call_arguments_are_accepted_by_the_strict_server(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    prepared = openai_model.prepare(h.request(h.with_tool_round(h.TRUNCATED), tools=[h.LOOKUP]))
    await openai_model.send(prepared)
    body = validate("openai", strict_server.requests[0].body)
    calls = body["messages"][2]["tool_calls"]
    assert calls[0]["function"]["arguments"] == json.dumps(
        {"truncated_args": h.TRUNCATED}, separators=(",", ":")
    )
    assert calls[1]["function"]["arguments"] == '{"q":"event"}'  # valid: sent verbatim


async def test_a_tool_round_maps_to_tool_messages_after_the_assistant_turn(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    await openai_model.send(openai_model.prepare(h.request(h.with_tool_round())))
    messages = validate("openai", strict_server.requests[0].body)["messages"]
    assert messages[2:5] == [
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q":"ledger"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q":"event"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a book"},
        {"role": "tool", "tool_call_id": "call_2", "content": ""},
    ]


@pytest.mark.parametrize(
    "history",
    [h.call_without_result, h.result_without_call, h.result_not_after_its_turn],
    ids=["call-without-result", "result-without-call", "result-not-after-its-turn"],
)
async def test_an_unrepaired_history_is_rejected_with_400_without_retry(
    openai_model: OpenAIChatModel, strict_server: StrictServer, history: Any
) -> None:
    with pytest.raises(ModelHTTPError) as caught:
        await openai_model.send(openai_model.prepare(h.request(history())))
    assert caught.value.status == 400
    assert caught.value.attempts == 1
    assert "tool" in json.loads(caught.value.body)["error"]["message"]
    assert len(strict_server.requests) == 1


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("lookup", {"type": "function", "function": {"name": "lookup"}}),
    ],
)
async def test_tools_and_tool_choice_are_mapped(
    openai_model: OpenAIChatModel, strict_server: StrictServer, choice: str, wire: Any
) -> None:
    request = h.request(h.plain(), tools=[h.LOOKUP, h.CLOCK], tool_choice=choice)
    await openai_model.send(openai_model.prepare(request))
    body = validate("openai", strict_server.requests[0].body)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": h.LOOKUP.parameters,
            },
        },
        {"type": "function", "function": {"name": "clock", "parameters": h.CLOCK.parameters}},
    ]
    assert body["tool_choice"] == wire


def test_a_tool_choice_naming_an_undeclared_tool_is_refused(
    openai_model: OpenAIChatModel,
) -> None:
    with pytest.raises(ModelRequestError, match="'search'"):
        openai_model.prepare(h.request(h.plain(), tools=[h.LOOKUP], tool_choice="search"))
    with pytest.raises(ModelRequestError, match="declares no tools"):
        openai_model.prepare(h.request(h.plain(), tool_choice="required"))


def test_auto_tool_choice_without_tools_is_left_out(openai_model: OpenAIChatModel) -> None:
    body = json.loads(openai_model.prepare(h.request(h.plain(), tool_choice="auto")).body)
    assert "tool_choice" not in body


async def test_user_parts_map_to_content_parts(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    user = Message(
        role="user",
        content="What is this?",
        parts=[
            UrlPart(url="https://example.com/cat.png", media_type="image/png"),
            UrlPart(url="https://example.com/unknown"),
            DataPart(media_type="image/png", data="iVBORw0KGgo="),
            TextPart(text="Be brief."),
            ThinkingPart(text="not sent"),
        ],
    )
    await openai_model.send(openai_model.prepare(h.request([user])))
    content = validate("openai", strict_server.requests[0].body)["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/unknown"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "Be brief."},
    ]


async def test_thinking_parts_are_not_sent(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    history = [
        Message(role="user", content="Hi."),
        Message(
            role="assistant", content="Hello.", parts=[ThinkingPart(text="hmm", signature="s")]
        ),
        Message(role="user", content="Bye."),
    ]
    await openai_model.send(openai_model.prepare(h.request(history)))
    body = validate("openai", strict_server.requests[0].body)
    assert body["messages"][1] == {"role": "assistant", "content": "Hello."}


def test_a_call_without_an_id_cannot_be_sent(openai_model: OpenAIChatModel) -> None:
    history = [
        Message(role="user", content="Go."),
        Message(role="assistant", tool_calls=[ToolCall(name="lookup")]),
    ]
    with pytest.raises(ModelRequestError, match="without an id"):
        openai_model.prepare(h.request(history))


async def test_usage_and_cached_tokens_are_mapped(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(Reply(input_tokens=120, output_tokens=9, cache_read=100))
    response = await openai_model.send(openai_model.prepare(h.request(h.plain())))
    assert response.usage == Usage(input_tokens=120, output_tokens=9, cache_read_tokens=100)


_RICH = Reply(
    text="Two calls coming.",
    thinking="The user wants both.",
    calls=(Call("call_a", "lookup", '{"q":"alpha"}'), Call("call_b", "clock", "{}")),
    cache_read=3,
)


async def test_a_response_with_tool_calls_and_reasoning_is_parsed(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(_RICH)
    response = await openai_model.send(openai_model.prepare(h.request(h.plain())))
    assert response.message == Message(
        role="assistant",
        content="Two calls coming.",
        parts=[ThinkingPart(text="The user wants both.")],
        tool_calls=[
            ToolCall(id="call_a", name="lookup", arguments='{"q":"alpha"}'),
            ToolCall(id="call_b", name="clock", arguments="{}"),
        ],
    )
    assert response.finish_reason == "tool_calls"


async def test_a_streamed_response_equals_the_non_streamed_one(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(_RICH, _RICH)
    plain = await openai_model.send(openai_model.prepare(h.request(h.plain())))
    deltas: list[Delta] = []

    async def on_delta(delta: Delta) -> None:
        deltas.append(delta)

    prepared = openai_model.prepare(h.request(h.plain()), stream=True)
    streamed = await openai_model.send(prepared, on_delta=on_delta)
    assert streamed == plain
    body = validate("openai", strict_server.requests[1].body)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "".join(d.text for d in deltas if d.kind == "text") == "Two calls coming."
    assert "".join(d.text for d in deltas if d.kind == "thinking") == "The user wants both."
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert [(d.index, d.tool_call_id, d.tool_name) for d in calls if d.tool_name] == [
        (0, "call_a", "lookup"),
        (1, "call_b", "clock"),
    ]
    assert "".join(d.arguments for d in calls if d.index == 0) == '{"q":"alpha"}'


async def test_deltas_reach_a_sync_callback_in_order(
    openai_model: OpenAIChatModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(Reply(text="abcdefghi"))
    seen: list[str] = []
    prepared = openai_model.prepare(h.request(h.plain()), stream=True)
    await openai_model.send(prepared, on_delta=lambda d: seen.append(d.text))
    assert seen == ["abc", "def", "ghi"]


@pytest.mark.parametrize("clean", [False, True], ids=["dropped-connection", "body-ended-early"])
async def test_a_stream_cut_off_midway_raises_a_stream_error(
    openai_model: OpenAIChatModel, strict_server: StrictServer, clean: bool
) -> None:
    strict_server.enqueue(Reply(text="abcdefghi", cut_after=3, clean_cut=clean))
    seen: list[str] = []
    prepared = openai_model.prepare(h.request(h.plain()), stream=True)
    with pytest.raises(ModelStreamError):
        await openai_model.send(prepared, on_delta=lambda d: seen.append(d.text))
    assert seen == ["abc", "def"]
    assert len(strict_server.requests) == 1  # a begun stream is not retried


def test_a_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o")


async def test_a_local_server_needs_no_key_and_a_401_is_not_retried(
    strict_server: StrictServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIChatModel("llama3", base_url=strict_server.openai_url)
    with pytest.raises(ModelHTTPError, match="OPENAI_API_KEY") as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert caught.value.status == 401
    assert "authorization" not in strict_server.requests[0].headers
    assert len(strict_server.requests) == 1


async def test_environment_configures_key_and_base_url(
    strict_server: StrictServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", strict_server.openai_url + "/")
    model = OpenAIChatModel("gpt-4o-mini")
    response = await model.send(model.prepare(h.request(h.plain())))
    assert response.message.content == "ok"


async def test_settings_are_merged_and_reserved_keys_refused(
    strict_server: StrictServer,
) -> None:
    model = OpenAIChatModel(
        "gpt-4o-mini",
        api_key=OPENAI_KEY,
        base_url=strict_server.openai_url,
        settings={"temperature": 0.5, "max_tokens": 50},
    )
    await model.send(model.prepare(h.request(h.plain(), settings={"temperature": 0.0})))
    body = validate("openai", strict_server.requests[0].body)
    assert (body["temperature"], body["max_tokens"]) == (0.0, 50)
    with pytest.raises(ModelRequestError, match="'stream'"):
        model.prepare(h.request(h.plain(), settings={"stream": True}))


async def test_an_injected_client_is_used_and_left_open(strict_server: StrictServer) -> None:
    async with httpx.AsyncClient() as client:
        model = OpenAIChatModel(
            "gpt-4o-mini", api_key=OPENAI_KEY, base_url=strict_server.openai_url, client=client
        )
        await model.send(model.prepare(h.request(h.plain())))
        await model.aclose()
        assert not client.is_closed


async def test_a_pooled_model_serves_several_requests(strict_server: StrictServer) -> None:
    async with OpenAIChatModel(
        "gpt-4o-mini", api_key=OPENAI_KEY, base_url=strict_server.openai_url
    ) as model:
        for _ in range(2):
            await model.send(model.prepare(h.request(h.plain())))
    assert len(strict_server.requests) == 2


def test_a_tool_with_default_schema_maps(openai_model: OpenAIChatModel) -> None:
    body = json.loads(openai_model.prepare(h.request(h.plain(), tools=[ToolSpec("x")])).body)
    assert body["tools"] == [
        {"type": "function", "function": {"name": "x", "parameters": ToolSpec("x").parameters}}
    ]
