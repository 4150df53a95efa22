"""AsyncStore's own behaviour: cancellation, migrations and the whole-store operations.

A tenant's operations on the async face are held to the conformance suite
(tests/conformance/); the async fast paths: test_fast_paths.py.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import (
    AsyncLedger,
    AsyncStore,
    ConflictError,
    Message,
    SchemaError,
    Store,
    Verification,
)
from chatledger.store.schema import view_entries
from tests.conftest import _libpq
from tests.store.test_store_faults import waiting_for_lock


async def test_async_concurrent_appends_conflict_cleanly(database_url: str) -> None:
    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant(f"async-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        results = await asyncio.gather(
            *[
                ledger.append_messages(conv.id, [Message(role="user", content=str(i))], expected=1)
                for i in range(4)
            ],
            return_exceptions=True,
        )
        wins = [r for r in results if not isinstance(r, BaseException)]
        assert len(wins) == 1
        assert all(isinstance(r, ConflictError) for r in results if r not in wins)
        assert len(await ledger.history(conv.id)) == 1


async def _cancel_while_locked(
    postgres_url: str, ledger: AsyncLedger, conversation_id: str
) -> None:
    """Append "during" to the conversation while another session locks the table, and
    cancel the append once it waits for that lock (mid-transaction); then unlock."""
    with (
        psycopg.connect(_libpq(postgres_url), autocommit=True) as admin,
        admin.transaction(),
    ):
        admin.execute("LOCK TABLE chatledger_conversations IN ACCESS EXCLUSIVE MODE")
        append = asyncio.create_task(
            ledger.append_messages(conversation_id, [Message(role="user", content="during")])
        )
        await asyncio.to_thread(waiting_for_lock, admin)
        append.cancel()
        with pytest.raises(asyncio.CancelledError):
            await append


async def test_a_cancelled_append_is_still_committed_by_its_worker_thread(
    postgres_url: str,
) -> None:
    # A store with a key-encryption key runs its fast paths in a worker thread
    # (ADR 0026), which cannot be stopped mid-transaction, so it finishes it.
    async with AsyncStore.open(postgres_url, kek=bytes(32)) as store:
        tenant = f"async-{uuid.uuid4().hex[:8]}"
        ledger = store.tenant(tenant)
        conv = await ledger.create_conversation()
        # The store knows the conversation's key from here on: the append below
        # is one operation, the one the lock holds up.
        await ledger.append_messages(conv.id, [Message(role="user", content="before")])
        await _cancel_while_locked(postgres_url, ledger, conv.id)
        # Waits for the worker threads, the append's among them.
        await asyncio.get_running_loop().shutdown_default_executor()
    with Store.open(postgres_url, kek=bytes(32)) as sync_store:
        history = sync_store.tenant(tenant).history(conv.id)
    assert [m.content for m in history] == ["before", "during"]


async def test_a_cancelled_append_on_the_loop_is_cancelled_in_the_server(
    postgres_url: str,
) -> None:
    # Without a key, the Postgres fast paths run on the event loop (ADR 0026):
    # cancelling the task cancels the statement in the server (psycopg sends
    # the cancel request), so an append still waiting writes nothing, and the
    # store goes on.
    async with AsyncStore.open(postgres_url) as store:
        tenant = f"async-{uuid.uuid4().hex[:8]}"
        ledger = store.tenant(tenant)
        conv = await ledger.create_conversation()
        await _cancel_while_locked(postgres_url, ledger, conv.id)
        assert await ledger.history(conv.id) == []
        await ledger.append_messages(conv.id, [Message(role="user", content="after")])
        assert [m.content for m in await ledger.history(conv.id)] == ["after"]
        assert (await ledger.verify(conv.id)).ok


# -- The store's own operations, on the async face -----------------------------
#
# Each runs on a database of its own: these operations span every tenant, so
# on the session's shared database they would meet other tests' rows.


async def table_names(store: AsyncStore) -> set[str]:
    async with store.engine.connect() as conn:
        return set(await conn.run_sync(lambda c: sa.inspect(c).get_table_names()))


async def test_async_check_schema_refuses_an_unmigrated_database(empty_url: str) -> None:
    async with AsyncStore.open(empty_url) as store:
        with pytest.raises(SchemaError, match="migrate"):
            await store.check_schema()
        await store.migrate()
        await store.check_schema()


async def test_async_migrate_runs_inside_the_callers_transaction(empty_url: str) -> None:
    async with AsyncStore.open(empty_url) as store:
        async with store.engine.connect() as conn, conn.begin():
            await conn.exec_driver_sql("CREATE TABLE app_users (id INTEGER PRIMARY KEY)")
            await store.migrate(connection=conn)
        assert {"app_users", "chatledger_events"} <= await table_names(store)
        await store.check_schema()


async def test_async_migrate_on_a_connection_is_undone_with_the_callers_transaction(
    empty_url: str,
) -> None:
    async with AsyncStore.open(empty_url) as store:
        async with store.engine.connect() as conn:
            transaction = await conn.begin()
            await store.migrate(connection=conn)
            await transaction.rollback()
        assert not {t for t in await table_names(store) if t.startswith("chatledger_")}
        with pytest.raises(SchemaError, match="migrate"):
            await store.check_schema()


async def test_async_claim_stale_runs_claims_them_in_every_tenant(own_database: str) -> None:
    async with AsyncStore.open(own_database) as store:
        stale = {}
        for tenant in ("north", "south"):
            ledger = store.tenant(tenant)
            conv = await ledger.create_conversation()
            cursor = await ledger.runs.start(conv.id, owner="zombie", lease_seconds=0)
            stale[cursor.run_id] = tenant
        live = store.tenant("north")
        conv = await live.create_conversation()
        await live.runs.start(conv.id, owner="alive", lease_seconds=600)

        claimed = await store.claim_stale_runs(owner="rescuer", lease_seconds=60)

        assert {run.id: run.tenant for run, _ in claimed} == stale
        assert {(c.owner, c.attempt) for _, c in claimed} == {("rescuer", 2)}
        assert await store.claim_stale_runs(owner="another") == []


async def test_async_verify_checks_every_tenant_as_the_sync_store_does(own_database: str) -> None:
    async with AsyncStore.open(own_database) as store:
        ids = []
        for tenant in ("north", "south"):
            ledger = store.tenant(tenant)
            conv = await ledger.create_conversation()
            await ledger.append_messages(conv.id, [Message(role="user", content=tenant)])
            ids.append(conv.id)
        seen: list[Verification] = []

        results = await store.verify(seen.append, recompute="client")

    assert sorted(r.conversation_id for r in results) == sorted(ids)
    assert all(r.ok for r in results)
    assert seen == results
    with Store.open(own_database) as sync_store:
        assert sync_store.verify(recompute="client") == results


async def test_async_rebuild_recomputes_every_view_and_reports_progress(own_database: str) -> None:
    async with AsyncStore.open(own_database) as store:
        ledger = store.tenant("t")
        conv = await ledger.create_conversation()
        await ledger.append_messages(conv.id, [Message(role="user", content="kept")])
        fork = await ledger.fork(conv.id)
        async with store.engine.begin() as conn:
            await conn.execute(view_entries.delete())
        assert await ledger.history(conv.id) == []
        progress: list[tuple[int, int]] = []

        rebuilt = await store.rebuild(lambda done, total: progress.append((done, total)))

        assert rebuilt == 2
        assert progress == [(1, 2), (2, 2)]
        for conversation_id in (conv.id, fork.id):
            assert [m.content for m in await ledger.history(conversation_id)] == ["kept"]
