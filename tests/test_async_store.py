"""AsyncStore runs the same operations, through `run_sync`, on every backend."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from store import AsyncStore, ConflictError, Message, NewEvent, NotFoundError


async def test_async_store_round_trip(database_url: str) -> None:
    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant(f"async-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation({"k": "v"})
        await ledger.append_messages(conv.id, [Message(role="user", content="hi")], expected=1)
        cursor = await ledger.start_run(conv.id, owner="async-worker")
        reply = NewEvent.of_message(Message(role="assistant", content="hello"))
        _, cursor = await ledger.record(cursor, [reply])
        await ledger.complete_run(cursor)
        history = await ledger.history(conv.id)
        assert [m.content for m in history] == ["hi", "hello"]
        fork = await ledger.fork(conv.id, at=2)
        assert [m.content for m in await ledger.history(fork.id)] == ["hi"]
        assert (await ledger.run(cursor.run_id)).status == "completed"
        with pytest.raises(NotFoundError):
            await store.tenant("other").history(conv.id)


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
