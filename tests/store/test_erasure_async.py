"""`AsyncStore` keeps the key-encryption key, decryption and retention's files off its loop.

A key-encryption key may be a KMS: each `wrap` and `unwrap` a network call.
An async store that made them on its event loop would stall every other
task of the process for as long as the KMS takes. These tests record the
thread of every call (the calls themselves are real: a `LocalKek`, real
AES-GCM, real files) and fail if one ran on the loop's thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import chatledger.store._retention as retention_module
from chatledger.store import AsyncStore, LocalKek, Message, new_id
from chatledger.store._crypto import DataKey

KEK = bytes(range(160, 192))


class RecordingKek(LocalKek):
    """A local key-encryption key that notes the thread of each call."""

    def __init__(self, key: bytes, calls: list[tuple[str, int]]) -> None:
        super().__init__(key)
        self.calls = calls

    def wrap(self, data_key: bytes) -> bytes:
        self.calls.append(("wrap", threading.get_ident()))
        return super().wrap(data_key)

    def unwrap(self, wrapped: bytes) -> bytes:
        self.calls.append(("unwrap", threading.get_ident()))
        return super().unwrap(wrapped)


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every decryption of sealed content."""
    threads: list[int] = []
    real = DataKey.open_parts

    def recording(self: DataKey, nonce: str, data: str) -> str:
        threads.append(threading.get_ident())
        return real(self, nonce, data)

    monkeypatch.setattr(DataKey, "open_parts", recording)
    return threads


async def test_no_key_encryption_key_call_or_decryption_runs_on_the_event_loop(
    database_url: str, fast_paths: bool, opens: list[int]
) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[str, int]] = []
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    secret = f"secret-{uuid.uuid4().hex}"
    kek = RecordingKek(KEK, calls)
    async with AsyncStore.open(database_url, fast_paths=fast_paths, kek=kek) as writer:
        ledger = writer.tenant(tenant)
        conv = await ledger.create_conversation({"note": secret})  # mints: wrap
        await ledger.append_messages(conv.id, [Message(role="user", content=secret)])
        forked = await ledger.fork(conv.id)
    # A second store has no key cached: its first write unwraps the subject's key,
    # and each kind of read opens content with keys it unwraps itself.
    async with AsyncStore.open(database_url, fast_paths=fast_paths, kek=kek) as reader:
        ledger = reader.tenant(tenant)
        await ledger.append_messages(forked.id, [Message(role="user", content=secret)])
    # A write's own result (the metadata a creation and a fork return, the events an
    # append returns) opens in place with the key it sealed under: no key-encryption
    # key call, and no more than the caller just passed. Reads must not decrypt on
    # the loop.
    opens.clear()
    for read in ("history", "entries", "events", "conversation"):
        async with AsyncStore.open(database_url, fast_paths=fast_paths, kek=kek) as reader:
            ledger = reader.tenant(tenant)
            if read == "history":
                shown: Any = await ledger.history(conv.id)
            elif read == "entries":
                shown = [e.message for e in await ledger.entries(conv.id)]
            elif read == "events":
                shown = [e.payload for e in await ledger.events(conversation_id=conv.id)]
            else:
                shown = (await ledger.conversation(conv.id)).metadata
            assert secret in repr(shown), read

    assert {kind for kind, _ in calls} == {"wrap", "unwrap"}
    assert len([c for c in calls if c[0] == "unwrap"]) >= 5
    assert opens, "no sealed content was opened"
    on_loop = [kind for kind, thread in calls if thread == loop_thread]
    assert on_loop == [], f"key-encryption key calls on the event loop: {on_loop}"
    assert loop_thread not in opens, "a read decrypted sealed content on the event loop"


async def test_an_async_retention_pass_writes_and_syncs_its_exports_off_the_loop(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(retention_module.os, "fsync", recording_fsync)
    async with AsyncStore.open(database_url, kek=KEK) as sealed:
        ledger = sealed.tenant(f"t-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation(subject="person")
        await ledger.append_messages(conv.id, [Message(role="user", content="words")])
        await ledger.retention.set(1, "export-erase")
        now = (await ledger.events(conversation_id=conv.id))[-1].recorded_at + timedelta(days=2)
        report = await sealed.run_retention(
            tenant=ledger.tenant, export_dir=tmp_path / "exports", now=now
        )
        (outcome,) = report.subjects
        assert outcome.erased and len(outcome.exported) == 1
        assert Path(outcome.exported[0]).stat().st_size > 0
    assert len(synced) == 2  # the file, then its directory
    assert loop_thread not in synced


async def test_a_retention_pass_needs_no_more_than_one_worker_thread(
    database_url: str, tmp_path: Path
) -> None:
    # Its blocking steps take a worker thread each in turn, and never wait for
    # another one: passes side by side on a one-thread executor all finish.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    async with AsyncStore.open(database_url, kek=KEK) as sealed:
        tenants = [sealed.tenant(f"t-{uuid.uuid4().hex[:8]}") for _ in range(3)]
        now = None
        for ledger in tenants:
            conv = await ledger.create_conversation()
            await ledger.append_messages(conv.id, [Message(role="user", content="words")])
            await ledger.retention.set(1, "export-erase")
            last = (await ledger.events(conversation_id=conv.id))[-1].recorded_at
            now = max(now or last, last)
        assert now is not None
        passes = [
            sealed.run_retention(
                tenant=ledger.tenant, export_dir=tmp_path / "exports", now=now + timedelta(days=2)
            )
            for ledger in tenants
        ]
        # A deadlock would hang here: fail after a minute instead.
        reports = await asyncio.wait_for(asyncio.gather(*passes), timeout=60)
    assert [len(r.subjects) for r in reports] == [1, 1, 1]
    assert all(r.subjects[0].erased for r in reports)


async def test_a_seal_read_in_a_rolled_back_transaction_is_not_kept_by_the_async_store(
    database_url: str, fast_paths: bool
) -> None:
    """As the synchronous test in test_erasure.py: a seal read inside a caller's
    transaction that rolls back is not used by the store's later writes."""
    from chatledger.store._store import Operations

    tenant, cid = f"t-{uuid.uuid4().hex[:8]}", new_id()
    async with AsyncStore.open(database_url, fast_paths=fast_paths, kek=KEK) as sealed_store:
        ops = Operations(tenant, sealed_store.message_cache, sealed_store._sealer)
        async with sealed_store.engine.connect() as caller:
            await caller.begin()
            await sealed_store.execute(
                ops.create_conversation(conversation_id=cid, subject="gone"), caller
            )
            turn = next(ops.append_messages(cid, [Message(role="user", content="inside")]))
            await sealed_store.execute(turn, caller)
            await caller.rollback()
        async with AsyncStore.open(database_url, kek=KEK) as other:
            await other.tenant(tenant).create_conversation(conversation_id=cid, subject="kept")
        ledger = sealed_store.tenant(tenant)
        acknowledged = [Message(role="user", content="acknowledged")]
        await ledger.append_messages(cid, acknowledged)
        assert await ledger.history(cid) == acknowledged


async def test_a_subjects_first_conversations_created_at_once_share_its_key(
    database_url: str,
) -> None:
    from tests.store.test_erasure import _MintingTogether

    async with AsyncStore.open(database_url, kek=_MintingTogether()) as store:
        ledger = store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")
        made = [ledger.create_conversation(subject="pair") for _ in range(2)]
        convs = await asyncio.wait_for(asyncio.gather(*made), timeout=60)
        await ledger.erase("pair", reason="both at once")
        for conv in convs:
            assert (await ledger.conversation(conv.id)).erased_at is not None
