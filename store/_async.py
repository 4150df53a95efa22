"""`AsyncStore`, `AsyncLedger` and its sub-handles: the async face.

They run the very `Op`s of the sync face, so every rule has one
implementation, and inherit their operations from `store._faces`, written
from the same declarations by scripts/faces.py. On Postgres the plain-SQL forms run
on psycopg async connections of the store's own, on the event loop
(docs/adr/0026-async-fast-paths-on-the-loop.md); on SQLite, and with a
key-encryption key, on the sync face's driver connections in a worker thread;
the rest in a worker thread on the store's sync engine, or through
SQLAlchemy's `run_sync` on a caller's engine (docs/adr/0015-async-fast-paths.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from chatledger.store import _tail
from chatledger.store._audit import AuditOperations
from chatledger.store._cache import HeadCache, MessageCache, TailCache
from chatledger.store._crypto import KeyEncryptionKey, sealer_for
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
from chatledger.store._db.workers import Workers
from chatledger.store._faces import (
    AsyncAuditFace,
    AsyncLedgerFace,
    AsyncRetentionFace,
    AsyncRunsFace,
    AsyncStoreFace,
)
from chatledger.store._ops import Operations, StoreOperations
from chatledger.store._sealing import Program, adrive, executing, runs_alone
from chatledger.store._sql.dialect import WRITE, is_sqlite
from chatledger.store._sql.ops import AsyncExecutor, Op, in_transaction, run_fast
from chatledger.store._sql.pages import Page
from chatledger.store._sql.tail import notify_on_commit
from chatledger.store._sql.translate import translating
from chatledger.store._values import (
    Event,
)

__all__ = ["AsyncAudit", "AsyncLedger", "AsyncRetention", "AsyncRuns", "AsyncStore"]

T = TypeVar("T")

CHECKPOINTS = 256
"""On SQLite, after this many writes committed on the loop, the write-ahead log's
checkpoint runs in a worker thread."""


class AsyncStore(AsyncStoreFace):
    """The async face of `Store`: the same operations, as coroutines.

    A store that `open` made its engine for also makes a synchronous engine on
    the same database (sqlite3, or psycopg 3 in its sync mode). On Postgres
    it runs the plain-SQL forms of the hot operations on psycopg async
    connections of its own, on the event loop, with no thread hop
    (`AsyncDriverConnections`, ADR 0026). On SQLite, a write's plain-SQL
    form runs on the loop too, on a connection of that synchronous engine that
    never waits (ADR 0051). It goes to a worker thread instead when another
    writer holds the database, or the loop's connection is not open (it is
    opened and closed in a worker); after every `CHECKPOINTS` commits on the
    loop, the write-ahead log's checkpoint runs in a worker. A read's form, and every
    form of a store with a key-encryption key (whose calls must stay off the
    loop), run in a worker thread too: on that engine's driver connections
    (`DriverConnections`, as `Store` does), in a thread of the store's own
    (`store._db.workers`), one hop per operation where aiosqlite takes one
    per statement. Every other
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
        self._ops = StoreOperations(self._sealer, self._tenant_ops)
        self.message_cache = MessageCache(message_cache)
        self._heads = HeadCache()
        self._tails = TailCache()
        self.fast_paths = fast_paths
        """Whether operations try their plain-SQL form first (see `Store.open`)."""
        self._sqlite = is_sqlite(engine.sync_engine)
        # Set by `open` when it creates the engine (see the class docstring).
        self._sync_engine: Engine | None = None
        self._driver: DriverConnections | None = None
        # SQLite: the fast forms of writes on the loop, when they need not wait.
        self._on_loop: DriverConnections | None = None
        self._loop_commits = 0
        # Postgres: the fast paths on psycopg's async connections, on the loop.
        self._native: AsyncDriverConnections | None = None
        self._replicas: Replicas | None = None
        # Blocking calls (SQLite's forms, the general path, replicas) hop to these.
        self._workers = Workers()
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
            elif store._sealer is None:
                store._on_loop = DriverConnections(sibling, size=1, waits=False)
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
        for driver in (self._on_loop, self._driver):
            if driver is not None:
                driver.close()
        if self._replicas is not None:
            self._replicas.close()
        if self._sync_engine is not None:
            self._sync_engine.dispose()
        if self._owns_engine:
            await self.engine.dispose()
        self._workers.close()

    def _tenant_ops(self, tenant: str) -> Operations:
        return Operations(tenant, self.message_cache, self._sealer, self._heads, self._tails)

    def tenant(self, tenant: str) -> AsyncLedger:
        """A handle whose every operation is scoped to `tenant`."""
        return AsyncLedger(self, tenant)

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
        if runs_alone(self._sealer, op):
            return await self._execute(op, connection)
        program = executing(self._sealer, op, inside=connection is not None)
        return await self._drive(program, connection)

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
            answer = await self._workers.run(self._replicas.read, op)
            if answer is not None:
                return answer
        done = await self._run(op)
        if op.write and self._notifier is not None:
            self._notifier.touch()
        return done

    async def _committed_on_loop(self) -> None:
        """Count a commit on the loop's connection, which runs no checkpoint: every
        `CHECKPOINTS`th runs one, passive, in a worker thread (ADR 0051)."""
        self._loop_commits += 1
        if self._loop_commits >= CHECKPOINTS:
            self._loop_commits = 0
            await self._workers.run(self._checkpoint)

    def _checkpoint(self) -> None:
        assert self._sync_engine is not None
        raw = self._sync_engine.raw_connection()  # in autocommit: no transaction around it
        try:
            raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")  # type: ignore[union-attr]
        finally:
            raw.close()

    def _primed(self, write: bool, fn: Callable[[Any], T | None]) -> tuple[bool, T | None]:
        """`DriverConnections.run` in a worker, once the loop's connection is open (it
        opens none on the loop)."""
        assert self._on_loop is not None and self._driver is not None
        self._on_loop.prime()
        return self._driver.run(write, fn)

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
        on_loop = self._on_loop if direct is not None and op.write else None
        if on_loop is not None and direct is not None:
            with translating(op.action):
                tried, done = on_loop.run(True, direct)
            if tried:
                # The loop's other tasks get their turn, as after a round trip: a task
                # appending in a loop would otherwise hold the loop until a hop.
                await asyncio.sleep(0)
            if done is not None:
                await self._committed_on_loop()
                return done
        if direct is not None and driver is not None and not tried:
            # Declined on the loop: in a worker, where the loop's connection opens too.
            run = driver.run if on_loop is None else self._primed
            with translating(op.action):
                ran: tuple[bool, T | None] = await self._workers.run(run, op.write, direct)
            tried, done = ran
            if done is not None:
                return done
        if self._sync_engine is not None:
            # The rest of the tiers in the same thread hop, on the store's own
            # sync engine: one hop per operation, not one per statement.
            with translating(op.action):
                return await self._workers.run(
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


class AsyncLedger(AsyncLedgerFace):
    """The async face of `Ledger`: the same operations, as coroutines.

    `export` writes `out`, and `import_file` reads `source`, synchronously: in a
    worker thread when the store made its own engine, else in the event loop's;
    their `progress` is called there too.
    """

    _store: AsyncStore

    def __init__(self, store: AsyncStore, tenant: str) -> None:
        self._store = store
        self._ops = store._tenant_ops(tenant)

    @property
    def tenant(self) -> str:
        """The tenant every operation is scoped to."""
        return self._ops.tenant

    @property
    def audit(self) -> AsyncAudit:
        """See `Ledger.audit`."""
        return AsyncAudit(self._store, self._ops.tenant)

    @property
    def runs(self) -> AsyncRuns:
        """See `Ledger.runs`."""
        return AsyncRuns(self._store, self._ops)

    @property
    def retention(self) -> AsyncRetention:
        """See `Ledger.retention`."""
        return AsyncRetention(self._store, self._ops)

    def _tail(self, settings: _tail.TailSettings) -> AsyncIterator[Page[Event]]:
        # Iterated with `async for`; a cursor past the end of the log, which takes a
        # read, is refused on the first step of the iteration.
        tenant, store, after = self.tenant, self._store, settings.after
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
            settings=settings,
        )


class AsyncRuns(AsyncRunsFace):
    """The async face of `Runs`."""


class AsyncRetention(AsyncRetentionFace):
    """The async face of `Retention`."""


class AsyncAudit(AsyncAuditFace):
    """The async face of `Audit`: the same queries, as coroutines."""

    def __init__(self, store: AsyncExecutor, tenant: str) -> None:
        self._store = store
        self._ops = AuditOperations(tenant)
