"""Property-based tests of the history algorithms over generated histories.

The generated histories mix well-formed tool turns (parallel calls followed by
some, none, or duplicated results in any order) with loose messages of every
role: results placed before their calls or after later turns, results for
unknown ids or without an id (None or ""), calls without an id, reused call
ids, truncated arguments (non-JSON constants such as NaN included), and parts
of every kind with safe and unsafe URLs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chatledger.store import (
    DataPart,
    HistoryError,
    HistoryRepair,
    Message,
    SanitizeReport,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UnsafePart,
    UrlPart,
    _repair,
    _tails,
    budget_history,
    normalize_history,
    sanitize_history,
    trim_history,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NO_RESULT = (
    "No result was recorded for this tool call; it may not have run. "
    "Call the tool again if you still need its result."
)

# Each URL the generator uses, with the scheme sanitize must see in it.
URL_SCHEMES = {
    "https://example.com/a.png": "https",
    "HTTP://EXAMPLE.COM/b": "http",
    "hTTps:relative": "https",
    "javascript:alert(1)": "javascript",
    " JavaScript:alert(1)": "javascript",
    "file:///etc/passwd": "file",
    "data:text/html,<script>": "data",
    "http://[::1": "",
    "example.com/no-scheme": "",
    "": "",
}
SAFE_SCHEMES = {"http", "https"}

# --- strategies ------------------------------------------------------------------------

# None and "" are both "no id": such a call is never answered, and a result
# that names "" answers nothing.
call_ids = st.sampled_from([None, "", "c0", "c1", "c2", "c3"])
texts = st.sampled_from(["", "", "hi", "ok", "ünïcödé", "a\x00b"])
arguments = st.sampled_from(
    ["{}", '{"q": 1}', '{"q": "x"}', '{"q": ', "[1]", "", "null", '{"q": NaN}', '{"q": -Infinity}']
)

parts = st.lists(
    st.one_of(
        st.builds(TextPart, text=texts),
        st.builds(UrlPart, url=st.sampled_from(sorted(URL_SCHEMES))),
        st.builds(DataPart, media_type=st.just("image/png"), data=st.just("iVBORw0=")),
        st.builds(ThinkingPart, text=texts),
        st.builds(
            lambda src: UnknownPart.model_validate({"kind": "video", "src": src}),
            st.sampled_from(["javascript:x", "https://v"]),
        ),
    ),
    max_size=3,
)


def plain(role: str) -> st.SearchStrategy[Message]:
    return st.builds(lambda c, p: Message(role=role, content=c, parts=p), texts, parts)  # type: ignore[arg-type]


tool_calls = st.lists(
    st.builds(ToolCall, id=call_ids, name=st.sampled_from(["f", "g"]), arguments=arguments),
    min_size=1,
    max_size=4,
)
assistant_with_calls = st.builds(
    lambda calls, content, cid: Message(
        role="assistant", content=content, tool_calls=calls, conversation_id=cid
    ),
    tool_calls,
    texts,
    st.sampled_from([None, "conv"]),
)


def tool_result(
    call_id: str | None, content: str, failed: bool, part_list: list[object]
) -> Message:
    return Message.model_validate(
        {
            "role": "tool",
            "toolCallId": call_id,
            "toolName": "f",
            "content": content,
            "failed": failed,
            "parts": part_list,
        }
    )


loose_result = st.builds(tool_result, call_ids, texts, st.booleans(), parts)


@st.composite
def tool_turn(draw: st.DrawFn) -> list[Message]:
    """An assistant turn followed by results for some of its calls, in any order."""
    turn = draw(assistant_with_calls)
    # An empty id is kept here, so a result naming "" can follow a call with
    # the empty id: it must still be dropped.
    ids = [call.id for call in turn.tool_calls if call.id is not None]
    if not ids:
        return [turn]
    answered = draw(st.lists(st.sampled_from(ids), max_size=len(ids) + 1))
    results = [
        tool_result(call_id, draw(texts), draw(st.booleans()), draw(parts)) for call_id in answered
    ]
    return [turn, *results]


single = st.one_of(
    plain("user"),
    plain("user"),
    plain("assistant"),
    plain("system"),
    assistant_with_calls,
    loose_result,
).map(lambda message: [message])


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    chunks = draw(st.lists(st.one_of(single, tool_turn()), max_size=14))
    history = [message for chunk in chunks for message in chunk]
    # The oracles below find messages by identity; generated ones are distinct.
    assume(len({id(m) for m in history}) == len(history))
    return history


# --- the checker -----------------------------------------------------------------------


def blocks(messages: Sequence[Message]) -> list[tuple[int, list[int]]]:
    """Each assistant turn's index with the indexes of the tool messages right after it."""
    found: list[tuple[int, list[int]]] = []
    for index, message in enumerate(messages):
        if message.role == "assistant":
            found.append((index, []))
        elif message.role == "tool" and found and found[-1][0] + len(found[-1][1]) + 1 == index:
            found[-1][1].append(index)
    return found


def assert_well_paired(messages: Sequence[Message]) -> None:
    """Assert the shape every provider accepts.

    Every tool call with an id is answered exactly once, in one contiguous
    block of tool messages directly after the assistant turn that made it, and
    there is no tool message anywhere else.
    """
    in_blocks = 0
    for turn, results in blocks(messages):
        wanted = Counter(c.id for c in messages[turn].tool_calls if c.id)
        got = Counter(messages[r].tool_call_id for r in results)
        assert got == wanted, f"turn {turn} calls {dict(wanted)} but is answered by {dict(got)}"
        in_blocks += len(results)
    loose = sum(1 for m in messages if m.role == "tool")
    assert loose == in_blocks, "a tool message lies outside the block after its turn"


def check_repair(history: list[Message], repaired: list[Message], repair: HistoryRepair) -> None:
    """Check a normalize result against the input, independently of the algorithm."""
    assert_well_paired(repaired)
    position = {id(m): i for i, m in enumerate(history)}
    non_tool_in = [m for m in history if m.role != "tool"]
    non_tool_out = [m for m in repaired if m.role != "tool"]
    assert len(non_tool_in) == len(non_tool_out)
    assert all(a is b for a, b in zip(non_tool_in, non_tool_out, strict=True))

    synthesized: list[str] = []
    moved: list[int] = []
    kept: set[int] = set()
    for turn, results in blocks(repaired):
        turn_at = position[id(repaired[turn])]
        last_real = -1
        for r in results:
            message = repaired[r]
            at = position.get(id(message))
            if at is None:
                # Synthesized: neutral, fixed, before any real result of the turn.
                assert last_real == -1
                assert message.content == NO_RESULT and not message.failed
                assert message.run_id is None and message.conversation_id is None
                assert message.tool_call_id  # never for a call without an id
                synthesized.append(message.tool_call_id)
                continue
            # Real results: after their call, in recorded order.
            assert turn_at < at and last_real < at
            last_real = at
            kept.add(at)
            if any(history[k].role != "tool" for k in range(turn_at + 1, at)):
                moved.append(at)
    assert repair.synthesized == synthesized
    assert repair.moved == sorted(moved)
    assert repair.dropped == [
        i for i, m in enumerate(history) if m.role == "tool" and i not in kept
    ]
    assert repair.truncated == [
        c.id for m in history for c in m.tool_calls if c.id and not _strict_json_object(c.arguments)
    ]


def _strict_json_object(text: str) -> bool:
    """An oracle independent of `ToolCall.arguments_object`: strict JSON, an object."""

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        return isinstance(json.loads(text, parse_constant=refuse), dict)
    except ValueError:
        return False


def copy_of(history: list[Message]) -> list[Message]:
    return [
        Message.model_validate(json.loads(json.dumps(m.model_dump(mode="json")))) for m in history
    ]


# --- normalize -------------------------------------------------------------------------


@PROPERTY
@given(histories())
def test_normalize_answers_every_call_exactly_once_right_after_its_turn(
    history: list[Message],
) -> None:
    repaired, repair = normalize_history(history)
    check_repair(history, repaired, repair)


@PROPERTY
@given(histories())
def test_the_quick_well_formed_check_agrees_with_normalize(history: list[Message]) -> None:
    # Reads skip the repair when `well_formed` says so: it must never say so
    # of a history that normalize would change, and must say so of one that
    # normalize already repaired.
    repaired, report = normalize_history(history)
    if _repair.well_formed(history):
        assert repaired == history
        assert not (report.synthesized or report.dropped or report.moved)
    # It recognizes a repaired history, unless a turn reuses an id (then it
    # leaves the history to the full pass).
    ids_per_turn = [[c.id for c in m.tool_calls if c.id] for m in repaired]
    if all(len(set(ids)) == len(ids) for ids in ids_per_turn):
        assert _repair.well_formed(repaired)
    assert _repair.repaired(history) == repaired


@given(histories())
def test_normalize_is_idempotent(history: list[Message]) -> None:
    once, first = normalize_history(history)
    twice, second = normalize_history(once)
    assert twice == once
    assert all(a is b for a, b in zip(twice, once, strict=True))
    assert second == HistoryRepair(truncated=first.truncated)


@PROPERTY
@given(histories())
def test_normalize_is_deterministic(history: list[Message]) -> None:
    assert normalize_history(copy_of(history)) == normalize_history(history)


# --- sanitize --------------------------------------------------------------------------


def expected_unsafe(history: list[Message]) -> list[UnsafePart]:
    return [
        UnsafePart(message_index=i, kind="url", scheme=URL_SCHEMES[p.url])
        for i, m in enumerate(history)
        if m.role != "system"
        for p in m.parts
        if isinstance(p, UrlPart) and URL_SCHEMES[p.url] not in SAFE_SCHEMES
    ]


@PROPERTY
@given(histories())
def test_sanitize_drops_system_messages_and_unsafe_urls_and_answers_every_call(
    history: list[Message],
) -> None:
    cleaned, report = sanitize_history(history)
    assert_well_paired(cleaned)
    assert all(m.role != "system" for m in cleaned)
    assert report.system_prompts == sum(m.role == "system" for m in history)
    assert report.unsafe_parts == expected_unsafe(history)
    for message in cleaned:
        for part in message.parts:
            if isinstance(part, UrlPart):
                assert URL_SCHEMES[part.url] in SAFE_SCHEMES
    # Every part that is not a URL survives, except in dropped tool results.
    dropped = set(report.repair.dropped)
    given_parts = sum(
        not isinstance(p, UrlPart)
        for i, m in enumerate(history)
        if m.role != "system" and i not in dropped
        for p in m.parts
    )
    assert sum(not isinstance(p, UrlPart) for m in cleaned for p in m.parts) == given_parts


@PROPERTY
@given(histories())
def test_sanitize_never_removes_tool_results_and_reports_in_the_callers_indexes(
    history: list[Message],
) -> None:
    cleaned, report = sanitize_history(history)
    repair = report.repair
    for index in repair.dropped + repair.moved:
        assert history[index].role == "tool"
    assert set(repair.dropped).isdisjoint(repair.moved)
    given_results = sum(m.role == "tool" for m in history)
    real_results = sum(m.role == "tool" for m in cleaned) - len(repair.synthesized)
    assert real_results == given_results - len(repair.dropped)
    # A user message goes only when the drops emptied it.
    emptied = {
        part.message_index
        for part in report.unsafe_parts
        if history[part.message_index].role == "user"
        and not history[part.message_index].content
        and all(
            isinstance(p, UrlPart) and URL_SCHEMES[p.url] not in SAFE_SCHEMES
            for p in history[part.message_index].parts
        )
    }
    users_in = sum(m.role == "user" for m in history)
    assert sum(m.role == "user" for m in cleaned) == users_in - len(emptied)


@PROPERTY
@given(histories())
def test_sanitize_equals_dropping_then_normalizing(history: list[Message]) -> None:
    unsafe = expected_unsafe(history)
    touched = {part.message_index for part in unsafe}
    dropped: list[tuple[int, Message]] = []
    for i, m in enumerate(history):
        if m.role == "system":
            continue
        if i in touched:
            m = m.model_copy(
                update={
                    "parts": [
                        p
                        for p in m.parts
                        if not isinstance(p, UrlPart) or URL_SCHEMES[p.url] in SAFE_SCHEMES
                    ]
                }
            )
            if m.role == "user" and not m.content and not m.parts:
                continue
        dropped.append((i, m))
    repaired, repair = normalize_history([m for _, m in dropped])
    check_repair([m for _, m in dropped], repaired, repair)
    origin = [i for i, _ in dropped]

    cleaned, report = sanitize_history(history)
    assert cleaned == repaired
    assert report.repair == HistoryRepair(
        synthesized=repair.synthesized,
        dropped=[origin[i] for i in repair.dropped],
        moved=[origin[i] for i in repair.moved],
        truncated=repair.truncated,
    )


@PROPERTY
@given(histories())
def test_sanitize_is_idempotent_and_deterministic(history: list[Message]) -> None:
    once, first = sanitize_history(history)
    assert sanitize_history(copy_of(history)) == (once, first)
    twice, second = sanitize_history(once)
    assert twice == once
    assert second == SanitizeReport(repair=HistoryRepair(truncated=first.repair.truncated))


# --- trim and budget -------------------------------------------------------------------


def assert_cut_cleanly(history: list[Message], kept: list[Message]) -> None:
    """`kept` is a suffix of `history` that starts a request and splits no call from a result."""
    assert kept, "a cut history is never empty"
    assert kept[0].role == "user"
    assert all(a is b for a, b in zip(kept, history[len(history) - len(kept) :], strict=True))
    inside = {id(m) for m in kept}
    given = {id(m) for m in history}
    # The repair of the whole history says which real result answers which call.
    repaired, _ = normalize_history(history)
    for turn, results in blocks(repaired):
        turn_kept = id(repaired[turn]) in inside
        for r in results:
            if id(repaired[r]) in given:
                assert (id(repaired[r]) in inside) == turn_kept, "a call was split from its result"


@PROPERTY
@given(histories(), st.integers(min_value=1, max_value=30))
def test_trim_output_starts_with_a_user_message_and_never_splits_a_call(
    history: list[Message], limit: int
) -> None:
    try:
        kept = trim_history(limit)(history)
    except HistoryError:
        assert len(history) > limit
        return
    if len(history) <= limit:
        assert kept == history
        return
    assert len(kept) <= limit
    assert_cut_cleanly(history, kept)


@PROPERTY
@given(histories(), st.integers(min_value=1, max_value=30))
def test_trim_of_a_repaired_history_cuts_at_the_first_user_message_in_reach(
    history: list[Message], limit: int
) -> None:
    repaired, _ = normalize_history(history)
    window = repaired[-limit:]
    users = [i for i, m in enumerate(window) if m.role == "user"]
    if len(repaired) <= limit:
        assert trim_history(limit)(repaired) == repaired
    elif not users:
        with pytest.raises(HistoryError):
            trim_history(limit)(repaired)
    else:
        kept = trim_history(limit)(repaired)
        assert kept == window[users[0] :]
        assert_well_paired(kept)


def by_length(message: Message) -> int:
    return len(message.content) + 1


@PROPERTY
@given(histories(), st.integers(min_value=1, max_value=60))
def test_budget_output_fits_starts_with_a_user_message_and_never_splits_a_call(
    history: list[Message], budget: int
) -> None:
    total = sum(by_length(m) for m in history)
    try:
        kept = budget_history(by_length, budget)(history)
    except HistoryError:
        assert total > budget
        return
    if total <= budget:
        assert kept == history
        return
    assert sum(by_length(m) for m in kept) <= budget
    assert_cut_cleanly(history, kept)


@PROPERTY
@given(histories(), st.integers(min_value=1, max_value=60))
def test_budget_of_a_repaired_history_keeps_the_longest_fitting_run_from_a_user_message(
    history: list[Message], budget: int
) -> None:
    repaired, _ = normalize_history(history)
    start = len(repaired)
    while start > 0 and sum(by_length(m) for m in repaired[start - 1 :]) <= budget:
        start -= 1
    if start == 0:
        assert budget_history(by_length, budget)(repaired) == repaired
        return
    users = [i for i in range(start, len(repaired)) if repaired[i].role == "user"]
    if not users:
        with pytest.raises(HistoryError):
            budget_history(by_length, budget)(repaired)
        return
    kept = budget_history(by_length, budget)(repaired)
    assert kept == repaired[users[0] :]
    assert_well_paired(kept)


# --- the contract ----------------------------------------------------------------------


@PROPERTY
@given(histories())
def test_json_round_trip_is_lossless_and_byte_stable(history: list[Message]) -> None:
    for message in history:
        text = json.dumps(message.model_dump(mode="json"))
        loaded = Message.model_validate(json.loads(text))
        assert loaded == message
        assert json.dumps(loaded.model_dump(mode="json")) == text


def expected_append_repair(history: list[Message], k: int) -> HistoryRepair:
    """What repair does to `history[k:]` appended after `history[:k]`, read off the
    pairing of the whole: the appended messages' indexes, their own calls' ids."""
    pairing = _repair.pair(history)
    own_calls = [
        number
        for turn, (first, last) in pairing.turns.items()
        if turn >= k
        for number in range(first, last)
    ]
    return HistoryRepair(
        synthesized=[pairing.ids[n] for n in sorted(own_calls) if not pairing.answered[n]],
        dropped=[i - k for i in pairing.dropped if i >= k],
        moved=[i - k for i in pairing.moved if i >= k],
    )  # `truncated` names no repair: an append leaves it empty


@PROPERTY
@given(history=histories(), data=st.data())
def test_an_appends_repair_from_the_tail_it_follows_is_that_of_the_whole_history(
    history: list[Message], data: st.DataObject
) -> None:
    """`_tails.extend` knows the history before an append only by its `Tail` (the calls
    left open, where its last turn is), yet reports what `normalize_history` of the
    whole does to the appended messages; appends chained tail to tail agree too."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(history)), max_size=4)))
    tail: _tails.Tail | None = _tails.EMPTY_TAIL
    start = 0
    for cut in [*cuts, len(history)]:
        found = _tails.extend(tail, history[start:cut])
        assert found is not None
        repair, tail = found
        assert (repair or HistoryRepair()) == expected_append_repair(history[:cut], start)
        start = cut
    # Without the tail, the answer is the same whenever it can be given at all.
    for k in range(len(history) + 1):
        unknown = _tails.extend(None, history[k:])
        if unknown is not None:
            assert (unknown[0] or HistoryRepair()) == expected_append_repair(history, k)
            assert unknown[1] is None


def test_an_empty_append_leaves_the_tail_as_it_was() -> None:
    # Found by the property above: after a result, the last turn is still the
    # call's, and a result appended later (with nothing between) stays in place.
    call = Message(role="assistant", tool_calls=[ToolCall(id="c0", name="f", arguments="{}")] * 2)
    result = Message(role="tool", tool_call_id="c0", tool_name="f")
    found = _tails.extend(_tails.EMPTY_TAIL, [Message(role="user", content="hi"), call, result])
    assert found is not None and found[1] is not None
    tail = found[1]
    assert _tails.extend(tail, []) == (None, tail)
    assert _tails.extend(None, []) == (None, None)
    after = _tails.extend(tail, [result])
    assert after is not None and after[0] is None  # answered in place: nothing moved
