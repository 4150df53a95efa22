"""`Store` and `Ledger`: the synchronous face.

Every operation is an `Op` built by `store._ops` (`StoreOperations` for the
store's own, `Operations` for a tenant's), run here in its own transaction on
a connection, so each method is one call; `store._async` runs the same `Op`s
as coroutines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TextIO, TypeVar

from sqlalchemy.engine import Connection, Engine

from chatledger.store import _tail
from chatledger.store._audit import Audit
from chatledger.store._cache import HeadCache, MessageCache, TailCache
from chatledger.store._crypto import KeyEncryptionKey, sealer_for
from chatledger.store._db.engines import (
    DriverConnections,
    Durability,
    create_engine,
    database_url,
    install_sqlite_hooks,
)
from chatledger.store._db.replicas import Replicas, check_replicas
from chatledger.store._db.run import general
from chatledger.store._db.tail import (
    Notifier,
    PostgresWaiter,
    SqliteWaiter,
    connector,
    sqlite_connector,
)
from chatledger.store._errors import ConflictError, EncryptionError, ErasedError
from chatledger.store._ops import Operations, StoreOperations
from chatledger.store._retention import RetentionReport, SubjectOutcome
from chatledger.store._sealing import drive, needs_opening, opening, preparing
from chatledger.store._sql.dialect import is_sqlite
from chatledger.store._sql.erasure import Erasure
from chatledger.store._sql.ops import Op
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

__all__ = ["Ledger", "Retention", "Runs", "Store"]

T = TypeVar("T")


class Store:
    """A chatledger store on one database.

    Open it with `Store.open()`; get a tenant-scoped handle with `tenant()`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        owns_engine: bool,
        message_cache: int = 10_000,
        fast_paths: bool = True,
        notify: bool = True,
        kek: KeyEncryptionKey | bytes | None = None,
    ) -> None:
        self._sealer = sealer_for(kek)  # first: a bad key leaves nothing open
        self.engine = engine
        self._owns_engine = owns_engine
        # Operations with a plain-SQL form for this database run on driver
        # connections of their own (see `DriverConnections`).
        self._sqlite = is_sqlite(engine)
        self._driver = DriverConnections(engine)
        self._ops = StoreOperations(self._sealer, self._tenant_ops)
        self.message_cache = MessageCache(message_cache)
        self._heads = HeadCache()
        self._tails = TailCache()
        self.fast_paths = fast_paths
        """Whether operations try their plain-SQL form first (see `open`)."""
        self._replicas: Replicas | None = None  # set by `open` (see there)
        # Wakes tails after writes (Postgres; see `open`).
        self._notifier = Notifier(connector(engine)) if notify and not self._sqlite else None

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        durability: Durability = "full",
        busy_timeout: float = 30.0,
        message_cache: int = 10_000,
        fast_paths: bool = True,
        replicas: Sequence[str] = (),
        notify: bool = True,
        kek: KeyEncryptionKey | bytes | None = None,
    ) -> Store:
        """Open a store.

        Args:
            url: a SQLAlchemy URL; default `CHATLEDGER_DATABASE_URL`, else the
                SQLite file `./chatledger.db`. `postgresql://` URLs use psycopg 3.
            engine: an existing SQLAlchemy Engine to use instead (a backend's
                own); on SQLite, chatledger's connection hooks are added to it.
            durability: on SQLite, `full` (fsync every commit: nothing
                acknowledged is lost on power failure) or `normal`.
            busy_timeout: seconds a SQLite writer waits for the lock.
            message_cache: how many parsed messages to keep (by event; events
                never change, so the cache is always right); 0 turns it off.
            fast_paths: False runs every operation through its general path
                only, skipping the plain-SQL forms of the hot operations
                (an append, a head read). The results are the same, only
                slower: the test suite runs both ways to hold them equal.
            replicas: URLs of Postgres read replicas (physical streaming
                standbys of the primary). The reads that tolerate staleness
                run on them in turn: every `ledger.audit` query, `history`
                and `entries` at an explicit `at`, `verify`, `verify_all` and
                `Store.verify`. Everything else, each write and every read
                that must see the caller's own writes (the head, runs,
                leases, `events`), runs on the primary. A replica that
                cannot answer (unreachable, or not caught up with what the
                read names) is never the caller's error: the primary
                answers instead. docs/adr/0023-read-replicas.md.
            notify: on Postgres, after each write the store sends `NOTIFY
                chatledger_events`, coalesced, from a thread and connection
                of its own, so tails (`Ledger.tail`) wake at once. False
                sends none: tails then see this store's writes on their idle
                re-read (docs/tail.md).
            kek: the key-encryption key: 32 bytes, or a `KeyEncryptionKey`
                (a KMS behind `wrap` and `unwrap`); default the base64 or hex
                key in `CHATLEDGER_KEK`, if set. With one, the messages and
                metadata of every new conversation are sealed under a data
                key of its erasure subject, which `ledger.erase` destroys
                (docs/erasure.md); without one, sealed content cannot be read
                or written.
        """
        sealer_for(kek)  # checked before any engine exists
        # Checked before any engine exists, so a refusal leaves nothing open.
        primary = (
            engine.dialect.name if engine is not None else database_url(url).get_backend_name()
        )
        replica_urls = check_replicas(replicas, primary)
        if engine is not None:
            if engine.dialect.name == "sqlite":
                install_sqlite_hooks(engine, durability=durability, busy_timeout=busy_timeout)
            store = cls(
                engine,
                owns_engine=False,
                message_cache=message_cache,
                fast_paths=fast_paths,
                notify=notify,
                kek=kek,
            )
        else:
            store = cls(
                create_engine(url, durability=durability, busy_timeout=busy_timeout),
                owns_engine=True,
                message_cache=message_cache,
                fast_paths=fast_paths,
                notify=notify,
                kek=kek,
            )
        if replica_urls:
            store._replicas = Replicas(replica_urls)
        return store

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pools (of the engines this store created, replicas too)."""
        if self._notifier is not None:
            self._notifier.close()
        self._driver.close()
        if self._replicas is not None:
            self._replicas.close()
        if self._owns_engine:
            self.engine.dispose()

    def _tenant_ops(self, tenant: str) -> Operations:
        return Operations(tenant, self.message_cache, self._sealer, self._heads, self._tails)

    def tenant(self, tenant: str) -> Ledger:
        """A handle whose every operation is scoped to `tenant`."""
        return Ledger(self, tenant)

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    def migrate(
        self,
        connection: Connection | None = None,
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
        return self.execute(self._ops.migrate(partitions=partitions, progress=progress), connection)

    def run_retention(
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
        return drive(
            self._ops.run_retention(
                tenant=tenant,
                export_dir=export_dir,
                dry_run=dry_run,
                now=now,
                progress=progress,
            ),
            self.execute,
        )

    def rebuild(
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
        return self.execute(self._ops.rebuild(progress, tenant=tenant))

    def claim_stale_runs(
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
        return self.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    def verify(
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
        return self.execute(self._ops.verify(progress, recompute=recompute))

    def rotate_kek(self, new: KeyEncryptionKey | bytes) -> int:
        """Re-wrap every data key under the key-encryption key `new` (32 bytes or a
        `KeyEncryptionKey`), in one transaction; returns how many were re-wrapped.

        The store must hold the current key. Afterwards, open every store with
        `new`; once no backup you keep holds a key row wrapped by the old one,
        destroying the old key makes erased content unreadable in those
        backups too (docs/erasure.md, "Rotating the key-encryption key").
        Keys already under `new` are left as they are, so a repeat is a no-op.
        """
        return drive(self._ops.rotate_kek(new), self.execute)

    def check_schema(self) -> None:
        """Raise `SchemaError` unless the database is at this package's head revision."""
        return self.execute(self._ops.check_schema())

    # -- end of the operations --

    def execute(self, op: Op[T], connection: Connection | None = None) -> T:
        """Run one operation in its own transaction.

        With `connection`, run its general path inside the caller's
        transaction on that connection instead. An operation that tolerates
        staleness (`Op.replica`) runs on a read replica when the store has
        one and it answers. A write that stores content is sealed first when
        the store has a key-encryption key, and sealed content in any result
        is opened (`store._sealing`).
        """

        def run(o: Op[Any]) -> Any:
            return self._execute(o, connection)

        seal = None
        sealer = self._sealer
        sealing = op.sealing  # the op it builds has none of its own
        if sealing is not None and sealer is not None:
            op, seal = drive(preparing(sealer, sealing, remember=connection is None), run)
        try:
            done = self._execute(op, connection)
        except (ErasedError, ConflictError, EncryptionError):
            if sealing is not None and sealer is not None:
                sealer.forget(sealing.tenant, sealing.conversation_id)
            raise
        if not needs_opening(sealer, op, done):
            return done
        return drive(opening(sealer, done, seal, op.tenant), run)

    def _execute(self, op: Op[T], connection: Connection | None) -> T:
        if connection is not None:
            with translating(op.action):
                done = op.fn(connection)
                if op.write and self._notifier is not None:
                    notify_on_commit(connection)
                return done
        if op.replica and self._replicas is not None:
            answer = self._replicas.read(op)
            if answer is not None:
                return answer
        done = self._run(op)
        if op.write and self._notifier is not None:
            self._notifier.touch()
        return done

    def _run(self, op: Op[T]) -> T:
        # The tiers: the plain-SQL form on a driver connection of our own;
        # when every one is busy, the Postgres form on a pooled connection;
        # the SQLite form inside the transaction unless it already ran; `fn`.
        fast = self.fast_paths
        direct = (op.sqlite if self._sqlite else op.postgres) if fast else None
        tried = False
        if direct is not None:
            with translating(op.action):
                tried, done = self._driver.run(op.write, direct)
            if done is not None:
                return done
        with translating(op.action):
            return general(self.engine, op, fast=fast, tried=tried)


class Ledger:
    """A tenant-scoped handle on a `Store`: every operation sees only this tenant."""

    def __init__(self, store: Store, tenant: str) -> None:
        self._store = store
        self._ops = store._tenant_ops(tenant)

    @property
    def tenant(self) -> str:
        """The tenant every operation is scoped to."""
        return self._ops.tenant

    @property
    def audit(self) -> Audit:
        """Audit queries over this tenant's log: timelines, model requests, tools, lineage."""
        return Audit(self._store, self._ops.tenant)

    @property
    def runs(self) -> Runs:
        """The tenant's runs: start, record, complete or fail one; leases; listings."""
        return Runs(self._store, self._ops)

    @property
    def retention(self) -> Retention:
        """The tenant's retention policy (docs/erasure.md, "Retention")."""
        return Retention(self._store, self._ops)

    def _tail(self, settings: _tail.TailSettings) -> Iterator[Page[Event]]:
        tenant, store = self.tenant, self._store
        if settings.after is not None:
            store.execute(_tail.start_op(tenant, settings.after))
        waiter: _tail.Waiter = (
            SqliteWaiter(sqlite_connector(store.engine), settings.poll_seconds)
            if is_sqlite(store.engine)
            else PostgresWaiter(connector(store.engine))
        )
        return _tail.tail(
            lambda cursor: store.execute(_tail.tail_op(tenant, settings, cursor)),
            waiter=waiter,
            settings=settings,
        )

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    def create_conversation(
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
        return self._store.execute(
            self._ops.create_conversation(
                metadata,
                conversation_id=conversation_id,
                key=key,
                subject=subject,
            )
        )

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation: metadata, head, and where it was forked from."""
        return self._store.execute(self._ops.conversation(conversation_id))

    def conversation_by_key(self, key: str) -> Conversation:
        """The conversation created with `key`; `NotFoundError` when the tenant has none."""
        return self._store.execute(self._ops.conversation_by_key(key))

    def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """The tenant's conversations, newest first, at most `limit` of them.

        Newest by id: minted ids are UUIDv7, so they sort in creation order. For
        the next page pass the last conversation's id as `before`; the list is
        short of `limit` only on the last page. A `before` that is no
        conversation of this tenant (another tenant's id, a made-up one) is a
        `NotFoundError` (`InvalidInputError` when it is not an id), so a cursor
        never reaches another tenant's rows. Keyset pagination on the `(tenant,
        id)` index: a deep page costs what the first does.
        """
        return self._store.execute(self._ops.conversations(limit, before))

    def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> list[Entry]:
        """The messages of the history at the head (or `at`), each with its event id and position, oldest first; only the last `last` with it, in one query. Unrepaired: each entry is a message as stored."""
        return self._store.execute(self._ops.entries(conversation_id, at=at, last=last))

    def entry(self, event_id: str) -> Entry:
        """The message with this event id, which its caller minted (`append_messages(ids=...)`)."""
        return self._store.execute(self._ops.entry(event_id))

    def state_changes(
        self,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> list[Event]:
        """The `state.changed` events, oldest first, their payloads opened: those a
        conversation's log holds (every branch, and the lineage a fork continues from
        its source), or those stamped with `run_id` in any of the tenant's
        conversations, or with both, those of the conversation stamped with the run."""
        return self._store.execute(self._ops.state_changes(conversation_id, run_id=run_id))

    def append_messages(
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
        return drive(
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

    def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """The history at the head, or `at` a position or moment; repaired by default."""
        return self._store.execute(self._ops.history(conversation_id, at=at, repaired=repaired))

    def fork(
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
        return self._store.execute(
            self._ops.fork(conversation_id, at=at, metadata=metadata, key=key, subject=subject)
        )

    def move_head(
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
        return self._store.execute(
            self._ops.move_head(conversation_id, to, expected=expected, state=state)
        )

    def erase(self, subject: str, *, reason: str) -> Erasure:
        """Erase an erasure subject: destroy its data key, in one transaction.

        Every conversation of the subject (a sealed conversation's subject is
        its own id unless it was given one; forks inherit their source's)
        gets a `conversation.erased` event naming the subject and `reason`,
        and reads as erased markers from then on, in every process; it takes
        no more writes. The log and its hash chain stay whole, so `verify`
        passes. Erasing a subject again changes nothing and says so
        (`Erasure.already`). docs/erasure.md says what it guarantees.
        """
        return drive(self._ops.erase(subject, reason=reason), self._store.execute)

    def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The raw log, in order."""
        return self._store.execute(
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
    ) -> Iterator[Page[Event]]:
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

    def verify(self, conversation_id: str, *, recompute: Recompute = 'auto') -> Verification:
        """Recompute one conversation's hash chain; say where it first breaks.

        `recompute`: see `Store.verify`.
        """
        return self._store.execute(self._ops.verify(conversation_id, recompute=recompute))

    def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of this tenant; `progress` is
        called with each conversation's result as it comes."""
        return self._store.execute(self._ops.verify_all(progress, recompute=recompute))

    def export(
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
        return self._store.execute(
            self._ops.export(out, conversation_id=conversation_id, progress=progress)
        )

    def import_file(
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
        return self._store.execute(self._ops.import_file(source, progress=progress))

    # -- end of the operations --


class Runs:
    """A tenant's runs (`Ledger.runs`): each run a lease-fenced writer of events."""

    def __init__(self, store: Store, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    def start(
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
        return self._store.execute(
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

    def record(
        self,
        cursor: RunCursor,
        events: Sequence[NewEvent],
        *,
        idempotency_key: str | None = None,
    ) -> tuple[list[Event], RunCursor]:
        """Append a run's events, fenced by its lease; return them and the new cursor."""
        return self._store.execute(
            self._ops.record(cursor, events, idempotency_key=idempotency_key)
        )

    def complete(
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
        return drive(
            self._ops.complete_run(
                cursor,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
            ),
            self._store.execute,
        )

    def fail(
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
        return drive(
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

    def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """Extend the run's lease by `seconds` of the database's clock."""
        return self._store.execute(self._ops.renew_lease(cursor, seconds))

    def get(self, run_id: str) -> Run:
        """The run's projection row."""
        return self._store.execute(self._ops.run(run_id))

    def claim_stale(
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
        return self._store.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    def recent(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """The tenant's runs, newest first."""
        return self._store.execute(
            self._ops.runs(
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            )
        )

    # -- end of the operations --


class Retention:
    """A tenant's retention policy (`Ledger.retention`)."""

    def __init__(self, store: Store, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    # -- operations: written by scripts/faces.py from their declarations; edit those --

    def set(self, idle_days: int, action: RetentionAction) -> RetentionPolicy:
        """Set the tenant's retention policy: conversations idle for `idle_days` are
        erased (`erase`), or exported and then erased (`export-erase`), by
        `Store.run_retention` (docs/erasure.md, "Retention")."""
        return self._store.execute(self._ops.set_retention(idle_days, action))

    def get(self) -> RetentionPolicy | None:
        """The tenant's retention policy, None when it has none."""
        return self._store.execute(self._ops.retention())

    def clear(self) -> bool:
        """Remove the tenant's retention policy; whether it had one."""
        return self._store.execute(self._ops.clear_retention())

    # -- end of the operations --
