"""`AsyncDriverConnections`: the Postgres fast paths on the event loop, no thread hop.

The fast paths (`Op.postgres`) are synchronous functions over a DB-API
cursor: one self-contained statement, or two, each a round trip. `Store`
runs them on `DriverConnections`; `AsyncStore` ran them there too, in a
worker thread, and the hop there and back cost more than the database's
own work for a one-message append on this project's bench machine (ADR 0026).

Here they run on psycopg's async connections, on the loop: each function
runs in a greenlet (`greenlet_spawn`, as SQLAlchemy's asyncio extension runs
its synchronous core), over a cursor whose calls await psycopg's async
cursor (`await_only`). The function's code and its errors are psycopg's
own, exactly as on the synchronous driver.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.util import greenlet_spawn

from chatledger.store._db.engines import (
    GENERIC_PLANS,
    PREPARE_THRESHOLD,
    cut_off,
    opening_error,
)
from chatledger.store._errors import ChatledgerError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine  # it imports SQLAlchemy's ORM

try:  # SQLAlchemy 2.1 names it `await_`, and deprecates `await_only`
    from sqlalchemy.util import await_ as await_only
except ImportError:  # pragma: no cover - SQLAlchemy 2.0
    from sqlalchemy.util import await_only

__all__ = ["AsyncDriverConnections"]

T = TypeVar("T")


class _AwaitingCursor:
    """A psycopg `AsyncCursor` behind the synchronous DB-API calls the fast paths make.

    Only usable inside `greenlet_spawn`, where `await_only` hands each call's
    coroutine to the event loop and resumes with its result.
    """

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None) -> None:
        await_only(self._cursor.execute(query, params))

    def fetchall(self) -> list[Any]:
        rows: list[Any] = await_only(self._cursor.fetchall())
        return rows

    def fetchone(self) -> Any:
        return await_only(self._cursor.fetchone())

    @property
    def connection(self) -> Any:
        """The psycopg `AsyncConnection` (its `info` and `closed` need no awaiting)."""
        return self._cursor.connection

    @property
    def rowcount(self) -> int:
        count: int = self._cursor.rowcount
        return count

    @property
    def description(self) -> Any:
        return self._cursor.description


class AsyncDriverConnections:
    """psycopg async connections of the store's own, for the Postgres fast paths.

    The async twin of `store._db.engines.DriverConnections`, with its rules:
    each connection is checked out of the async engine's pool once and
    detached (so it carries what the engine's connect does), kept in
    autocommit mode (a fast path's statement is atomic by itself) with
    generic plans (`GENERIC_PLANS`), never kept longer than `recycle`
    seconds, nor handed out once the server has closed it. At most `size`
    exist; when all are in use, `run` declines and the caller takes another
    path. A connection that saw an error, or whose operation was cancelled
    mid-statement, is closed, not reused: its state is unknown.

    For one event loop, as the async engine is.
    """

    def __init__(self, engine: AsyncEngine, size: int = 8, recycle: float = 1800.0) -> None:
        self._engine = engine
        self._size = size
        self._recycle = recycle
        self._idle: list[tuple[float, Any]] = []
        self._in_use = 0
        self._pid = os.getpid()
        self._closed = False

    async def run(self, fn: Callable[[Any], T | None]) -> tuple[bool, T | None]:
        """`fn(cursor)` on a connection of its own, in autocommit mode.

        Returns (False, None) without running it when every connection is in
        use or the store is closing.
        """
        if self._closed or self._in_use >= self._size:
            return False, None
        self._in_use += 1
        try:
            born, fairy = await self._take()
            broke: BaseException | None = None
            try:
                cursor = _driver(fairy).cursor()
                try:
                    done = await greenlet_spawn(fn, _AwaitingCursor(cursor))
                finally:
                    await cursor.close()
                return True, done
            except ChatledgerError:
                raise  # the operation's own refusal: the connection is fine
            except BaseException as error:
                broke = error
                raise
            finally:
                await self._give(born, fairy, broke)
        finally:
            self._in_use -= 1

    async def close(self) -> None:
        """Close the idle connections; those in use close when they come back."""
        self._closed = True
        if os.getpid() != self._pid:  # a forked child's: its parent's to close
            self._idle = []
        await self._drop_idle()

    async def _drop_idle(self) -> None:
        while self._idle:
            _, idle = self._idle.pop()
            await _close(idle)

    async def _take(self) -> tuple[float, Any]:
        if os.getpid() != self._pid:  # a forked child must not share its parent's
            self._idle, self._pid = [], os.getpid()
        while self._idle:
            born, idle = self._idle.pop()
            if time.monotonic() - born < self._recycle and not cut_off(_driver(idle)):
                return born, idle
            await _close(idle)
        fairy = await self._connect()
        fairy.detach()
        dialect = self._engine.dialect
        try:
            await _driver(fairy).set_autocommit(True)
            _driver(fairy).prepare_threshold = PREPARE_THRESHOLD
            await _driver(fairy).execute(GENERIC_PLANS)
        except dialect.loaded_dbapi.Error as error:  # nothing of the caller's ran
            await _close(fairy)
            raise opening_error(dialect, error) from error
        except BaseException:
            await _close(fairy)
            raise
        return time.monotonic(), fairy

    async def _connect(self) -> Any:
        """A connection from the engine's pool, its driver's error wrapped as
        `DriverConnections._connect` wraps it."""
        dialect = self._engine.dialect
        dbapi_error: type[Exception] = dialect.loaded_dbapi.Error
        try:
            return await self._engine.raw_connection()
        except dbapi_error as error:
            raise opening_error(dialect, error) from error

    async def _give(self, born: float, fairy: Any, broke: BaseException | None) -> None:
        if broke is None and not self._closed:
            self._idle.append((born, fairy))
            return
        import psycopg  # loaded: these are its connections

        connection = _driver(fairy)
        # A driver error on a connection that then closed: likely the server went
        # away, and the idle ones are cut off too. (A cancellation psycopg could
        # not finish closes the connection too, and says nothing of the others.)
        lost = isinstance(broke, psycopg.Error) and bool(connection.closed or connection.broken)
        await _close(fairy)
        if lost:
            await self._drop_idle()


async def _close(fairy: Any) -> None:
    """Close a detached connection directly (see `store._db.engines._close`)."""
    with contextlib.suppress(Exception):
        await _driver(fairy).close()


def _driver(fairy: Any) -> Any:
    """The psycopg `AsyncConnection` of a detached pool connection."""
    return fairy.dbapi_connection.driver_connection
