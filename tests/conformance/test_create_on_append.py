"""A conversation created by its first append: `append_messages(create=True)`.

For a backend that mints its own conversation ids: the conversation and its
first turn land in one transaction (one statement on Postgres's fast path),
and every rule of both operations holds: tenancy, idempotency, `expected`,
the hash chain, racing writers.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import (
    ConflictError,
    InvalidInputError,
    Ledger,
    Message,
    NewConversation,
    Position,
    Store,
)
from chatledger.store._ops import Operations
from chatledger.store.ids import new_id
from chatledger.store.schema import branches, conversations, events, view_entries
from tests.helpers import turn
from tests.store.test_fast_paths import anonymized, counts, shape


def test_a_first_append_creates_the_conversation_and_appends_in_one_go(ledger: Ledger) -> None:
    cid = new_id()
    appended = ledger.append_messages(
        cid, turn("hello", "hi"), create=NewConversation(metadata={"user": "u1"})
    )

    assert appended.created
    assert appended.conversation_id == cid
    # Its events are `conversation.created` and the messages, as the log holds them.
    assert appended.events == ledger.events(conversation_id=cid)
    assert [(e.kind, e.position, e.head) for e in appended.events] == [
        ("conversation.created", 1, False),
        ("message.recorded", 2, False),
        ("message.recorded", 3, True),
    ]
    assert appended.head.position == 3
    conv = ledger.conversation(cid)
    assert conv.metadata == {"user": "u1"}
    assert conv.head == appended.head and conv.head_open
    assert [m.content for m in ledger.history(cid)] == ["hello", "hi"]
    assert [c.id for c in ledger.conversations()] == [cid]
    assert ledger.verify(cid).ok


def test_create_on_a_conversation_the_tenant_has_appends_to_it(ledger: Ledger) -> None:
    conv = ledger.create_conversation({"k": "v"})
    first = ledger.append_messages(conv.id, turn("one"), create=True)
    cid = new_id()
    ledger.append_messages(cid, turn("a"), create=True)
    second = ledger.append_messages(
        cid, turn("b"), create=NewConversation(metadata={"ignored": True})
    )

    assert not first.created and first.positions == [2]
    assert not second.created and second.positions == [3]
    # The metadata of an existing conversation stays as it was.
    assert ledger.conversation(conv.id).metadata == {"k": "v"}
    assert ledger.conversation(cid).metadata == {}
    kinds = [e.kind for e in ledger.events(conversation_id=cid)]
    assert kinds == ["conversation.created", "message.recorded", "message.recorded"]
    assert [m.content for m in ledger.history(cid)] == ["a", "b"]


def test_a_retried_first_append_with_its_key_returns_the_original(ledger: Ledger) -> None:
    cid = new_id()
    original = ledger.append_messages(cid, turn("x", "y"), create=True, idempotency_key="k")
    again = ledger.append_messages(cid, turn("x", "y"), create=True, idempotency_key="k")

    # The retry finds the conversation: it replays the messages it wrote.
    assert not again.created
    assert again.events == original.events[1:]
    assert again.head == original.head
    assert len(ledger.events(conversation_id=cid)) == 3
    with pytest.raises(InvalidInputError, match="different append"):
        ledger.append_messages(cid, turn("other"), create=True, idempotency_key="k")


def test_expected_counts_the_new_conversations_head(store: Store, ledger: Ledger) -> None:
    cid = new_id()
    before = counts(store.engine)
    for wrong in (0, 2):
        with pytest.raises(ConflictError) as caught:
            ledger.append_messages(cid, turn("x"), create=True, expected=wrong)
        assert (caught.value.expected, caught.value.actual) == (wrong, 1)
    assert counts(store.engine) == before  # the conversation was not created either

    # No caller knows a new conversation's branch: a head expected on one is refused.
    with pytest.raises(ConflictError):
        ledger.append_messages(cid, turn("x"), create=True, expected=Position(new_id(), 1))
    assert counts(store.engine) == before

    appended = ledger.append_messages(cid, turn("x"), create=True, expected=1)
    assert appended.created and appended.positions == [1, 2]


def test_another_tenants_id_is_the_taken_conflict_and_writes_nothing(
    store: Store, ids_per_tenant: bool
) -> None:
    owner = store.tenant(f"owner-{uuid.uuid4().hex[:8]}")
    other = store.tenant(f"other-{uuid.uuid4().hex[:8]}")
    cid = owner.create_conversation().id
    with pytest.raises(ConflictError) as taken:
        owner.create_conversation(conversation_id=cid)
    before = counts(store.engine)
    if ids_per_tenant:  # on Citus the id is free in another tenant: a conversation of its own
        assert other.append_messages(cid, turn("mine"), create=True).created
        assert [c.id for c in other.conversations()] == [cid]
        assert [m.content for m in other.history(cid)] == ["mine"]
        assert [e.kind for e in owner.events(conversation_id=cid)] == ["conversation.created"]
        return

    with pytest.raises(ConflictError) as caught:
        other.append_messages(cid, turn("mine now?"), create=True)

    assert str(caught.value) == str(taken.value)
    assert counts(store.engine) == before
    assert other.conversations() == []
    assert [e.kind for e in owner.events(conversation_id=cid)] == ["conversation.created"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"create": "yes"}, "create is True, False or a NewConversation"),
        ({"create": 1}, "create is True, False or a NewConversation"),
        ({"create": {"metadata": {"k": "v"}}}, "create is True, False or a NewConversation"),
        ({"create": NewConversation(metadata=["a"])}, "metadata must be a dict"),  # type: ignore[arg-type]
        ({"create": NewConversation(metadata={"when": {1, 2}})}, "metadata"),
    ],
)
def test_bad_create_options_are_refused_before_anything_is_written(
    store: Store, ledger: Ledger, options: dict[str, Any], says: str
) -> None:
    before = counts(store.engine)
    with pytest.raises(InvalidInputError, match=says):
        ledger.append_messages(new_id(), turn("x"), **options)
    assert counts(store.engine) == before


def test_racing_first_appends_of_one_id_all_land_and_one_creates(
    store: Store, ledger: Ledger
) -> None:
    cid = new_id()
    writers = 8
    start = threading.Barrier(writers)

    def first_append(w: int) -> bool:
        start.wait()
        return ledger.append_messages(cid, turn(f"from {w}"), create=True).created

    with ThreadPoolExecutor(writers) as pool:
        created = list(pool.map(first_append, range(writers)))

    assert created.count(True) == 1
    logged = ledger.events(conversation_id=cid)
    assert [e.position for e in logged] == list(range(1, writers + 2))
    assert [e.kind for e in logged].count("conversation.created") == 1
    assert sorted(m.content for m in ledger.history(cid)) == sorted(
        f"from {w}" for w in range(writers)
    )
    assert ledger.verify(cid).ok


@pytest.mark.parametrize(
    ("backend", "fast_paths"),
    [("postgres", True), ("postgres", False)],  # SQLite has one writer at a time: none waits
    indirect=True,
)
def test_a_first_append_that_waits_on_a_concurrent_creation_appends_to_it(
    store: Store, ledger: Ledger
) -> None:
    """The other writer's conversation is uncommitted when this append tries to
    create it; once it commits, this append goes after its first turn."""
    cid = new_id()
    with store.engine.connect() as holder, holder.begin():
        ops = Operations(ledger.tenant, store.message_cache)
        first = next(ops.append_messages(cid, turn("first"), create=True))
        assert store.execute(first, holder).created
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(ledger.append_messages, cid, turn("second"), create=True)
            wait_for_a_lock_wait(store)
            assert not waiting.done()
            holder.commit()
            appended = waiting.result(timeout=30)

    assert not appended.created and appended.positions == [3]
    assert [m.content for m in ledger.history(cid)] == ["first", "second"]
    assert ledger.verify(cid).ok


def wait_for_a_lock_wait(store: Store, timeout: float = 30.0) -> None:
    """Until a backend of this database waits on a lock (the append behind the holder):
    on a Citus cluster, a backend of any node (the row is on a worker)."""
    deadline = time.monotonic() + timeout
    with store.engine.connect() as conn:
        citus = conn.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
        activity = "citus_stat_activity" if citus.first() else "pg_stat_activity"
        while time.monotonic() < deadline:
            waiting = conn.execute(
                sa.text(
                    f"SELECT count(*) FROM {activity} WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            conn.rollback()
            if waiting:
                return
    raise AssertionError("no append waited on the holder's lock")


def first_appends(engine: sa.Engine, ledger: Ledger) -> list[Any]:
    """Every case of a creating append; what each returned, and the rows it wrote."""
    steps: list[Any] = []
    names: dict[str, str] = {}
    fresh = [new_id() for _ in range(3)]
    calls: list[tuple[str, list[Message], dict[str, Any]]] = [
        (fresh[0], turn("a", "b", "c"), {"create": NewConversation(metadata={"m": 1})}),
        (fresh[1], turn("keyed"), {"idempotency_key": "k"}),
        (fresh[1], turn("keyed"), {"idempotency_key": "k"}),
        (fresh[2], turn("run"), {"run_id": new_id(), "origin": "repair", "expected": 1}),
        (fresh[2], turn("more"), {}),
    ]
    for cid, messages, options in calls:
        a = ledger.append_messages(cid, messages, **{"create": True, **options})
        # What it returned is what the log holds (a replay returns the original).
        assert a.events[-1] == ledger.events(conversation_id=cid)[-1]
        steps.append(
            (
                a.created,
                a.positions,
                [shape(e, names) for e in a.events],
                anonymized([a.head.branch_id, a.head.position], names),
            )
        )
    for cid in fresh:
        assert ledger.verify(cid).ok
        steps.append([shape(e, names) for e in ledger.events(conversation_id=cid)])
        steps.append(rows(engine, cid, names))
    return steps


def rows(engine: sa.Engine, cid: str, names: dict[str, str]) -> Any:
    """The conversation, branch and view rows, ids anonymized, times and hashes out."""
    with engine.connect() as conn:
        conv = conn.execute(sa.select(conversations).where(conversations.c.id == cid)).mappings()
        branch = conn.execute(
            sa.select(branches).where(branches.c.conversation_id == cid)
        ).mappings()
        view = conn.execute(
            sa.select(view_entries.c.position, events.c.position)
            .join(
                events,
                sa.and_(
                    events.c.seq == view_entries.c.event_seq,
                    events.c.tenant == view_entries.c.tenant,
                ),
            )
            .where(view_entries.c.conversation_id == cid)
            .order_by(view_entries.c.position)
        ).all()
        return anonymized(
            [
                [
                    {k: v for k, v in r.items() if k not in ("created_at", "head_hash")}
                    for r in conv
                ],
                [{k: v for k, v in r.items() if k != "created_at"} for r in branch],
                [tuple(v) for v in view],
            ],
            names,
        )


def test_the_fast_and_general_paths_create_on_append_alike(database_url: str) -> None:
    with (
        Store.open(database_url) as fast,
        Store.open(database_url, fast_paths=False) as general,
    ):
        tenant = f"first-{uuid.uuid4().hex[:8]}"
        assert first_appends(fast.engine, fast.tenant(tenant)) == first_appends(
            general.engine, general.tenant(tenant)
        )
