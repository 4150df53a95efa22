"""`AsyncStore` and `AsyncLedger`: the async face.

They run the very `Op`s of the sync face, so every rule has one
implementation, and their operations are written from the same declarations
(`store._ops`, by scripts/faces.py). On Postgres the plain-SQL forms run
on psycopg async connections of the store's own, on the event loop
(docs/adr/0026-async-fast-paths-on-the-loop.md); on SQLite, and with a
key-encryption key, on the sync face's driver connections in a worker thread;
the rest in a worker thread on the store's sync engine, or through
SQLAlchemy's `run_sync` on a caller's engine (docs/adr/0015-async-fast-paths.md).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any, TextIO, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from chatledger.store import _tail
from chatledger.store._audit import AsyncAudit
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
from chatledger.store._errors import ConflictError, EncryptionError, ErasedError
from chatledger.store._ops import Operations, StoreOperations
from chatledger.store._retention import RetentionReport, SubjectOutcome
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
from chatledger.store._tail import Stop
from chatledger.store._values import (
    Appended,
    Conversation,
    Entry,
    Event,
    Expected,
    NewConversation,
    NewEvent,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from chatledger.store.messages import Message, Usage

__all__ = ["AsyncLedger", "AsyncRetention", "AsyncRuns", "AsyncStore"]

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

    def _tenant_ops(self, tenant: str) -> Operations:
        return Operations(tenant, self.message_cache, self._sealer, self._heads, self._tails)

    def tenant(self, tenant: str) -> AsyncLedger:
        """A handle whose every operation is scoped to `tenant`."""
        return AsyncLedger(self, tenant)

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    async def migrate(
        self,
        connection: AsyncConnection | None = None,
        *,
        partitions: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Upgrade the schema to this package's head revision.

        With `connection`, run inside the caller's transaction on it. With
        `partitions` (Postgres only), also make the events and head-view
        tables hash-partitioned by conversation into that many partitions,
        copying their rows, if they are not partitioned yet; a different
        count on a partitioned database is refused
        (docs/scaling.md). `progress(done, total)` is called after each
        revision applied.
        """
        return await self.execute(
            self._ops.migrate(partitions=partitions, progress=progress),
            connection,
        )

    async def run_retention(
        self,
        *,
        tenant: str | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        progress: Callable[[SubjectOutcome], None] | None = None,
    ) -> RetentionReport:
        """Apply retention policies: for `tenant`, or every tenant that has one.

        Each subject whose conversations are all idle past its tenant's
        cutoff is exported (for `export-erase`: one file per conversation
        under `export_dir/tenant-<tenant, percent-encoded>/`, written whole or not at all) and then
        erased; a subject with an active conversation is kept, and idle
        conversations stored in the clear are reported, never touched. Run it
        from a scheduler: a pass killed halfway finishes when run again.
        `dry_run` writes nothing and reports what would be done; `now` (default
        the database's clock) is the moment idleness is measured from.
        `progress` is called with each subject's outcome as it comes.
        """
        return await adrive(
            self._ops.run_retention(
                tenant=tenant,
                export_dir=export_dir,
                dry_run=dry_run,
                now=now,
                progress=progress,
            ),
            self.execute,
        )

    async def rebuild(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        tenant: str | None = None,
    ) -> int:
        """Recompute every materialized view from the events; return the view count.

        It runs in one transaction: readers see the old views until it commits.
        `progress(done, total)` is called as it goes; `tenant` rebuilds only the
        views of that tenant's conversations.
        """
        return await self.execute(self._ops.rebuild(progress, tenant=tenant))

    async def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim stale runs of every tenant (for a resume worker serving them all); only
        the run `run_id` when given (`chatledger resume RUN_ID`)."""
        return await self.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    async def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of every tenant.

        `recompute` says where the hashes are computed: `"auto"` (in SQL on
        Postgres, fastest; here on SQLite), `"database"`, or `"client"` (in
        this process, independent of the server's own functions).
        """
        return await self.execute(self._ops.verify(progress, recompute=recompute))

    async def rotate_kek(self, new: KeyEncryptionKey | bytes) -> int:
        """Re-wrap every data key under the key-encryption key `new` (32 bytes or a
        `KeyEncryptionKey`), in one transaction; returns how many were re-wrapped.

        The store must hold the current key. Afterwards, open every store with
        `new`; once no backup you keep holds a key row wrapped by the old one,
        destroying the old key makes erased content unreadable in those
        backups too (docs/erasure.md, "Rotating the key-encryption key").
        Keys already under `new` are left as they are, so a repeat is a no-op.
        """
        return await adrive(self._ops.rotate_kek(new), self.execute)

    async def check_schema(self) -> None:
        """Raise `SchemaError` unless the database is at this package's head revision."""
        return await self.execute(self._ops.check_schema())

    # -- end of the operations --

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
    """The async face of `Ledger`: the same operations, as coroutines.

    `export` writes `out`, and `import_file` reads `source`, synchronously: in a
    worker thread when the store made its own engine, else in the event loop's;
    their `progress` is called there too.
    """

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

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    async def create_conversation(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        conversation_id: str | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """Create a conversation (its id a new UUIDv7 unless given).

        `subject`: on a store with a key-encryption key, the erasure subject
        whose data key seals it (default: its own id); `erase(subject)`
        erases every conversation of the subject at once.
        """
        return await self._store.execute(
            self._ops.create_conversation(
                metadata,
                conversation_id=conversation_id,
                key=key,
                subject=subject,
            )
        )

    async def conversation(self, conversation_id: str) -> Conversation:
        """The conversation: metadata, head, and where it was forked from."""
        return await self._store.execute(self._ops.conversation(conversation_id))

    async def conversation_by_key(self, key: str) -> Conversation:
        """The conversation created with `key`; `NotFoundError` when the tenant has none."""
        return await self._store.execute(self._ops.conversation_by_key(key))

    async def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """The tenant's conversations, newest first, at most `limit` of them.

        Newest by id: minted ids are UUIDv7, so they sort in creation order. For
        the next page pass the last conversation's id as `before`; the list is
        short of `limit` only on the last page. A `before` that is no
        conversation of this tenant (another tenant's id, a made-up one) is a
        `NotFoundError` (`InvalidInputError` when it is not an id), so a cursor
        never reaches another tenant's rows. Keyset pagination on the `(tenant,
        id)` index: a deep page costs what the first does.
        """
        return await self._store.execute(self._ops.conversations(limit, before))

    async def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> list[Entry]:
        """The messages of the history at the head (or `at`), each with its event id and position, oldest first; only the last `last` with it, in one query. Unrepaired: each entry is a message as stored."""
        return await self._store.execute(self._ops.entries(conversation_id, at=at, last=last))

    async def entry(self, event_id: str) -> Entry:
        """The message with this event id, which its caller minted (`append_messages(ids=...)`)."""
        return await self._store.execute(self._ops.entry(event_id))

    async def state_changes(
        self,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> list[Event]:
        """The `state.changed` events, oldest first, their payloads opened: those a
        conversation's log holds (every branch, and the lineage a fork continues from
        its source), or those stamped with `run_id` in any of the tenant's
        conversations, or with both, those of the conversation stamped with the run."""
        return await self._store.execute(self._ops.state_changes(conversation_id, run_id=run_id))

    async def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | Position | Expected | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = 'client',
        create: bool | NewConversation = False,
        after: int | Position | None = None,
        ids: Sequence[str] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Appended:
        """Append one turn at the head, atomically, and move the head past it.

        Everything is checked before anything is written: a refused append
        writes nothing, and a successful one writes the whole turn (its
        messages, then the `state.changed` event of `state`) in one
        transaction.

        Args:
            conversation_id: the conversation, which must exist in this
                tenant (`NotFoundError` otherwise, as for another tenant's),
                unless `create` is set.
            messages: the turn's messages, in order (`Message`s or dicts in
                the durable JSON form). May be empty when `state` is given:
                the `state.changed` event is then appended alone.
            expected: what the caller expects to find, else `ConflictError`
                and nothing is written: the head position it last saw (an
                `int` or a `Position`), or an `Expected(head=..., state=...)`
                whose `state` is a compare-and-set on the conversation's
                state (each field given must hold that value now; a field
                given as `None` must be absent). Without it, the append goes
                after whatever the head is.
            run_id: a run id to stamp on the events.
            idempotency_key: a retried append with the same key and content
                writes nothing and returns the original; the key with other
                content is an `InvalidInputError` (the caller's mistake: do
                not retry it).
            origin: who produced the messages, as the log records it:
                `"client"` (the default: the caller), `"run"` (a model run)
                or `"repair"`.
            create: create the conversation with the id `conversation_id`
                when the tenant has none by that id, in the same transaction
                as the append (one round trip on the fast path): for a
                backend that mints its own conversation ids. `True`, or a
                `NewConversation(metadata=..., subject=...)` with the new
                conversation's metadata and, on a store with a key-encryption
                key, its erasure subject (docs/erasure.md).
                `Appended.created` says whether it did. Pass it for a
                conversation you expect to be new: on an existing one the
                append costs one more statement. An id another tenant holds
                is the `ConflictError` of `create_conversation`.
            after: append after this position of the head's history instead
                of at the head, replacing what followed it there (it stays in
                the log, on its branch): a framework rewriting the tail of a
                history. An `int` counts events on the head's lineage, as
                `Entry.position` does.
            ids: the event ids of the messages, one per message, minted by
                the caller (canonical UUIDs, none twice); `ledger.entry(id)`
                reads a message back by its id. A taken id is a
                `ConflictError`.
            state: the conversation's new state (a JSON object), recorded as
                a `state.changed` event after the messages and returned by
                `conversation(...).state`.

        Returns:
            The events written, the new head, whether the conversation was
            created, and `repair`: what the repaired history does with the
            messages added (results dropped or moved, calls still waiting
            for a result).

        Raises:
            InvalidInputError: an option is malformed (the message names it).
            NotFoundError: no such conversation in this tenant.
            ConflictError: `expected` or an id no longer holds; reload and
                retry.
        """
        return await adrive(
            self._ops.append_messages(
                conversation_id,
                messages,
                expected=expected,
                run_id=run_id,
                idempotency_key=idempotency_key,
                origin=origin,
                create=create,
                after=after,
                ids=ids,
                state=state,
            ),
            self._store.execute,
        )

    async def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """The history at the head, or `at` a position or moment; repaired by default."""
        return await self._store.execute(
            self._ops.history(conversation_id, at=at, repaired=repaired)
        )

    async def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """A new conversation that continues this one at `at` (default: the head).

        Sealed, it belongs to its source's erasure subject unless `subject`
        names another: then erasing the source's subject leaves the fork its
        own messages and erases only the prefix they share.
        """
        return await self._store.execute(
            self._ops.fork(conversation_id, at=at, metadata=metadata, key=key, subject=subject)
        )

    async def move_head(
        self,
        conversation_id: str,
        to: int | Position,
        *,
        expected: Position | Expected | None = None,
        state: dict[str, Any] | None = None,
    ) -> Conversation:
        """Move the head to `to`: compare-and-set against `expected` when given (the
        head `Position` the caller last saw, or an `Expected` with it and the state
        fields that must hold), and set the state to `state` when given."""
        return await self._store.execute(
            self._ops.move_head(conversation_id, to, expected=expected, state=state)
        )

    async def erase(self, subject: str, *, reason: str) -> Erasure:
        """Erase an erasure subject: destroy its data key, in one transaction.

        Every conversation of the subject (a sealed conversation's subject is
        its own id unless it was given one; forks inherit their source's)
        gets a `conversation.erased` event naming the subject and `reason`,
        and reads as erased markers from then on, in every process; it takes
        no more writes. The log and its hash chain stay whole, so `verify`
        passes. Erasing a subject again changes nothing and says so
        (`Erasure.already`). docs/erasure.md says what it guarantees.
        """
        return await adrive(self._ops.erase(subject, reason=reason), self._store.execute)

    async def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The raw log, in order."""
        return await self._store.execute(
            self._ops.events(
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            )
        )

    def tail(
        self,
        after: str | None = None,
        *,
        conversation_id: str | None = None,
        follow: bool = False,
        limit: int = DEFAULT_LIMIT,
        idle_seconds: float = 5.0,
        poll_seconds: float = 0.05,
        stop: Stop | None = None,
    ) -> AsyncIterator[Page[Event]]:
        """Pages of the tenant's events (or one conversation's) in commit order, after `after`.

        Every event committed after the cursor comes exactly once, and never
        one that rolled back, in an order consistent with commit order: a
        transaction that committed before another began comes first, and a
        transaction's events come together in `seq` order. On Postgres,
        transactions that overlapped come in transaction-id order, and a
        commit that becomes visible late (its transaction took its `seq`
        early) is never passed (docs/adr/0005-audit-pagination.md). Store each page's `next_after`
        once its events are handled, and pass it back as `after` to resume:
        in the same transaction as what handling them wrote, for
        exactly-once; after it, for at-least-once (docs/tail.md).

        Args:
            after: a `next_after` from an earlier page (or an audit page of
                `events`); None starts at the beginning of the log.
            conversation_id: follow one conversation of the tenant only.
            follow: False stops once caught up (a page with `pending` may
                hold newer events back); True waits for new commits: on
                Postgres woken by `LISTEN chatledger_events` (which stores
                send after their writes, `Store.open(notify=)`), and reading
                again after `idle_seconds` in any case; on SQLite checking
                the file's data version every `poll_seconds`.
            limit: the most events per page.
            idle_seconds: when following, read again after this long with no
                wake-up (writes that sent no notification are found then).
            poll_seconds: SQLite: how often to check for a commit.
            stop: when following, set it to end the iteration within a
                fraction of a second: a `threading.Event` set from another
                thread, or on `AsyncLedger` an `asyncio.Event` (or cancel the
                task that iterates).

        Only pages with events are yielded, except, when not following, a
        last empty page with `pending` set if events are held back behind an
        open transaction (Postgres). Inputs are checked here, before the
        first page is read, `after` against the log's end with one read: a
        cursor past it raises `InvalidInputError`. A database that cannot be
        reached, or a connection that breaks, raises `StorageError` (a
        follower's too): start again from the stored cursor.
        """
        return self._tail(self._ops.tail(
            after,
            conversation_id=conversation_id,
            follow=follow,
            limit=limit,
            idle_seconds=idle_seconds,
            poll_seconds=poll_seconds,
            stop=stop,
        ))

    async def verify(self, conversation_id: str, *, recompute: Recompute = 'auto') -> Verification:
        """Recompute one conversation's hash chain; say where it first breaks.

        `recompute`: see `Store.verify`.
        """
        return await self._store.execute(self._ops.verify(conversation_id, recompute=recompute))

    async def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of this tenant; `progress` is
        called with each conversation's result as it comes."""
        return await self._store.execute(self._ops.verify_all(progress, recompute=recompute))

    async def export(
        self,
        out: TextIO,
        *,
        conversation_id: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ExportReport:
        """Write the tenant's conversations, or one with the conversations it was forked
        from, to `out` as JSON Lines (docs/export.md), streaming from one snapshot.

        The log as stored, byte for byte: sealed content stays sealed (a store
        that imports it needs the same key-encryption key to read it).
        `progress` is called with the running count of events written.
        """
        return await self._store.execute(
            self._ops.export(out, conversation_id=conversation_id, progress=progress)
        )

    async def import_file(
        self,
        source: TextIO,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Read an export of this tenant from `source` into the store, in one transaction.

        Every line is checked (order, fields, every hash, the end record) before
        anything commits: a file refused raises `ImportFileError` naming its
        line, and nothing is written. Conversations the store already holds,
        identical, are left as they are (`ImportReport.already_present`), so an
        import can be repeated; one that differs is refused. `progress` is
        called with the running count of events read.
        """
        return await self._store.execute(self._ops.import_file(source, progress=progress))

    # -- end of the operations --


class AsyncRuns:
    """The async face of `Runs`."""

    def __init__(self, store: AsyncStore, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    async def start(
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
        """Start a run at `base` (default the head), leased to `owner`.

        `events` (the run's prompt) are recorded with `run.started`, atomically.

        Args:
            create: the run opens a new conversation: `conversation_id` (a
                new id) is created in the same transaction, so a refused
                start leaves no conversation behind.
            exclusive: refuse the start with `ConflictError`, writing nothing,
                while another run of the conversation is live (running, its
                lease not expired): one run at a time, where a second one's
                completion could only conflict.
        """
        return await self._store.execute(
            self._ops.start_run(
                conversation_id,
                owner=owner,
                run_id=run_id,
                base=base,
                resumes=resumes,
                model=model,
                instructions_digest=instructions_digest,
                lease_seconds=lease_seconds,
                events=events,
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
        """Append a run's events, fenced by its lease; return them and the new cursor."""
        return await self._store.execute(
            self._ops.record(cursor, events, idempotency_key=idempotency_key)
        )

    async def complete(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation:
        """Complete a run and move the head to its end by compare-and-set.

        Raises `ConflictError` (after recording the run as failed at stage
        `conflict`) when the head moved while the run ran.
        """
        return await adrive(
            self._ops.complete_run(
                cursor,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
            ),
            self._store.execute,
        )

    async def fail(
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
        """Record a run as failed (or canceled) at `stage`; the head does not move.

        `attention` marks it as needing a person (listed by `runs.recent(attention=True)`).
        """
        return await adrive(
            self._ops.fail_run(
                cursor,
                stage=stage,
                error=error,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
                canceled=canceled,
                attention=attention,
            ),
            self._store.execute,
        )

    async def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """Extend the run's lease by `seconds` of the database's clock."""
        return await self._store.execute(self._ops.renew_lease(cursor, seconds))

    async def get(self, run_id: str) -> Run:
        """The run's projection row."""
        return await self._store.execute(self._ops.run(run_id))

    async def claim_stale(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim runs whose lease expired (each claim a new attempt); only the run
        `run_id` when given, none while its lease is live."""
        return await self._store.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    async def recent(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """The tenant's runs, newest first."""
        return await self._store.execute(
            self._ops.runs(
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            )
        )

    # -- end of the operations --


class AsyncRetention:
    """The async face of `Retention`."""

    def __init__(self, store: AsyncStore, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    async def set(self, idle_days: int, action: RetentionAction) -> RetentionPolicy:
        """Set the tenant's retention policy: conversations idle for `idle_days` are
        erased (`erase`), or exported and then erased (`export-erase`), by
        `Store.run_retention` (docs/erasure.md, "Retention")."""
        return await self._store.execute(self._ops.set_retention(idle_days, action))

    async def get(self) -> RetentionPolicy | None:
        """The tenant's retention policy, None when it has none."""
        return await self._store.execute(self._ops.retention())

    async def clear(self) -> bool:
        """Remove the tenant's retention policy; whether it had one."""
        return await self._store.execute(self._ops.clear_retention())

    # -- end of the operations --
