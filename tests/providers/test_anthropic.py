"""AnthropicModel against the strict server: wire shape, responses, streams, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatledger.engine.providers import (
    AnthropicModel,
    Delta,
    ModelConfigError,
    ModelHTTPError,
    ModelRequestError,
    ModelStreamError,
)
from chatledger.engine.providers._anthropic_wire import AnthropicStream
from chatledger.store import DataPart, Message, ThinkingPart, ToolCall, UnknownPart, UrlPart, Usage

from . import histories as h
from .sdk import validate
from .strict_server import ANTHROPIC_KEY, Call, Reply, StrictServer

pytest.importorskip("anthropic")


async def test_the_server_receives_exactly_the_prepared_bytes(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    prepared = anthropic_model.prepare(h.request(h.plain()))
    response = await anthropic_model.send(prepared)
    (received,) = strict_server.requests
    assert received.sha256 == prepared.digest
    assert received.headers["x-api-key"] == ANTHROPIC_KEY
    assert received.headers["anthropic-version"] == "2023-06-01"
    assert response.message == Message(role="assistant", content="ok")
    assert response.finish_reason == "end_turn"
    assert response.model_name == "claude-sonnet-4-5"


async def test_system_messages_become_the_top_level_system(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    await anthropic_model.send(anthropic_model.prepare(h.request(h.plain())))
    body = validate("anthropic", strict_server.requests[0].body)
    assert body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say ok."}]}],
    }


async def test_truncated_call_arguments_are_accepted_by_the_strict_server(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    prepared = anthropic_model.prepare(h.request(h.with_tool_round(h.TRUNCATED), tools=[h.LOOKUP]))
    await anthropic_model.send(prepared)
    body = validate("anthropic", strict_server.requests[0].body)
    uses = [b for b in body["messages"][1]["content"] if b["type"] == "tool_use"]
    assert [u["input"] for u in uses] == [{"truncated_args": h.TRUNCATED}, {"q": "event"}]


async def test_tool_results_are_grouped_in_the_next_user_message(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    await anthropic_model.send(anthropic_model.prepare(h.request(h.with_tool_round())))
    messages = validate("anthropic", strict_server.requests[0].body)["messages"]
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "ledger"}},
                {"type": "tool_use", "id": "call_2", "name": "lookup", "input": {"q": "event"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": "a book",
                    "is_error": False,
                },
                {"type": "tool_result", "tool_use_id": "call_2", "is_error": True},
                {"type": "text", "text": "Thanks. And now?"},
            ],
        },
    ]


@pytest.mark.parametrize(
    "history",
    [h.call_without_result, h.result_without_call, h.result_not_after_its_turn],
    ids=["call-without-result", "result-without-call", "result-not-after-its-turn"],
)
async def test_an_unrepaired_history_is_rejected_with_400_without_retry(
    anthropic_model: AnthropicModel, strict_server: StrictServer, history: Any
) -> None:
    with pytest.raises(ModelHTTPError) as caught:
        await anthropic_model.send(anthropic_model.prepare(h.request(history())))
    assert caught.value.status == 400
    assert caught.value.attempts == 1
    error = json.loads(caught.value.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert "tool_" in error["message"]
    assert len(strict_server.requests) == 1


async def test_consecutive_user_messages_merge_into_one(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    history = [Message(role="user", content="One."), Message(role="user", content="Two.")]
    await anthropic_model.send(anthropic_model.prepare(h.request(history)))
    messages = validate("anthropic", strict_server.requests[0].body)["messages"]
    assert messages == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        }
    ]


async def test_signed_thinking_is_replayed_and_unsigned_thinking_is_not(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    history = [
        Message(role="user", content="Hi."),
        Message(
            role="assistant",
            content="Hello.",
            parts=[
                ThinkingPart(text="greet", signature="sig-1"),
                ThinkingPart(text="from another provider"),
                UnknownPart(kind="redacted_thinking", data="opaque"),
            ],
        ),
        Message(role="user", content="Bye."),
    ]
    await anthropic_model.send(anthropic_model.prepare(h.request(history)))
    body = validate("anthropic", strict_server.requests[0].body)
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "greet", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Hello."},
    ]


async def test_url_and_data_parts_become_image_blocks(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    user = Message(
        role="user",
        content="Compare.",
        parts=[
            UrlPart(url="https://example.com/a.jpg", media_type="image/jpeg"),
            DataPart(media_type="image/png", data="iVBORw0KGgo="),
            DataPart(media_type="application/pdf", data="JVBERi0="),
        ],
    )
    await anthropic_model.send(anthropic_model.prepare(h.request([user])))
    content = validate("anthropic", strict_server.requests[0].body)["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "Compare."},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        },
    ]


def test_an_unsupported_data_part_is_refused_before_sending(
    anthropic_model: AnthropicModel,
) -> None:
    user = Message(role="user", parts=[DataPart(media_type="audio/wav", data="UklGRg==")])
    with pytest.raises(ModelRequestError, match="audio/wav"):
        anthropic_model.prepare(h.request([user]))


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("lookup", {"type": "tool", "name": "lookup"}),
    ],
)
async def test_tools_and_tool_choice_are_mapped(
    anthropic_model: AnthropicModel, strict_server: StrictServer, choice: str, wire: Any
) -> None:
    request = h.request(h.plain(), tools=[h.LOOKUP, h.CLOCK], tool_choice=choice)
    await anthropic_model.send(anthropic_model.prepare(request))
    body = validate("anthropic", strict_server.requests[0].body)
    assert body["tools"] == [
        {"name": "lookup", "description": "Look a word up.", "input_schema": h.LOOKUP.parameters},
        {"name": "clock", "input_schema": h.CLOCK.parameters},
    ]
    assert body["tool_choice"] == wire


async def test_usage_input_includes_cache_reads_and_writes(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(Reply(input_tokens=20, output_tokens=9, cache_read=100, cache_write=30))
    response = await anthropic_model.send(anthropic_model.prepare(h.request(h.plain())))
    assert response.usage == Usage(
        input_tokens=150, output_tokens=9, cache_read_tokens=100, cache_write_tokens=30
    )


_RICH = Reply(
    text="Two calls coming.",
    thinking="The user wants both.",
    signature="sig-xyz",
    calls=(Call("toolu_a", "lookup", '{"q": "alpha"}'), Call("toolu_b", "clock", "{}")),
    cache_read=3,
    cache_write=4,
)


async def test_a_response_with_tool_use_and_thinking_is_parsed(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(_RICH)
    response = await anthropic_model.send(anthropic_model.prepare(h.request(h.plain())))
    assert response.message == Message(
        role="assistant",
        content="Two calls coming.",
        parts=[ThinkingPart(text="The user wants both.", signature="sig-xyz")],
        tool_calls=[
            ToolCall(id="toolu_a", name="lookup", arguments='{"q":"alpha"}'),
            ToolCall(id="toolu_b", name="clock", arguments="{}"),
        ],
    )
    assert response.finish_reason == "tool_use"


async def test_a_streamed_response_equals_the_non_streamed_one(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    strict_server.enqueue(_RICH, _RICH)
    plain = await anthropic_model.send(anthropic_model.prepare(h.request(h.plain())))
    deltas: list[Delta] = []

    async def on_delta(delta: Delta) -> None:
        deltas.append(delta)

    prepared = anthropic_model.prepare(h.request(h.plain()), stream=True)
    streamed = await anthropic_model.send(prepared, on_delta=on_delta)
    assert streamed == plain
    assert validate("anthropic", strict_server.requests[1].body)["stream"] is True
    assert [d.kind for d in deltas][:3] == ["thinking", "thinking", "text"]
    assert "".join(d.text for d in deltas if d.kind == "text") == "Two calls coming."
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert [(d.index, d.tool_call_id, d.tool_name) for d in calls if d.tool_name] == [
        (0, "toolu_a", "lookup"),
        (1, "toolu_b", "clock"),
    ]
    assert "".join(d.arguments for d in calls if d.index == 0) == '{"q":"alpha"}'


@pytest.mark.parametrize("clean", [False, True], ids=["dropped-connection", "body-ended-early"])
async def test_a_stream_cut_off_midway_raises_a_stream_error(
    anthropic_model: AnthropicModel, strict_server: StrictServer, clean: bool
) -> None:
    strict_server.enqueue(Reply(text="abcdefghi", cut_after=4, clean_cut=clean))
    seen: list[str] = []
    prepared = anthropic_model.prepare(h.request(h.plain()), stream=True)
    with pytest.raises(ModelStreamError):
        await anthropic_model.send(prepared, on_delta=lambda d: seen.append(d.text))
    assert seen == ["abc"]
    assert len(strict_server.requests) == 1


def test_an_error_event_midway_raises_a_stream_error() -> None:
    state = AnthropicStream()
    state.feed("message_start", {"type": "message_start", "message": {"model": "m"}})
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(ModelStreamError, match="overloaded_error: Overloaded"):
        state.feed("error", error)


def test_a_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ModelConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-5")


async def test_a_wrong_key_is_a_401_that_is_not_retried(strict_server: StrictServer) -> None:
    model = AnthropicModel("claude-sonnet-4-5", api_key="wrong", base_url=strict_server.url)
    with pytest.raises(ModelHTTPError, match="ANTHROPIC_API_KEY") as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert caught.value.status == 401
    assert len(strict_server.requests) == 1


async def test_max_tokens_can_be_overridden_per_request(
    anthropic_model: AnthropicModel, strict_server: StrictServer
) -> None:
    request = h.request(h.plain(), settings={"max_tokens": 17, "stop_sequences": ["END"]})
    await anthropic_model.send(anthropic_model.prepare(request))
    body = validate("anthropic", strict_server.requests[0].body)
    assert (body["max_tokens"], body["stop_sequences"]) == (17, ["END"])
    assert list(body)[:2] == ["model", "max_tokens"]
