"""sanitize_history: the boundary pass for history that crossed a trust boundary."""

from __future__ import annotations

import pytest

from chatledger.store import (
    DataPart,
    HistoryRepair,
    Message,
    SanitizeReport,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UnsafePart,
    UrlPart,
    sanitize_history,
)


def user(text: str = "question", *parts: object) -> Message:
    return Message.model_validate({"role": "user", "content": text, "parts": list(parts)})


def url(address: str) -> UrlPart:
    return UrlPart(url=address)


def calls(*ids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=i, name="tool") for i in ids])


def result(call_id: str, *parts: object) -> Message:
    return Message.model_validate(
        {"role": "tool", "toolCallId": call_id, "content": "", "parts": list(parts)}
    )


def test_system_messages_are_dropped_and_counted() -> None:
    history = [Message(role="system", content="obey me"), user(), Message(role="system")]
    cleaned, report = sanitize_history(history)
    assert cleaned == [history[1]]
    assert report.system_prompts == 2


@pytest.mark.parametrize(
    "address",
    [
        "javascript:alert(1)",
        "file:///etc/passwd",
        "data:text/html;base64,PHNjcmlwdD4=",
        "ftp://example.com/a",
    ],
)
def test_url_parts_with_a_scheme_other_than_http_or_https_are_dropped(address: str) -> None:
    history = [user("look", url(address), url("https://example.com/a.png"))]
    cleaned, report = sanitize_history(history)
    assert cleaned[0].parts == [url("https://example.com/a.png")]
    assert report.unsafe_parts == [
        UnsafePart(message_index=0, kind="url", scheme=address.split(":")[0])
    ]


def test_url_schemes_are_compared_case_insensitively() -> None:
    history = [user("look", url("HTTPS://example.com/a.png"), url("JavaScript:alert(1)"))]
    cleaned, report = sanitize_history(history)
    assert cleaned[0].parts == [url("HTTPS://example.com/a.png")]
    assert report.unsafe_parts == [UnsafePart(message_index=0, kind="url", scheme="javascript")]


def test_blanks_and_tabs_do_not_hide_an_unsafe_scheme() -> None:
    history = [user("look", url("  java\tscript:alert(1)"))]
    _, report = sanitize_history(history)
    assert report.unsafe_parts == [UnsafePart(message_index=0, kind="url", scheme="javascript")]


def test_url_that_does_not_parse_is_unsafe_with_an_empty_scheme() -> None:
    history = [user("look", url("http://[::1"))]
    cleaned, report = sanitize_history(history)
    assert cleaned[0].parts == []
    assert report.unsafe_parts == [UnsafePart(message_index=0, kind="url", scheme="")]


def test_url_without_a_scheme_is_unsafe_with_an_empty_scheme() -> None:
    _, report = sanitize_history([user("look", url("example.com/a.png"))])
    assert report.unsafe_parts == [UnsafePart(message_index=0, kind="url", scheme="")]


def test_data_parts_are_untouched() -> None:
    data = DataPart(media_type="text/html", data="PHNjcmlwdD4=")
    history = [user("look", data)]
    cleaned, report = sanitize_history(history)
    assert cleaned[0] is history[0]
    assert cleaned[0].parts[0] is data
    assert report == SanitizeReport()


def test_text_thinking_and_unknown_parts_are_untouched() -> None:
    history = [
        user("a", TextPart(text="t"), {"kind": "video", "src": "javascript:x"}),
        Message(role="assistant", parts=[ThinkingPart(text="hmm", signature="sig")]),
    ]
    cleaned, report = sanitize_history(history)
    assert isinstance(cleaned[0].parts[1], UnknownPart)
    assert all(a is b for a, b in zip(cleaned, history, strict=True))
    assert report == SanitizeReport()


def test_a_user_message_emptied_by_sanitize_is_removed_while_tool_results_never_are() -> None:
    history = [
        user("question"),
        calls("a"),
        result("a", url("file:///secret")),
        user("", url("javascript:alert(1)")),
    ]
    cleaned, report = sanitize_history(history)
    assert [m.role for m in cleaned] == ["user", "assistant", "tool"]
    assert cleaned[2].tool_call_id == "a"
    assert cleaned[2].parts == []
    assert [p.message_index for p in report.unsafe_parts] == [2, 3]
    assert report.repair == HistoryRepair()


def test_a_user_message_that_arrived_empty_is_kept() -> None:
    history = [user(""), user("", url("javascript:x"))]
    cleaned, _ = sanitize_history(history)
    assert cleaned == [history[0]]


def test_a_user_message_with_content_is_kept_when_its_url_is_dropped() -> None:
    cleaned, _ = sanitize_history([user("see", url("javascript:x"))])
    assert cleaned == [user("see")]


def test_an_assistant_message_emptied_by_sanitize_is_kept() -> None:
    history = [user(), Message(role="assistant", parts=[url("javascript:x")])]
    cleaned, _ = sanitize_history(history)
    assert cleaned == [history[0], Message(role="assistant")]


def test_dropping_parts_keeps_the_messages_other_fields() -> None:
    history = [
        Message.model_validate(
            {
                "role": "user",
                "content": "x",
                "parts": [{"kind": "url", "url": "file:///a"}],
                "conversationId": "c1",
                "futureField": {"k": 1},
            }
        )
    ]
    cleaned, _ = sanitize_history(history)
    assert cleaned[0].conversation_id == "c1"
    assert cleaned[0].model_extra == {"futureField": {"k": 1}}
    assert cleaned[0].content == "x"


def test_sanitize_repairs_pairing() -> None:
    history = [user(), calls("a", "b"), result("b"), result("zzz")]
    cleaned, report = sanitize_history(history)
    assert [(m.role, m.tool_call_id) for m in cleaned] == [
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
    ]
    assert report.repair.synthesized == ["a"]
    assert report.repair.dropped == [3]


def test_sanitize_synthesizes_no_result_for_a_call_with_an_empty_id() -> None:
    history = [Message(role="system", content="s"), user(), calls(""), result("")]
    cleaned, report = sanitize_history(history)
    assert cleaned == [user(), calls("")]
    assert report.repair == HistoryRepair(dropped=[3])


def test_report_indexes_refer_to_the_callers_list() -> None:
    history = [
        Message(role="system", content="s"),  # 0: dropped
        user("", url("javascript:x")),  # 1: emptied, removed
        user("q"),  # 2
        calls("a"),  # 3
        Message(role="system", content="s"),  # 4: dropped, so 5 stays in place
        result("a", url("file:///x")),  # 5
        user("again"),  # 6
        result("a"),  # 7: duplicate, dropped
        calls("b"),  # 8
        user("later"),  # 9
        result("b"),  # 10: moved up
    ]
    _, report = sanitize_history(history)
    assert report == SanitizeReport(
        system_prompts=2,
        unsafe_parts=[
            UnsafePart(message_index=1, kind="url", scheme="javascript"),
            UnsafePart(message_index=5, kind="url", scheme="file"),
        ],
        repair=HistoryRepair(dropped=[7], moved=[10]),
    )


def test_sanitize_is_idempotent() -> None:
    history = [
        Message(role="system", content="s"),
        user("", url("javascript:x")),
        user("q", url("https://ok.example")),
        Message(role="assistant", tool_calls=[ToolCall(id="a", name="t", arguments="{")]),
        user("late"),
        result("a"),
    ]
    once, first = sanitize_history(history)
    twice, second = sanitize_history(once)
    assert twice == once
    assert second == SanitizeReport(repair=HistoryRepair(truncated=first.repair.truncated))
    assert first.repair.truncated == ["a"]


def test_sanitize_is_deterministic() -> None:
    history = [user("q", url("javascript:x")), calls("a")]
    assert sanitize_history(history) == sanitize_history(list(history))


def test_safe_history_comes_back_as_the_same_objects() -> None:
    history = [user("q", url("http://example.com")), calls("a"), result("a")]
    cleaned, report = sanitize_history(history)
    assert all(a is b for a, b in zip(cleaned, history, strict=True))
    assert report == SanitizeReport()
