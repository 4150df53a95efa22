"""`Op`: one store operation, and how it runs.

An operation is a function over one open transaction (`fn`), plus, where one
exists, a plain-SQL form for each backend that is tried first on a driver
connection (`postgres`, `sqlite`; see `store._sql.append`). `run_fast` and
`in_transaction` are the tiers `Store.execute` and `AsyncStore.execute` walk
(`general`, which runs them on an engine's pooled connection, is
`store._db.run`'s).
Whether an operation may run on a read replica is its own property too
(`replica`): the faces only follow it.

`Executor` and `AsyncExecutor` are what runs an `Op`: the faces built on a
store (`Audit`, `AsyncAudit`) are typed against them, not against the store
classes, so they import nothing of the store faces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.engine import Connection

from chatledger.store._sql.dialect import is_sqlite, on_cursor

__all__ = [
    "AsyncExecutor",
    "Executor",
    "Op",
    "Sealing",
    "in_transaction",
    "run_fast",
]

T = TypeVar("T")


# Not frozen, as `Turn`, `At`, `Written` and `Sealing` are not: one of each is built
# for every append, and a frozen dataclass's __init__ costs about four times a
# plain one's. Nothing changes one once it is built.
@dataclass(slots=True)
class Op(Generic[T]):
    """One store operation: a function over a transaction, and what it does.

    Build it with keywords, `Op(action, write=..., fn=...)`, so that what
    `True` means is on the page.
    """

    action: str
    """What it does, as a gerund phrase ("appending to conversation '…'"):
    every translated error says it happened while doing this."""
    write: bool
    """Whether it writes: a write takes SQLite's write lock when it begins
    (`BEGIN IMMEDIATE`), so that a read cannot fail to upgrade later."""
    fn: Callable[[Connection], T]
    """The general path: the operation inside one open transaction."""
    postgres: Callable[[Any], T | None] | None = None
    """Postgres: an attempt as one self-contained statement on an autocommit
    DB-API cursor, tried first; None from it means nothing was written and
    `fn` runs as usual."""
    sqlite: Callable[[Any], T | None] | None = None
    """SQLite: an attempt in plain SQL on a DB-API cursor, inside the
    operation's transaction, tried first; None means nothing was written and
    `fn` runs as usual, in the same transaction."""
    replica: bool = False
    """Whether it tolerates staleness: a read whose answer may lag the
    primary by the replication delay, so a store opened with read replicas
    runs it on one (`store._db.replicas`), and on the primary only when no
    replica answers. Such a read returns a value, never None. False, the
    default, for every write and for every read that must see what its
    caller just wrote; a write is never `replica`."""

    tenant: str | None = None
    """The tenant whose data it reads (None: a store-wide operation): sealed content
    in its result is opened only with that tenant's keys, so a ciphertext copied
    into another tenant's rows stays closed there."""
    opens: bool = False
    """Whether every form of it opens the sealed content of its own result (or, on
    a store without a key-encryption key, refuses it): the faces then need not
    look through the result for sealed content (a 1,000-message history is
    0.3 ms to look through)."""

    sealing: Sealing[T] | None = None
    """For a write that stores content: how to build it again once the key its
    content seals under is known (`store._sealing`). The op itself is built
    in the clear; a store with a key-encryption key runs the rebuilt one."""

    def __post_init__(self) -> None:
        assert not (self.write and self.replica), "a write runs on the primary"


@dataclass(slots=True)  # not frozen: see `Op`
class Sealing(Generic[T]):
    """What a write seals under: the conversation it writes to (and, when it may
    create it, the subject and fork source that decide a new one's key)."""

    tenant: str
    conversation_id: str
    build: Callable[[Any], Op[T]]
    """The op, given a `store._crypto.Seal`."""
    create: bool = False
    subject: str | None = None
    source: str | None = None
    ends: bool = False
    """The write ends a run, which an erasure does not stop: an erased conversation
    gets a seal without a key (its free text is stored as the erased marker)."""


class Executor(Protocol):
    """Runs an `Op` in a transaction of its own (`Store`)."""

    def execute(self, op: Op[T], /) -> T: ...


class AsyncExecutor(Protocol):
    """Runs an `Op` in a transaction of its own, as a coroutine (`AsyncStore`)."""

    async def execute(self, op: Op[T], /) -> T: ...


def run_fast(conn: Connection, fast: Callable[[Any], T | None], /) -> T | None:
    """Try an operation's one-statement form in autocommit mode (one round trip)."""
    default = conn.default_isolation_level
    conn.execution_options(isolation_level="AUTOCOMMIT")
    try:
        return on_cursor(conn, fast)
    finally:
        conn.rollback()  # ends SQLAlchemy's logical transaction; the statement committed itself
        conn.execution_options(isolation_level=default)


def in_transaction(conn: Connection, op: Op[T], *, fast: bool = True) -> T:
    """`op` inside the transaction on `conn`: its SQLite form first if `fast`, then `fn`."""
    if fast and op.sqlite is not None and is_sqlite(conn):
        done = on_cursor(conn, op.sqlite)
        if done is not None:
            return done
    return op.fn(conn)
