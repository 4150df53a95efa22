"""The message contract: camelCase JSON, additive-only round trips, role rules."""

from __future__ import annotations

import gc
import json
from typing import Any

import pydantic
import pytest

from chatledger.store import (
    DataPart,
    InvalidInputError,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
    Usage,
)
from chatledger.store.messages import dump_message, load_message, load_messages


def round_trip(message: Message) -> tuple[str, Message]:
    text = json.dumps(message.model_dump(mode="json"))
    return text, Message.model_validate(json.loads(text))


def test_json_uses_camel_case_names() -> None:
    message = Message(
        role="tool", tool_call_id="c1", tool_name="search", run_id="r", conversation_id="v"
    )
    dumped = message.model_dump(mode="json")
    assert {"toolCallId", "toolName", "runId", "conversationId", "toolCalls"} <= dumped.keys()
    assert not {"tool_call_id", "tool_name", "run_id", "conversation_id"} & dumped.keys()
    part = UrlPart(url="https://x", media_type="image/png").model_dump()
    assert part["mediaType"] == "image/png"


def test_snake_case_and_camel_case_names_both_validate() -> None:
    by_alias = Message.model_validate({"role": "tool", "toolCallId": "c1"})
    by_name = Message.model_validate({"role": "tool", "tool_call_id": "c1"})
    assert by_alias == by_name
    assert by_alias.tool_call_id == "c1"


def test_unknown_message_fields_survive_a_round_trip() -> None:
    data = {"role": "user", "content": "hi", "replyTo": {"id": 7}, "tags": ["a"]}
    text, loaded = round_trip(Message.model_validate(data))
    assert json.loads(text)["replyTo"] == {"id": 7}
    assert loaded.model_extra == {"replyTo": {"id": 7}, "tags": ["a"]}


def test_unknown_part_kinds_survive_a_round_trip() -> None:
    video = {"kind": "video", "src": "https://x/v.mp4", "durationMs": 1200}
    message = Message.model_validate({"role": "user", "parts": [video]})
    assert isinstance(message.parts[0], UnknownPart)
    text, loaded = round_trip(message)
    assert json.loads(text)["parts"] == [video]
    assert json.loads(dump_message(loaded))["parts"] == [video]


def test_unknown_fields_of_known_parts_and_tool_calls_survive_a_round_trip() -> None:
    data = {
        "role": "assistant",
        "parts": [{"kind": "text", "text": "t", "cacheControl": "ephemeral"}],
        "toolCalls": [{"id": "c", "name": "f", "arguments": "{}", "index": 0}],
    }
    text, _ = round_trip(Message.model_validate(data))
    dumped = json.loads(text)
    assert dumped["parts"][0]["cacheControl"] == "ephemeral"
    assert dumped["toolCalls"][0]["index"] == 0


def every_kind_of_message() -> list[Message]:
    return [
        Message(role="system", content="be brief"),
        Message(
            role="user",
            content="look \u00e9\U0001f600 \x00",
            parts=[
                TextPart(text="t"),
                UrlPart(url="https://x/a.png", media_type="image/png"),
                DataPart(media_type="application/pdf", data="JVBERi0="),
                ThinkingPart(text="hm", signature="sig"),
                UnknownPart.model_validate({"kind": "video", "src": "v"}),
            ],
            conversation_id="conv",
        ),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", name="f", arguments='{"a": 1'), ToolCall(name="g")],
            run_id="run",
        ),
        Message(role="tool", tool_call_id="c1", tool_name="f", failed=True, content="boom"),
        Message.model_validate({"role": "user", "future": {"nested": [1, None, "x"]}}),
    ]


@pytest.mark.parametrize("message", every_kind_of_message(), ids=lambda m: m.role)
def test_json_round_trip_is_lossless_and_byte_for_byte_stable(message: Message) -> None:
    text, loaded = round_trip(message)
    assert loaded == message
    again, _ = round_trip(loaded)
    assert again == text


@pytest.mark.parametrize("message", every_kind_of_message(), ids=lambda m: m.role)
def test_dump_message_round_trip_is_lossless_and_stable(message: Message) -> None:
    text = dump_message(message)
    loaded = load_message(text)
    assert loaded == message
    assert dump_message(loaded) == text


def test_load_messages_reads_many_texts() -> None:
    messages = every_kind_of_message()
    assert load_messages([dump_message(m) for m in messages]) == messages


def test_tool_call_arguments_keep_the_verbatim_string() -> None:
    raw = '{"b": 1,  "a": [2]}'
    call = ToolCall(id="c", name="f", arguments=raw)
    assert call.arguments == raw
    dumped = Message(role="assistant", tool_calls=[call]).model_dump()
    assert dumped["toolCalls"][0]["arguments"] == raw


def test_tool_call_arguments_given_as_a_mapping_become_compact_json() -> None:
    assert ToolCall(name="f", arguments={"q": "é", "n": 1}).arguments == '{"q":"é","n":1}'  # type: ignore[arg-type]


@pytest.mark.parametrize("arguments", ['{"a": 1', "[1]", "3", "", "null"])
def test_arguments_object_is_none_when_the_arguments_are_not_a_json_object(
    arguments: str,
) -> None:
    assert ToolCall(name="f", arguments=arguments).arguments_object() is None


def test_arguments_object_parses_a_json_object() -> None:
    assert ToolCall(name="f", arguments='{"a": [1]}').arguments_object() == {"a": [1]}


@pytest.mark.parametrize("role", ["user", "system", "tool"])
def test_only_assistant_messages_carry_tool_calls(role: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="only assistant messages request tools"):
        Message.model_validate({"role": role, "toolCalls": [{"name": "f"}]})


@pytest.mark.parametrize("role", ["user", "system", "assistant"])
@pytest.mark.parametrize(
    "field", [{"toolCallId": "c"}, {"toolName": "f"}, {"failed": True}], ids=str
)
def test_tool_fields_belong_only_on_tool_messages(role: str, field: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError, match="belong on tool messages"):
        Message.model_validate({"role": role, **field})


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match="role"):
        load_message({"role": "developer", "content": "x"})


def test_malformed_json_is_rejected_with_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError):
        load_message('{"role": "user", ')


def test_messages_are_immutable() -> None:
    message = Message(role="user", content="x")
    with pytest.raises(pydantic.ValidationError):
        message.content = "y"  # type: ignore[misc]


def test_model_copy_derives_a_changed_message() -> None:
    message = Message(role="user", content="x")
    assert message.model_copy(update={"content": "y"}).content == "y"
    assert message.content == "x"


def test_kind_stays_in_a_dump_that_leaves_defaults_out() -> None:
    assert TextPart(text="t").model_dump(exclude_defaults=True) == {"kind": "text", "text": "t"}


def test_dump_message_leaves_defaults_out() -> None:
    assert json.loads(dump_message(Message(role="user", content="x"))) == {
        "role": "user",
        "content": "x",
    }


def test_dump_message_rejects_text_that_is_not_valid_unicode() -> None:
    with pytest.raises(InvalidInputError, match="surrogates"):
        dump_message(Message(role="user", content="\udc00"))


def test_text_joins_content_and_text_parts() -> None:
    message = Message(role="user", content="a", parts=[TextPart(text="b"), UrlPart(url="u")])
    assert message.text == "a\nb"


def test_usage_adds_up_and_keeps_unreported_cache_tokens_unset() -> None:
    total = Usage(input_tokens=1, output_tokens=2) + Usage(input_tokens=3, cache_read_tokens=4)
    assert total == Usage(input_tokens=4, output_tokens=2, cache_read_tokens=4)
    assert total.cache_write_tokens is None


def test_a_large_parse_runs_no_collection_and_leaves_the_collector_as_it_found_it() -> None:
    texts = [dump_message(Message(role="user", content=f"m{i}", parts=[])) for i in range(2000)]
    collections: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(phase)

    gc.callbacks.append(count)
    try:
        assert gc.isenabled()
        loaded = load_messages(texts)
        during = len(collections)  # before anything else allocates
        assert during == 0  # 2,000 messages' objects, and not one collection
        assert [m.content for m in loaded] == [f"m{i}" for i in range(2000)]
        assert gc.isenabled()
        with pytest.raises(InvalidInputError):
            load_messages([*texts, '{"role": "nobody"}'])
        assert gc.isenabled()  # turned back on after a refusal too
        gc.disable()
        try:
            load_messages(texts)
            assert not gc.isenabled()  # off stays off
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(count)
