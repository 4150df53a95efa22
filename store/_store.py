"""`Store` and `AsyncStore`: connections, transactions, and the tenant handles.

Every operation is a function of `store._log` / `store._runs` over one open
transaction. The sync store runs it on a connection; the async store runs the
very same function through SQLAlchemy's `run_sync`, so there is one
implementation of every rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_args

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from store import _fastpath, _log, _migrate, _repair, _runs, _verify, projector
from store._cache import MessageCache
from store._checks import check_choice, check_id
from store._dialect import (
    WRITE,
    DriverConnections,
    Durability,
    create_engine,
    install_sqlite_hooks,
    is_sqlite,
    normalize_url,
    on_cursor,
)
from store._errors import ConflictError, InvalidInputError, SchemaError
from store._translate import translating
from store._values import (
    Appended,
    Conversation,
    Event,
    NewEvent,
    Origin,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from store._verify import Recompute, Verification
from store.messages import Message, Usage, load_message, load_messages

if TYPE_CHECKING:
    from store._audit_ops import AsyncAudit, Audit

__all__ = ["AsyncLedger", "AsyncStore", "Ledger", "Store"]

T = TypeVar("T")
_ORIGINS: frozenset[str] = frozenset(get_args(Origin))


@dataclass(frozen=True)
class Op(Generic[T]):
    """One store operation: a function over a transaction, and what it does."""

    action: str
    write: bool
    fn: Callable[[Connection], T]
    postgres: Callable[[Any], T | None] | None = None
    """Postgres: an attempt as one self-contained statement on an autocommit
    DB-API cursor, tried first; None from it means nothing was written and
    `fn` runs as usual."""
    sqlite: Callable[[Any], T | None] | None = None
    """SQLite: an attempt in plain SQL on a DB-API cursor, inside the
    operation's transaction, tried first; None means nothing was written and
    `fn` runs as usual, in the same transaction."""


def _head_messages(
    rows: list[tuple[int, str]] | None, repaired: bool, cache: MessageCache
) -> list[Message] | None:
    """The head history from its (seq, payload) rows (None: empty or missing; `_history` decides)."""
    if rows is None:
        return None
    messages = cache.load(rows)
    return _repair.repaired(messages) if repaired else messages


def _history(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    at: int | Position | datetime | None,
    repaired: bool,
    cache: MessageCache,
) -> list[Message]:
    conv = _log.get_conversation(conn, tenant, conversation_id)
    if at is None:
        messages = load_messages(projector.view_payloads(conn, conv.id))
    else:
        if isinstance(at, datetime):
            point = projector.head_at(conn, conv.id, at)
            if point is None:
                return []
        else:
            point = _log.resolve_position(conn, conv, at)
        messages = cache.load(projector.message_rows(conn, projector.lineage(conn, point)))
    return _repair.repaired(messages) if repaired else messages


class _Ops:
    """Builds the tenant-scoped operations that `Ledger` and `AsyncLedger` run."""

    def __init__(self, tenant: str, cache: MessageCache) -> None:
        self.tenant = _log.check_text(tenant, "tenant")
        self.cache = cache

    def create_conversation(
        self, metadata: dict[str, Any] | None, conversation_id: str | None
    ) -> Op[Conversation]:
        return Op(
            "creating a conversation",
            True,
            lambda c: _log.create_conversation(
                c, self.tenant, metadata, conversation_id=conversation_id
            ),
        )

    def conversation(self, conversation_id: str) -> Op[Conversation]:
        return Op(
            f"reading conversation '{conversation_id}'",
            False,
            lambda c: _log.get_conversation(c, self.tenant, conversation_id),
        )

    def conversations(self, limit: int, before: str | None) -> Op[list[Conversation]]:
        return Op(
            "listing conversations",
            False,
            lambda c: _log.list_conversations(c, self.tenant, limit=limit, before=before),
        )

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        expected: int | None,
        run_id: str | None,
        idempotency_key: str | None,
        origin: str,
    ) -> Op[Appended]:
        if isinstance(messages, Message | dict | str | bytes) or not isinstance(
            messages, Sequence
        ):
            raise InvalidInputError(
                f"append_messages takes a list of messages, not {type(messages).__name__}."
            )
        check_choice(origin, "origin", _ORIGINS)
        # Every option is checked here, before either path: the fast paths
        # write without passing through `_log.append_messages`.
        check_id(conversation_id, "conversation")
        _log.check_append_options(expected, run_id, idempotency_key)
        encoded = _log.encode_events(
            [NewEvent.of_message(_as_message(m), origin=origin) for m in messages]  # type: ignore[arg-type]
        )
        tenant = self.tenant

        def in_place(append: _fastpath.Append) -> Callable[[Any], Appended | None] | None:
            if not encoded:
                return None
            return lambda handle: _log.appended_in_place(
                conversation_id,
                append(
                    handle,
                    tenant,
                    conversation_id,
                    encoded,
                    expected=expected,
                    run_id=run_id,
                    idempotency_key=idempotency_key,
                ),
                encoded,
                run_id,
                idempotency_key,
            )

        return Op(
            f"appending to conversation '{conversation_id}'",
            True,
            postgres=in_place(_fastpath.append_postgres),
            sqlite=in_place(_fastpath.append_sqlite),
            fn=lambda c: _log.append_messages(
                c,
                self.tenant,
                conversation_id,
                encoded,
                expected=expected,
                run_id=run_id,
                idempotency_key=idempotency_key,
            ),
        )

    def history(
        self, conversation_id: str, at: int | Position | datetime | None, repaired: bool
    ) -> Op[list[Message]]:
        read = Op(
            f"reading the history of conversation '{conversation_id}'",
            False,
            lambda c: _history(c, self.tenant, conversation_id, at, repaired, self.cache),
        )
        if at is not None:
            return read
        _log._check_id(conversation_id, "conversation")
        tenant, cache = self.tenant, self.cache
        return replace(
            read,
            postgres=lambda c: _head_messages(
                _fastpath.head_payloads_postgres(c, tenant, conversation_id), repaired, cache
            ),
            sqlite=lambda cursor: _head_messages(
                _fastpath.head_payloads_sqlite(cursor, tenant, conversation_id), repaired, cache
            ),
        )

    def fork(
        self, conversation_id: str, at: int | Position | None, metadata: dict[str, Any] | None
    ) -> Op[Conversation]:
        return Op(
            f"forking conversation '{conversation_id}'",
            True,
            lambda c: _log.fork(c, self.tenant, conversation_id, at, metadata),
        )

    def move_head(
        self, conversation_id: str, to: int | Position, expected: Position | None
    ) -> Op[Conversation]:
        return Op(
            f"moving the head of conversation '{conversation_id}'",
            True,
            lambda c: _log.move_head(c, self.tenant, conversation_id, to, expected=expected),
        )

    def events(
        self,
        conversation_id: str | None,
        run_id: str | None,
        after_seq: int | None,
        limit: int | None,
    ) -> Op[list[Event]]:
        return Op(
            "reading events",
            False,
            lambda c: _log.list_events(
                c,
                self.tenant,
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            ),
        )

    def start_run(
        self, conversation_id: str, events: Sequence[NewEvent], **options: Any
    ) -> Op[RunCursor]:
        initial = _log.encode_events(events)
        return Op(
            f"starting a run on conversation '{conversation_id}'",
            True,
            lambda c: _runs.start_run(c, self.tenant, conversation_id, initial=initial, **options),
        )

    def record(
        self, cursor: RunCursor, new_events: Sequence[NewEvent], idempotency_key: str | None
    ) -> Op[tuple[list[Event], RunCursor]]:
        encoded = _log.encode_events(new_events)
        return Op(
            f"recording events of run '{cursor.run_id}'",
            True,
            lambda c: _runs.record(
                c, self.tenant, cursor, encoded, idempotency_key=idempotency_key
            ),
        )

    def end_run(
        self, cursor: RunCursor, status: RunStatus, **options: Any
    ) -> Op[tuple[Conversation | None, ConflictError | None]]:
        return Op(
            f"ending run '{cursor.run_id}'",
            True,
            lambda c: _runs.end_run(c, self.tenant, cursor, status, **options),
        )

    def renew_lease(self, cursor: RunCursor, seconds: float) -> Op[None]:
        return Op(
            f"renewing the lease of run '{cursor.run_id}'",
            True,
            lambda c: _runs.renew_lease(c, self.tenant, cursor, seconds),
        )

    def run(self, run_id: str) -> Op[Run]:
        return Op(f"reading run '{run_id}'", False, lambda c: _runs.get_run(c, self.tenant, run_id))

    def runs(
        self,
        conversation_id: str | None,
        status: RunStatus | None,
        attention: bool | None,
        limit: int,
    ) -> Op[list[Run]]:
        return Op(
            "listing runs",
            False,
            lambda c: _runs.list_runs(
                c,
                self.tenant,
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            ),
        )

    def verify(
        self, conversation_ids: list[str] | None, recompute: Recompute
    ) -> Op[list[Verification]]:
        for conversation_id in conversation_ids or ():
            _log._check_id(conversation_id, "conversation")
        return Op(
            "verifying hash chains",
            False,
            lambda c: _verify.verify_many(c, self.tenant, conversation_ids, recompute=recompute),
        )

    def claim_stale_runs(
        self, owner: str, limit: int, lease_seconds: float, max_attempts: int
    ) -> Op[list[tuple[Run, RunCursor]]]:
        return Op(
            "claiming stale runs",
            True,
            lambda c: _runs.claim_stale_runs(
                c,
                self.tenant,
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
            ),
        )


def _as_message(value: Message | dict[str, Any]) -> Message:
    return value if isinstance(value, Message) else load_message(value)


def _ended(result: tuple[Conversation | None, ConflictError | None]) -> Conversation | None:
    conversation, conflict = result
    if conflict is not None:
        raise conflict
    return conversation


# -- sync ---------------------------------------------------------------------------


def _run_fast(conn: Connection, fast: Callable[[Any], T | None], /) -> T | None:
    """Try an operation's one-statement form in autocommit mode (one round trip)."""
    default = conn.default_isolation_level
    conn.execution_options(isolation_level="AUTOCOMMIT")
    try:
        return on_cursor(conn, fast)
    finally:
        conn.rollback()  # ends SQLAlchemy's logical transaction; the statement committed itself
        conn.execution_options(isolation_level=default)


def _in_transaction(conn: Connection, op: Op[T], tried: bool = False) -> T:
    """`op` inside the transaction on `conn`; its SQLite form first, unless `tried`."""
    if op.sqlite is not None and not tried and is_sqlite(conn):
        done = on_cursor(conn, op.sqlite)
        if done is not None:
            return done
    return op.fn(conn)


class Store:
    """A chatledger store on one database.

    Open it with `Store.open()`; get a tenant-scoped handle with `tenant()`.
    """

    def __init__(self, engine: Engine, *, owns_engine: bool, message_cache: int = 10_000) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        # Operations with a plain-SQL form for this database run on driver
        # connections of their own (see `DriverConnections`).
        self._sqlite = is_sqlite(engine)
        self._driver = DriverConnections(engine)
        self.message_cache = MessageCache(message_cache)

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        durability: Durability = "full",
        busy_timeout: float = 30.0,
        message_cache: int = 10_000,
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
        """
        if engine is not None:
            if engine.dialect.name == "sqlite":
                install_sqlite_hooks(engine, durability=durability, busy_timeout=busy_timeout)
            return cls(engine, owns_engine=False, message_cache=message_cache)
        return cls(
            create_engine(url, durability=durability, busy_timeout=busy_timeout),
            owns_engine=True,
            message_cache=message_cache,
        )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool (of an engine this store created)."""
        self._driver.close()
        if self._owns_engine:
            self.engine.dispose()

    def migrate(self, connection: Connection | None = None) -> None:
        """Upgrade the schema to this package's head revision.

        With `connection`, run inside the caller's transaction on it.
        """
        if connection is not None:
            with translating("migrating the schema"):
                _migrate.upgrade(connection)
            return
        with translating("migrating the schema"), self.engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                _migrate.upgrade(conn)

    def tenant(self, tenant: str) -> Ledger:
        """A handle whose every operation is scoped to `tenant`."""
        return Ledger(self, tenant)

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Recompute every materialized view from the events; return the view count.

        It runs in one transaction: readers see the old views until it commits.
        """
        return self.execute(
            Op("rebuilding views", True, lambda c: projector.rebuild_views(c, progress=progress))
        )

    def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim stale runs of every tenant (for a resume worker serving them all)."""
        return self.execute(
            Op(
                "claiming stale runs",
                True,
                lambda c: _runs.claim_stale_runs(
                    c,
                    None,
                    owner=owner,
                    limit=limit,
                    lease_seconds=lease_seconds,
                    max_attempts=max_attempts,
                ),
            )
        )

    def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = "auto",
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of every tenant.

        `recompute` says where the hashes are computed: `"auto"` (in SQL on
        Postgres, fastest; here on SQLite), `"database"`, or `"client"` (in
        this process, independent of the server's own functions).
        """
        return self.execute(
            Op(
                "verifying hash chains",
                False,
                lambda c: _verify.verify_many(c, None, None, progress, recompute),
            )
        )

    def check_schema(self) -> None:
        """Raise `SchemaError` unless the database is at this package's head revision."""
        current = self.execute(Op("reading the schema version", False, _migrate.current_revision))
        head = _migrate.head_revision()
        if current != head:
            raise SchemaError(
                f"The database is at schema revision {current or 'none'}, but this chatledger "
                f"needs {head}. Run `store.migrate()` or `chatledger migrate`."
            )

    def execute(self, op: Op[T]) -> T:
        """Run one operation in its own transaction."""
        direct = op.sqlite if self._sqlite else op.postgres
        tried = False
        if direct is not None:
            with translating(op.action):
                tried, done = self._driver.run(op.write, direct)
            if done is not None:
                return done
        with translating(op.action), self.engine.connect() as conn:
            if op.postgres is not None and not tried and not self._sqlite:
                done = _run_fast(conn, op.postgres)
                if done is not None:
                    return done
            if op.write:
                conn.execution_options(**{WRITE: True})
            with conn.begin():
                return _in_transaction(conn, op, tried=tried)


class Ledger:
    """A tenant-scoped handle on a `Store`: every operation sees only this tenant."""

    def __init__(self, store: Store, tenant: str) -> None:
        self._store = store
        self._ops = _Ops(tenant, store.message_cache)

    @property
    def tenant(self) -> str:
        """The tenant every operation is scoped to."""
        return self._ops.tenant

    @property
    def audit(self) -> Audit:
        """Audit queries over this tenant's log: timelines, model requests, tools, lineage."""
        from store._audit_ops import Audit  # imported here: it builds on this module's Op

        return Audit(self._store, self._ops.tenant)

    def create_conversation(
        self, metadata: dict[str, Any] | None = None, *, conversation_id: str | None = None
    ) -> Conversation:
        """Create a conversation (its id a new UUIDv7 unless given)."""
        return self._store.execute(self._ops.create_conversation(metadata, conversation_id))

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation: metadata, head, and where it was forked from."""
        return self._store.execute(self._ops.conversation(conversation_id))

    def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """The tenant's conversations, newest first; pass the last id as `before` for more."""
        return self._store.execute(self._ops.conversations(limit, before))

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = "client",
    ) -> Appended:
        """Append one turn at the head, atomically, and move the head past it.

        Args:
            expected: the head position the caller last saw; `ConflictError`
                when another writer appended first. Without it, the append
                goes after whatever the head is.
            run_id: a run id to stamp on the events.
            idempotency_key: a retried append with the same key and content
                writes nothing and returns the original.
        """
        return self._store.execute(
            self._ops.append_messages(
                conversation_id, messages, expected, run_id, idempotency_key, origin
            )
        )

    def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """The history at the head, or `at` a position or moment; repaired by default."""
        return self._store.execute(self._ops.history(conversation_id, at, repaired))

    def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Conversation:
        """A new conversation that continues this one at `at` (default: the head)."""
        return self._store.execute(self._ops.fork(conversation_id, at, metadata))

    def move_head(
        self, conversation_id: str, to: int | Position, *, expected: Position | None = None
    ) -> Conversation:
        """Move the head to `to` (compare-and-set against `expected` when given)."""
        return self._store.execute(self._ops.move_head(conversation_id, to, expected))

    def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The raw log, in order."""
        return self._store.execute(self._ops.events(conversation_id, run_id, after_seq, limit))

    def start_run(
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
    ) -> RunCursor:
        """Start a run at `base` (default the head), leased to `owner`.

        `events` (the run's prompt) are recorded with `run.started`, atomically.
        """
        return self._store.execute(
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
        return self._store.execute(self._ops.record(cursor, events, idempotency_key))

    def complete_run(
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
        result = _ended(
            self._store.execute(
                self._ops.end_run(
                    cursor,
                    "completed",
                    usage=usage,
                    request_count=request_count,
                    tool_count=tool_count,
                )
            )
        )
        assert result is not None
        return result

    def fail_run(
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

        `attention` marks it as needing a person (listed by `runs(attention=True)`).
        """
        self._store.execute(
            self._ops.end_run(
                cursor,
                "canceled" if canceled else "failed",
                stage=stage,
                error=error,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
                attention=attention,
            )
        )

    def verify(self, conversation_id: str, *, recompute: Recompute = "auto") -> Verification:
        """Recompute one conversation's hash chain; say where it first breaks.

        `recompute`: see `Store.verify`.
        """
        results = self._store.execute(self._ops.verify([conversation_id], recompute))
        if not results:
            self.conversation(conversation_id)  # raises NotFoundError
        return results[0]

    def verify_all(self, *, recompute: Recompute = "auto") -> list[Verification]:
        """Recompute the hash chain of every conversation of this tenant."""
        return self._store.execute(self._ops.verify(None, recompute))

    def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """Extend the run's lease by `seconds` of the database's clock."""
        self._store.execute(self._ops.renew_lease(cursor, seconds))

    def run(self, run_id: str) -> Run:
        """The run's projection row."""
        return self._store.execute(self._ops.run(run_id))

    def runs(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """The tenant's runs, newest first."""
        return self._store.execute(self._ops.runs(conversation_id, status, attention, limit))

    def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim runs whose lease expired (each claim a new attempt)."""
        return self._store.execute(
            self._ops.claim_stale_runs(owner, limit, lease_seconds, max_attempts)
        )


# -- async --------------------------------------------------------------------------


class AsyncStore:
    """The async face of `Store`: the same operations, as coroutines."""

    def __init__(
        self, engine: AsyncEngine, *, owns_engine: bool, message_cache: int = 10_000
    ) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        self.message_cache = MessageCache(message_cache)

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        engine: AsyncEngine | None = None,
        durability: Durability = "full",
        busy_timeout: float = 30.0,
        message_cache: int = 10_000,
    ) -> AsyncStore:
        """Open a store; the arguments are those of `Store.open`."""
        if engine is None:
            url = normalize_url(url)
            if url.startswith("sqlite:"):
                url = "sqlite+aiosqlite:" + url.split(":", 1)[1]
            kwargs: dict[str, Any] = (
                {"connect_args": {"timeout": busy_timeout}}
                if url.startswith("sqlite")
                else {"pool_recycle": 1800}
            )
            engine = sa_create_async_engine(url, **kwargs)
            owns = True
        else:
            owns = False
        if engine.dialect.name == "sqlite":
            install_sqlite_hooks(
                engine.sync_engine, durability=durability, busy_timeout=busy_timeout
            )
        return cls(engine, owns_engine=owns, message_cache=message_cache)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the connection pool (of an engine this store created)."""
        if self._owns_engine:
            await self.engine.dispose()

    async def migrate(self) -> None:
        """Upgrade the schema to this package's head revision."""
        await self.execute(Op("migrating the schema", True, _migrate.upgrade))

    def tenant(self, tenant: str) -> AsyncLedger:
        """A handle whose every operation is scoped to `tenant`."""
        return AsyncLedger(self, tenant)

    async def rebuild(self) -> int:
        """Recompute every materialized view from the events."""
        return await self.execute(Op("rebuilding views", True, projector.rebuild_views))

    async def execute(self, op: Op[T]) -> T:
        """Run one operation in its own transaction, through `run_sync`."""
        with translating(op.action):
            async with self.engine.connect() as conn:
                fast = op.postgres
                if fast is not None and self.engine.dialect.name != "sqlite":
                    done = await conn.run_sync(lambda c: _run_fast(c, fast))
                    if done is not None:
                        return done
                if op.write:
                    await conn.execution_options(**{WRITE: True})
                async with conn.begin():
                    return await conn.run_sync(lambda c: _in_transaction(c, op))


class AsyncLedger:
    """The async face of `Ledger`."""

    def __init__(self, store: AsyncStore, tenant: str) -> None:
        self._store = store
        self._ops = _Ops(tenant, store.message_cache)

    @property
    def tenant(self) -> str:
        """The tenant every operation is scoped to."""
        return self._ops.tenant

    @property
    def audit(self) -> AsyncAudit:
        """See `Ledger.audit`."""
        from store._audit_ops import AsyncAudit  # imported here: it builds on this module's Op

        return AsyncAudit(self._store, self._ops.tenant)

    async def create_conversation(
        self, metadata: dict[str, Any] | None = None, *, conversation_id: str | None = None
    ) -> Conversation:
        """See `Ledger.create_conversation`."""
        return await self._store.execute(self._ops.create_conversation(metadata, conversation_id))

    async def conversation(self, conversation_id: str) -> Conversation:
        """See `Ledger.conversation`."""
        return await self._store.execute(self._ops.conversation(conversation_id))

    async def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """See `Ledger.conversations`."""
        return await self._store.execute(self._ops.conversations(limit, before))

    async def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = "client",
    ) -> Appended:
        """See `Ledger.append_messages`."""
        return await self._store.execute(
            self._ops.append_messages(
                conversation_id, messages, expected, run_id, idempotency_key, origin
            )
        )

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
    ) -> Conversation:
        """See `Ledger.fork`."""
        return await self._store.execute(self._ops.fork(conversation_id, at, metadata))

    async def move_head(
        self, conversation_id: str, to: int | Position, *, expected: Position | None = None
    ) -> Conversation:
        """See `Ledger.move_head`."""
        return await self._store.execute(self._ops.move_head(conversation_id, to, expected))

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
        result = _ended(
            await self._store.execute(
                self._ops.end_run(
                    cursor,
                    "completed",
                    usage=usage,
                    request_count=request_count,
                    tool_count=tool_count,
                )
            )
        )
        assert result is not None
        return result

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
            self._ops.end_run(
                cursor,
                "canceled" if canceled else "failed",
                stage=stage,
                error=error,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
                attention=attention,
            )
        )

    async def verify(self, conversation_id: str, *, recompute: Recompute = "auto") -> Verification:
        """See `Ledger.verify`."""
        results = await self._store.execute(self._ops.verify([conversation_id], recompute))
        if not results:
            await self.conversation(conversation_id)  # raises NotFoundError
        return results[0]

    async def verify_all(self, *, recompute: Recompute = "auto") -> list[Verification]:
        """See `Ledger.verify_all`."""
        return await self._store.execute(self._ops.verify(None, recompute))

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
    ) -> list[tuple[Run, RunCursor]]:
        """See `Ledger.claim_stale_runs`."""
        return await self._store.execute(
            self._ops.claim_stale_runs(owner, limit, lease_seconds, max_attempts)
        )
