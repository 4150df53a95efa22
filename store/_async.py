"""`AsyncStore` and `AsyncLedger`: the async face.

They run the very `Op`s of the sync face, so every rule has one
implementation; only the signatures are written twice, and
`tests/test_faces.py` holds them equal. On Postgres the plain-SQL forms run
on psycopg async connections of the store's own, on the event loop
(docs/adr/0026-async-fast-paths-on-the-loop.md); on SQLite, and with a
key-encryption key, on the sync face's driver connections in a worker thread;
the rest in a worker thread on the store's sync engine, or through
SQLAlchemy's `run_sync` on a caller's engine (docs/adr/0015-async-fast-paths.md).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from chatledger.store import _tail
from chatledger.store._audit import AsyncAudit
from chatledger.store._cache import HeadCache, MessageCache, TailCache
from chatledger.store._crypto import KeyEncryptionKey, kek_for, sealer_for
from chatledger.store._db.engines import (
    DriverConnections,
    Durability,
    create_engine,
    database_url,
    install_sqlite_hooks,
    sync_driver_url,
)
from chatledger.store._db.native import AsyncDriverConnections
from chatledger.store._db.replicas import Replicas, check_replicas
from chatledger.store._db.run import general
from chatledger.store._db.tail import (
    AsyncPostgresWaiter,
    Notifier,
    SqliteWaiter,
    async_connector,
    connector,
    sqlite_connector,
    url_connector,
)
from chatledger.store._errors import ConflictError, EncryptionError, ErasedError
from chatledger.store._ops import Operations, StoreOperations, completed
from chatledger.store._retention import RetentionReport, SubjectOutcome, run_retention
from chatledger.store._sealing import Program, adrive, needs_opening, opening, preparing
from chatledger.store._sql.dialect import WRITE, is_sqlite
from chatledger.store._sql.erasure import Erasure
from chatledger.store._sql.ops import Op, in_transaction, run_fast
from chatledger.store._sql.pages import DEFAULT_LIMIT, Page
from chatledger.store._sql.retention import RetentionAction, RetentionPolicy
from chatledger.store._sql.tail import notify_on_commit
from chatledger.store._sql.transfer import ExportReport, ImportReport
from chatledger.store._sql.translate import translating
from chatledger.store._sql.verify import Recompute, Verification
from chatledger.store._values import (
    Appended,
    Conversation,
    Entry,
    Event,
    NewEvent,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from chatledger.store.messages import Message, Usage

__all__ = ["AsyncLedger", "AsyncStore"]

T = TypeVar("T")


class AsyncStore:
    """The async face of `Store`: the same operations, as coroutines.

    A store that `open` made its engine for also makes a synchronous engine on
    the same database (sqlite3, or psycopg 3 in its sync mode). On Postgres
    it runs the plain-SQL forms of the hot operations on psycopg async
    connections of its own, on the event loop, with no thread hop
    (`AsyncDriverConnections`, ADR 0026); on SQLite, and on a store with a
    key-encryption key (whose calls must stay off the loop), on that
    synchronous engine's driver connections (`DriverConnections`, as `Store`
    does), each in a worker thread (`asyncio.to_thread`): one thread hop per
    operation, where aiosqlite takes one per statement. Every other
    operation, and a fast form that declines, runs the general path on that
    synchronous engine's pool, in one thread hop (ADR 0015).

    A store on a caller's `AsyncEngine` (`open(engine=...)`) runs every
    operation through that engine, as before: a second engine could not
    carry what the caller gave theirs (`connect_args`, a `creator`, pool
    settings, event hooks), so its connections might reach the database
    differently, or not at all.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owns_engine: bool,
        message_cache: int = 10_000,
        fast_paths: bool = True,
        notify: bool = True,
        kek: KeyEncryptionKey | bytes | None = None,
    ) -> None:
        self._sealer = sealer_for(kek)
        self.engine = engine
        self._owns_engine = owns_engine
        self._ops = StoreOperations()
        self.message_cache = MessageCache(message_cache)
        self._heads = HeadCache()
        self._tails = TailCache()
        self.fast_paths = fast_paths
        """Whether operations try their plain-SQL form first (see `Store.open`)."""
        self._sqlite = is_sqlite(engine.sync_engine)
        # Set by `open` when it creates the engine (see the class docstring).
        self._sync_engine: Engine | None = None
        self._driver: DriverConnections | None = None
        # Postgres: the fast paths on psycopg's async connections, on the loop.
        self._native: AsyncDriverConnections | None = None
        self._replicas: Replicas | None = None
        # Wakes tails after writes (Postgres; see `Store.open`): on a connection
        # made as the engine makes them (`open` gives the store a sync twin of
        # its own engine; a caller's engine is seen through its URL).
        self._notifier = Notifier(url_connector(engine)) if notify and not self._sqlite else None

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        engine: AsyncEngine | None = None,
        durability: Durability = "full",
        busy_timeout: float = 30.0,
        message_cache: int = 10_000,
        fast_paths: bool = True,
        replicas: Sequence[str] = (),
        notify: bool = True,
        kek: KeyEncryptionKey | bytes | None = None,
    ) -> AsyncStore:
        """Open a store; the arguments are those of `Store.open`.

        A `sqlite:` URL uses the aiosqlite driver; `postgresql+psycopg:` is
        psycopg 3's async mode. With a URL, the store also opens a synchronous
        engine on the same database for its fast paths (see the class
        docstring); with `engine`, it uses only that one. Reads on `replicas`
        run on synchronous engines of their own (psycopg 3), in a worker
        thread, as the fast paths do.
        """
        primary = (
            engine.dialect.name if engine is not None else database_url(url).get_backend_name()
        )
        replica_urls = check_replicas(replicas, primary)  # before any engine exists
        sealer_for(kek)
        sibling = None
        if engine is None:
            parsed = database_url(url)
            twin = sync_driver_url(parsed)
            if twin is not None:
                sibling = create_engine(twin, durability=durability, busy_timeout=busy_timeout)
            if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
                parsed = parsed.set(drivername="sqlite+aiosqlite")
            kwargs: dict[str, Any] = (
                {"connect_args": {"timeout": busy_timeout}}
                if parsed.get_backend_name() == "sqlite"
                else {"pool_recycle": 1800}
            )
            engine = sa_create_async_engine(parsed, **kwargs)
            owns = True
        else:
            owns = False
        if engine.dialect.name == "sqlite":
            install_sqlite_hooks(
                engine.sync_engine, durability=durability, busy_timeout=busy_timeout
            )
        store = cls(
            engine,
            owns_engine=owns,
            message_cache=message_cache,
            fast_paths=fast_paths,
            notify=notify,
            kek=kek,
        )
        if sibling is not None:
            store._sync_engine, store._driver = sibling, DriverConnections(sibling)
            # Not with a key-encryption key: a head read opens what it reads inside
            # its fast path, and the key's calls (a KMS) must stay off the loop.
            if not store._sqlite and store._sealer is None:
                store._native = AsyncDriverConnections(engine)
            if store._notifier is not None:
                store._notifier = Notifier(connector(sibling))
        if replica_urls:
            store._replicas = Replicas(replica_urls)
        return store

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the connection pools (of the engines this store created)."""
        if self._notifier is not None:
            self._notifier.close(wait=False)  # no thread hop: the loop's executor may be shut
        if self._native is not None:
            await self._native.close()
        if self._driver is not None:
            self._driver.close()
        if self._replicas is not None:
            self._replicas.close()
        if self._sync_engine is not None:
            self._sync_engine.dispose()
        if self._owns_engine:
            await self.engine.dispose()

    async def migrate(
        self,
        connection: AsyncConnection | None = None,
        *,
        partitions: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Upgrade the schema to this package's head revision.

        `partitions`: see `Store.migrate`.

        With `connection`, run inside the caller's transaction on it: Alembic
        is synchronous, so the upgrade runs through `connection.run_sync`.
        Commit it as usual, for example within
        `async with engine.begin() as connection:`.
        """
        await self.execute(self._ops.migrate(partitions, progress), connection)

    def _tenant_ops(self, tenant: str) -> Operations:
        return Operations(tenant, self.message_cache, self._sealer, self._heads, self._tails)

    async def run_retention(
        self,
        *,
        tenant: str | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        progress: Callable[[SubjectOutcome], None] | None = None,
    ) -> RetentionReport:
        """See `Store.run_retention`. Its export files are written and synced in a
        worker thread, not on the event loop."""
        program = run_retention(
            self._tenant_ops,
            tenant=tenant,
            export_dir=export_dir,
            dry_run=dry_run,
            now=now,
            progress=progress,
        )
        return await adrive(program, self.execute)

    def tenant(self, tenant: str) -> AsyncLedger:
        """A handle whose every operation is scoped to `tenant`."""
        return AsyncLedger(self, tenant)

    async def rebuild(
        self, progress: Callable[[int, int], None] | None = None, *, tenant: str | None = None
    ) -> int:
        """See `Store.rebuild`."""
        return await self.execute(self._ops.rebuild(progress, tenant))

    async def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """See `Store.claim_stale_runs`."""
        return await self.execute(
            self._ops.claim_stale_runs(owner, limit, lease_seconds, max_attempts, run_id)
        )

    async def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = "auto",
    ) -> list[Verification]:
        """See `Store.verify`."""
        return await self.execute(self._ops.verify(progress, recompute))

    async def rotate_kek(self, new: KeyEncryptionKey | bytes) -> int:
        """See `Store.rotate_kek`."""
        target = kek_for(new)
        count = await self.execute(self._ops.rotate_kek(self._sealer, target))
        assert self._sealer is not None  # rotate_kek refused a store without one
        self._sealer.rekey(target)  # this store (and its ledgers) seals under `new` now
        return count

    async def check_schema(self) -> None:
        """See `Store.check_schema`."""
        await self.execute(self._ops.check_schema())

    async def execute(self, op: Op[T], connection: AsyncConnection | None = None) -> T:
        """Run one operation in its own transaction: the tiers of `Store.execute`.

        Its plain-SQL form, when it has one for this database, runs on a
        connection of the store's own (see the class docstring); the rest
        runs in a worker thread on the store's synchronous engine, or on a
        caller's async engine through `run_sync`. When the awaiting task is
        cancelled while a worker thread runs the operation, the thread still
        finishes its transaction, committed or rolled back as it would have
        been. When it is cancelled while a Postgres fast path's statement runs
        on the loop, psycopg asks the server to cancel the statement, which
        rolls it back unless it had already committed; if that request is
        itself interrupted (a second cancellation) or goes unanswered,
        psycopg closes the connection and the statement may still complete.
        Either way, whether an in-flight commit took effect is then unknown
        to the caller, as for any commit cut off, and an idempotency key is
        how to retry it safely.

        With `connection`, run its general path inside the caller's
        transaction on that connection instead. An operation that tolerates
        staleness runs on a read replica first, as in `Store.execute`; sealing
        is as there too.
        """
        seal = None
        sealer = self._sealer
        sealing = op.sealing  # the op it builds has none of its own
        if sealing is not None and sealer is not None:
            op, seal = await self._drive(
                preparing(sealer, sealing, remember=connection is None), connection
            )
        try:
            done = await self._execute(op, connection)
        except (ErasedError, ConflictError, EncryptionError):
            if sealing is not None and sealer is not None:
                sealer.forget(sealing.tenant, sealing.conversation_id)
            raise
        if not needs_opening(sealer, op, done):
            return done
        return await self._drive(opening(sealer, done, seal, op.tenant), connection)

    async def _drive(self, program: Program[T], connection: AsyncConnection | None) -> T:
        return await adrive(program, lambda op: self._execute(op, connection))

    async def _execute(self, op: Op[T], connection: AsyncConnection | None) -> T:
        if connection is not None:
            with translating(op.action):
                done = await connection.run_sync(op.fn)
                if op.write and self._notifier is not None:
                    await connection.run_sync(notify_on_commit)
                return done
        if op.replica and self._replicas is not None:
            answer = await asyncio.to_thread(self._replicas.read, op)
            if answer is not None:
                return answer
        done = await self._run(op)
        if op.write and self._notifier is not None:
            self._notifier.touch()
        return done

    async def _run(self, op: Op[T]) -> T:
        fast = self.fast_paths
        driver = self._driver
        direct = (op.sqlite if self._sqlite else op.postgres) if fast else None
        tried = False
        if direct is not None and self._native is not None:
            with translating(op.action):
                tried, done = await self._native.run(direct)
            if done is not None:
                return done
        if direct is not None and driver is not None and not tried:
            with translating(op.action):
                ran: tuple[bool, T | None] = await asyncio.to_thread(driver.run, op.write, direct)
            tried, done = ran
            if done is not None:
                return done
        if self._sync_engine is not None:
            # The rest of the tiers in the same thread hop, on the store's own
            # sync engine: one hop per operation, not one per statement.
            with translating(op.action):
                return await asyncio.to_thread(
                    general, self._sync_engine, op, fast=fast, tried=tried
                )
        with translating(op.action):
            async with self.engine.connect() as conn:
                if fast and op.postgres is not None and not tried and not self._sqlite:
                    postgres = op.postgres
                    done = await conn.run_sync(lambda c: run_fast(c, postgres))
                    if done is not None:
                        return done
                if op.write:
                    await conn.execution_options(**{WRITE: True})
                async with conn.begin():
                    sqlite_form = fast and not tried  # not a second time
                    return await conn.run_sync(lambda c: in_transaction(c, op, fast=sqlite_form))


class AsyncLedger:
    """The async face of `Ledger`."""

    def __init__(self, store: AsyncStore, tenant: str) -> None:
        self._store = store
        self._ops = Operations(
            tenant, store.message_cache, store._sealer, store._heads, store._tails
        )

    @property
    def tenant(self) -> str:
        """The tenant every operation is scoped to."""
        return self._ops.tenant

    @property
    def audit(self) -> AsyncAudit:
        """See `Ledger.audit`."""
        return AsyncAudit(self._store, self._ops.tenant)

    async def create_conversation(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        conversation_id: str | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """See `Ledger.create_conversation`."""
        return await self._store.execute(
            self._ops.create_conversation(metadata, conversation_id, key, subject)
        )

    async def conversation(self, conversation_id: str) -> Conversation:
        """See `Ledger.conversation`."""
        return await self._store.execute(self._ops.conversation(conversation_id))

    async def conversation_by_key(self, key: str) -> Conversation:
        """See `Ledger.conversation_by_key`."""
        return await self._store.execute(self._ops.conversation_by_key(key))

    async def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> list[Entry]:
        """See `Ledger.entries`."""
        return await self._store.execute(self._ops.entries(conversation_id, at, last))

    async def state_changes(
        self, conversation_id: str | None = None, *, run_id: str | None = None
    ) -> list[Event]:
        """See `Ledger.state_changes`."""
        return await self._store.execute(self._ops.state_changes(conversation_id, run_id))

    async def entry(self, event_id: str) -> Entry:
        """See `Ledger.entry`."""
        return await self._store.execute(self._ops.entry(event_id))

    async def set_state(
        self,
        conversation_id: str,
        state: dict[str, Any],
        *,
        expected_state: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """See `Ledger.set_state`."""
        return await self._store.execute(
            self._ops.set_state(conversation_id, state, expected_state)
        )

    async def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """See `Ledger.conversations`."""
        return await self._store.execute(self._ops.conversations(limit, before))

    async def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | Position | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = "client",
        create: bool = False,
        metadata: dict[str, Any] | None = None,
        after: int | Position | None = None,
        ids: Sequence[str] | None = None,
        state: dict[str, Any] | None = None,
        expected_state: Mapping[str, Any] | None = None,
        subject: str | None = None,
    ) -> Appended:
        """See `Ledger.append_messages`."""
        done = await self._store.execute(
            self._ops.append_messages(
                conversation_id,
                messages,
                expected,
                run_id,
                idempotency_key,
                origin,
                create,
                metadata,
                after=after,
                ids=ids,
                state=state,
                expected_state=expected_state,
                subject=subject,
            )
        )
        found = self._ops.report(done, messages)
        if isinstance(found, Op):  # the report needs the history the append followed
            history: list[Message] = await self._store.execute(found)
            found = self._ops.report(done, messages, history)
        assert isinstance(found, Appended)
        return found

    async def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """See `Ledger.history`."""
        return await self._store.execute(self._ops.history(conversation_id, at, repaired))

    async def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """See `Ledger.fork`."""
        return await self._store.execute(
            self._ops.fork(conversation_id, at, metadata, key, subject)
        )

    async def move_head(
        self,
        conversation_id: str,
        to: int | Position,
        *,
        expected: Position | None = None,
        state: dict[str, Any] | None = None,
        expected_state: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """See `Ledger.move_head`."""
        return await self._store.execute(
            self._ops.move_head(
                conversation_id, to, expected, state=state, expected_state=expected_state
            )
        )

    async def set_retention(self, idle_days: int, action: RetentionAction) -> RetentionPolicy:
        """See `Ledger.set_retention`."""
        return await self._store.execute(self._ops.set_retention(idle_days, action))

    async def retention(self) -> RetentionPolicy | None:
        """See `Ledger.retention`."""
        return await self._store.execute(self._ops.retention())

    async def clear_retention(self) -> bool:
        """See `Ledger.clear_retention`."""
        return await self._store.execute(self._ops.clear_retention())

    async def erase(self, subject: str, *, reason: str) -> Erasure:
        """See `Ledger.erase`."""
        erasure = await self._store.execute(self._ops.erase(subject, reason))
        self._ops.cache.clear()  # as Ledger.erase
        return erasure

    async def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """See `Ledger.events`."""
        return await self._store.execute(
            self._ops.events(conversation_id, run_id, after_seq, limit)
        )

    async def start_run(
        self,
        conversation_id: str,
        *,
        owner: str,
        run_id: str | None = None,
        base: int | Position | None = None,
        resumes: str | None = None,
        model: str | None = None,
        instructions_digest: str | None = None,
        lease_seconds: float = 60.0,
        events: Sequence[NewEvent] = (),
        create: bool = False,
        exclusive: bool = False,
    ) -> RunCursor:
        """See `Ledger.start_run`."""
        return await self._store.execute(
            self._ops.start_run(
                conversation_id,
                events,
                run_id=run_id,
                base=base,
                resumes=resumes,
                model=model,
                instructions_digest=instructions_digest,
                owner=owner,
                lease_seconds=lease_seconds,
                create=create,
                exclusive=exclusive,
            )
        )

    async def record(
        self,
        cursor: RunCursor,
        events: Sequence[NewEvent],
        *,
        idempotency_key: str | None = None,
    ) -> tuple[list[Event], RunCursor]:
        """See `Ledger.record`."""
        return await self._store.execute(self._ops.record(cursor, events, idempotency_key))

    async def complete_run(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation:
        """See `Ledger.complete_run`."""
        return completed(
            await self._store.execute(
                self._ops.complete_run(cursor, usage, request_count, tool_count)
            )
        )

    async def fail_run(
        self,
        cursor: RunCursor,
        *,
        stage: str,
        error: str,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
        canceled: bool = False,
        attention: str | None = None,
    ) -> None:
        """See `Ledger.fail_run`."""
        await self._store.execute(
            self._ops.fail_run(
                cursor, stage, error, usage, request_count, tool_count, canceled, attention
            )
        )

    async def verify(self, conversation_id: str, *, recompute: Recompute = "auto") -> Verification:
        """See `Ledger.verify`."""
        return await self._store.execute(self._ops.verify(conversation_id, recompute))

    def tail(
        self,
        after: str | None = None,
        *,
        conversation_id: str | None = None,
        follow: bool = False,
        limit: int = DEFAULT_LIMIT,
        idle_seconds: float = 5.0,
        poll_seconds: float = 0.05,
        stop: asyncio.Event | None = None,
    ) -> AsyncIterator[Page[Event]]:
        """See `Ledger.tail`; iterate with `async for`. To stop following, set
        `stop`, or cancel the task that iterates. The arguments are checked
        here, except that a cursor past the end of the log, which takes a
        read, is refused on the first step of the iteration."""
        settings = _tail.TailSettings(
            after=after,
            conversation_id=conversation_id,
            limit=limit,
            follow=follow,
            idle_seconds=idle_seconds,
            poll_seconds=poll_seconds,
        )
        tenant, store = self.tenant, self._store
        waiter = (
            SqliteWaiter(
                sqlite_connector(store._sync_engine or store.engine), settings.poll_seconds
            )
            if store._sqlite
            else AsyncPostgresWaiter(async_connector(store.engine))
        )
        return _tail.async_tail(
            lambda cursor: store.execute(_tail.tail_op(tenant, settings, cursor)),
            start=None if after is None else lambda: store.execute(_tail.start_op(tenant, after)),
            waiter=waiter,
            after=after,
            settings=settings,
            stop=stop,
        )

    async def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = "auto",
    ) -> list[Verification]:
        """See `Ledger.verify_all`."""
        return await self._store.execute(self._ops.verify_all(progress, recompute))

    async def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """See `Ledger.renew_lease`."""
        await self._store.execute(self._ops.renew_lease(cursor, seconds))

    async def run(self, run_id: str) -> Run:
        """See `Ledger.run`."""
        return await self._store.execute(self._ops.run(run_id))

    async def runs(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """See `Ledger.runs`."""
        return await self._store.execute(self._ops.runs(conversation_id, status, attention, limit))

    async def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """See `Ledger.claim_stale_runs`."""
        return await self._store.execute(
            self._ops.claim_stale_runs(owner, limit, lease_seconds, max_attempts, run_id)
        )

    async def export(
        self,
        out: TextIO,
        *,
        conversation_id: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ExportReport:
        """See `Ledger.export`. `out` is written, and `progress` called, synchronously: in a
        worker thread when the store made its own engine, else in the event loop's."""
        return await self._store.execute(self._ops.export(out, conversation_id, progress))

    async def import_file(
        self, source: TextIO, *, progress: Callable[[int], None] | None = None
    ) -> ImportReport:
        """See `Ledger.import_file`. `source` is read, and `progress` called, as in `export`."""
        return await self._store.execute(self._ops.import_file(source, progress))
