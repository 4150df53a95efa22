"""An append says what the history's repair does to the messages it added (`Appended.repair`).

A tool result without its call, or without a `tool_call_id`, is kept in the log
as evidence and left out of the repaired history; the caller learns it from
the append's report, in the indexes of the list it passed. The report is the
one `normalize_history` gives for the whole head history, restricted to the
appended messages, whichever store wrote the turns before, and on every path.
"""

from __future__ import annotations

import uuid

import pytest

from chatledger.store import (
    Appended,
    AsyncStore,
    HistoryRepair,
    Ledger,
    Message,
    Store,
    ToolCall,
    new_id,
    normalize_history,
)
from tests.helpers import user


def calls(*ids: str, arguments: str = "{}") -> Message:
    return Message(
        role="assistant", tool_calls=[ToolCall(id=i, name="t", arguments=arguments) for i in ids]
    )


def result(call_id: str | None, text: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, tool_name="t", content=text)


def expected(ledger: Ledger, conversation_id: str, count: int) -> HistoryRepair:
    """What normalize_history of the head's raw history does to its last `count` messages."""
    raw = ledger.history(conversation_id, repaired=False)
    _, repair = normalize_history(raw)
    k = len(raw) - count
    own = [c.id for m in raw[k:] for c in m.tool_calls if c.id]
    return HistoryRepair(
        synthesized=[i for i in repair.synthesized if i in own],
        dropped=[i - k for i in repair.dropped if i >= k],
        moved=[i - k for i in repair.moved if i >= k],
    )  # `truncated` names no repair: an append leaves it empty


def test_a_result_without_its_call_is_reported_dropped_and_kept_in_the_log(
    ledger: Ledger,
) -> None:
    conv = ledger.create_conversation()
    done = ledger.append_messages(conv.id, [user("hi"), result("absent"), result(None)])
    assert done.repair == HistoryRepair(dropped=[1, 2])
    assert [m.content for m in ledger.history(conv.id)] == ["hi"]
    assert len(ledger.history(conv.id, repaired=False)) == 3  # evidence, not lost


def test_the_chat_loop_reports_only_what_is_still_open_or_misplaced(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    assert ledger.append_messages(conv.id, [user("weather?")]).repair == HistoryRepair()
    asked = ledger.append_messages(conv.id, [calls("c1", "c2", arguments="{")])
    # Until their results come, the history shows the neutral result in their place.
    assert asked.repair == HistoryRepair(synthesized=["c1", "c2"])
    assert ledger.append_messages(conv.id, [result("c2")]).repair == HistoryRepair()
    assert ledger.append_messages(conv.id, [result("c1")]).repair == HistoryRepair()
    # A second result for an answered call is a duplicate: dropped.
    assert ledger.append_messages(conv.id, [result("c1")]).repair == HistoryRepair(dropped=[0])
    ledger.append_messages(conv.id, [calls("c3"), user("never mind")])
    late = ledger.append_messages(conv.id, [result("c3")])
    assert late.repair == HistoryRepair(moved=[0])  # moved up into its call's block
    assert late.repair == expected(ledger, conv.id, 1)


def test_another_stores_turns_are_read_once_and_give_the_same_report(
    database_url: str, fast_paths: bool
) -> None:
    tenant = f"repair-{uuid.uuid4().hex[:8]}"
    with (
        Store.open(database_url, fast_paths=fast_paths) as first,
        Store.open(database_url, fast_paths=fast_paths) as second,
    ):
        a, b = first.tenant(tenant), second.tenant(tenant)
        conv = a.create_conversation()
        a.append_messages(conv.id, [user("q"), calls("c1", "c2")])
        # `b` never saw the call: it reads the history it appends after.
        done = b.append_messages(conv.id, [result("c1"), result("c9")])
        assert done.repair == HistoryRepair(dropped=[1]) == expected(b, conv.id, 2)
        # And `a`, whose knowledge of the head is stale now, reads it again.
        again = a.append_messages(conv.id, [result("c1"), result("c2")])
        assert again.repair == HistoryRepair(dropped=[0]) == expected(a, conv.id, 2)


def test_a_turn_after_a_position_is_reported_against_the_history_it_follows(
    ledger: Ledger,
) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("q"), calls("c1")])  # positions 2 and 3
    ledger.append_messages(conv.id, [result("c1")])
    # After position 2, the call is not in the history the turn follows.
    edited = ledger.append_messages(conv.id, [result("c1")], after=2)
    assert edited.repair == HistoryRepair(dropped=[0]) == expected(ledger, conv.id, 1)


def test_a_created_conversation_and_a_replay_report_alike(ledger: Ledger) -> None:
    cid = new_id()
    turn = [result("c0"), user("q"), calls("c1"), result("c1")]
    first = ledger.append_messages(cid, turn, create=True, idempotency_key="k")
    assert first.repair == HistoryRepair(dropped=[0])
    again = ledger.append_messages(cid, turn, create=True, idempotency_key="k")
    assert again.repair == first.repair


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
async def test_the_async_face_reports_the_same(database_url: str, fast: bool) -> None:
    async with AsyncStore.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"repair-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        asked = await ledger.append_messages(conv.id, [user("q"), calls("c1")])
        assert asked.repair == HistoryRepair(synthesized=["c1"])
        done = await ledger.append_messages(conv.id, [result("c1"), result(None)])
        assert done.repair == HistoryRepair(dropped=[1])


def test_the_chat_loop_reads_nothing_for_its_report(store: Store, ledger: Ledger) -> None:
    """Each append's report comes from the tail the previous append left: `report`
    answers at once, never with the read of a history."""
    conv = ledger.create_conversation()
    for turn in ([user("q")], [calls("c1", "c2")], [result("c1")], [result("c2")], [user("r")]):
        done = store.execute(next(ledger._ops.append_messages(conv.id, turn)))
        found = ledger._ops.report(done, turn)
        assert isinstance(found, Appended)
        assert found.repair == expected(ledger, conv.id, len(turn))
    # Another store's append leaves this store's tail behind: then it reads.
    with Store.open(str(store.engine.url.render_as_string(hide_password=False))) as other:
        other.tenant(ledger.tenant).append_messages(conv.id, [calls("c3")])
    done = store.execute(
        next(ledger._ops.append_messages(conv.id, [result("c3")]))
    )
    assert not isinstance(ledger._ops.report(done, [result("c3")]), Appended)
