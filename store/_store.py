"""`Store`, `Ledger` and its sub-handles: the synchronous face.

Every operation is an `Op` built by `store._ops` (`StoreOperations` for the
store's own, `Operations` for a tenant's, `store._audit.AuditOperations` for
its audit queries), run here in its own transaction on a connection. The
faces inherit their operations, one call each, from `store._faces`, which
scripts/faces.py writes from those declarations; `store._async` runs the
same `Op`s as coroutines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from sqlalchemy.engine import Connection, Engine

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
from chatledger.store._faces import AuditFace, LedgerFace, RetentionFace, RunsFace, StoreFace
from chatledger.store._ops import Operations, StoreOperations
from chatledger.store._sealing import drive, executing, runs_alone
from chatledger.store._sql.dialect import is_sqlite
from chatledger.store._sql.ops import Executor, Op
from chatledger.store._sql.pages import Page
from chatledger.store._sql.tail import notify_on_commit
from chatledger.store._sql.translate import translating
from chatledger.store._values import (
    Event,
)

__all__ = ["Audit", "Ledger", "Retention", "Runs", "Store"]

T = TypeVar("T")


class Store(StoreFace):
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

    def execute(self, op: Op[T], connection: Connection | None = None) -> T:
        """Run one operation in its own transaction.

        With `connection`, run its general path inside the caller's
        transaction on that connection instead. An operation that tolerates
        staleness (`Op.replica`) runs on a read replica when the store has
        one and it answers. A write that stores content is sealed first when
        the store has a key-encryption key, and sealed content in any result
        is opened (`store._sealing`).
        """

        if runs_alone(self._sealer, op):
            return self._execute(op, connection)
        program = executing(self._sealer, op, inside=connection is not None)
        return drive(program, lambda o: self._execute(o, connection))

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


class Ledger(LedgerFace):
    """A tenant-scoped handle on a `Store`: every operation sees only this tenant."""

    _store: Store

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


class Runs(RunsFace):
    """A tenant's runs (`Ledger.runs`): each run a lease-fenced writer of events."""


class Retention(RetentionFace):
    """A tenant's retention policy (`Ledger.retention`)."""


class Audit(AuditFace):
    """Audit queries scoped to one tenant: `store.tenant("acme").audit`.

    Lists come in pages (`Page`): pass `next_after` back as `after` to read
    on. Times are compared with `recorded_at` (database clock, UTC; a naive
    datetime means UTC): `since` inclusive, `until` exclusive.
    """

    def __init__(self, store: Executor, tenant: str) -> None:
        self._store = store
        self._ops = AuditOperations(tenant)
