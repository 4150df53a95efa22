"""LangChain's messages to chatledger's `Message` and back (`adapters/langgraph/_translate.py`)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from chatledger.adapters.langgraph import from_message, to_message
from chatledger.store import DataPart, Message, TextPart, ThinkingPart, UnknownPart, UrlPart

SERDE = JsonPlusSerializer()

CORPUS: list[BaseMessage] = [
    HumanMessage(content="hi", id="h1", name="ada"),
    HumanMessage(
        content=[
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "image", "base64": "aGk=", "mime_type": "image/png"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,aGk="}},
            {"type": "video_call", "x": 1},
        ],
        id="h2",
    ),
    AIMessage(
        content="",
        tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}],
        invalid_tool_calls=[{"name": "add", "args": '{"a": 1', "id": "c2", "error": "cut"}],
        usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
        response_metadata={"model": "m"},
        id="a1",
    ),
    AIMessage(
        content=[{"type": "thinking", "thinking": "hmm", "signature": "s"}, "and so"], id="a2"
    ),
    ToolMessage(content="3", tool_call_id="c1", name="add", artifact={"raw": 3}, id="t1"),
    ToolMessage(content="no", tool_call_id="c2", status="error", id="t2"),
    SystemMessage(content="be brief", id="s1"),
    ChatMessage(role="developer", content="rules", id="d1"),
    ChatMessage(role="critic", content="meh", id="x1"),
    FunctionMessage(content="42", name="answer", id="f1"),
]


@pytest.mark.parametrize("message", CORPUS, ids=lambda m: str(m.id))
def test_a_message_comes_back_as_the_serializer_gives_it(message: BaseMessage) -> None:
    stored = Message.model_validate_json(to_message(message, SERDE).model_dump_json())
    assert from_message(stored, SERDE) == SERDE.loads_typed(SERDE.dumps_typed(message))


def projected(message: BaseMessage) -> dict[str, Any]:
    return to_message(message, SERDE).model_dump(exclude={"native"}, exclude_defaults=True)


def test_the_projection_is_what_chatledger_reads() -> None:
    assert projected(CORPUS[0]) == {"role": "user", "content": "hi"}
    parts = to_message(CORPUS[1], SERDE).parts
    assert parts == [
        TextPart(text="what is this?"),
        UrlPart(url="https://example.com/cat.png"),
        DataPart(media_type="image/png", data="aGk="),
        DataPart(media_type="image/jpeg", data="aGk="),
        UnknownPart(kind="langchain.video_call"),
    ]
    calls = to_message(CORPUS[2], SERDE).tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("c1", "add", '{"a":1,"b":2}'),
        ("c2", "add", '{"a": 1'),
    ]
    assert to_message(CORPUS[3], SERDE).parts == [
        ThinkingPart(text="hmm", signature="s"),
        TextPart(text="and so"),
    ]
    assert projected(CORPUS[4]) == {
        "role": "tool",
        "content": "3",
        "toolCallId": "c1",
        "toolName": "add",
    }
    assert projected(CORPUS[5])["failed"] is True
    assert [projected(m)["role"] for m in CORPUS[6:]] == ["system", "system", "user", "tool"]


def test_a_string_content_is_stored_once() -> None:
    text = "x" * 5000
    stored = to_message(HumanMessage(content=text, id="h"), SERDE)
    assert stored.content == text and text not in str(stored.model_extra)
    assert from_message(stored, SERDE).content == text


def test_a_message_without_a_native_copy_is_refused() -> None:
    with pytest.raises(ValueError, match="no LangChain message"):
        from_message(Message(role="user", content="hi"), SERDE)
