"""normalize_history: the pairing repair of tool calls and results."""

from __future__ import annotations

import pytest

from chatledger.store import HistoryRepair, Message, ToolCall, _repair, normalize_history
from tests.helpers import user

NO_RESULT = (
    "No result was recorded for this tool call; it may not have run. "
    "Call the tool again if you still need its result."
)


def calls(*ids: str | None, arguments: str = "{}") -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id=i, name=f"tool_{i}", arguments=arguments) for i in ids],
    )


def result(call_id: str | None, text: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, tool_name=f"tool_{call_id}", content=text)


def shape(messages: list[Message]) -> list[tuple[str, str | None, str]]:
    return [(m.role, m.tool_call_id, m.content) for m in messages]


def test_empty_history_is_returned_unchanged() -> None:
    assert normalize_history([]) == ([], HistoryRepair())


def test_history_without_tool_traffic_comes_back_as_the_same_objects() -> None:
    history = [user(), Message(role="assistant", content="answer"), user("again")]
    repaired, repair = normalize_history(history)
    assert all(a is b for a, b in zip(repaired, history, strict=True))
    assert repair == HistoryRepair()


def test_well_paired_history_comes_back_as_the_same_objects() -> None:
    history = [user(), calls("a", "b"), result("a"), result("b"), user("next")]
    repaired, repair = normalize_history(history)
    assert all(a is b for a, b in zip(repaired, history, strict=True))
    assert repair == HistoryRepair()


def test_call_without_result_gets_a_neutral_synthesized_result() -> None:
    history = [user(), calls("a")]
    repaired, repair = normalize_history(history)
    synthesized = repaired[2]
    assert synthesized == Message(
        role="tool", tool_call_id="a", tool_name="tool_a", content=NO_RESULT, failed=False
    )
    assert synthesized.run_id is None and synthesized.conversation_id is None
    assert repair.synthesized == ["a"]


def test_synthesized_result_is_placed_right_after_the_turn_that_made_the_call() -> None:
    history = [user(), calls("a"), user("next"), Message(role="assistant", content="done")]
    repaired, _ = normalize_history(history)
    assert shape(repaired) == [
        ("user", None, "question"),
        ("assistant", None, ""),
        ("tool", "a", NO_RESULT),
        ("user", None, "next"),
        ("assistant", None, "done"),
    ]


def test_synthesized_results_come_first_in_call_order_then_real_results_in_recorded_order() -> None:
    history = [user(), calls("a", "b", "c", "d"), result("d", "D"), result("b", "B")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[2:] == [
        ("tool", "a", NO_RESULT),
        ("tool", "c", NO_RESULT),
        ("tool", "d", "D"),
        ("tool", "b", "B"),
    ]
    assert repair.synthesized == ["a", "c"]
    assert repair.moved == []


def test_synthesized_results_are_identical_on_every_run() -> None:
    history = [user(), calls("a")]
    assert normalize_history(history) == normalize_history(history)


def test_result_placed_before_its_call_is_dropped() -> None:
    history = [user(), result("a"), calls("a")]
    repaired, repair = normalize_history(history)
    assert shape(repaired) == [
        ("user", None, "question"),
        ("assistant", None, ""),
        ("tool", "a", NO_RESULT),
    ]
    assert repair.dropped == [1]
    assert repair.synthesized == ["a"]


def test_result_whose_call_is_absent_is_dropped() -> None:
    history = [user(), calls("a"), result("a"), result("zzz")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[-1] == ("tool", "a", "ok")
    assert len(repaired) == 3
    assert repair.dropped == [3]


def test_tool_message_without_tool_call_id_is_dropped() -> None:
    history = [user(), calls("a"), result("a"), result(None)]
    repaired, repair = normalize_history(history)
    assert len(repaired) == 3
    assert repair.dropped == [3]


def test_duplicate_results_keep_the_first() -> None:
    history = [user(), calls("a"), result("a", "first"), result("a", "second"), user("x")]
    repaired, repair = normalize_history(history)
    assert shape(repaired) == [
        ("user", None, "question"),
        ("assistant", None, ""),
        ("tool", "a", "first"),
        ("user", None, "x"),
    ]
    assert repair.dropped == [3]


def test_calls_without_id_pass_through() -> None:
    turn = calls(None, "b")
    history = [user(), turn, result("b")]
    repaired, repair = normalize_history(history)
    assert repaired[1] is turn
    assert shape(repaired)[2:] == [("tool", "b", "ok")]
    assert repair == HistoryRepair()


def test_turn_with_only_calls_without_id_gets_no_synthesized_result() -> None:
    history = [user(), calls(None, None)]
    repaired, repair = normalize_history(history)
    assert repaired == history
    assert repair == HistoryRepair()


def test_a_call_with_an_empty_id_gets_no_synthesized_result() -> None:
    history = [user(), calls("")]
    repaired, repair = normalize_history(history)
    assert repaired == history
    assert repair == HistoryRepair()
    assert _repair.well_formed(history) and _repair.repaired(history) == history


def test_a_result_with_an_empty_id_answers_no_call_and_is_dropped() -> None:
    history = [user(), calls("", "b"), result(""), result("b")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[1:] == [("assistant", None, ""), ("tool", "b", "ok")]
    assert repair == HistoryRepair(dropped=[2])
    assert not _repair.well_formed(history) and _repair.repaired(history) == repaired


def test_truncated_arguments_are_reported_on_every_pass_and_kept_verbatim() -> None:
    cut = '{"city": "Par'
    history = [user(), calls("a", arguments=cut), result("a")]
    first, first_repair = normalize_history(history)
    second, second_repair = normalize_history(first)
    assert first_repair.truncated == ["a"] == second_repair.truncated
    assert second[1].tool_calls[0].arguments == cut
    assert second == history


def test_arguments_that_are_valid_json_but_not_an_object_are_reported_truncated() -> None:
    history = [user(), calls("a", arguments="[1, 2]"), result("a")]
    _, repair = normalize_history(history)
    assert repair.truncated == ["a"]


@pytest.mark.parametrize(
    "arguments", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": [1, NaN]}']
)
def test_arguments_with_non_json_constants_are_reported_truncated(arguments: str) -> None:
    history = [user(), calls("a", arguments=arguments), result("a")]
    repaired, repair = normalize_history(history)
    assert repair.truncated == ["a"]
    assert repaired[1].tool_calls[0].arguments == arguments


def test_strict_json_object_arguments_are_not_reported_truncated() -> None:
    history = [user(), calls("a", arguments='{"x": 1, "y": -1.5e3}'), result("a")]
    assert normalize_history(history)[1].truncated == []


def test_truncated_lists_call_ids_in_order_of_appearance() -> None:
    history = [
        user(),
        calls("b", "a", arguments="nope"),
        result("b"),
        result("a"),
        user(),
        calls("c", arguments="{"),
    ]
    _, repair = normalize_history(history)
    assert repair.truncated == ["b", "a", "c"]


def test_result_separated_from_its_call_by_a_user_turn_is_moved_up() -> None:
    history = [user(), calls("a"), user("impatient"), result("a", "late")]
    repaired, repair = normalize_history(history)
    assert shape(repaired) == [
        ("user", None, "question"),
        ("assistant", None, ""),
        ("tool", "a", "late"),
        ("user", None, "impatient"),
    ]
    assert repaired[2] is history[3]
    assert repair.moved == [3]
    assert repair.synthesized == []


def test_result_after_an_other_turns_block_is_moved_up_into_its_own_turn() -> None:
    history = [user(), calls("a"), calls("b"), result("b"), result("a")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[1:] == [
        ("assistant", None, ""),
        ("tool", "a", "ok"),
        ("assistant", None, ""),
        ("tool", "b", "ok"),
    ]
    assert repair.moved == [4]


def test_result_behind_a_dropped_tool_message_is_not_reported_moved() -> None:
    history = [user(), calls("a"), result("orphan"), result("a")]
    _, repair = normalize_history(history)
    assert repair.moved == []
    assert repair.dropped == [2]


def test_call_id_reused_by_a_later_turn_opens_a_new_call() -> None:
    history = [user(), calls("a"), result("a", "one"), user(), calls("a"), result("a", "two")]
    repaired, repair = normalize_history(history)
    assert repaired == history
    assert repair == HistoryRepair()


def test_result_after_a_turn_that_reuses_the_id_answers_that_later_turn() -> None:
    history = [user(), calls("a"), user(), calls("a"), result("a", "two")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[1:] == [
        ("assistant", None, ""),
        ("tool", "a", NO_RESULT),
        ("user", None, "question"),
        ("assistant", None, ""),
        ("tool", "a", "two"),
    ]
    assert repair.synthesized == ["a"]
    assert repair.moved == []


def test_result_answers_the_most_recent_open_call_with_its_id() -> None:
    # Both turns' calls are open when the results arrive: the first result
    # answers the later call, the second the earlier one.
    history = [user(), calls("a"), calls("a"), result("a", "one"), result("a", "two")]
    repaired, repair = normalize_history(history)
    assert shape(repaired)[1:] == [
        ("assistant", None, ""),
        ("tool", "a", "two"),
        ("assistant", None, ""),
        ("tool", "a", "one"),
    ]
    assert repair.moved == [4]


def test_report_indexes_refer_to_the_callers_list() -> None:
    history = [
        result("x"),  # 0: dropped, before any call
        user(),  # 1
        calls("a", "b"),  # 2: b is synthesized
        user("interrupt"),  # 3
        result("a"),  # 4: moved up
        result("a"),  # 5: duplicate, dropped
    ]
    _, repair = normalize_history(history)
    assert repair == HistoryRepair(synthesized=["b"], dropped=[0, 5], moved=[4])


def test_repair_is_idempotent() -> None:
    history = [result("x"), user(), calls("a", "b", None), user(), result("b"), calls("b")]
    once, _ = normalize_history(history)
    twice, repair = normalize_history(once)
    assert twice == once
    assert all(a is b for a, b in zip(twice, once, strict=True))
    assert repair == HistoryRepair()


def test_content_is_never_rewritten() -> None:
    history = [user(), calls("a"), user("x"), result("a", "payload \x00 kept")]
    repaired, _ = normalize_history(history)
    assert repaired[2] is history[3]


def test_the_callers_list_is_not_changed() -> None:
    history = [user(), calls("a"), user("x"), result("b")]
    snapshot = list(history)
    normalize_history(history)
    assert history == snapshot


def test_accepts_any_sequence() -> None:
    repaired, repair = normalize_history((user(), calls("a")))
    assert isinstance(repaired, list)
    assert repair.synthesized == ["a"]
