"""The fast paths and the general path of the append answer alike.

The whole conformance suite also runs with the fast paths off (the
`*-general` ids, see `conftest.py`); these tests pin the switch itself, and
compare what the two paths write for the same turns, row by row.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from chatledger.store import (
    AsyncStore,
    ConflictError,
    Conversation,
    ErasedError,
    Event,
    Expected,
    HistoryRepair,
    Ledger,
    Message,
    NotFoundError,
    Store,
    ToolCall,
)
from chatledger.store._db.tail import NOTIFIER_THREAD
from chatledger.store.ids import is_id, new_id
from chatledger.store.schema import (
    branches,
    conversation_keys,
    conversations,
    events,
    view_entries,
)
from tests.conftest import citus_url


@contextmanager
def statements(engine: sa.Engine | type[sa.Engine]) -> Iterator[list[str]]:
    """The statements SQLAlchemy executes on `engine` (the class: on any engine)
    meanwhile (a fast path runs none)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


@contextmanager
def checkouts() -> Iterator[list[Any]]:
    """The DB-API connections taken out of any engine's pool meanwhile.

    The store's own driver connections are taken out once and then kept, so
    an operation that runs on one takes none. The notifier's (a Postgres
    store's one connection for waking tails, taken in its own thread after
    the first write) is no operation's, and is left out.
    """
    seen: list[Any] = []

    def record(dbapi_connection: Any, *_rest: Any) -> None:
        if threading.current_thread().name != NOTIFIER_THREAD:
            seen.append(dbapi_connection)

    sa.event.listen(sa.pool.Pool, "checkout", record)
    try:
        yield seen
    finally:
        sa.event.remove(sa.pool.Pool, "checkout", record)


SYNC_DRIVERS = (sqlite3.Connection, psycopg.Connection)
"""The synchronous drivers' connections (the async engines' are adapters of their own)."""


def turn(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_the_switch_decides_which_path_an_append_and_a_head_read_take(
    database_url: str, fast: bool
) -> None:
    with Store.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"switch-{uuid.uuid4().hex[:8]}")
        conv = ledger.create_conversation()
        with statements(store.engine) as seen:
            ledger.append_messages(conv.id, turn("hi"), expected=1)
            assert [m.content for m in ledger.history(conv.id)] == ["hi"]
    assert bool(seen) is not fast


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_a_state_change_alone_is_a_fast_append_that_keeps_the_tail(
    database_url: str, fast: bool
) -> None:
    # A framework's record between a call and its result (LangGraph's checkpoints)
    # costs one statement, and the result's report still needs no read of the history.
    with Store.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"state-{uuid.uuid4().hex[:8]}")
        conv = ledger.create_conversation()
        call = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="look_up")])
        ledger.append_messages(conv.id, [call])
        with statements(store.engine) as seen:
            ledger.append_messages(conv.id, [], state={"tip": "a"}, expected=Expected(state={}))
            answered = ledger.append_messages(
                conv.id,
                [Message(role="tool", tool_call_id="c1", tool_name="look_up", content="ok")],
            )
        assert answered.repair == HistoryRepair()
        assert ledger.conversation(conv.id).state == {"tip": "a"}
    assert bool(seen) is not fast


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
async def test_the_switch_decides_the_same_on_the_async_store(
    database_url: str, fast: bool
) -> None:
    async with AsyncStore.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"switch-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        # Any engine: the async one, or the store's own sync engine that runs
        # the general path in a worker thread.
        with statements(sa.Engine) as seen:
            await ledger.append_messages(conv.id, turn("hi"), expected=1)
            assert [m.content for m in await ledger.history(conv.id)] == ["hi"]
    assert bool(seen) is not fast


async def async_chat_loop(store: AsyncStore, tenant: str) -> tuple[list[Any], list[Any]]:
    """A chat loop on `store`, then a conflict and a retry; what each step returned and the
    log, and the connections the chat loop took out of a pool."""
    ledger = store.tenant(tenant)
    conv = await ledger.create_conversation({"k": "v"})
    # A write and a read: each kind of the store's own connections is taken out
    # of the pool once, before the loop (on SQLite, a write's on the event loop).
    await ledger.history(conv.id)
    steps: list[Any] = []
    with checkouts() as taken:
        for position, text in enumerate(["one", "two", "three", "four"], start=1):
            appended = await ledger.append_messages(conv.id, turn(text), expected=position)
            steps.append(("appended", appended.positions, appended.head.position))
            steps.append(("history", [m.content for m in await ledger.history(conv.id)]))
    # Both decline their fast form: the general path decides, after it.
    with pytest.raises(ConflictError) as conflict:
        await ledger.append_messages(conv.id, turn("late"), expected=1)
    steps.append(("conflict", conflict.value.expected, conflict.value.actual))
    first = await ledger.append_messages(conv.id, turn("keyed"), idempotency_key="k")
    retried = await ledger.append_messages(conv.id, turn("keyed"), idempotency_key="k")
    assert retried.events == first.events
    names: dict[str, str] = {}
    steps.append(("log", [shape(e, names) for e in await ledger.events(conversation_id=conv.id)]))
    assert (await ledger.verify(conv.id)).ok
    return steps, taken


async def test_the_async_chat_loop_runs_on_driver_connections_of_the_stores_own(
    database_url: str,
) -> None:
    tenant = f"async-driver-{uuid.uuid4().hex[:8]}"
    with checkouts() as fast_taken:
        async with AsyncStore.open(database_url) as fast:
            fast_steps, fast_loop = await async_chat_loop(fast, tenant)
    with checkouts() as general_taken:
        async with AsyncStore.open(database_url, fast_paths=False) as general:
            general_steps, general_loop = await async_chat_loop(general, tenant)
    assert fast_steps == general_steps
    # The fast store's chat loop ran on connections of its own (the synchronous
    # driver's on SQLite; psycopg's async ones on Postgres, see
    # tests/store/test_native_connections.py): no append or head read took one from
    # a pool. Its other operations ran on the synchronous driver.
    assert any(isinstance(c, SYNC_DRIVERS) for c in fast_taken)
    assert fast_loop == []
    # The general path takes a pooled connection of the store's own sync
    # engine, one per call, in its worker thread.
    assert all(isinstance(c, SYNC_DRIVERS) for c in general_taken)
    assert all(isinstance(c, SYNC_DRIVERS) for c in general_loop)
    assert len(general_loop) == 8


async def test_an_async_store_on_a_callers_engine_runs_every_operation_on_that_engine(
    database_url: str,
) -> None:
    # A second engine could not carry what the caller set up theirs with.
    url = sa.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    engine = create_async_engine(url)
    try:
        with checkouts() as taken:
            async with AsyncStore.open(engine=engine) as store:
                ledger = store.tenant(f"callers-{uuid.uuid4().hex[:8]}")
                conv = await ledger.create_conversation()
                await ledger.append_messages(conv.id, turn("hi"), expected=1)
                assert [m.content for m in await ledger.history(conv.id)] == ["hi"]
        assert taken
        assert not any(isinstance(c, SYNC_DRIVERS) for c in taken)
    finally:
        await engine.dispose()


async def test_a_taken_id_refused_on_a_callers_engine_writes_nothing(database_url: str) -> None:
    # On a caller's engine the fast forms run inside the operation's own
    # transaction, before the general path: a form that gave up after writing
    # would leave its rows for the general path to build on.
    url = sa.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    engine = create_async_engine(url)
    try:
        async with AsyncStore.open(engine=engine) as store:
            ledger = store.tenant(f"callers-{uuid.uuid4().hex[:8]}")
            first = await ledger.create_conversation()
            second = await ledger.create_conversation()
            taken = new_id()
            await ledger.append_messages(first.id, turn("mine"), ids=[taken])
            before = await ledger.events(conversation_id=second.id)
            for key in (None, "retry-key"):
                with pytest.raises(ConflictError, match="is taken"):
                    await ledger.append_messages(
                        second.id, turn("again"), ids=[taken], idempotency_key=key
                    )
            assert await ledger.events(conversation_id=second.id) == before
            assert await ledger.history(second.id) == []
            await ledger.append_messages(second.id, turn("next"))  # the head is whole
            assert [m.content for m in await ledger.history(second.id)] == ["next"]
    finally:
        await engine.dispose()


def written(ledger: Ledger) -> list[Any]:
    """The same turns, every case of the append; what each step returned and read back."""
    steps: list[Any] = []
    conv = ledger.create_conversation({"k": "v"})

    def append(messages: list[Message], **options: Any) -> None:
        appended = ledger.append_messages(conv.id, messages, **options)
        first = appended.events[0].seq
        # What the append returned is what the log holds.
        assert appended.events == ledger.events(conversation_id=conv.id, after_seq=first - 1)
        steps.append(("appended", appended.positions, appended.head.position))

    append(turn("one"), expected=1)
    append(
        [Message(role="assistant", content="two"), Message(role="user", content="three")],
        idempotency_key="k",
    )
    # A retry with the same key and content writes nothing and returns the original.
    retried = ledger.append_messages(
        conv.id,
        [Message(role="assistant", content="two"), Message(role="user", content="three")],
        idempotency_key="k",
    )
    steps.append(("retried", retried.positions))
    with pytest.raises(ConflictError) as conflict:
        ledger.append_messages(conv.id, turn("late"), expected=1)
    steps.append(("conflict", conflict.value.expected, conflict.value.actual))
    append(turn("repaired"), origin="repair")
    append(turn("stamped"), run_id=new_id())
    # Two messages at the head the last append left (ADR 0029's array form).
    append([Message(role="user", content="four"), Message(role="assistant", content="five")])
    ledger.move_head(conv.id, 2)
    append(turn("on a branch"))  # the head is no longer its branch's end
    append(turn("after the branch"))
    steps.append(("history", [m.content for m in ledger.history(conv.id)]))
    names: dict[str, str] = {}
    steps.append(("log", [shape(e, names) for e in ledger.events(conversation_id=conv.id)]))
    assert ledger.verify(conv.id).ok
    return steps


def shape(event: Event, names: dict[str, str]) -> Any:
    """An event without what two conversations differ in by design: ids, times, hashes."""
    return anonymized(
        (
            event.kind,
            event.branch_id,
            event.position,
            event.origin,
            event.run_id,
            event.head,
            event.idempotency_key,
            event.payload,
        ),
        names,
    )


def anonymized(value: Any, names: dict[str, str]) -> Any:
    """`value` with every id replaced by its order of first appearance."""
    if is_id(value):
        return names.setdefault(value, f"id{len(names)}")
    if isinstance(value, dict):
        return {k: anonymized(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [anonymized(v, names) for v in value]
    return value


def test_the_fast_and_general_paths_write_the_same_log(database_url: str) -> None:
    with (
        Store.open(database_url) as fast,
        Store.open(database_url, fast_paths=False) as general,
    ):
        tenant = f"differential-{uuid.uuid4().hex[:8]}"
        assert written(fast.tenant(tenant)) == written(general.tenant(tenant))


@pytest.mark.parametrize("count", [1, 2, 5, 6, 40])
def test_a_turn_of_any_length_is_written_alike_by_both_paths(database_url: str, count: int) -> None:
    """Up to 6 events (5 messages and the state change) a Postgres turn is sent as
    scalar rows, and longer as arrays: on both sides of that line each event gets
    its position in order, the key is on the first and the head flag on the last,
    as the general path writes them."""
    logs = []
    with (
        Store.open(database_url) as fast,
        Store.open(database_url, fast_paths=False) as general,
    ):
        for store in (fast, general):
            ledger = store.tenant(f"length-{uuid.uuid4().hex[:8]}")
            conv = ledger.create_conversation()
            ledger.append_messages(conv.id, turn("first"))  # the head is kept: in place next
            messages = [
                Message(role="user" if i % 2 else "assistant", content=f"m{i}")
                for i in range(count)
            ]
            done = ledger.append_messages(
                conv.id, messages, idempotency_key="k", state={"count": count}
            )
            log = ledger.events(conversation_id=conv.id)
            assert done.events == log[2:]
            assert [e.seq for e in log] == sorted(e.seq for e in log)
            logs.append(
                [(e.kind, e.position, e.head, e.idempotency_key, e.payload) for e in log[1:]]
            )
    assert logs[0] == logs[1]
    written_turn = logs[0][1:]
    assert [position for _, position, *_ in written_turn] == list(range(3, count + 4))
    assert [head for _, _, head, *_ in written_turn] == [False] * count + [True]
    assert [key for *_, key, _ in written_turn] == ["k"] + [None] * count
    assert [p.get("content") for *_, p in written_turn[:-1]] == [f"m{i}" for i in range(count)]


# -- creating a conversation --------------------------------------------------------------

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

CREATIONS: list[tuple[dict[str, Any] | None, bool, bool]] = [
    (None, False, False),
    ({}, False, False),
    (
        {"user": "u1", "tags": ["a", "é", "\u2028"], "n": 1.5, "deep": {"z": None, "a": True}},
        False,
        False,
    ),
    (None, True, False),  # a caller-given id
    ({"k": "v"}, True, False),
    (None, False, True),  # a key (a framework's thread or session id)
    ({"k": "v"}, True, True),
]
"""(metadata, whether the caller gives the id, whether it gives a key) for each
conversation the differential creates."""


def creation_options(given: bool, keyed: bool) -> dict[str, Any]:
    return {"conversation_id": new_id() if given else None, "key": new_id() if keyed else None}


def creation_rows(engine: sa.Engine, convs: list[Conversation], names: dict[str, str]) -> Any:
    """Every column of the rows creating `convs` wrote, ids anonymized and times, seq, txid
    and hashes taken out once checked."""
    found: list[Any] = []
    with engine.connect() as conn:
        for conv in convs:
            (row,) = conn.execute(
                sa.select(conversations).where(conversations.c.id == conv.id)
            ).mappings()
            (branch,) = conn.execute(
                sa.select(branches).where(branches.c.conversation_id == conv.id)
            ).mappings()
            (event,) = conn.execute(
                sa.select(events).where(events.c.conversation_id == conv.id)
            ).mappings()
            keyed = conn.execute(
                sa.select(conversation_keys).where(conversation_keys.c.conversation_id == conv.id)
            ).mappings()
            views = conn.execute(
                sa.select(view_entries).where(view_entries.c.conversation_id == conv.id)
            ).all()
            assert not views  # `conversation.created` is not a message
            # The head's hash is that of its event; one clock, read in order.
            assert bytes(row["head_hash"]) == bytes(event["hash"])
            times = [branch["created_at"], event["recorded_at"], row["created_at"]]
            assert times == sorted(times)
            found.append(
                anonymized(
                    [
                        {k: v for k, v in row.items() if k not in ("created_at", "head_hash")},
                        {k: v for k, v in branch.items() if k != "created_at"},
                        {
                            k: v
                            for k, v in event.items()
                            if k not in ("seq", "txid", "recorded_at", "hash")
                        },
                        [dict(k) for k in keyed],
                    ],
                    names,
                )
            )
    return found


def creation_record(
    engine: sa.Engine,
    reader: Ledger,
    convs: list[Conversation],
    conflicts: list[ConflictError],
) -> list[Any]:
    """What creating `convs` returned and wrote, and the conflicts' errors, comparable
    across paths; `reader` (the same tenant) reads back and verifies."""
    names: dict[str, str] = {}
    for conv in convs:
        # What the operation returned is what the log holds, and its chain verifies.
        assert conv == reader.conversation(conv.id)
        assert conv.head_open and reader.conversation(conv.id).head_open
        assert reader.verify(conv.id).ok
    returned = [
        anonymized(
            (c.id, c.tenant, c.head.branch_id, c.head.position, c.metadata, c.forked_from, c.key),
            names,
        )
        for c in convs
    ]
    errors = [
        (
            _UUID.sub(lambda m: anonymized(m.group(0), names), str(e)),
            anonymized(e.conversation_id, names),
        )
        for e in conflicts
    ]
    return [returned, creation_rows(engine, convs, names), errors]


def create_all(ledger: Ledger, taken: str) -> tuple[list[Conversation], list[ConflictError]]:
    convs = [
        ledger.create_conversation(m, **creation_options(given, keyed))
        for m, given, keyed in CREATIONS
    ]
    conflicts = []
    # An id taken by another tenant, and by this one (a conversation just created);
    # a key this tenant uses.
    for options in taken_options(taken, convs):
        with pytest.raises(ConflictError) as caught:
            ledger.create_conversation({"k": "v"}, **options)
        conflicts.append(caught.value)
    return convs, conflicts


def taken_options(taken: str, convs: list[Conversation]) -> list[dict[str, Any]]:
    return [{"conversation_id": taken}, {"conversation_id": convs[3].id}, {"key": convs[5].key}]


def test_a_conversation_reads_alike_on_both_paths(database_url: str) -> None:
    # Kept, forked, with a state (sealed on this store), erased; another tenant's and
    # a missing one are the same NotFoundError. The fast path reads the row without
    # SQLAlchemy.
    kek = bytes(range(32))
    with (
        Store.open(database_url, kek=kek) as fast,
        Store.open(database_url, kek=kek, fast_paths=False) as general,
    ):
        tenant = f"read-{uuid.uuid4().hex[:8]}"
        ledger = fast.tenant(tenant)
        plain = ledger.create_conversation({"m": 1}, key=f"k-{uuid.uuid4().hex}")
        ledger.append_messages(plain.id, turn("hi"), state={"tip": "a"})
        forked = ledger.fork(plain.id)
        erased = ledger.create_conversation(subject="gone")
        ledger.erase("gone", reason="asked")
        foreign = fast.tenant(f"other-{uuid.uuid4().hex[:8]}").create_conversation().id
        ids = [plain.id, forked.id, erased.id]
        with statements(fast.engine) as seen:
            found = [ledger.conversation(i) for i in ids]
        assert not [s for s in seen if "chatledger_conversations" in s]  # keys, to open states
        assert found == [general.tenant(tenant).conversation(i) for i in ids]
        assert found[0].state == {"tip": "a"} and found[2].erased_at is not None
        for missing in (foreign, str(uuid.uuid4())):
            with pytest.raises(NotFoundError) as on_fast:
                ledger.conversation(missing)
            with pytest.raises(NotFoundError) as on_general:
                general.tenant(tenant).conversation(missing)
            assert str(on_fast.value) == str(on_general.value)


def _owner(database_url: str, tenant: str) -> str:
    """The tenant whose conversation's id the creations find taken: another tenant,
    except on Citus, where an id is a tenant's own (ADR 0054): the tenant itself."""
    on_citus = citus_url() is not None and database_url.startswith("postgresql")
    return tenant if on_citus else f"owner-{uuid.uuid4().hex[:8]}"


def test_the_fast_and_general_paths_create_the_same_conversations(database_url: str) -> None:
    with (
        Store.open(database_url) as fast,
        Store.open(database_url, fast_paths=False) as general,
    ):
        tenant = f"created-{uuid.uuid4().hex[:8]}"
        taken = fast.tenant(_owner(database_url, tenant)).create_conversation().id
        before = counts(fast.engine)
        records = []
        for store in (fast, general):
            ledger = store.tenant(tenant)
            convs, conflicts = create_all(ledger, taken)
            records.append(creation_record(store.engine, ledger, convs, conflicts))
        # Each creation: a conversation, a branch and an event apiece, no view rows;
        # the conflicts wrote nothing.
        n = 2 * len(CREATIONS)
        added = (n, n, n, 0)
        assert counts(fast.engine) == tuple(n + d for n, d in zip(before, added, strict=True))
        assert records[0] == records[1]


async def test_the_async_store_creates_the_same_conversations(database_url: str) -> None:
    tenant = f"created-{uuid.uuid4().hex[:8]}"
    with Store.open(database_url, fast_paths=False) as general:
        taken = general.tenant(_owner(database_url, tenant)).create_conversation().id
        async with AsyncStore.open(database_url) as fast:
            ledger = fast.tenant(tenant)
            with statements(fast.engine.sync_engine) as seen:
                convs = [
                    await ledger.create_conversation(m, **creation_options(g, k))
                    for m, g, k in CREATIONS
                ]
            assert not seen  # the fast forms, on the driver's cursor
            conflicts = []
            for options in taken_options(taken, convs):
                with pytest.raises(ConflictError) as caught:
                    await ledger.create_conversation({"k": "v"}, **options)
                conflicts.append(caught.value)
        reader = general.tenant(tenant)
        record = creation_record(general.engine, reader, convs, conflicts)
        expected_convs, expected_conflicts = create_all(reader, taken)
        assert record == creation_record(general.engine, reader, expected_convs, expected_conflicts)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_the_switch_decides_which_path_creating_a_conversation_takes(
    database_url: str, fast: bool
) -> None:
    with Store.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"switch-{uuid.uuid4().hex[:8]}")
        given = ledger.create_conversation().id  # the driver connection is open from here
        with statements(store.engine) as seen:
            ledger.create_conversation({"k": "v"})
            ledger.create_conversation(conversation_id=new_id())
        assert bool(seen) is not fast
        # A taken id: the fast form writes nothing and the general path raises.
        with statements(store.engine) as seen, pytest.raises(ConflictError):
            ledger.create_conversation(conversation_id=given)
        assert seen


def counts(engine: sa.Engine) -> tuple[int, ...]:
    with engine.connect() as conn:
        return tuple(
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (conversations, branches, events, view_entries)
        )


# -- the head a store's last append left --------------------------------------------------


def test_an_append_after_another_writers_appends_goes_after_them(database_url: str) -> None:
    """A store keeps the head its last append left and chains the next append's
    hashes on it; when another writer has appended since, that head is stale,
    and the append must still go after the other writer's messages, chained
    to them."""
    with Store.open(database_url) as first, Store.open(database_url) as second:
        tenant = f"heads-{uuid.uuid4().hex[:8]}"
        mine, theirs = first.tenant(tenant), second.tenant(tenant)
        cid = mine.append_messages(new_id(), turn("mine"), create=True).conversation_id
        kept = first._heads.get(tenant, cid)
        if database_url.startswith("postgresql"):
            assert kept is not None and kept[1] == 2  # the creation, then the message
        theirs.append_messages(cid, turn("theirs"))
        theirs.append_messages(cid, turn("theirs again"))
        assert first._heads.get(tenant, cid) == kept  # stale now
        assert mine.append_messages(cid, turn("mine again")).positions == [5]
        assert mine.append_messages(cid, turn("and again")).positions == [6]
        contents = [m.content for m in mine.history(cid)]
        assert contents == ["mine", "theirs", "theirs again", "mine again", "and again"]
        assert mine.verify(cid).ok


def test_a_head_moved_or_erased_since_the_last_append_is_not_written_after(
    database_url: str,
) -> None:
    """The head a store's last append left is only tried: after a head move the
    next append branches, and after an erasure it is refused, as without it."""
    with Store.open(database_url, kek=bytes(range(32))) as store:
        ledger = store.tenant(f"heads-{uuid.uuid4().hex[:8]}")
        root = ledger.append_messages(new_id(), turn("first"), create=True)
        cid = root.conversation_id
        ledger.append_messages(cid, turn("second"))
        ledger.move_head(cid, root.head.position)
        # A write that moves the head forgets the one kept: the next append
        # does not try it first.
        assert store._heads.get(ledger.tenant, cid) is None
        branched = ledger.append_messages(cid, turn("branched"))
        assert branched.head.branch_id != root.head.branch_id
        ledger.append_messages(cid, turn("on the branch"))
        assert [m.content for m in ledger.history(cid)] == ["first", "branched", "on the branch"]
        assert ledger.verify(cid).ok
        ledger.erase(cid, reason="heads test")
        count = len(ledger.events(conversation_id=cid))
        with pytest.raises(ErasedError):
            ledger.append_messages(cid, turn("after erasure"))
        assert len(ledger.events(conversation_id=cid)) == count
