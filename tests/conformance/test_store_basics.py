"""The store's public operations, on every backend."""

from __future__ import annotations

import pytest

from chatledger.store import (
    ConflictError,
    InvalidInputError,
    Ledger,
    Message,
    NotFoundError,
    Position,
    Store,
    ToolCall,
)
from chatledger.store._ops import Operations
from tests.helpers import assistant, user


def test_new_conversation_has_empty_history_and_its_metadata(ledger: Ledger) -> None:
    conv = ledger.create_conversation({"user": "u1"})
    assert ledger.history(conv.id) == []
    assert ledger.conversation(conv.id).metadata == {"user": "u1"}
    assert conv.head.position == 1


def test_append_moves_head_and_history_returns_messages_in_order(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.append_messages(conv.id, [user("hi"), assistant("hello")])
    second = ledger.append_messages(conv.id, [user("again")])
    assert first.positions == [2, 3]
    assert second.positions == [4]
    assert ledger.conversation(conv.id).head == second.head
    assert [m.content for m in ledger.history(conv.id)] == ["hi", "hello", "again"]


def test_history_is_repaired_by_default_and_raw_on_request(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    call = ToolCall(id="c1", name="lookup", arguments="{}")
    ledger.append_messages(conv.id, [user("q"), Message(role="assistant", tool_calls=[call])])
    repaired = ledger.history(conv.id)
    raw = ledger.history(conv.id, repaired=False)
    assert len(raw) == 2
    assert [m.role for m in repaired] == ["user", "assistant", "tool"]
    assert repaired[2].tool_call_id == "c1"


def test_history_at_a_position_reads_the_past(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one")])
    ledger.append_messages(conv.id, [user("two")])
    assert [m.content for m in ledger.history(conv.id, at=2)] == ["one"]


def test_history_at_a_timestamp_reads_the_past(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.append_messages(conv.id, [user("one")])
    ledger.append_messages(conv.id, [user("two")])
    moment = first.events[-1].recorded_at
    assert [m.content for m in ledger.history(conv.id, at=moment)] == ["one"]
    assert ledger.history(conv.id, at=conv.created_at.replace(year=2000)) == []


def test_expected_position_conflict_names_both_positions(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one")], expected=1)
    with pytest.raises(ConflictError) as caught:
        ledger.append_messages(conv.id, [user("stale")], expected=1)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert "expected 1" in str(caught.value)
    assert [m.content for m in ledger.history(conv.id)] == ["one"]


def test_idempotent_retry_returns_the_original_append(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.append_messages(conv.id, [user("a"), user("b")], idempotency_key="k1")
    retry = ledger.append_messages(conv.id, [user("a"), user("b")], idempotency_key="k1")
    assert retry.positions == first.positions
    assert [e.seq for e in retry.events] == [e.seq for e in first.events]
    assert len(ledger.history(conv.id)) == 2


def test_idempotency_key_reused_for_other_content_is_refused(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("a")], idempotency_key="k1")
    with pytest.raises(InvalidInputError, match="different append"):
        ledger.append_messages(conv.id, [user("other")], idempotency_key="k1")


def test_another_tenants_conversation_is_not_found(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    other = store.tenant("someone-else")
    for call in (
        lambda: other.conversation(conv.id),
        lambda: other.history(conv.id),
        lambda: other.append_messages(conv.id, [user("x")]),
        lambda: other.fork(conv.id),
        lambda: other.events(conversation_id=conv.id),
    ):
        with pytest.raises(NotFoundError, match="does not exist for tenant 'someone-else'"):
            call()
    assert other.conversations() == []
    assert ledger.history(conv.id) == []


def test_missing_conversation_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(NotFoundError):
        ledger.history("01900000-0000-7000-8000-000000000000")


def test_malformed_id_is_invalid_input(ledger: Ledger) -> None:
    with pytest.raises(InvalidInputError, match="not a UUID"):
        ledger.history("not-an-id")


def test_conversations_are_listed_newest_first_by_keyset(ledger: Ledger) -> None:
    ids = [ledger.create_conversation().id for _ in range(5)]
    page1 = ledger.conversations(limit=2)
    page2 = ledger.conversations(limit=2, before=page1[-1].id)
    page3 = ledger.conversations(limit=2, before=page2[-1].id)
    listed = [c.id for c in page1 + page2 + page3]
    assert listed == list(reversed(ids))


def test_nul_characters_round_trip_exactly(ledger: Ledger) -> None:
    conv = ledger.create_conversation({"note": "a\x00b"})
    text = "before\x00after \u0000 end"
    ledger.append_messages(conv.id, [user(text)])
    assert ledger.history(conv.id)[0].content == text
    assert ledger.conversation(conv.id).metadata == {"note": "a\x00b"}


def test_lone_surrogates_are_refused_and_nothing_is_written(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    with pytest.raises(InvalidInputError, match="surrogates"):
        ledger.append_messages(conv.id, [user("fine"), user("bad \ud800")])
    assert ledger.history(conv.id) == []
    assert len(ledger.events(conversation_id=conv.id)) == 1


def test_ten_megabyte_message_round_trips(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    big = "é" + "x" * (10 * 1024 * 1024)
    ledger.append_messages(conv.id, [user(big)])
    assert ledger.history(conv.id)[0].content == big


def test_unknown_fields_survive_storage(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    message = Message.model_validate({"role": "user", "content": "x", "newField": {"a": 1}})
    ledger.append_messages(conv.id, [message])
    assert ledger.history(conv.id)[0].model_dump(mode="json") == message.model_dump(mode="json")


def test_bad_tenant_is_refused(store: Store) -> None:
    for bad in ("", "a\x00b", "x" * 201):
        with pytest.raises(InvalidInputError, match="tenant"):
            store.tenant(bad)


def test_events_are_the_raw_log_in_order(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("a")])
    events = ledger.events(conversation_id=conv.id)
    assert [e.kind for e in events] == ["conversation.created", "message.recorded"]
    assert [e.origin for e in events] == ["client", "client"]
    assert events[1].message == user("a")
    assert events[0].seq < events[1].seq


def test_an_append_returns_its_events_exactly_as_the_log_holds_them(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("first")])
    appended = ledger.append_messages(conv.id, [user(str(i)) for i in range(5)])
    logged = {e.seq: e for e in ledger.events(conversation_id=conv.id)}
    assert [e.position for e in appended.events] == [3, 4, 5, 6, 7]
    assert [logged.get(e.seq) for e in appended.events] == appended.events


def test_move_head_back_opens_an_edit_branch(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one")])
    ledger.append_messages(conv.id, [user("two")])
    moved = ledger.move_head(conv.id, 2)
    assert [m.content for m in ledger.history(conv.id)] == ["one"]
    assert moved.head.branch_id != conv.head.branch_id
    ledger.append_messages(conv.id, [user("edited")])
    assert [m.content for m in ledger.history(conv.id)] == ["one", "edited"]
    kinds = [e.kind for e in ledger.events(conversation_id=conv.id)]
    assert "head.moved" in kinds


def test_move_head_compare_and_set_refuses_a_stale_expectation(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one")])
    with pytest.raises(ConflictError):
        ledger.move_head(conv.id, 1, expected=conv.head)
    assert ledger.conversation(conv.id).head.position == 2


def test_position_off_the_branch_is_invalid(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    with pytest.raises(InvalidInputError, match="holds positions"):
        ledger.history(conv.id, at=Position(conv.head.branch_id, 5))
    with pytest.raises(InvalidInputError, match="head lineage"):
        ledger.history(conv.id, at=9)


def test_non_canonical_ids_are_refused_alike_on_every_backend(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    for spelling in (conv.id.upper(), "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"):
        with pytest.raises(InvalidInputError, match="canonical"):
            ledger.history(spelling)


def test_cached_and_uncached_reads_agree(database_url: str, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one"), assistant("two")])
    first = ledger.history(conv.id)
    ledger.append_messages(conv.id, [user("three")])
    second = ledger.history(conv.id)
    with Store.open(database_url, message_cache=0) as uncached:
        plain = uncached.tenant(ledger.tenant).history(conv.id)
    assert second == plain and second[:2] == first
    assert [m.content for m in second] == ["one", "two", "three"]


def test_a_read_inside_a_rolled_back_transaction_leaves_nothing_to_serve_later(
    store: Store, ledger: Ledger
) -> None:
    """A caller's transaction appends, reads its own append (at its position:
    a read that goes through the message cache) and rolls back. On SQLite the
    next append takes the same seq (a rowid is taken again): the message read
    inside must not stand in for the one committed later."""
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("kept")])
    ops = Operations(ledger.tenant, store.message_cache)
    with store.engine.connect() as caller:
        caller.begin()
        appended = store.execute(
            next(ops.append_messages(conv.id, [user("rolled back")])), caller
        )
        inside = store.execute(ops.history(conv.id, at=appended.head), caller)
        assert [m.content for m in inside] == ["kept", "rolled back"]
        caller.rollback()
    committed = ledger.append_messages(conv.id, [user("committed")])
    assert committed.head == appended.head
    for at in (None, committed.head):
        assert [m.content for m in ledger.history(conv.id, at=at)] == ["kept", "committed"]
