"""`AsyncStore` on SQLite runs a write's fast form on the event loop when it need
not wait, and hands it to a worker thread when it would (docs/adr/0051).

A write that would wait, for another writer of this process or of another
one, must leave the loop free: each test below holds the writer lock, sees the
write go to a worker, and only then lets the other writer go, from the loop.
A write that blocked the loop instead would never let it go (it fails at the
busy timeout).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import AsyncLedger, AsyncStore, Message
from chatledger.store._async import CHECKPOINTS
from chatledger.store._db import engines
from chatledger.store._db.engines import DriverConnections, create_engine, sqlite_writer
from chatledger.store._db.workers import Workers

WAIT = 30.0  # the store's busy timeout, and how long a test waits for what comes at once
PATIENCE = 10.0  # how long another writer waits to be let go from the loop


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[AsyncStore]:
    async with AsyncStore.open(sqlite_url, busy_timeout=WAIT) as opened:
        yield opened


FORM = "AsyncStore._primed"  # a write's fast form declined on the loop, in a worker
CHECKPOINT = "AsyncStore._checkpoint"


@contextmanager
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What is handed to a worker thread (`FORM`, `CHECKPOINT`, or another call's
    name), as it is handed over."""
    seen: list[str] = []
    real = Workers.run

    async def counting(self: Workers, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(fn, "__qualname__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Workers, "run", counting)
        yield seen


async def handed_over(seen: list[str]) -> None:
    async def first() -> None:
        while FORM not in seen:
            await asyncio.sleep(0)  # a turn of the loop: the append's task runs

    await asyncio.wait_for(first(), WAIT)


def say(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


async def test_writes_run_on_the_loop_and_the_logs_checkpoints_in_a_worker(
    store: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = store.tenant("on-loop")
    with hops(monkeypatch) as seen:
        conv = await ledger.create_conversation()
        assert seen == [FORM]  # the first: the loop's connection is opened in the worker
        for i in range(2 * CHECKPOINTS):
            await ledger.append_messages(conv.id, say(f"m{i}"), expected=i + 1)
        assert seen == [FORM, CHECKPOINT, CHECKPOINT]
    history = await ledger.history(conv.id)
    assert [m.content for m in history] == [f"m{i}" for i in range(2 * CHECKPOINTS)]
    # The loop's connection neither waits for a lock nor runs checkpoints.
    assert store._on_loop is not None
    pragmas = store._on_loop.run(
        False,
        lambda c: [
            c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("busy_timeout", "wal_autocheckpoint")
        ],
    )
    assert pragmas == (True, [0, 0])


async def test_a_task_appending_on_the_loop_gives_the_others_their_turns(
    store: AsyncStore,
) -> None:
    ledger = store.tenant("turns")
    conv = await ledger.create_conversation()
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)  # it starts
    before = turns
    for i in range(CHECKPOINTS // 2):  # none of them in a worker thread
        await ledger.append_messages(conv.id, say(f"m{i}"))
    done = True
    await task
    assert turns - before >= CHECKPOINTS // 2


async def test_the_logs_checkpoints_run_whatever_else_is_written(
    store: AsyncStore, sqlite_url: str
) -> None:
    # The loop's commits leave the write-ahead log growing; the checkpoint after
    # each CHECKPOINTS of them copies it into the database file, whatever the
    # writes between do (a replay, committing nothing, goes to the worker).
    path = Path(sa.make_url(sqlite_url).database or "")
    before = os.path.getsize(path)
    ledger = store.tenant("checkpoints")
    conv = await ledger.create_conversation()
    big = "x" * 10_000
    for i in range(2 * CHECKPOINTS):
        for _ in range(2):  # the second: a replay
            await ledger.append_messages(conv.id, say(f"{i} {big}"), idempotency_key=f"k{i}")
    grown = os.path.getsize(path) - before
    assert grown > 4 * 1024 * 1024, grown  # more than 1,000 pages of 4 KiB reached the file
    assert len(await ledger.history(conv.id)) == 2 * CHECKPOINTS


async def test_the_loop_opens_and_closes_no_connection(
    store: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening one may wait for the pool (or for SQLite, in its connect-time
    # settings), and closing the last one checkpoints the log: both in a worker.
    loop_thread = threading.current_thread()
    used_on: list[tuple[str, threading.Thread]] = []
    connect, close = DriverConnections._connect, engines._close

    def connecting(self: DriverConnections) -> Any:
        used_on.append(("open", threading.current_thread()))
        return connect(self)

    def closing(fairy: Any) -> None:
        used_on.append(("close", threading.current_thread()))
        close(fairy)

    monkeypatch.setattr(DriverConnections, "_connect", connecting)
    monkeypatch.setattr(engines, "_close", closing)
    ledger = store.tenant("opening")
    conv = await ledger.create_conversation()
    assert store._on_loop is not None
    store._on_loop._recycle = 0.0  # its connection is due to be replaced
    await ledger.append_messages(conv.id, say("replaced"))
    store._on_loop._recycle = 1800.0
    used = [what for what, _ in used_on]
    with hops(monkeypatch) as seen:
        for i in range(3):
            await ledger.append_messages(conv.id, say(f"m{i}"))
        assert seen == []  # on the loop again, on the new connection
    assert used.count("open") >= 2 and "close" in used
    assert all(thread is not loop_thread for _, thread in used_on)


class Holder:
    """Another writer, in a thread: it holds the writer's lock until the test lets it
    go from the loop, or, when the loop never gets there, until `PATIENCE` runs out
    (`stuck`). The store waits longer than that for a lock (`WAIT`), so a write that
    waited on the loop would outlast it, then write there, never handed over."""

    def __init__(self, hold: Callable[[threading.Event], None]) -> None:
        self.holding, self.release, self.stuck = threading.Event(), threading.Event(), False
        self._thread = threading.Thread(target=self._run, args=(hold,))

    def _run(self, hold: Callable[[threading.Event], None]) -> None:
        hold(self.holding)
        self.stuck = not self.release.wait(PATIENCE)

    def __enter__(self) -> Holder:
        self._thread.start()
        assert self.holding.wait(WAIT)
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        self._thread.join()


async def appended_behind(ledger: AsyncLedger, holder: Holder, seen: list[str]) -> None:
    """An append while `holder` writes: handed to a worker, and done once let go."""
    conv = await ledger.create_conversation()
    order: list[str] = []

    async def append() -> None:
        await ledger.append_messages(conv.id, say("behind"))
        order.append("appended")

    with holder:
        seen.clear()
        task = asyncio.create_task(append())
        await handed_over(seen)
        order.append("let go")
        holder.release.set()
        await asyncio.wait_for(task, WAIT)
    assert not holder.stuck
    assert order == ["let go", "appended"]
    assert [m.content for m in await ledger.history(conv.id)] == ["behind"]


async def test_a_write_behind_a_writer_of_this_process_leaves_the_loop_free(
    store: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = store._sync_engine
    assert engine is not None

    def hold(holding: threading.Event) -> None:
        with sqlite_writer(engine):
            holding.set()
            holder.release.wait(PATIENCE)

    holder = Holder(hold)
    with hops(monkeypatch) as seen:
        await appended_behind(store.tenant("behind-thread"), holder, seen)


async def test_a_write_behind_another_processs_writer_leaves_the_loop_free(
    store: AsyncStore, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hold(holding: threading.Event) -> None:
        # A connection of its own, as another process's: it meets ours only in SQLite.
        other = sqlite3.connect(sa.make_url(sqlite_url).database or "", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            holding.set()
            holder.release.wait(PATIENCE)
            other.execute("COMMIT")
        finally:
            other.close()

    holder = Holder(hold)
    with hops(monkeypatch) as seen:
        await appended_behind(store.tenant("behind-process"), holder, seen)


def test_a_connection_that_must_not_wait_declines_a_taken_lock(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    connections = DriverConnections(engine, size=1, waits=False)
    other = sqlite3.connect(sa.make_url(sqlite_url).database or "", isolation_level=None)
    try:

        def count(cursor: Any) -> int:
            cursor.execute("SELECT count(*) FROM chatledger_events")
            return int(cursor.fetchone()[0])

        assert connections.run(False, count) == (False, None)  # it opens none itself
        connections.prime()
        assert connections.run(False, count) == (True, 0)
        other.execute("BEGIN IMMEDIATE")
        assert connections.run(True, count) == (False, None)  # declined, nothing ran
        assert connections.run(False, count) == (True, 0)  # a read never waits
        other.execute("COMMIT")
        assert connections.run(True, count) == (True, 0)
    finally:
        other.close()
        connections.close()
        engine.dispose()


async def test_a_store_with_a_key_keeps_its_writes_off_the_loop(sqlite_url: str) -> None:
    # The key's calls (a KMS) must not run on the loop.
    async with AsyncStore.open(sqlite_url, kek=bytes(32)) as sealed:
        assert sealed._on_loop is None
