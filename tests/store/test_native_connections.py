"""`AsyncStore`'s own psycopg async connections, which run the Postgres fast paths on
the event loop (store/_db/native.py, ADR 0026).

The same rules as the synchronous `DriverConnections` (tests/store/test_driver_connections.py),
plus what only an event loop has: an operation cancelled mid-statement.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from chatledger.store import AsyncStore, EncryptionError, Message
from chatledger.store._db.engines import normalize_url
from chatledger.store._db.native import AsyncDriverConnections, await_only
from chatledger.store._db.workers import Workers
from tests.conftest import _libpq, postgres_admin_url
from tests.store.test_driver_connections import end_session


@pytest.fixture
async def engine(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    created = create_async_engine(normalize_url(postgres_url))
    yield created
    await created.dispose()


def _pid(cursor: Any) -> int:
    cursor.execute("SELECT pg_backend_pid()")
    return int(cursor.fetchone()[0])


async def test_connections_are_reused_in_autocommit_and_closed_by_close(
    engine: AsyncEngine,
) -> None:
    connections = AsyncDriverConnections(engine)
    seen: list[Any] = []

    def remember(cursor: Any) -> int:
        seen.append(cursor.connection)
        return _pid(cursor)

    first = await connections.run(remember)
    second = await connections.run(remember)
    assert first[0] and first == second  # one connection, taken and given back
    assert seen[0] is seen[1] and seen[0].autocommit
    await connections.close()
    assert seen[0].closed


async def test_connections_take_generic_plans_and_the_pool_does_not(engine: AsyncEngine) -> None:
    # docs/adr/0030-generic-plans-on-the-store-connections.md
    connections = AsyncDriverConnections(engine)

    def mode(cursor: Any) -> str:
        cursor.execute("SHOW plan_cache_mode")
        return str(cursor.fetchone()[0])

    try:
        assert await connections.run(mode) == (True, "force_generic_plan")
        async with engine.connect() as conn:  # the engine's own connections keep the default
            assert (await conn.exec_driver_sql("SHOW plan_cache_mode")).scalar_one() == "auto"
    finally:
        await connections.close()


async def test_when_every_connection_is_busy_run_declines(engine: AsyncEngine) -> None:
    # The store then takes its other paths.
    connections = AsyncDriverConnections(engine, size=1)
    inner: list[tuple[bool, int | None]] = []

    def nested(cursor: Any) -> int:
        inner.append(await_only(connections.run(lambda c: 2)))
        return 1

    assert await connections.run(nested) == (True, 1)
    assert inner == [(False, None)]
    assert await connections.run(lambda c: 3) == (True, 3)  # the slot came back
    await connections.close()


async def test_a_connection_that_saw_an_error_is_not_reused(engine: AsyncEngine) -> None:
    connections = AsyncDriverConnections(engine)
    seen: list[Any] = []

    def fail(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT no_such_column FROM pg_class")

    for _ in range(2):
        with pytest.raises(psycopg.errors.UndefinedColumn, match="no_such_column"):
            await connections.run(fail)
    assert seen[0] is not seen[1] and seen[0].closed
    await connections.close()


async def test_the_operations_own_refusal_keeps_its_connection(engine: AsyncEngine) -> None:
    connections = AsyncDriverConnections(engine)
    seen: list[Any] = []

    def refuse(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT 1")
        raise EncryptionError("refused")

    for _ in range(2):
        with pytest.raises(EncryptionError):
            await connections.run(refuse)
    assert seen[0] is seen[1] and not seen[0].closed
    await connections.close()


async def test_an_idle_connection_the_server_closed_is_not_handed_out(
    engine: AsyncEngine, postgres_url: str
) -> None:
    connections = AsyncDriverConnections(engine)
    ok, pid = await connections.run(_pid)
    assert ok and pid is not None
    await asyncio.to_thread(end_session, postgres_url, pid)
    ok, again = await connections.run(_pid)
    assert ok and again != pid
    await connections.close()


async def test_a_connection_that_breaks_in_use_is_closed_quietly(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.pool")
    connections = AsyncDriverConnections(engine)
    seen: list[Any] = []

    def end_itself(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    with pytest.raises(psycopg.OperationalError, match="terminating connection"):
        await connections.run(end_itself)
    assert seen[0].closed
    assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
    assert await connections.run(lambda c: 1) == (True, 1)
    await connections.close()


async def test_a_connection_that_cannot_be_opened_fails_wrapped_as_the_pool_reports_it() -> None:
    refused = sa.make_url(normalize_url(postgres_admin_url())).set(host="127.0.0.1", port=1)
    engine = create_async_engine(refused)
    connections = AsyncDriverConnections(engine, size=1)
    try:
        for _ in range(2):  # the second try shows the slot came back
            with pytest.raises(sa.exc.OperationalError) as caught:
                await connections.run(lambda cursor: 1)
            assert isinstance(caught.value.orig, psycopg.OperationalError)
    finally:
        await connections.close()
        await engine.dispose()


async def _wait_for_session(postgres_url: str, pid: int, running: bool) -> None:
    """Until the session `pid` is (`running`) or is no longer inside its `pg_sleep`,
    a condition read from the server, each check a round trip; 30 s at most."""
    async with await psycopg.AsyncConnection.connect(
        _libpq(postgres_url), autocommit=True
    ) as admin:
        deadline = asyncio.get_running_loop().time() + 30
        while asyncio.get_running_loop().time() < deadline:
            row = await (
                await admin.execute(
                    "SELECT state = 'active' AND query LIKE '%%pg_sleep%%' "
                    "FROM pg_stat_activity WHERE pid = %s",
                    [pid],
                )
            ).fetchone()
            if bool(row is not None and row[0]) == running:
                return
    raise AssertionError(f"session {pid} never {'began' if running else 'left'} its pg_sleep")


async def test_an_operation_cancelled_mid_statement_is_cancelled_in_the_server(
    engine: AsyncEngine, postgres_url: str
) -> None:
    connections = AsyncDriverConnections(engine)
    # Two connections, both idle afterwards (the runs overlap at their awaits).
    warm = {pid for _, pid in await asyncio.gather(connections.run(_pid), connections.run(_pid))}
    assert len(warm) == 2
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen: list[Any] = []

    def slow(cursor: Any) -> None:
        seen.append(cursor.connection)
        started.set_result(cursor.connection.info.backend_pid)
        cursor.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(connections.run(slow))  # takes one; the other stays idle
    pid = await started
    await _wait_for_session(postgres_url, pid, running=True)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The server stopped the statement (psycopg's cancel request), and the
    # connection, its state unknown to us, is closed and never handed out again.
    await _wait_for_session(postgres_url, pid, running=False)
    assert seen[0].closed
    ok, other = await connections.run(_pid)
    assert ok and other != pid
    assert warm == {pid, other}  # the other idle connection was kept
    await connections.close()


async def test_the_async_chat_loop_on_postgres_makes_no_thread_hop(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    real = Workers.run

    async def counting(self: Workers, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(Workers, "run", counting)
    async with AsyncStore.open(postgres_url) as fast:
        ledger = fast.tenant(f"native-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        for position, text in enumerate(["one", "two", "three"], start=1):
            await ledger.append_messages(
                conv.id, [Message(role="user", content=text)], expected=position
            )
            assert [m.content for m in await ledger.history(conv.id)][-1] == text
        created = await ledger.append_messages(
            str(uuid.uuid4()), [Message(role="user", content="new")], create=True
        )
        assert created.created
        assert hops == []
        # What the fast paths do not cover still runs in a worker thread.
        assert (await ledger.verify(conv.id)).ok
        assert hops != []
    # A store with a key-encryption key keeps its fast paths in the worker thread:
    # a head read opens what it reads there, and the key's calls stay off the loop.
    hops.clear()
    async with AsyncStore.open(postgres_url, kek=bytes(32)) as sealed:
        assert sealed._native is None
        ledger = sealed.tenant(f"native-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        await ledger.append_messages(conv.id, [Message(role="user", content="hi")])
        assert "DriverConnections.run" in hops


async def test_a_store_cancelled_mid_append_stays_usable_and_consistent(
    postgres_url: str,
) -> None:
    # The cancelled append either committed or not; the store goes on, and the
    # log verifies either way.
    async with AsyncStore.open(postgres_url) as fast:
        ledger = fast.tenant(f"native-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        # Connections open and idle first, so the cancellations below find
        # appends inside their statements, not inside a connect.
        await asyncio.gather(*[ledger.history(conv.id) for _ in range(8)])
        appends = [
            asyncio.create_task(
                ledger.append_messages(conv.id, [Message(role="user", content=str(i))])
            )
            for i in range(20)
        ]
        await asyncio.sleep(0)  # one turn of the loop: each task runs to its first await
        for task in appends[::2]:
            task.cancel()
        results = await asyncio.gather(*appends, return_exceptions=True)
        done = [r for r in results if not isinstance(r, BaseException)]
        assert len(done) >= 10
        await ledger.append_messages(conv.id, [Message(role="user", content="after")])
        history = [m.content for m in await ledger.history(conv.id)]
        assert history[-1] == "after"
        assert {str(i) for i in range(1, 20, 2)} <= set(history)
        assert (await ledger.verify(conv.id)).ok
