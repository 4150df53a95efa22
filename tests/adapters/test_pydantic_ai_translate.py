"""pydantic-ai messages through chatledger messages and back: lossless, and repair-ready."""

from __future__ import annotations

import itertools
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai import messages as pai
from pydantic_ai.usage import RequestUsage

from chatledger.adapters.pydantic_ai import from_messages, group_sizes, group_start, to_messages
from chatledger.store import InvalidInputError
from chatledger.store._repair import well_formed
from chatledger.store.history import normalize_history
from chatledger.store.messages import (
    DataPart,
    Message,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
    dump_message,
    load_messages,
)

ADAPTER = pai.ModelMessagesTypeAdapter
T0 = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
PNG = b"\x89PNG\r\n\x1a\n\x00\xff binary"


if hasattr(pai, "DataCapabilityPart"):  # pydantic-ai 2.78 and later

    @dataclass(kw_only=True)
    class ProgressPart(
        pai.DataCapabilityPart[str],
        namespace="tests",
        tag="progress_report",
        attributes=("task_id",),
    ):
        """A capability part of a kind of the application's own, as pydantic-ai defines one."""

        task_id: str


def capability_parts() -> list[Any]:
    """The installed pydantic-ai's capability parts (none before 2.78)."""
    if not hasattr(pai, "DataCapabilityPart"):
        return []
    return [
        ProgressPart(
            content="3 of 5 steps done.",
            source=pai.OperatorSource(),
            task_id="t1",
            timestamp=at(14),
        )
    ]


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def retry_prompt(content: Any, **kwargs: Any) -> Any:
    """The deprecated `RetryPromptPart`, as code written for older versions still builds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pai.RetryPromptPart(content, **kwargs)  # pyright: ignore[reportDeprecated]


def validated(data: dict[str, Any]) -> pai.ModelMessage:
    """A message built from its stored JSON form, for the parts that are easiest to write so."""
    return ADAPTER.validate_python([data])[0]


# -- the corpus ---------------------------------------------------------------------------


def corpus() -> dict[str, pai.ModelMessage]:
    usage = RequestUsage(
        input_tokens=120,
        cache_write_tokens=7,
        cache_read_tokens=30,
        output_tokens=45,
        details={"reasoning_tokens": 12},
    )
    return {
        "system and user prompts": pai.ModelRequest(
            parts=[
                pai.SystemPromptPart("You are terse.", timestamp=at(0), dynamic_ref="sys"),
                pai.UserPromptPart("What is in these? ünïcode ✓", timestamp=at(1)),
                pai.UserPromptPart(
                    [
                        "look:",
                        pai.TextContent("a text content", metadata={"k": 1}),
                        pai.ImageUrl("https://example.com/cat.png"),
                        pai.AudioUrl("https://example.com/a.mp3", media_type="audio/mpeg"),
                        pai.VideoUrl("https://example.com/v.mp4"),
                        pai.DocumentUrl("https://example.com/d.pdf", vendor_metadata={"x": 1}),
                        pai.BinaryContent(PNG, media_type="image/png"),
                        pai.CachePoint(ttl="1h"),
                        pai.UploadedFile(
                            "file-123", provider_name="openai", media_type="application/pdf"
                        ),
                    ],
                    timestamp=at(2),
                ),
            ],
            timestamp=at(3),
            instructions="Answer in one line.",
            run_id="run-1",
            conversation_id="conv-1",
            metadata={"trace": "abc"},
        ),
        "response with every projected part": pai.ModelResponse(
            parts=[
                pai.ThinkingPart("hmm", id="th1", signature="sig==", provider_name="anthropic"),
                pai.TextPart("Two calls.", id="t1", provider_details={"logprobs": [0.1]}),
                pai.ToolCallPart("get_weather", {"city": "Paris", "n": [1, 2]}, tool_call_id="c1"),
                pai.ToolCallPart("get_time", '{"tz": "CET" }', tool_call_id="c2", id="item2"),
                pai.ToolCallPart("no_args", None, tool_call_id="c3"),
                pai.TextPart(" And text."),
                pai.FilePart(pai.BinaryContent(PNG, media_type="image/png"), id="f1"),
            ],
            usage=usage,
            model_name="claude-x-2026",
            model_id="anthropic:claude-x",
            timestamp=at(4),
            provider_name="anthropic",
            provider_url="https://api.anthropic.com",
            provider_details={"timestamp": "2026-11-30T12:00:04Z"},
            provider_response_id="resp_1",
            finish_reason="tool_call",
            run_id="run-1",
            conversation_id="conv-1",
            metadata={"m": True},
        ),
        "tool returns": pai.ModelRequest(
            parts=[
                pai.ToolReturnPart(
                    "get_weather", {"temp": 21.5}, tool_call_id="c1", timestamp=at(5)
                ),
                pai.ToolReturnPart(
                    "get_time", "boom", tool_call_id="c2", outcome="failed", metadata={"why": 1}
                ),
                pai.ToolReturnPart("no_args", [at(6), b"\x00\x01"], tool_call_id="c3"),
                pai.UserPromptPart("and also this", timestamp=at(7)),
            ],
            run_id="run-1",
        ),
        "legacy retry prompts": pai.ModelRequest(
            parts=[
                retry_prompt(
                    "try again", tool_name="get_weather", tool_call_id="c9", timestamp=at(8)
                ),
                retry_prompt(
                    [{"type": "missing", "loc": ("a",), "msg": "Field required", "input": {}}],
                    timestamp=at(9),
                ),
            ]
        ),
        "retry feedback and retried return": pai.ModelRequest(
            parts=[
                pai.ToolReturnPart(
                    "get_weather",
                    "bad city",
                    tool_call_id="c8",
                    outcome="retried",
                    retry=pai.RetryInfo(cause="model_retry", attempt=1, max_retries=3),
                ),
                pai.RetryFeedbackPart(
                    "output was not valid",
                    retry=pai.RetryInfo(cause="model_retry"),
                    timestamp=at(10),
                ),
            ]
        ),
        "speech both ways": pai.ModelRequest(
            parts=[
                pai.SpeechPart(
                    speaker="user",
                    transcript="hello there",
                    audio=pai.BinaryContent(b"RIFF....", media_type="audio/wav"),
                    interrupted_at_ms=120,
                    timestamps=[
                        pai.SpeechTimestamp(
                            text="hello", start_ms=0, duration_ms=300, granularity="word"
                        )
                    ],
                    id="sp1",
                )
            ]
        ),
        "speech response": pai.ModelResponse(
            parts=[
                pai.SpeechPart(
                    speaker="assistant", transcript="hi!", id="sp2", provider_name="openai"
                )
            ],
            timestamp=at(11),
        ),
        "bookkeeping request parts": validated(
            {
                "kind": "request",
                "parts": [
                    {"part_kind": "tool-availability-delta", "tools_added": ["a", "b"]},
                    {"part_kind": "capability-load-delta", "loaded": ["web"], "tool_call_id": "c4"},
                    {"part_kind": "model-settings-delta", "settings": {"temperature": 0.2}},
                    {"part_kind": "instruction-delta", "id": "agent:main", "content": "Be kind."},
                    {
                        "part_kind": "instruction-baseline",
                        "instructions": [{"content": "Base.", "id": "agent"}],
                    },
                    {"part_kind": "compaction", "content": "summary so far", "metadata": {"n": 3}},
                ],
                "timestamp": "2026-11-30T12:00:12Z",
            }
        ),
        "empty interrupted request": pai.ModelRequest(parts=[], state="interrupted"),
        "typed tool calls and provider tools": pai.ModelResponse(
            parts=[
                pai.ToolSearchCallPart(args={"queries": ["weather"]}, tool_call_id="s1"),
                pai.LoadCapabilityCallPart(args={"id": "web"}, tool_call_id="l1"),
                pai.NativeToolSearchCallPart(
                    args={"queries": ["files"]}, tool_call_id="ns1", provider_name="anthropic"
                ),
                pai.NativeToolSearchReturnPart(
                    content={"discovered_tools": [{"name": "read_file"}]},
                    tool_call_id="ns1",
                    provider_name="anthropic",
                ),
                pai.NativeToolCallPart(
                    "web_search", {"q": "x"}, tool_call_id="b1", provider_name="openai"
                ),
                pai.NativeToolReturnPart(
                    "web_search", {"results": []}, tool_call_id="b1", provider_name="openai"
                ),
                pai.CompactionPart(content="encrypted", id="cmp2", provider_name="openai"),
            ],
            timestamp=at(13),
            state="incomplete",
        ),
        "typed tool returns": pai.ModelRequest(
            parts=[
                pai.ToolSearchReturnPart(
                    content={"discovered_tools": [{"name": "get_weather"}]}, tool_call_id="s1"
                ),
                pai.LoadCapabilityReturnPart(content={"message": "loaded"}, tool_call_id="l1"),
            ]
        ),
        "capability parts": pai.ModelRequest(
            parts=[*capability_parts(), pai.UserPromptPart("and now?", timestamp=at(15))]
        ),
    }


def members(union: Any) -> Iterator[tuple[str, type]]:
    """The discriminator tags of a pydantic-ai part union and the class each one validates to."""
    for member in typing.get_args(typing.get_args(union)[0]):
        cls, *metadata = typing.get_args(member)
        (tag,) = [m.tag for m in metadata if isinstance(m, pydantic.Tag)]
        while typing.get_origin(cls) is not None:  # SerializeAsAny[...] wraps a class
            cls = typing.get_args(cls)[0]
        yield tag, cls


def kinds_of(message: pai.ModelMessage) -> set[str]:
    """The union tags a message's parts are: by exact class, with the legacy retry tags."""
    union = pai.ModelRequestPart if isinstance(message, pai.ModelRequest) else pai.ModelResponsePart
    by_class: dict[type, str] = {}
    for tag, cls in members(union):
        by_class.setdefault(cls, tag)
    tags: set[str] = set()
    for part in message.parts:
        # A capability part is of a kind its application defines: a subclass of the member.
        tags.add(next(by_class[c] for c in type(part).__mro__ if c in by_class))
        if isinstance(part, pai.RetryPromptPart):  # pyright: ignore[reportDeprecated]
            tags.add("legacy-retry-tool-return" if part.tool_name else "legacy-retry-feedback")
    return tags


def test_the_corpus_holds_every_part_kind_of_the_installed_version() -> None:
    request_tags = {tag for tag, _ in members(pai.ModelRequestPart)}
    response_tags = {tag for tag, _ in members(pai.ModelResponsePart)}
    messages = corpus().values()
    requests = set().union(*(kinds_of(m) for m in messages if isinstance(m, pai.ModelRequest)))
    responses = set().union(*(kinds_of(m) for m in messages if isinstance(m, pai.ModelResponse)))
    assert request_tags - requests == set(), "add these request part kinds to the corpus"
    assert response_tags - responses == set(), "add these response part kinds to the corpus"
    # and every `part_kind` literal the part classes declare
    literals = {
        cls.__dataclass_fields__["part_kind"].default
        for union in (pai.ModelRequestPart, pai.ModelResponsePart)
        for _, cls in members(union)
    }
    seen = {p.part_kind for m in messages for p in m.parts}
    assert literals == seen


# -- the round trip ---------------------------------------------------------------------


def stored(messages: list[Message]) -> list[Message]:
    """Messages as the store gives them back: each dumped to its payload, then one parse."""
    return load_messages([dump_message(m) for m in messages])


def canonical(message: pai.ModelMessage) -> bytes:
    """What pydantic-ai itself reads back from its own serialization of `message`.

    For everything but the deprecated `RetryPromptPart` this is `message`'s own dump; a
    stored `RetryPromptPart` loads as the part it stands for, here as in pydantic-ai.
    """
    return ADAPTER.dump_json(ADAPTER.validate_python(ADAPTER.dump_python([message], mode="json")))


@pytest.mark.parametrize("name", list(corpus()))
def test_a_message_round_trips_byte_for_byte(name: str) -> None:
    message = corpus()[name]
    projected = to_messages(message)
    assert ADAPTER.dump_json(from_messages(projected)) == canonical(message)
    assert ADAPTER.dump_json(from_messages(stored(projected))) == canonical(message)
    if name != "legacy retry prompts":
        assert canonical(message) == ADAPTER.dump_json([message])


def test_the_whole_corpus_round_trips_as_one_history() -> None:
    messages = list(corpus().values())
    projected = [m for message in messages for m in to_messages(message)]
    back = from_messages(stored(projected))
    assert ADAPTER.dump_json(back) == b"[" + b",".join(canonical(m)[1:-1] for m in messages) + b"]"
    assert group_sizes(projected) == [len(to_messages(m)) for m in messages]


def test_every_message_of_a_group_is_marked_and_the_last_holds_native() -> None:
    message = corpus()["tool returns"]
    projected = stored(to_messages(message))
    assert [m.model_extra and m.model_extra["nativeGroup"] for m in projected] == [
        {"index": i, "count": 4} for i in range(4)
    ]
    assert [bool(m.model_extra and "native" in m.model_extra) for m in projected] == [
        False,
        False,
        False,
        True,
    ]
    last = projected[-1].model_extra
    assert last is not None
    assert last["native"] == ADAPTER.dump_python([message], mode="json")[0]


def test_pydantic_ai_run_and_conversation_ids_stay_in_native() -> None:
    for message in to_messages(corpus()["system and user prompts"]):
        assert message.run_id is None
        assert message.conversation_id is None
    last = to_messages(corpus()["system and user prompts"])[-1].model_extra or {}
    assert (last["native"]["run_id"], last["native"]["conversation_id"]) == ("run-1", "conv-1")


# -- the projection ---------------------------------------------------------------------


def test_a_request_projects_one_message_per_part() -> None:
    projected = to_messages(corpus()["system and user prompts"])
    assert [m.role for m in projected] == ["system", "user", "user"]
    assert projected[0].content == "You are terse."
    assert projected[1].content == "What is in these? ünïcode ✓"
    texts = [p.text for p in projected[2].parts if p.kind == "text"]
    assert texts == ["look:", "a text content"]
    urls = [p for p in projected[2].parts if isinstance(p, UrlPart)]
    assert [(u.url, u.media_type) for u in urls] == [
        ("https://example.com/cat.png", "image/png"),
        ("https://example.com/a.mp3", "audio/mpeg"),
        ("https://example.com/v.mp4", "video/mp4"),
        ("https://example.com/d.pdf", "application/pdf"),
    ]
    (data,) = [p for p in projected[2].parts if isinstance(p, DataPart)]
    assert data.media_type == "image/png"
    assert data.data == "iVBORw0KGgoA/yBiaW5hcnk="


def test_a_url_without_a_media_type_projects_without_one() -> None:
    message = pai.ModelRequest(
        [pai.UserPromptPart([pai.DocumentUrl("https://example.com/x?id=1")])]
    )
    (user,) = to_messages(message)
    assert user.parts == [UrlPart(url="https://example.com/x?id=1")]
    assert ADAPTER.dump_json(from_messages([user])) == ADAPTER.dump_json([message])


def test_tool_returns_project_as_tool_messages_ahead_of_the_rest() -> None:
    projected = to_messages(corpus()["tool returns"])
    assert [(m.role, m.tool_call_id, m.tool_name, m.failed) for m in projected] == [
        ("tool", "c1", "get_weather", False),
        ("tool", "c2", "get_time", True),
        ("tool", "c3", "no_args", False),
        ("user", None, None, False),
    ]
    assert projected[0].content == '{"temp":21.5}'
    assert projected[1].content == "boom"
    assert projected[2].content == '["2026-11-30T12:00:06.123456Z","AAE="]'


def test_retries_project_as_tool_results_or_user_feedback() -> None:
    legacy = to_messages(corpus()["legacy retry prompts"])
    assert [(m.role, m.tool_call_id) for m in legacy] == [("tool", "c9"), ("user", None)]
    assert "try again" in legacy[0].content
    assert "Field required" in legacy[1].content
    modern = to_messages(corpus()["retry feedback and retried return"])
    assert [(m.role, m.tool_call_id, m.failed) for m in modern] == [
        ("tool", "c8", False),
        ("user", None, False),
    ]
    assert "output was not valid" in modern[1].content


def test_a_response_projects_one_assistant_message() -> None:
    (message,) = to_messages(corpus()["response with every projected part"])
    assert message.role == "assistant"
    assert message.content == "Two calls.\n\n And text."
    assert message.tool_calls == [
        ToolCall(id="c1", name="get_weather", arguments='{"city":"Paris","n":[1,2]}'),
        ToolCall(id="c2", name="get_time", arguments='{"tz": "CET" }'),
        ToolCall(id="c3", name="no_args", arguments="{}"),
    ]
    assert message.parts[0] == ThinkingPart(text="hmm", signature="sig==")
    assert isinstance(message.parts[1], DataPart)


def test_part_kinds_without_a_field_become_unknown_parts() -> None:
    (message,) = to_messages(corpus()["typed tool calls and provider tools"])
    assert [c.name for c in message.tool_calls] == ["search_tools", "load_capability"]
    assert [p.kind for p in message.parts] == [
        "pydantic-ai.builtin-tool-call",
        "pydantic-ai.builtin-tool-return",
        "pydantic-ai.builtin-tool-call",
        "pydantic-ai.builtin-tool-return",
        "pydantic-ai.compaction",
    ]
    (speech,) = to_messages(corpus()["speech both ways"])
    assert (speech.role, speech.content) == ("user", "hello there")
    assert speech.parts == [UnknownPart(kind="pydantic-ai.speech")]


def test_a_request_of_bookkeeping_parts_is_one_system_message() -> None:
    (message,) = to_messages(corpus()["bookkeeping request parts"])
    assert (message.role, message.content) == ("system", "")
    assert [p.kind for p in message.parts] == [
        "pydantic-ai.tool-availability-delta",
        "pydantic-ai.capability-load-delta",
        "pydantic-ai.model-settings-delta",
        "pydantic-ai.instruction-delta",
        "pydantic-ai.instruction-baseline",
        "pydantic-ai.compaction",
    ]


def test_an_empty_request_is_one_empty_system_message() -> None:
    (message,) = to_messages(corpus()["empty interrupted request"])
    assert (message.role, message.content, message.parts) == ("system", "", [])


# -- what chatledger's repair needs -----------------------------------------------------


def test_a_grouped_turn_gives_repair_nothing_to_do() -> None:
    history = [
        pai.ModelRequest(parts=[pai.UserPromptPart("weather and time?")]),
        pai.ModelResponse(
            parts=[
                pai.ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="c1"),
                pai.ToolCallPart("get_time", {"tz": "CET"}, tool_call_id="c2"),
            ]
        ),
        pai.ModelRequest(
            parts=[
                pai.ToolReturnPart("get_weather", "sunny", tool_call_id="c1"),
                pai.ToolReturnPart("get_time", "12:00", tool_call_id="c2"),
            ]
        ),
        pai.ModelResponse(parts=[pai.TextPart("Sunny, noon.")]),
    ]
    projected = stored([m for message in history for m in to_messages(message)])
    assert well_formed(projected)
    repaired, report = normalize_history(projected)
    assert repaired == projected
    assert (report.synthesized, report.dropped, report.moved, report.truncated) == ([], [], [], [])


def test_the_typed_tool_parts_pair_like_plain_ones() -> None:
    messages = corpus()
    history = [messages["typed tool calls and provider tools"], messages["typed tool returns"]]
    assert well_formed([m for message in history for m in to_messages(message)])


# -- cut-short groups -------------------------------------------------------------------


def test_a_window_that_starts_inside_a_group_is_refused_and_group_start_says_where_to_begin() -> (
    None
):
    messages = corpus()
    projected = to_messages(messages["tool returns"]) + to_messages(messages["speech response"])
    window = projected[2:]
    with pytest.raises(InvalidInputError, match="starts inside a group"):
        from_messages(window)
    skip = group_start(window)
    assert skip == 2
    assert ADAPTER.dump_json(from_messages(window[skip:])) == ADAPTER.dump_json(
        [messages["speech response"]]
    )
    assert group_start(projected) == 0
    assert group_start([]) == 0
    assert group_start(projected[1:3]) == 2


def test_a_group_missing_its_end_is_refused() -> None:
    projected = to_messages(corpus()["tool returns"])
    with pytest.raises(InvalidInputError, match="cut short"):
        from_messages(projected[:-1])


def test_a_foreign_native_is_refused_with_a_sentence() -> None:
    message = Message.model_validate(
        {"role": "user", "native": {"type": "message"}, "nativeGroup": {"index": 0, "count": 1}}
    )
    with pytest.raises(InvalidInputError, match="not a pydantic-ai message"):
        from_messages([message])


# -- messages without native ------------------------------------------------------------


def test_messages_written_by_chatledger_convert_to_a_best_effort_history() -> None:
    history = [
        Message(role="system", content="Be brief."),
        Message(
            role="user",
            content="see",
            parts=[
                UrlPart(url="https://example.com/x.png", media_type="image/png"),
                DataPart(media_type="application/pdf", data="JVBERg=="),
            ],
        ),
        Message(
            role="assistant",
            content="calling",
            parts=[ThinkingPart(text="plan", signature="s")],
            tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"q":1}')],
        ),
        # a result repair synthesized: no toolName
        Message(role="tool", tool_call_id="c1", content="No result was recorded"),
        Message(role="user", content="thanks"),
        Message(role="assistant", content="welcome"),
    ]
    back = from_messages(stored(history))
    assert group_sizes(history) == [2, 1, 2, 1]
    first, call, result, answer = back
    assert isinstance(first, pai.ModelRequest)
    system, user = first.parts
    assert isinstance(system, pai.SystemPromptPart) and system.content == "Be brief."
    assert isinstance(user, pai.UserPromptPart)
    assert user.content == [
        "see",
        pai.ImageUrl("https://example.com/x.png", media_type="image/png"),
        pai.BinaryContent(b"%PDF", media_type="application/pdf"),
    ]
    assert isinstance(call, pai.ModelResponse)
    assert [type(p) for p in call.parts] == [pai.ThinkingPart, pai.TextPart, pai.ToolCallPart]
    assert call.tool_calls[0].args == '{"q":1}' and call.tool_calls[0].tool_call_id == "c1"
    assert isinstance(result, pai.ModelRequest)
    tool, thanks = result.parts
    assert isinstance(tool, pai.ToolReturnPart)
    assert (tool.tool_name, tool.tool_call_id, tool.outcome) == ("lookup", "c1", "success")
    assert isinstance(thanks, pai.UserPromptPart) and thanks.content == "thanks"
    assert isinstance(answer, pai.ModelResponse) and answer.text == "welcome"
    # and pydantic-ai accepts the result as a history
    assert ADAPTER.validate_json(ADAPTER.dump_json(back)) == back


def test_native_and_native_less_messages_mix() -> None:
    native = to_messages(corpus()["response with every projected part"])
    repaired_result = Message(role="tool", tool_call_id="c1", tool_name="get_weather", content="x")
    back = from_messages([*native, repaired_result])
    assert group_sizes([*native, repaired_result]) == [1, 1]
    assert ADAPTER.dump_json(back[:1]) == ADAPTER.dump_json(
        [corpus()["response with every projected part"]]
    )
    assert isinstance(back[1], pai.ModelRequest)


# -- any history, any window ------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_call_id = st.sampled_from(["c1", "c2", "c3"])
_request_part = st.one_of(
    st.builds(pai.SystemPromptPart, _text, timestamp=st.just(T0)),
    st.builds(pai.UserPromptPart, _text, timestamp=st.just(T0)),
    st.builds(
        pai.ToolReturnPart,
        st.just("t"),
        st.one_of(_text, st.dictionaries(_text, st.integers(), max_size=2)),
        tool_call_id=_call_id,
        timestamp=st.just(T0),
        outcome=st.sampled_from(["success", "failed", "denied"]),
    ),
    st.builds(pai.ToolAvailabilityDeltaPart, tools_added=st.lists(_text, max_size=2)),
)
_response_part = st.one_of(
    st.builds(pai.TextPart, _text),
    st.builds(pai.ThinkingPart, _text, signature=st.one_of(st.none(), _text)),
    st.builds(
        pai.ToolCallPart,
        st.just("t"),
        st.one_of(st.none(), _text, st.dictionaries(_text, st.integers(), max_size=2)),
        tool_call_id=_call_id,
    ),
)
_message = st.one_of(
    st.builds(pai.ModelRequest, st.lists(_request_part, max_size=4), timestamp=st.just(T0)),
    st.builds(pai.ModelResponse, st.lists(_response_part, max_size=4), timestamp=st.just(T0)),
)


@given(st.lists(_message, max_size=6), st.integers(min_value=0, max_value=30))
def test_any_history_round_trips_from_any_window_start(
    history: list[pai.ModelMessage], start: int
) -> None:
    projected = stored([m for message in history for m in to_messages(message)])
    assert ADAPTER.dump_json(from_messages(projected)) == ADAPTER.dump_json(history)
    sizes = group_sizes(projected)
    assert sizes == [len(to_messages(m)) for m in history]
    window = projected[start:]
    skip = group_start(window)
    # the window, from its first whole group, is the history's tail
    whole = from_messages(window[skip:])
    assert ADAPTER.dump_json(whole) == ADAPTER.dump_json(history[len(history) - len(whole) :])
    ends = set(itertools.accumulate(sizes, initial=0))
    assert min(start, len(projected)) + skip in ends
