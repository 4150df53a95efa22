"""The live tail (`Ledger.tail`, `AsyncLedger.tail`) on both backends.

What it promises: every event of the tenant (or one conversation) committed
after the cursor, once, in commit order; on Postgres a commit that becomes
visible late is never passed; a follower wakes on a commit (NOTIFY on
Postgres, the file's data version on SQLite) and finds writes that sent no
wake-up on its idle re-read. tests/store/test_tail_stress.py runs writers and a
killed consumer against it.

On Postgres a page holds back every event behind the oldest transaction open
on the whole server (other test runs included), so these tests wait for what
they expect with deadlines, never assuming a page is complete at once.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from chatledger.store import (
    AsyncStore,
    Event,
    InvalidInputError,
    Ledger,
    Message,
    NotFoundError,
    Page,
    StorageError,
    Store,
    _tail,
)
from chatledger.store._sql.pages import position
from tests.store.test_audit import append_in, postgres_only

DEADLINE = 30.0  # far beyond any wake-up; a follower idles for longer (IDLE)
IDLE = 3600.0  # a follower set so reads again only when woken


def texts(pages: list[Page[Event]]) -> list[str]:
    return [e.message.content for p in pages for e in p.items if e.message is not None]


def settled(ledger: Ledger, **kwargs: object) -> list[Page[Event]]:
    """Every page up to now, waiting out pages held back by open transactions."""
    deadline = time.monotonic() + DEADLINE
    pages: list[Page[Event]] = []
    after = kwargs.pop("after", None)
    while True:
        batch = list(ledger.tail(after, **kwargs))  # type: ignore[arg-type]
        pages += batch
        after = batch[-1].next_after if batch else after
        probe = ledger.audit.events(after=after, limit=1)
        if not probe.pending and not probe.items:
            return pages
        assert time.monotonic() < deadline, "pages stayed held back"


class Follower:
    """`ledger.tail(follow=True)` in a thread, collecting what it yields."""

    def __init__(self, ledger: Ledger, after: str | None = None, **kwargs: object) -> None:
        self.pages: list[Page[Event]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._arrived = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(ledger, after, kwargs))
        self._thread.start()

    def _run(self, ledger: Ledger, after: str | None, kwargs: dict[str, object]) -> None:
        try:
            for page in ledger.tail(after, follow=True, stop=self.stop, **kwargs):  # type: ignore[arg-type]
                with self._arrived:
                    self.pages.append(page)
                    self._arrived.notify_all()
        except BaseException as error:  # reported by `until` and `close`
            self.error = error

    def until(self, wanted: list[str]) -> list[str]:
        """Wait until the messages seen end with `wanted`; return all seen."""
        deadline = time.monotonic() + DEADLINE
        with self._arrived:
            while texts(self.pages)[-len(wanted) :] != wanted:
                assert self.error is None, self.error
                left = deadline - time.monotonic()
                assert left > 0, f"the follower saw {texts(self.pages)}, not {wanted}"
                self._arrived.wait(min(left, 0.5))
            return texts(self.pages)

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=DEADLINE)
        assert not self._thread.is_alive(), "stop did not end the tail"
        assert self.error is None, self.error


@pytest.fixture
def follower(ledger: Ledger) -> Iterator[list[Follower]]:
    made: list[Follower] = []
    yield made
    for f in made:
        f.close()


def say(ledger: Ledger, conversation_id: str, *contents: str) -> None:
    ledger.append_messages(conversation_id, [Message(role="user", content=c) for c in contents])


def test_the_tail_gives_every_event_of_the_tenant_once_in_order(
    store: Store, ledger: Ledger
) -> None:
    mine, theirs = ledger, store.tenant(f"{ledger.tenant}-theirs")
    a, b = mine.create_conversation().id, mine.create_conversation().id
    other = theirs.create_conversation().id
    say(mine, a, "a1", "a2")
    say(theirs, other, "secret")
    say(mine, b, "b1")
    say(mine, a, "a3")

    pages = settled(mine, limit=2)
    events = [e for p in pages for e in p.items]
    assert texts(pages) == ["a1", "a2", "b1", "a3"]
    assert [e.kind for e in events].count("conversation.created") == 2
    assert {e.conversation_id for e in events} == {a, b}
    assert len({e.seq for e in events}) == len(events)
    assert all(len(p.items) <= 2 for p in pages)
    # The log's own order for each conversation.
    for conv in (a, b):
        assert [e.seq for e in events if e.conversation_id == conv] == [
            e.seq for e in mine.events(conversation_id=conv)
        ]

    # Resuming from any page's cursor gives exactly what came after it.
    for i, page in enumerate(pages):
        assert texts(settled(mine, after=page.next_after)) == texts(pages[i + 1 :])
    assert settled(mine, after=pages[-1].next_after) == []
    say(mine, b, "b2")
    assert texts(settled(mine, after=pages[-1].next_after)) == ["b2"]


def test_one_conversation_tails_alone_and_another_tenants_is_missing(
    store: Store, ledger: Ledger
) -> None:
    a, b = ledger.create_conversation().id, ledger.create_conversation().id
    say(ledger, a, "a1")
    say(ledger, b, "b1")
    say(ledger, a, "a2")
    pages = settled(ledger, conversation_id=a)
    assert texts(pages) == ["a1", "a2"]
    assert {e.conversation_id for p in pages for e in p.items} == {a}

    stranger = store.tenant(f"{ledger.tenant}-stranger")
    with pytest.raises(NotFoundError) as theirs:
        list(stranger.tail(conversation_id=a))
    with pytest.raises(NotFoundError) as nobody:
        list(stranger.tail(conversation_id="01a22e65-f033-76ff-b1b9-aa4c378984fe"))
    # Another tenant's conversation reads exactly as one that does not exist.
    assert str(theirs.value).replace(a, "X") == str(nobody.value).replace(
        "01a22e65-f033-76ff-b1b9-aa4c378984fe", "X"
    )


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"after": "12"}, "not an audit cursor"),
        ({"after": "1:2:3"}, "not an audit cursor"),
        ({"limit": 0}, "A page holds 1 to"),
        ({"limit": True}, "A page holds 1 to"),
        ({"idle_seconds": 0}, "idle_seconds must be a positive number"),
        ({"poll_seconds": -1}, "poll_seconds must be a positive number"),
        ({"follow": "yes"}, "follow must be True or False"),
        ({"conversation_id": "not-a-uuid"}, "is not a UUID in canonical form"),
        ({"conversation_id": "not-a-uuid", "follow": True}, "is not a UUID in canonical form"),
    ],
)
def test_bad_tail_arguments_are_refused_before_anything_is_read(
    ledger: Ledger, kwargs: dict[str, object], said: str
) -> None:
    with pytest.raises(InvalidInputError, match=said):
        ledger.tail(**kwargs)  # type: ignore[arg-type]  # refused here, not on iteration


def test_a_follower_wakes_on_a_commit(
    database_url: str, ledger: Ledger, follower: list[Follower]
) -> None:
    conv = ledger.create_conversation().id
    say(ledger, conv, "before")
    cursor = settled(ledger)[-1].next_after
    follower.append(Follower(ledger, cursor, idle_seconds=IDLE))
    # Written by another store (on Postgres it notifies; on SQLite its
    # connection changes the file's data version): only a wake-up makes the
    # follower read again before IDLE.
    with Store.open(database_url) as writer:
        for n in range(3):
            say(writer.tenant(ledger.tenant), conv, f"after {n}")
            assert follower[0].until([f"after {n}"]) == [f"after {k}" for k in range(n + 1)]


def test_writes_that_send_no_wake_up_are_found_on_the_idle_re_read(
    database_url: str, ledger: Ledger, follower: list[Follower]
) -> None:
    conv = ledger.create_conversation().id
    follower.append(Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=0.2))
    with Store.open(database_url, notify=False) as quiet:
        say(quiet.tenant(ledger.tenant), conv, "quiet")
    assert follower[0].until(["quiet"]) == ["quiet"]


def test_stop_ends_a_follower_that_sees_nothing(ledger: Ledger) -> None:
    ledger.create_conversation()
    follower = Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=IDLE)
    follower.close()  # asserts it ended
    assert follower.pages == []


def through(
    store: Store, ledger: Ledger, conn: sa.Connection, conversation_id: str, text: str
) -> None:
    """Append with the store, inside the caller's open transaction (`connection=`)."""
    message = Message(role="user", content=text)
    op = next(ledger._ops.append_messages(conversation_id, [message]))
    store.execute(op, conn)


def test_a_follower_never_passes_an_event_that_commits_late(
    backend: str, store: Store, ledger: Ledger, follower: list[Follower]
) -> None:
    """The transaction that took its seq first commits last (both are the caller's
    own, written with `connection=`): the follower delivers it after the other."""
    postgres_only(backend)
    late, early = ledger.create_conversation().id, ledger.create_conversation().id
    follower.append(Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=IDLE))
    with store.engine.connect() as older, store.engine.connect() as newer:
        older.begin()
        newer.begin()
        older.execute(sa.text("SELECT pg_current_xact_id()"))
        newer.execute(sa.text("SELECT pg_current_xact_id()"))
        through(store, ledger, newer, late, "late")  # the lower seq, committed last
        through(store, ledger, older, early, "early")
        older.commit()
        assert follower[0].until(["early"]) == ["early"]
        newer.commit()
    assert follower[0].until(["late"]) == ["early", "late"]
    seqs = [e.seq for p in follower[0].pages for e in p.items if e.message is not None]
    assert seqs[0] > seqs[1]  # commit order, not seq order


def test_events_held_back_by_another_programs_transaction_come_when_it_ends(
    backend: str, store: Store, ledger: Ledger, follower: list[Follower]
) -> None:
    """Another program's transaction, open with the older id, holds back a store's
    commit (which woke the follower) and commits with no wake-up of its own:
    the follower reads again while events are held back, and delivers both in
    commit order."""
    postgres_only(backend)
    conv = ledger.create_conversation().id
    follower.append(Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=IDLE))
    with store.engine.connect() as foreign:
        foreign.begin()
        foreign.execute(sa.text("SELECT pg_current_xact_id()"))  # the older id
        say(ledger, conv, "stored")  # committed, held back behind `foreign`
        append_in(foreign, ledger.tenant, conv, "foreign")  # not through the store
        foreign.commit()
    assert follower[0].until(["foreign", "stored"]) == ["foreign", "stored"]


def test_a_rolled_back_write_is_never_delivered(
    store: Store, ledger: Ledger, follower: list[Follower]
) -> None:
    conv = ledger.create_conversation().id
    follower.append(Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=0.2))
    with store.engine.connect() as conn:
        conn.begin()
        append_in(conn, ledger.tenant, conv, "rolled back")
        conn.rollback()
    say(ledger, conv, "kept")
    assert follower[0].until(["kept"]) == ["kept"]


def test_the_async_tail_follows_and_stops_when_cancelled(database_url: str, ledger: Ledger) -> None:
    conv = ledger.create_conversation().id
    say(ledger, conv, "first")

    async def scenario() -> list[str]:
        async with AsyncStore.open(database_url) as store:
            aledger = store.tenant(ledger.tenant)
            with pytest.raises(InvalidInputError):
                aledger.tail("nonsense")
            caught_up: list[str] = []
            async for page in aledger.tail(conversation_id=conv):
                caught_up += texts([page])
            assert caught_up == ["first"] or caught_up == []  # [] while held back (Postgres)
            seen: list[str] = []
            got = asyncio.Event()

            async def follow() -> None:
                async for page in aledger.tail(
                    conversation_id=conv, follow=True, idle_seconds=IDLE
                ):
                    seen.extend(texts([page]))
                    if "second" in seen:
                        got.set()

            task = asyncio.create_task(follow())
            await aledger.append_messages(conv, [Message(role="user", content="second")])
            await asyncio.wait_for(got.wait(), DEADLINE)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return seen

    assert asyncio.run(scenario()) == ["first", "second"]


def test_the_tail_runs_on_a_partitioned_log(partitioned: str) -> None:
    with Store.open(partitioned) as store:
        ledger = store.tenant("partitioned")
        convs = [ledger.create_conversation().id for _ in range(8)]  # spread over partitions
        for n, conv in enumerate(convs):
            say(ledger, conv, f"m{n}")
        assert texts(settled(ledger)) == [f"m{n}" for n in range(8)]
        follower = Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=IDLE)
        try:
            say(ledger, convs[3], "late one")
            assert follower.until(["late one"]) == ["late one"]
        finally:
            follower.close()


def test_a_caught_up_tail_says_when_events_are_held_back(
    backend: str, store: Store, ledger: Ledger
) -> None:
    postgres_only(backend)
    conv = ledger.create_conversation().id
    cursor = settled(ledger)[-1].next_after
    with store.engine.connect() as older:
        older.begin()
        older.execute(sa.text("SELECT pg_current_xact_id()"))
        say(ledger, conv, "held back")
        pages = list(ledger.tail(cursor))
        older.rollback()
    # Not following, the tail ends with an empty page that says so, and its
    # cursor does not pass what it held back.
    assert pages[-1].pending and pages[-1].items == []
    assert "held back" not in texts(pages)
    assert texts(settled(ledger, after=pages[-1].next_after)) == ["held back"]


@pytest.mark.parametrize("follow", [False, True])
def test_a_database_out_of_reach_is_a_storage_error(follow: bool) -> None:
    with Store.open("postgresql+psycopg://postgres@127.0.0.1:1/nowhere") as store:
        tail = store.tenant("t").tail(follow=follow)
        with pytest.raises(StorageError):
            next(iter(tail))


def test_a_quiet_tenants_cursor_moves_past_other_tenants_events(
    store: Store, ledger: Ledger
) -> None:
    """A page that is not full moves its cursor past what is settled in the log,
    so a quiet tenant's tail does not read a busy tenant's events again."""
    before = settled(ledger)
    cursor = before[-1].next_after if before else None
    busy = store.tenant(f"{ledger.tenant}-busy")
    other = busy.create_conversation().id
    for n in range(5):
        say(busy, other, f"busy {n}")
    deadline = time.monotonic() + DEADLINE
    while True:  # until the busy tenant's commits are settled (Postgres: below the xmin)
        page = store.execute(_tail.tail_op(ledger.tenant, TENANT_WIDE, cursor))
        assert page.items == []
        if page.next_after is not None and position(page.next_after) >= last_position(busy):
            break
        assert time.monotonic() < deadline, "the cursor never moved past the busy tenant"
    # And nothing of this tenant is passed: what it writes next comes.
    conv = ledger.create_conversation().id
    say(ledger, conv, "mine")
    assert texts(settled(ledger, after=page.next_after)) == ["mine"]


TENANT_WIDE = _tail.TailSettings(
    after=None, conversation_id=None, limit=100, follow=False, idle_seconds=5, poll_seconds=0.05
)


def last_position(ledger: Ledger) -> tuple[int, int]:
    pages = settled(ledger)
    assert pages[-1].next_after is not None
    return position(pages[-1].next_after)


def test_listening_connects_as_the_engine_does(postgres_url: str) -> None:
    """The notifier's and a follower's connections are made as the store's engine
    makes its own: here the URL names a database that does not exist, and only
    the engine's `connect_args` name the real one."""
    real = sa.make_url(postgres_url)
    engine = sa.create_engine(
        real.set(database="chatledger_no_such_database"),
        connect_args={"dbname": real.database},
    )
    try:
        with Store.open(engine=engine) as store:
            ledger = store.tenant(f"engine-{time.monotonic_ns()}")
            conv = ledger.create_conversation().id
            follower = Follower(ledger, settled(ledger)[-1].next_after, idle_seconds=IDLE)
            try:
                say(ledger, conv, "woken")  # only its notifier can wake the follower
                assert follower.until(["woken"]) == ["woken"]
            finally:
                follower.close()
    finally:
        engine.dispose()


# -- cursors chatledger never printed (issue 33, item 12) ---------------------------------

NEVER_PRINTED = [
    f"0:{2**63}",  # a part above 2**63 - 1: SQLite's int64 overflows, Postgres's bigint
    f"{2**63}:1",
    "9999999999999999999:0",
    "\uff11:\uff12",  # fullwidth digits
    "\u0663:\u0664",  # Arabic-Indic digits
    "01:2",  # chatledger prints no leading zeros
]


@pytest.mark.parametrize("cursor", NEVER_PRINTED)
def test_a_cursor_that_only_looks_like_one_is_refused_at_the_call(
    database_url: str, cursor: str
) -> None:
    with Store.open(database_url) as store:
        ledger = store.tenant("cursors")
        with pytest.raises(InvalidInputError, match="not an audit cursor") as refused:
            ledger.tail(cursor)  # refused here, not on iteration
        assert repr(cursor) in str(refused.value)
        with pytest.raises(InvalidInputError, match="not an audit cursor"):
            ledger.audit.events(after=cursor)

    async def scenario() -> None:
        async with AsyncStore.open(database_url) as store:
            with pytest.raises(InvalidInputError, match="not an audit cursor"):
                store.tenant("cursors").tail(cursor)

    asyncio.run(scenario())


def the_end(ledger: Ledger) -> str:
    """The log's end as a tail prints it to `ledger`, once `ledger` has an event."""
    conv = ledger.create_conversation().id
    say(ledger, conv, "here")
    end = settled(ledger)[-1].next_after
    assert end is not None
    return end


def past(backend: str, end: str) -> str:
    """A position after `end` that the log cannot reach while the test runs: on
    Postgres a transaction id far beyond the server's (its xmin moves with other
    test runs), on SQLite the next `seq`."""
    txid, seq = position(end)
    return f"{txid + 10**12}:0" if backend == "postgres" else f"0:{seq + 1}"


def test_a_cursor_past_the_end_of_the_log_is_refused_at_the_call(
    backend: str, ledger: Ledger
) -> None:
    end = the_end(ledger)
    ahead = past(backend, end)
    beyond = [ahead, f"{2**62}:0"]  # on SQLite a transaction part is 0: 2**62 is past it
    for cursor in beyond:
        with pytest.raises(InvalidInputError, match="past the end of the log") as refused:
            ledger.tail(cursor)  # refused here, before anything is yielded
        assert repr(cursor) in str(refused.value)
        with pytest.raises(InvalidInputError, match="past the end of the log"):
            ledger.tail(cursor, follow=True)
    # The end itself is a cursor chatledger printed: what commits later comes.
    conv = ledger.create_conversation().id
    say(ledger, conv, "later")
    assert texts(settled(ledger, after=end)) == ["later"]


def test_the_async_tail_refuses_a_cursor_past_the_end_before_its_first_page(
    backend: str, database_url: str, ledger: Ledger
) -> None:
    ahead = past(backend, the_end(ledger))

    async def scenario() -> str:
        async with AsyncStore.open(database_url) as store:
            pages = store.tenant(ledger.tenant).tail(ahead)
            with pytest.raises(InvalidInputError, match="past the end of the log") as refused:
                await anext(aiter(pages))
            return str(refused.value)

    assert repr(ahead) in asyncio.run(scenario())


def test_another_tenants_position_reads_as_any_position_in_the_log(
    backend: str, store: Store, ledger: Ledger
) -> None:
    """A cursor is a position in the whole log: another tenant's passes as one of
    the caller's would, and a position past the end is refused in the same words
    whoever's events the log holds, naming nothing but the cursor."""
    theirs = the_end(ledger)
    stranger = store.tenant(f"{ledger.tenant}-stranger")
    assert list(stranger.tail(theirs)) == []
    conv = stranger.create_conversation().id
    say(stranger, conv, "mine")
    assert texts(settled(stranger, after=theirs)) == ["mine"]

    ahead = past(backend, the_end(stranger))
    said = []
    for who in (ledger, stranger, store.tenant(f"{ledger.tenant}-nobody")):
        with pytest.raises(InvalidInputError) as refused:
            who.tail(ahead)
        said.append(str(refused.value))
    assert said[0] == said[1] == said[2]
    assert not re.search(r"\d", said[0].replace(repr(ahead), "")), "it names no other position"
