"""What framework backends need from the store (ADR 0018), on both backends and paths.

Conversation keys, entries with positions, caller-minted event ids, state
that changes after creation by compare-and-set, and the tail replaced in one
transaction.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import (
    ConflictError,
    Expected,
    InvalidInputError,
    Ledger,
    NotFoundError,
    Position,
    Store,
)
from chatledger.store.ids import new_id
from chatledger.store.schema import branches, conversations, event_ids, events, runs, view_entries
from tests.helpers import turn, user


def counts(store: Store) -> tuple[int, ...]:
    with store.engine.connect() as conn:
        return tuple(
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (conversations, branches, events, runs, view_entries, event_ids)
        )


def head_flags_agree(ledger: Ledger, conversation_id: str) -> None:
    """The last event flagged `head` is where the conversation's head is."""
    flagged = [e for e in ledger.events(conversation_id=conversation_id) if e.head]
    conv = ledger.conversation(conversation_id)
    assert Position(flagged[-1].branch_id, flagged[-1].position) == conv.head
    assert ledger.verify(conversation_id).ok


# -- keys ---------------------------------------------------------------------------------


def test_a_conversation_is_found_by_its_key(ledger: Ledger) -> None:
    conv = ledger.create_conversation({"m": 1}, key="thread: 42 / é")
    found = ledger.conversation_by_key("thread: 42 / é")
    assert found == conv and found.key == "thread: 42 / é"
    assert ledger.conversation(conv.id).key == "thread: 42 / é"
    assert ledger.create_conversation().key is None
    fork = ledger.fork(conv.id, key="thread: 43")
    assert ledger.conversation_by_key("thread: 43") == fork == ledger.conversation(fork.id)
    assert fork.forked_from is not None


def test_a_key_is_unique_in_its_tenant_only(store: Store, ledger: Ledger) -> None:
    ledger.create_conversation(key="k")
    before = counts(store)
    with pytest.raises(ConflictError, match="key 'k' is taken"):
        ledger.create_conversation(key="k")
    with pytest.raises(ConflictError, match="key 'k' is taken"):
        ledger.fork(ledger.conversation_by_key("k").id, key="k")
    assert counts(store) == before
    # Another tenant has keys of its own: the same key is free there, and
    # this tenant's key is not found there.
    other = store.tenant(f"other-{uuid.uuid4().hex[:8]}")
    with pytest.raises(NotFoundError) as missing:
        other.conversation_by_key("k")
    assert "does not exist for tenant" in str(missing.value)
    assert other.create_conversation(key="k").key == "k"


def test_racing_creations_of_one_key_create_one_conversation(store: Store, ledger: Ledger) -> None:
    writers = 6
    start = threading.Barrier(writers)

    def create(_: int) -> str:
        start.wait()
        try:
            return ledger.create_conversation(key="raced").id
        except ConflictError:
            return "conflict"

    with ThreadPoolExecutor(writers) as pool:
        results = list(pool.map(create, range(writers)))
    created = [r for r in results if r != "conflict"]
    assert len(created) == 1
    assert ledger.conversation_by_key("raced").id == created[0]


@pytest.mark.parametrize("key", ["", "x" * 513, "nul\x00", 7, None])
def test_a_bad_key_is_refused_before_anything_is_written(
    store: Store, ledger: Ledger, key: Any
) -> None:
    before = counts(store)
    with pytest.raises(InvalidInputError):
        if key is None:
            ledger.conversation_by_key(key)
        else:
            ledger.create_conversation(key=key)
    assert counts(store) == before


# -- entries ------------------------------------------------------------------------------


def test_entries_are_the_messages_with_their_events(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, turn("a", "b", "c"))
    ledger.append_messages(conv.id, turn("d"))
    logged = {e.id: e for e in ledger.events(conversation_id=conv.id)}

    entries = ledger.entries(conv.id)
    assert [e.message for e in entries] == ledger.history(conv.id, repaired=False)
    for entry in entries:
        event = logged[entry.event_id]
        assert (entry.position, entry.seq) == (Position(event.branch_id, event.position), event.seq)
        assert entry.recorded_at == event.recorded_at and entry.message == event.message
        assert entry.conversation_id == conv.id
    assert ledger.entries(conv.id, last=2) == entries[-2:]
    assert ledger.entries(conv.id, last=10) == entries
    assert ledger.entries(conv.id, last=0) == []


def test_entries_at_a_position_follow_its_lineage_and_a_fork_its_source(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, turn("a", "b", "c"))
    old = ledger.entries(conv.id)
    ledger.append_messages(conv.id, turn("x"), after=old[0].position)

    assert [e.message.content for e in ledger.entries(conv.id)] == ["a", "x"]
    # The replaced tail is still in the log, on its branch.
    assert ledger.entries(conv.id, at=old[-1].position) == old
    assert ledger.entries(conv.id, at=old[-1].position, last=1) == old[-1:]
    fork = ledger.fork(conv.id, at=old[1].position)
    assert ledger.entries(fork.id) == old[:2]  # the source's entries, nothing copied
    assert {e.conversation_id for e in ledger.entries(fork.id)} == {conv.id}


@pytest.mark.parametrize("last", [-1, "2", 2.0, True])
def test_a_bad_last_is_refused(ledger: Ledger, last: Any) -> None:
    conv = ledger.create_conversation()
    with pytest.raises(InvalidInputError):
        ledger.entries(conv.id, last=last)


# -- caller-minted ids --------------------------------------------------------------------


def test_messages_keep_the_ids_their_caller_minted(
    store: Store, ledger: Ledger, ids_per_tenant: bool
) -> None:
    conv = ledger.create_conversation()
    ids = [new_id(), new_id(), new_id()]
    appended = ledger.append_messages(conv.id, turn("a", "b", "c"), ids=ids)

    assert [e.id for e in appended.events] == ids
    assert [e.event_id for e in ledger.entries(conv.id)] == ids
    assert appended.events == ledger.events(conversation_id=conv.id)[1:]
    found = ledger.entry(ids[1])
    assert (found.message.content, found.position, found.conversation_id) == (
        "b",
        Position(conv.head.branch_id, 3),
        conv.id,
    )
    # An id is taken for good, in every tenant (on Citus, in its tenant); nothing
    # of a refused append lands.
    other = store.tenant(f"other-{uuid.uuid4().hex[:8]}")
    theirs = other.create_conversation()
    before = counts(store)
    with pytest.raises(ConflictError) as mine:
        ledger.append_messages(conv.id, turn("again"), ids=[ids[0]])
    assert counts(store) == before
    if ids_per_tenant:
        other.append_messages(theirs.id, turn("again"), ids=[ids[0]])
        assert other.entry(ids[0]).conversation_id == theirs.id
        assert ledger.entry(ids[0]).conversation_id == conv.id
        return
    with pytest.raises(ConflictError) as across:
        other.append_messages(theirs.id, turn("again"), ids=[ids[0]])
    assert str(mine.value) == str(across.value)
    assert counts(store) == before


def test_an_entry_of_another_tenant_reads_as_missing(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    minted = new_id()
    unminted = ledger.append_messages(conv.id, turn("a")).events[0].id
    ledger.append_messages(conv.id, turn("b"), ids=[minted])
    other = store.tenant(f"other-{uuid.uuid4().hex[:8]}")

    def refusal(owner: Ledger, event_id: str) -> str:
        with pytest.raises(NotFoundError) as caught:
            owner.entry(event_id)
        return str(caught.value).replace(event_id, "<id>")

    assert refusal(other, minted) == refusal(other, new_id())
    # Only ids a caller minted are found: a store-minted one is not indexed.
    assert refusal(ledger, unminted) == refusal(ledger, new_id())


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ("not-a-list", "ids must be a list"),
        (["not-a-uuid"], "(?i)event id"),
        ([], "one id per message"),
        ([None], "(?i)event id"),
    ],
)
def test_bad_ids_are_refused_before_anything_is_written(
    store: Store, ledger: Ledger, ids: Any, says: str
) -> None:
    conv = ledger.create_conversation()
    before = counts(store)
    with pytest.raises(InvalidInputError, match=says):
        ledger.append_messages(conv.id, turn("a"), ids=ids)
    twice = new_id()
    with pytest.raises(InvalidInputError, match="same id twice"):
        ledger.append_messages(conv.id, turn("a", "b"), ids=[twice, twice])
    assert counts(store) == before


# -- the tail replaced in one transaction ------------------------------------------------


def test_a_turn_after_an_earlier_position_replaces_the_tail(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.append_messages(conv.id, turn("q", "a1"))
    head = first.head
    with pytest.raises(ConflictError):  # the head moved since `expected` was read
        ledger.append_messages(
            conv.id, turn("a2"), after=first.events[0].position, expected=Position(new_id(), 3)
        )
    replaced = ledger.append_messages(
        conv.id, turn("a2"), after=first.events[0].position, expected=head
    )
    assert [m.content for m in ledger.history(conv.id)] == ["q", "a2"]
    assert replaced.events[0].kind == "branch.created"  # an edit branch at position 2
    assert ledger.history(conv.id, at=head) == turn("q", "a1")
    # After the tip of the head's branch, the append continues it in place.
    tip = ledger.append_messages(conv.id, turn("more"), after=replaced.head)
    assert tip.events[0].kind == "message.recorded"
    head_flags_agree(ledger, conv.id)


# -- state ------------------------------------------------------------------------------


def test_state_changes_by_compare_and_set_as_events(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    assert conv.state == {}
    set_once = ledger.append_messages(conv.id, [], state={"revision": "r1", "usage": {"in": 3}})
    assert [e.kind for e in set_once.events] == ["state.changed"]
    assert ledger.conversation(conv.id).state == {"revision": "r1", "usage": {"in": 3}}

    before = counts(store)
    with pytest.raises(ConflictError, match="'revision' no longer holds its expected value"):
        ledger.append_messages(
            conv.id, [], state={"revision": "r2"}, expected=Expected(state={"revision": "r0"})
        )
    with pytest.raises(ConflictError):
        ledger.append_messages(
            conv.id,
            turn("x"),
            state={"revision": "r2"},
            expected=Expected(state={"revision": "r0"}),
        )
    with pytest.raises(ConflictError):
        ledger.move_head(
            conv.id, 1, state={"revision": "r2"}, expected=Expected(state={"revision": "r0"})
        )
    assert counts(store) == before

    appended = ledger.append_messages(
        conv.id,
        turn("q", "a"),
        state={"revision": "r2"},
        expected=Expected(state={"revision": "r1"}),
    )
    assert [e.kind for e in appended.events][-1] == "state.changed"
    assert appended.head == ledger.conversation(conv.id).head
    assert [m.content for m in ledger.history(conv.id)] == ["q", "a"]
    moved = ledger.move_head(
        conv.id,
        1,
        state={"revision": "r3"},
        expected=Expected(state={"revision": "r2", "gone": None}),
    )
    assert moved.state == {"revision": "r3"} and ledger.history(conv.id) == []
    changes = [
        e.payload for e in ledger.events(conversation_id=conv.id) if e.kind == "state.changed"
    ]
    assert [c["state"].get("revision") for c in changes] == ["r1", "r2", "r3"]
    head_flags_agree(ledger, conv.id)


def test_a_state_change_alone_is_an_append(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.append_messages(
        conv.id, [], state={"tip": "c1"}, expected=Expected(state={"tip": None})
    )
    assert [e.kind for e in first.events] == ["state.changed"] and first.head.position == 2
    before = counts(store)
    with pytest.raises(ConflictError):
        ledger.append_messages(
            conv.id, [], state={"tip": "c2"}, expected=Expected(state={"tip": "c0"})
        )
    with pytest.raises(InvalidInputError, match="at least one message, or a state"):
        ledger.append_messages(conv.id, [])
    assert counts(store) == before
    ledger.append_messages(
        conv.id, turn("q"), state={"tip": "c2"}, expected=Expected(state={"tip": "c1"})
    )
    run = new_id()
    aside = ledger.append_messages(conv.id, [], after=first.head, state={"tip": "c3"}, run_id=run)
    assert aside.head.branch_id != first.head.branch_id  # an edit branch after c1
    assert aside.events[-1].run_id == run
    assert ledger.conversation(conv.id).state == {"tip": "c3"} and ledger.history(conv.id) == []
    head_flags_agree(ledger, conv.id)


def test_state_changes_are_read_back_from_every_branch_and_a_forks_source(
    ledger: Ledger,
) -> None:
    conv = ledger.create_conversation()
    one = ledger.append_messages(conv.id, turn("q"), state={"n": 1})
    ledger.append_messages(conv.id, turn("a"), state={"n": 2})
    ledger.append_messages(conv.id, [], after=one.head, state={"n": 3})  # a branch after n=1
    changes = ledger.state_changes(conv.id)
    assert [e.payload["state"]["n"] for e in changes] == [1, 2, 3]
    assert {e.kind for e in changes} == {"state.changed"}
    assert changes[0].position == one.head.position and changes[0].branch_id == one.head.branch_id
    fork = ledger.fork(conv.id)  # at the head: n=1, then n=3
    ledger.append_messages(fork.id, [], state={"n": 4})
    inherited = ledger.state_changes(fork.id)
    assert [e.payload["state"]["n"] for e in inherited] == [1, 3, 4]
    assert [e.conversation_id for e in inherited] == [conv.id, conv.id, fork.id]


def test_state_changes_by_run_are_the_tenants_own(store: Store, ledger: Ledger) -> None:
    run = new_id()
    mine = ledger.create_conversation()
    ledger.append_messages(mine.id, turn("q"), state={"k": "mine"}, run_id=run)
    ledger.append_messages(mine.id, [], state={"k": "later"})
    theirs = store.tenant(f"{ledger.tenant}-other")
    other = theirs.create_conversation()
    theirs.append_messages(other.id, [], state={"k": "theirs"}, run_id=run)
    assert [e.payload for e in ledger.state_changes(run_id=run)] == [{"state": {"k": "mine"}}]
    assert ledger.state_changes(mine.id, run_id=run)[0].conversation_id == mine.id
    with pytest.raises(NotFoundError):
        ledger.state_changes(other.id)
    with pytest.raises(InvalidInputError, match="a conversation id, a run id, or both"):
        ledger.state_changes()


def test_state_changes_while_a_run_writes_past_the_head(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, turn("q"))
    cursor = ledger.runs.start(conv.id, owner="w")
    ledger.append_messages(conv.id, [], state={"s": 1})
    changed = ledger.conversation(conv.id)
    assert changed.state == {"s": 1} and [m.content for m in ledger.history(conv.id)] == ["q"]
    # A first append with create=True to a conversation whose head is not
    # open opens a branch; it created nothing.
    again = ledger.append_messages(conv.id, turn("r"), create=True)
    assert not again.created
    ledger.runs.fail(cursor, stage="model", error="stopped")
    head_flags_agree(ledger, conv.id)


@pytest.mark.parametrize(
    "options",
    [
        {"state": ["not", "a", "dict"]},
        {"state": {"when": {1}}},
        {"expected": Expected(state="r1")},  # type: ignore[arg-type]
        {"expected": Expected(state={"x": float("nan")})},
        {"after": "2"},
        {"after": -1},
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    store: Store, ledger: Ledger, options: dict[str, Any]
) -> None:
    conv = ledger.create_conversation()
    before = counts(store)
    with pytest.raises(InvalidInputError):
        ledger.append_messages(conv.id, turn("a"), **options)
    assert counts(store) == before


# -- edges the fast forms must decide as the general path does ---------------------------


def test_a_state_holding_nul_is_compared_and_set_like_any_other(
    store: Store, ledger: Ledger
) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [], state={"note": "a\x00b", "rev": 1})
    appended = ledger.append_messages(
        conv.id, turn("hi"), state={"rev": 2}, expected=Expected(state={"rev": 1})
    )
    assert ledger.conversation(conv.id).state == {"rev": 2}
    ledger.append_messages(conv.id, [], state={"note": "a\x00b"})
    before = counts(store)
    with pytest.raises(ConflictError):
        ledger.append_messages(conv.id, turn("x"), expected=Expected(state={"note": "a\x00c"}))
    assert counts(store) == before
    ledger.append_messages(conv.id, turn("y"), expected=Expected(state={"note": "a\x00b"}))
    assert appended.head.position < ledger.conversation(conv.id).head.position


def test_the_compare_and_set_tells_booleans_from_numbers(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(
        conv.id, [], state={"done": 1, "n": 0, "x": 1.0, "deep": [True, {"k": 2}]}
    )
    before = counts(store)
    for wrong in ({"done": True}, {"n": False}, {"deep": [1, {"k": 2}]}, {"deep": [True]}):
        with pytest.raises(ConflictError):
            ledger.append_messages(conv.id, turn("x"), expected=Expected(state=wrong))
        with pytest.raises(ConflictError):
            ledger.append_messages(conv.id, [], state={}, expected=Expected(state=wrong))
    assert counts(store) == before
    # Numbers compare by value, as JSON numbers do.
    ledger.append_messages(
        conv.id,
        turn("ok"),
        expected=Expected(state={"done": 1.0, "x": 1, "deep": [True, {"k": 2.0}]}),
    )


def test_a_replay_with_other_ids_is_a_key_conflict(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ids = [new_id()]
    original = ledger.append_messages(conv.id, turn("a"), ids=ids, idempotency_key="k")
    assert ledger.append_messages(conv.id, turn("a"), ids=ids, idempotency_key="k") == original
    before = counts(store)
    with pytest.raises(InvalidInputError, match="different append"):
        ledger.append_messages(conv.id, turn("a"), ids=[new_id()], idempotency_key="k")
    assert counts(store) == before


def test_a_turn_after_the_tip_of_the_heads_branch_keeps_the_view_whole(
    store: Store, ledger: Ledger
) -> None:
    """The head's branch may run past the head (a failed run's partial); a turn after
    its tip takes those messages into the history, and the view shows them."""
    from chatledger.store import NewEvent

    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, turn("hi"))
    cursor = ledger.runs.start(conv.id, owner="w", events=[NewEvent.of_message(user("partial"))])
    ledger.runs.fail(cursor, stage="model", error="boom")
    tip = max(e.position for e in ledger.events(conversation_id=conv.id))
    branch = ledger.events(conversation_id=conv.id)[-1].branch_id
    appended = ledger.append_messages(conv.id, turn("after"), after=Position(branch, tip))
    expected = ["hi", "partial", "after"]
    assert [m.content for m in ledger.history(conv.id)] == expected
    assert [m.content for m in ledger.history(conv.id, at=appended.head)] == expected
    assert [e.message.content for e in ledger.entries(conv.id)] == expected
    moved = ledger.move_head(conv.id, Position(branch, tip))
    assert [m.content for m in ledger.history(conv.id)] == ["hi", "partial"]
    store.rebuild()
    assert [m.content for m in ledger.history(conv.id)] == ["hi", "partial"]
    assert ledger.conversation(conv.id).head == moved.head


def test_a_state_too_large_is_refused(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    before = counts(store)
    with pytest.raises(InvalidInputError, match="state holds at most"):
        ledger.append_messages(conv.id, [], state={"big": "x" * (1024 * 1024)})
    assert counts(store) == before


@pytest.mark.parametrize(("backend", "fast_paths"), [("postgres", True)], indirect=True)
def test_racing_appends_of_one_minted_id_are_one_conflict(store: Store, ledger: Ledger) -> None:
    """Two appends to two conversations with the same new id: one lands, the other is
    the taken-id `ConflictError` (the fast statement's check runs in its snapshot)."""
    rounds = 20
    outcomes: list[str] = []
    for _ in range(rounds):
        convs = [ledger.create_conversation().id for _ in range(2)]
        minted = new_id()
        start = threading.Barrier(2)

        def append(cid: str, minted: str = minted, start: threading.Barrier = start) -> str:
            start.wait()
            try:
                ledger.append_messages(cid, turn("x"), ids=[minted])
            except ConflictError as error:
                assert "is taken" in str(error)
                return "conflict"
            return "ok"

        with ThreadPoolExecutor(2) as pool:
            outcomes += sorted(pool.map(append, convs))
    assert outcomes == ["conflict", "ok"] * rounds


@pytest.mark.parametrize(("backend", "fast_paths"), [("postgres", True)], indirect=True)
def test_racing_retries_of_one_key_write_once_and_replay(store: Store, ledger: Ledger) -> None:
    """Two retries of one append with one idempotency key, at once: one writes, the other
    returns what it wrote (the fast statement's key check runs in its snapshot)."""
    for round_ in range(20):
        conv = ledger.create_conversation().id
        start = threading.Barrier(2)

        def retry(_: int, conv: str = conv, start: threading.Barrier = start) -> Any:
            start.wait()
            return ledger.append_messages(conv, turn("once"), idempotency_key="k")

        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(retry, range(2))
        assert first.events == second.events, round_
        assert len(ledger.events(conversation_id=conv)) == 2
