"""ScriptedModel: canonical request bytes, scripted answers, streaming, exhaustion."""

from __future__ import annotations

import hashlib
import json

import pytest

from chatledger.engine.providers import (
    AnthropicModel,
    Delta,
    Model,
    ModelError,
    ModelHTTPError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    OpenAIChatModel,
    ScriptedModel,
)
from chatledger.store import Message, ThinkingPart, ToolCall, Usage

from . import histories as h

GOLDEN_BODY = (
    '{"messages":[{"content":"You are terse.","role":"system"},'
    '{"content":"Say ok.","role":"user"}],'
    '"settings":{"temperature":0},"stream":false,"tool_choice":"auto",'
    '"tools":[{"description":"","name":"clock","parameters":{"properties":{},"type":"object"}}]}'
)


def test_prepare_produces_canonical_json() -> None:
    model = ScriptedModel([])
    request = h.request(h.plain(), tools=[h.CLOCK], tool_choice="auto", settings={"temperature": 0})
    prepared = model.prepare(request)
    assert prepared.body.decode() == GOLDEN_BODY
    assert prepared.digest == hashlib.sha256(GOLDEN_BODY.encode()).hexdigest()
    assert model.prepare(request).body == prepared.body  # deterministic
    assert json.loads(model.prepare(request, stream=True).body)["stream"] is True


def test_prepare_dumps_messages_without_defaults_in_camel_case() -> None:
    history = h.with_tool_round()
    body = json.loads(ScriptedModel([]).prepare(h.request(history)).body)
    assert body["messages"][2]["toolCalls"][0] == {
        "arguments": '{"q":"ledger"}',
        "id": "call_1",
        "name": "lookup",
    }
    assert body["messages"][4] == {
        "failed": True,
        "role": "tool",
        "toolCallId": "call_2",
        "toolName": "lookup",
    }


async def test_answers_come_in_script_order_and_requests_are_recorded() -> None:
    call = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="clock")])
    canned = ModelResponse(message=Message(role="assistant", content="canned"), finish_reason="x")
    model = ScriptedModel([call, "plain text", canned])
    answers = []
    for _ in range(3):
        prepared = model.prepare(h.request(h.plain()))
        answers.append(await model.send(prepared))
    assert answers[0].message == call
    assert answers[0].finish_reason == "tool_calls"
    assert answers[1].message == Message(role="assistant", content="plain text")
    assert answers[1].finish_reason == "stop"
    assert answers[2] is canned
    assert len(model.requests) == 3
    assert model.remaining == 0


async def test_a_scripted_exception_is_raised() -> None:
    error = ModelHTTPError(
        "scripted outage",
        provider="scripted",
        status=503,
        body="",
        retry_after=None,
        url="",
        attempts=1,
    )
    model = ScriptedModel([error, "recovered"])
    with pytest.raises(ModelHTTPError) as caught:
        await model.send(model.prepare(h.request(h.plain())))
    assert caught.value is error
    assert (await model.send(model.prepare(h.request(h.plain())))).message.content == "recovered"


async def test_an_exhausted_script_raises_a_clear_model_error() -> None:
    model = ScriptedModel(["only one"], name="demo")
    await model.send(model.prepare(h.request(h.plain())))
    with pytest.raises(ModelError, match=r"received request 2, but its script holds only 1"):
        await model.send(model.prepare(h.request(h.plain())))


async def test_a_function_script_sees_each_request() -> None:
    def echo(request: ModelRequest) -> str:
        return f"echo: {request.messages[-1].text}"

    async def echo_async(request: ModelRequest) -> Message:
        return Message(role="assistant", content=f"async: {request.messages[-1].text}")

    for script, expected in [(echo, "echo: Say ok."), (echo_async, "async: Say ok.")]:
        model = ScriptedModel(script)
        response = await model.send(model.prepare(h.request(h.plain())))
        assert response.message.content == expected


async def test_a_non_assistant_answer_is_refused() -> None:
    model = ScriptedModel([Message(role="user", content="me?")])
    with pytest.raises(ModelResponseError, match="assistant"):
        await model.send(model.prepare(h.request(h.plain())))


async def test_streaming_splits_text_and_calls_into_deltas() -> None:
    answer = Message(
        role="assistant",
        content="Checking the clock now.",
        parts=[ThinkingPart(text="time?")],
        tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"q":"time"}')],
    )
    model = ScriptedModel([answer, answer])
    plain = await model.send(model.prepare(h.request(h.plain())))
    deltas: list[Delta] = []
    streamed = await model.send(
        model.prepare(h.request(h.plain()), stream=True), on_delta=deltas.append
    )
    assert streamed.message == plain.message
    texts = [d.text for d in deltas if d.kind == "text"]
    assert len(texts) == 3 and "".join(texts) == "Checking the clock now."
    assert "".join(d.text for d in deltas if d.kind == "thinking") == "time?"
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert (calls[0].tool_call_id, calls[0].tool_name) == ("c1", "lookup")
    assert "".join(d.arguments for d in calls) == '{"q":"time"}'


async def test_usage_is_a_deterministic_estimate() -> None:
    model = ScriptedModel(["abcdefgh", "abcdefgh"])
    first = await model.send(model.prepare(h.request(h.plain())))
    second = await model.send(model.prepare(h.request(h.plain())))
    body = model.prepare(h.request(h.plain())).body
    assert first.usage == second.usage == Usage(input_tokens=-(-len(body) // 4), output_tokens=2)


def test_every_adapter_satisfies_the_model_protocol() -> None:
    adapters = [
        ScriptedModel([]),
        OpenAIChatModel("m", api_key="k"),
        AnthropicModel("m", api_key="k"),
    ]
    assert all(isinstance(a, Model) for a in adapters)
    assert [a.name for a in adapters] == ["scripted:default", "openai:m", "anthropic:m"]
