"""Waking tails when events commit: NOTIFY from writers, LISTEN in readers.

A tail (`Ledger.tail`) reads pages of the log in commit order
(`store._sql.pages`) and, once caught up, waits for something new. What it
reads never depends on a wake-up: a wake-up only says when to read again.

Postgres: a store sends `NOTIFY chatledger_events` after its writes commit,
from a thread and connection of its own (`Notifier`), not inside the
writing transaction. A transaction that notifies takes a database-wide lock
from its commit until it ends, so notifying in every append would
serialize every writer's commit flush (measured here: 44% fewer appends per
second with 16 writers). The notifier's own transactions write nothing,
commit with `synchronous_commit = off` and coalesce: a burst of commits
sends one notification, and one at most every `min_interval` seconds (10
ms: a writer appending every millisecond sends one a tenth as often). A
writer pays an `Event.set`.

A tail waits with `LISTEN` on a connection of its own (`PostgresWaiter`).
It reads again on a notification, and in any case after `idle_seconds`:
writes that send none (another program's, a store's opened with
`notify=False`) and notifications lost with a dropped connection are found
then. A store's write inside a caller's own transaction (`connection=`)
notifies in that transaction (`notify_on_commit`, `store/_sql/tail.py`): delivered at its commit.
While a page holds committed events back behind an older open transaction
(`Page.pending`), which may belong to another program and end with no
notification, it reads again after a short, growing delay.

SQLite has no notifications: a tail asks `PRAGMA data_version`, which
changes when another connection commits, every `poll_seconds`. That is one
cheap statement on its own connection, no read of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from chatledger.store._sql.tail import CHANNEL
from chatledger.store._sql.translate import translating

if TYPE_CHECKING:
    import psycopg  # only a process on Postgres loads it
    from sqlalchemy.ext.asyncio import AsyncEngine  # it imports SQLAlchemy's ORM

__all__ = [
    "NOTIFIER_THREAD",
    "AsyncPostgresWaiter",
    "Notifier",
    "PostgresWaiter",
    "SqliteWaiter",
    "async_connector",
    "connector",
    "sqlite_connector",
    "url_connector",
]

# The name of every notifier's thread.
NOTIFIER_THREAD = "chatledger-notifier"

# What a tail was doing when it could not reach the database (`translating`).
_LISTENING = "listening for new events"


Connect = Callable[[], "psycopg.Connection[Any]"]
AsyncConnect = Callable[[], Awaitable["psycopg.AsyncConnection[Any]"]]


def connector(engine: Engine) -> Connect:
    """Opens autocommit driver connections as the engine does (its URL,
    `connect_args`, `creator`, connect hooks), each checked out of its pool
    and detached from it, so it is the caller's to close."""

    def connect() -> psycopg.Connection[Any]:
        fairy = engine.raw_connection()
        fairy.detach()
        conn: psycopg.Connection[Any] = fairy.dbapi_connection  # type: ignore[assignment]
        conn.autocommit = True
        return conn

    return connect


def async_connector(engine: AsyncEngine) -> AsyncConnect:
    """`connector` for an `AsyncEngine`: psycopg's `AsyncConnection`."""

    async def connect() -> psycopg.AsyncConnection[Any]:
        fairy = await engine.raw_connection()
        fairy.detach()
        # The dialect's adapter around psycopg's own connection.
        conn: psycopg.AsyncConnection[Any] = fairy.dbapi_connection.driver_connection  # type: ignore[union-attr]
        await conn.set_autocommit(True)
        return conn

    return connect


def sqlite_connector(engine: Engine | AsyncEngine) -> Callable[[], Any] | None:
    """A connection to the engine's SQLite file, or None for an in-memory database.

    A synchronous engine's own (detached from its pool); for an `AsyncEngine`,
    `sqlite3` on the file its URL names (a `file:` URI with `uri=true` as one).
    """
    url = engine.url
    if url.database in (None, "", ":memory:") or "mode=memory" in url.database:
        return None
    if isinstance(engine, Engine):

        def detached() -> Any:
            fairy = engine.raw_connection()
            fairy.detach()
            return fairy.dbapi_connection

        return detached
    database = url.database
    uri = str(url.query.get("uri", "")).lower() in ("true", "1")
    return lambda: sqlite3.connect(database, uri=uri)


def url_connector(engine: AsyncEngine) -> Connect:
    """A synchronous connection for an `AsyncEngine` a caller made: from its URL,
    as its dialect reads it (what it was given besides the URL is not seen)."""

    def connect() -> psycopg.Connection[Any]:
        import psycopg

        args, kwargs = engine.dialect.create_connect_args(engine.url)
        return psycopg.connect(*args, **{**kwargs, "autocommit": True})

    return connect


class Notifier:
    """Sends `NOTIFY chatledger_events` after a store's writes, coalesced, from its own thread.

    `touch()` after each write that committed; the thread starts on the first
    one. A failure to notify is never the writer's: a connection that broke
    (closed by the server while the store was quiet, say) is opened again
    and the notification sent on it; one that cannot be opened is tried again
    on the next touch, and tails find what they missed on their idle
    re-read. Nothing ends the thread but `close`.
    """

    def __init__(self, connect: Connect, *, min_interval: float = 0.01) -> None:
        self._connect_driver = connect
        self._min_interval = min_interval
        self._wanted = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def touch(self) -> None:
        """Note that a write committed: a notification follows soon."""
        if self._thread is None or self._pid != os.getpid():
            self._start()
        # Set already: the thread has not yet cleared it, and the notification it
        # sends after clearing it follows this write's commit. (`set` takes a lock.)
        if not self._wanted.is_set():
            self._wanted.set()

    def _start(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._thread is not None and self._pid == os.getpid():
                return
            # A forked child starts its own thread (the parent's is not in it).
            self._pid = os.getpid()
            self._wanted = threading.Event()
            self._thread = threading.Thread(target=self._run, name=NOTIFIER_THREAD, daemon=True)
            self._thread.start()

    def close(self, *, wait: bool = True) -> None:
        """Stop the thread after a last notification for what was touched;
        `wait` for it (at most 5 s), or let it end on its own."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if wait and thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(timeout=5)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        wanted = self._wanted
        try:
            while True:
                wanted.wait()
                wanted.clear()
                for _ in range(2):  # a connection that broke: once more on a new one
                    if conn is None:
                        conn = self._connect()
                    if conn is None or self._notify(conn):
                        break
                    _close(conn)
                    conn = None
                if self._closed:
                    return
                time.sleep(self._min_interval)  # what commits meanwhile shares the next one
        finally:
            if conn is not None:
                _close(conn)

    @staticmethod
    def _notify(conn: psycopg.Connection[Any]) -> bool:
        try:
            conn.execute(f"NOTIFY {CHANNEL}")
        except Exception:
            return False
        return True

    def _connect(self) -> psycopg.Connection[Any] | None:
        conn = None
        try:
            conn = self._connect_driver()
            # Its transactions are a NOTIFY each: nothing to wait for a flush of.
            conn.execute("SET synchronous_commit = off")
        except Exception:
            if conn is not None:
                _close(conn)
            return None
        return conn


def _close(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):
        conn.close()


class PostgresWaiter:
    """A tail's `LISTEN chatledger_events` on a connection of its own."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, seconds: float) -> bool:
        """Whether a notification came within `seconds`; listen first if not yet.

        Listening starts before the caller's next read, so a commit after
        that read is never missed: the first wait returns True at once, as
        does one after the connection broke (the read covers the gap).
        """
        import psycopg

        if self._conn is None or self._conn.closed:
            self._listen()
            return True
        try:
            woken = any(True for _ in self._conn.notifies(timeout=seconds, stop_after=1))
            if woken:  # drain what else arrived: one read serves them all
                for _ in self._conn.notifies(timeout=0):
                    pass
        except psycopg.OperationalError:
            self.close()
            return True
        return woken

    def _listen(self) -> None:
        with translating(_LISTENING):
            self._conn = self._connect()
            self._conn.execute(f"LISTEN {CHANNEL}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class AsyncPostgresWaiter:
    """`PostgresWaiter` on an `AsyncConnection`: cancelling the waiting task stops it."""

    def __init__(self, connect: AsyncConnect) -> None:
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def wait(self, seconds: float) -> bool:
        import psycopg

        if self._conn is None or self._conn.closed:
            with translating(_LISTENING):
                self._conn = await self._connect()
                await self._conn.execute(f"LISTEN {CHANNEL}")
            return True
        woken = False
        try:
            async for _ in self._conn.notifies(timeout=seconds, stop_after=1):
                woken = True
            if woken:
                async for _ in self._conn.notifies(timeout=0):
                    pass
        except psycopg.OperationalError:
            await self.close()
            return True
        return woken

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class SqliteWaiter:
    """Waits until a commit lands in the SQLite file (`PRAGMA data_version`).

    On a connection of its own to the file (`connect`): the version changes
    when any other connection commits. An in-memory database (`connect`
    None) has no other connection to see: there a wait never sees a
    commit, and the tail reads again after `idle_seconds`.
    """

    def __init__(self, connect: Callable[[], Any] | None, poll_seconds: float) -> None:
        self._connect = connect
        self._poll = poll_seconds
        self._conn: Any = None
        self._version: int | None = None

    def changed(self) -> bool:
        """Whether a commit landed since the last call (True on the first)."""
        if self._connect is None:
            first, self._version = self._version is None, 0
            return first
        with translating(_LISTENING):
            if self._conn is None:
                self._conn = self._connect()
            cursor = self._conn.cursor()
            try:
                version = cursor.execute("PRAGMA data_version").fetchone()[0]
            finally:
                cursor.close()
        seen, self._version = self._version, version
        return seen is None or version != seen

    def wait(self, seconds: float) -> bool:
        """Whether a commit landed within `seconds`."""
        deadline = time.monotonic() + seconds
        while not self.changed():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self._poll, left))
        return True

    async def wait_async(self, seconds: float) -> bool:
        """`wait` for an event loop: the sleeps are the loop's."""
        deadline = time.monotonic() + seconds
        while not self.changed():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(self._poll, left))
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
