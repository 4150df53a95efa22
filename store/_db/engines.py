"""The database URL, engines and their connection settings, and the store's own driver connections.

This module holds the database URL (`database_url`: which database, which
driver), the engine and its connection settings (`create_engine`, the SQLite
hooks), and the store's own driver connections (`DriverConnections`). The
SQL that differs per dialect is `store/_sql/dialect.py`'s.

SQLite: write transactions begin with `BEGIN IMMEDIATE`, because a deferred
transaction that reads and then upgrades to a write fails at once with
SQLITE_BUSY, ignoring `busy_timeout`. To issue our own BEGIN, the driver's
implicit transaction handling is switched off (`isolation_level = None`) and
SQLAlchemy's "begin" event emits BEGIN itself: `BEGIN IMMEDIATE` on
connections marked for writing (`WRITE`), a plain (deferred) `BEGIN` for reads.
A process's writers take turns on a lock first (`sqlite_writer`): SQLite's
busy handler, which otherwise makes a writer wait for another, sleeps it for 1
to 100 ms at a time, long after the other has committed.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Dialect, Engine

from chatledger.store._errors import ChatledgerError, InvalidInputError
from chatledger.store._sql.dialect import WRITE, is_sqlite, on_cursor, sqlite_clock, sqlite_time

T = TypeVar("T")

__all__ = [
    "DEFAULT_URL",
    "GENERIC_PLANS",
    "PREPARE_THRESHOLD",
    "DriverConnections",
    "Durability",
    "create_engine",
    "cut_off",
    "database_url",
    "install_sqlite_hooks",
    "normalize_url",
    "opening_error",
    "sqlite_writer",
    "sync_driver_url",
]

DEFAULT_URL = "sqlite:///chatledger.db"
Durability = Literal["full", "normal"]


def database_url(url: str | URL | None) -> URL:
    """The SQLAlchemy URL to use: `url`, else `CHATLEDGER_DATABASE_URL`, else the default.

    `postgresql://` and `postgres://` URLs get psycopg 3, the Postgres driver
    chatledger ships with. A URL that cannot be parsed, or that is for a
    database other than Postgres or SQLite, raises `InvalidInputError`.
    """
    where = ""
    if not url:
        url = os.environ.get("CHATLEDGER_DATABASE_URL")
        where = " (from CHATLEDGER_DATABASE_URL)" if url else ""
    try:
        parsed = sa.make_url(url or DEFAULT_URL)
    except sa_exc.ArgumentError as error:
        # The text is not shown: it may hold a password.
        raise InvalidInputError(
            f"The database URL{where} cannot be read as a URL. {_URL_FORMS}"
        ) from error
    except ValueError as error:  # SQLAlchemy reads the port with int()
        raise InvalidInputError(
            f"The port in the database URL{where} is not a number. Write it in digits "
            f"(`postgresql://user@host:5432/database`), or leave it out for the default."
        ) from error
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.get_backend_name() == "postgres":  # the old alias, with a driver named
        parsed = parsed.set(drivername=f"postgresql+{parsed.get_driver_name()}")
    if parsed.get_backend_name() not in ("postgresql", "sqlite"):
        raise InvalidInputError(
            f"The database URL{where} {_shown(parsed)} is for "
            f"'{parsed.get_backend_name()}', but chatledger stores its log in "
            f"PostgreSQL or SQLite. {_URL_FORMS}"
        )
    try:
        parsed.get_dialect()
    except sa_exc.NoSuchModuleError as error:
        raise InvalidInputError(
            f"The database URL{where} {_shown(parsed)} names '{parsed.drivername}', "
            f"a driver SQLAlchemy does not know. Leave the driver out (`postgresql://` "
            f"uses psycopg 3), or name one that SQLAlchemy supports."
        ) from error
    return parsed


def sync_driver_url(url: URL) -> URL | None:
    """`url`'s database with the synchronous driver `create_engine` would use for it.

    For an async store's engine, whose URL may name an async driver
    (`sqlite+aiosqlite`, `postgresql+psycopg_async`): on SQLite it is the
    standard library's sqlite3, on Postgres psycopg 3. None for an in-memory
    SQLite database, which a second engine could not reach: it would open a
    new, empty database of its own.
    """
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:") or url.query.get("mode") == "memory":
            return None
        return url.set(drivername="sqlite+pysqlite")
    return url.set(drivername="postgresql+psycopg")


def normalize_url(url: str | None) -> str:
    """`database_url(url)` as a string, password included."""
    return database_url(url).render_as_string(hide_password=False)


_URL_FORMS = (
    "Write it as `postgresql://user:password@host:port/database` or `sqlite:///path/to/file.db`."
)


def _shown(url: URL) -> str:
    return f"'{url.render_as_string(hide_password=True)}'"


def create_engine(
    url: str | URL | None = None, *, durability: Durability = "full", busy_timeout: float = 30.0
) -> Engine:
    """An engine for `url` with chatledger's connection settings."""
    url = database_url(url)
    if url.get_backend_name() == "sqlite":
        # The store's driver connections are used from whichever thread runs
        # the operation (an AsyncStore's worker threads, say), so sqlite3 must
        # not tie them to the thread that opened them. SQLAlchemy turns the
        # check off for file databases already; this keeps it off for a URL
        # that asks otherwise.
        engine = sa.create_engine(
            url, connect_args={"timeout": busy_timeout, "check_same_thread": False}
        )
        install_sqlite_hooks(engine, durability=durability, busy_timeout=busy_timeout)
        return engine
    # No pre-ping, which costs a round trip on every checkout; `cut_off` costs
    # a poll of the socket (docs/adr/0012-connection-faults.md). pool_recycle
    # retires connections before typical idle timeouts close them.
    engine = sa.create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800)
    event.listen(engine, "checkout", _replace_if_cut_off)
    return engine


def cut_off(dbapi_connection: Any) -> bool:
    """Whether the server has closed an idle Postgres connection, found without a round trip.

    An idle connection has nothing to read. When the server ends it (it was
    terminated, shut down, or idle too long) it sends a last error message
    and closes the socket, so the socket turns readable: a zero-timeout poll
    sees that. It cannot see a connection cut off silently (a network path
    gone); that one fails the operation that uses it.
    """
    if getattr(dbapi_connection, "closed", False):
        return True
    fileno = getattr(dbapi_connection, "fileno", None)
    if fileno is None:  # a driver that does not show its socket
        return False
    fd = fileno()
    if sys.platform == "win32":
        return bool(select.select([fd], [], [], 0)[0])
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


def _replace_if_cut_off(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    # The pool's protocol: it closes this connection and opens another, and the
    # operation runs on that one, before any statement was sent on this one.
    if cut_off(dbapi_connection):
        raise sa_exc.DisconnectionError("The server closed the connection while it was idle.")


_SQLITE_BUSY = 5  # another connection holds the lock a statement needs

# A SQLite engine's lock for its writers, and how long one waits on it.
_WRITERS: weakref.WeakKeyDictionary[Engine, tuple[threading.RLock, float]] = (
    weakref.WeakKeyDictionary()
)


def _unheld_in_child() -> None:
    # A forked child has only the forking thread: a lock another thread held at
    # the fork would stay held there, and every write wait out the busy timeout.
    for engine, (_, timeout) in list(_WRITERS.items()):
        _WRITERS[engine] = (threading.RLock(), timeout)


os.register_at_fork(after_in_child=_unheld_in_child)


def sqlite_writer(engine: Engine, write: bool = True, *, wait: bool = True) -> _WriterTurn:
    """A write transaction's turn among the writers of `engine` in this process
    (nothing for a read, which SQLite's WAL never makes wait): a context manager
    that yields whether the transaction may go on.

    Each waits on a lock, woken as the one before it ends, where SQLite's busy
    handler would sleep it 1 to 100 ms at a time. One that has waited out the
    busy timeout goes on to SQLite's handler (which then waits no longer, or
    reports the database busy, as without the lock); writers in other processes
    meet only that handler. Without `wait`, a writer that would wait does not
    go on (False). Nothing on an engine without `install_sqlite_hooks`.
    """
    return _WriterTurn(_WRITERS.get(engine) if write else None, wait)


class _WriterTurn:
    """`sqlite_writer`'s context manager (a class: every SQLite write enters one)."""

    __slots__ = ("_found", "_taken", "_wait")

    def __init__(self, found: tuple[threading.RLock, float] | None, wait: bool) -> None:
        self._found, self._wait, self._taken = found, wait, False

    def __enter__(self) -> bool:
        if self._found is None:
            return True
        lock, timeout = self._found
        wait = self._wait
        self._taken = lock.acquire(timeout=timeout) if wait else lock.acquire(blocking=False)
        return self._taken or wait

    def __exit__(self, *_: object) -> None:
        if self._taken:
            assert self._found is not None
            self._found[0].release()


def install_sqlite_hooks(
    engine: Engine, *, durability: Durability = "full", busy_timeout: float = 30.0
) -> None:
    """Pragmas and BEGIN handling on every connection of a SQLite `engine`, and the
    lock its writers take turns on (`sqlite_writer`)."""
    synchronous = "FULL" if durability == "full" else "NORMAL"
    # Reentrant: a writer that opens a second write transaction in its thread
    # meets SQLite's busy handler, as it would without the lock.
    _WRITERS[engine] = (threading.RLock(), busy_timeout)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        # SQLite's own clock has millisecond resolution; the host's (the
        # embedded database's clock) has microseconds, so events recorded in
        # one millisecond still get distinct, ordered timestamps.
        dbapi_connection.create_function("chatledger_now", 0, _sqlite_now)
        dbapi_connection.create_function("chatledger_now_plus", 1, _sqlite_now_plus)
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Straight to the driver: SQLAlchemy's statement machinery would cost
        # more than SQLite's BEGIN, on every operation.
        statement = "BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN"
        on_cursor(conn, lambda cursor: cursor.execute(statement))


# The store's own Postgres connections run a fixed set of statements, each
# reading or writing by key (a conversation's rows, a key's row), with no
# range, page or list of varying shape. Once psycopg prepares one (its sixth
# run), Postgres plans it afresh for five more runs, and then on a partitioned
# log for every run: a generic plan's estimate counts every partition, a
# custom plan's only the one its values select, so the custom plan always
# looks cheaper, and the head read was re-planned on every call. A generic
# plan is planned once per connection and still reads one partition:
# Postgres prunes the others when the executor starts, from the bound values
# (docs/adr/0030-generic-plans-on-the-store-connections.md).
#
# Not on Citus: its coordinator plans a statement of data-modifying CTEs (the
# append's) only with its parameters' values, so there the plans are custom
# (docs/adr/0054-citus-distributed-by-tenant.md).
GENERIC_PLANS = (
    "SELECT set_config('plan_cache_mode', CASE WHEN EXISTS "
    "(SELECT 1 FROM pg_extension WHERE extname = 'citus') "
    "THEN 'force_custom_plan' ELSE 'force_generic_plan' END, false)"
)
PREPARE_THRESHOLD = 0
"""psycopg's `prepare_threshold` on those connections: each statement is prepared
on its first run (psycopg's default waits for its sixth), so a new connection's
first appends and reads are not parsed and planned again each time; the
statements are the store's few, well under psycopg's 100 kept per connection."""


class DriverConnections:
    """Driver connections of the store's own, for operations written in plain SQL.

    Each is checked out of the engine's pool once and detached from it
    (`_ConnectionFairy.detach`), so it carries the engine's connect-time
    settings (the hooks above) but costs no pool bookkeeping per use: taking
    an idle one is a list pop. A chat-loop append spends less time in the
    database's own work than a pool checkout, SQLAlchemy's `Connection` and
    result machinery took around it.

    At most `size` exist at once, idle or in use; when all are in use, `run`
    declines (returns `(False, None)`) and the caller takes the pool's path,
    where the pool's own limits and timeout apply. None is kept longer than
    `recycle` seconds (the pool's `pool_recycle`), and on Postgres none the
    server has closed meanwhile is handed out (`cut_off`). A connection that
    saw an error is closed; one that was cut off (the server restarted, say)
    also closes every idle one, since they are likely cut off too, as the pool
    invalidates itself on a disconnect. Connections are closed directly, not
    through the pool's reset: a rollback on a connection the server has
    closed fails, and the pool would log that with a traceback.

    On SQLite, `run` wraps the function in `BEGIN IMMEDIATE` (a write) or
    `BEGIN`, and `COMMIT`; on Postgres the connections are in autocommit mode,
    with generic plans (`GENERIC_PLANS`), and the function runs one
    self-contained statement.

    Without `waits` (SQLite only: the connections an event loop runs on, ADR
    0051), `run` also declines a write that would wait for another writer, of
    this process (`sqlite_writer`) or of another (its connections have no busy
    timeout), and their commits leave the write-ahead log's checkpoints to the
    store's other connections (`wal_autocheckpoint=0`).
    """

    def __init__(
        self, engine: Engine, size: int = 8, recycle: float = 1800.0, *, waits: bool = True
    ) -> None:
        self._engine = engine
        self._sqlite = is_sqlite(engine)
        self._waits = waits
        self._recycle = recycle
        self._idle: list[tuple[float, Any]] = []
        self._size = size
        self._in_use = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def run(self, write: bool, fn: Callable[[Any], T | None]) -> tuple[bool, T | None]:
        """`fn(cursor)` in its own transaction, committed unless it returns None or raises.

        Returns (False, None) without running it when every connection is in use
        (or, without `waits`, none is open: see `prime`).
        """
        with self._lock:
            if self._in_use >= self._size:
                return False, None
            self._in_use += 1
        try:
            taken = self._take(opening=self._waits)
            if taken is None:
                return False, None
            born, fairy = taken
            healthy = False
            try:
                dbapi = fairy.dbapi_connection
                cursor = dbapi.cursor()
                try:
                    if not self._sqlite:
                        done = fn(cursor)  # one statement, atomic by itself
                    else:
                        with sqlite_writer(self._engine, write, wait=self._waits) as turn:
                            if not turn or not self._begin(cursor, write):
                                healthy = True
                                return False, None  # another writer's turn: declined
                            try:
                                done = fn(cursor)
                                cursor.execute("ROLLBACK" if done is None else "COMMIT")
                            except BaseException:
                                dbapi.rollback()
                                raise
                finally:
                    cursor.close()
                healthy = True
                return True, done
            except ChatledgerError:
                healthy = True  # the operation's own refusal: the connection is fine
                raise
            finally:
                self._give(born, fairy, healthy)
        finally:
            with self._lock:
                self._in_use -= 1

    def _begin(self, cursor: Any, write: bool) -> bool:
        """SQLite's BEGIN; False when it found another process writing and must not wait."""
        try:
            cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except self._engine.dialect.loaded_dbapi.OperationalError as error:
            code = getattr(error, "sqlite_errorcode", None)  # extended: BUSY_RECOVERY...
            if self._waits or code is None or code & 0xFF != _SQLITE_BUSY:
                raise
            return False
        return True

    def close(self) -> None:
        """Close the idle connections; those in use close when they come back."""
        self._closed = True
        self._drop_idle()

    def _drop_idle(self) -> None:
        while True:
            try:
                _, idle = self._idle.pop()
            except IndexError:
                return
            _close(idle)

    def prime(self) -> None:
        """Open a connection for `run` unless a fresh one is idle, closing a stale one:
        without `waits`, `run` opens and closes none itself (opening may wait for the
        pool, and closing the last connection checkpoints the log), so a caller that
        must not wait has this done where it may."""
        taken = self._take(opening=True)
        if taken is not None:
            self._give(*taken, healthy=True)

    def _take(self, opening: bool) -> tuple[float, Any] | None:
        """An idle connection, else a new one; unless `opening`, None where one would
        be opened or closed."""
        if os.getpid() != self._pid:  # a forked child must not share its parent's
            self._idle, self._pid = [], os.getpid()
        while True:
            try:
                born, idle = self._idle.pop()
            except IndexError:
                break
            if time.monotonic() - born < self._recycle and (
                self._sqlite or not cut_off(idle.dbapi_connection)
            ):
                return born, idle
            if not opening:
                self._idle.append((born, idle))
                return None
            _close(idle)
        if not opening:
            return None
        fairy = self._connect()
        for _ in range(2):  # only for an engine of the caller's: ours checks on checkout
            if self._sqlite or not cut_off(fairy.dbapi_connection):
                break
            fairy.invalidate()
            fairy = self._connect()
        fairy.detach()
        if self._sqlite and not self._waits:
            try:
                for pragma in ("busy_timeout=0", "wal_autocheckpoint=0"):
                    fairy.dbapi_connection.execute(f"PRAGMA {pragma}")
            except BaseException:
                _close(fairy)
                raise
        if not self._sqlite:
            dialect = self._engine.dialect
            try:
                fairy.dbapi_connection.autocommit = True
                fairy.dbapi_connection.prepare_threshold = PREPARE_THRESHOLD
                fairy.dbapi_connection.execute(GENERIC_PLANS)
            except dialect.loaded_dbapi.Error as error:  # nothing of the caller's ran
                _close(fairy)
                raise opening_error(dialect, error) from error
            except BaseException:
                _close(fairy)
                raise
        return time.monotonic(), fairy

    def _connect(self) -> Any:
        """A connection from the engine's pool; the driver's error wrapped if none opens.

        Wrapped as SQLAlchemy wraps it on its own checkout, so that a connection
        that could not be opened is told apart from one that broke in use, whose
        errors `run` passes on unwrapped (see `store._sql.translate`).
        """
        dbapi_error: type[Exception] = self._engine.dialect.loaded_dbapi.Error
        try:
            return self._engine.raw_connection()
        except dbapi_error as error:
            raise opening_error(self._engine.dialect, error) from error

    def _give(self, born: float, fairy: Any, healthy: bool) -> None:
        if healthy and not self._closed:
            self._idle.append((born, fairy))
            if self._closed:  # closed meanwhile
                self._drop_idle()
            return
        dbapi = fairy.dbapi_connection
        lost = bool(getattr(dbapi, "closed", False) or getattr(dbapi, "broken", False))
        _close(fairy)
        if lost:
            self._drop_idle()


def opening_error(dialect: Dialect, error: Exception) -> sa_exc.StatementError:
    """A driver's `error` in opening or setting up a connection, wrapped as SQLAlchemy
    wraps it on its own checkout: told apart from an error on a connection in
    use, after which a write may have committed (`store._sql.translate`)."""
    dbapi_error: type[Exception] = dialect.loaded_dbapi.Error
    return sa_exc.DBAPIError.instance(None, None, error, dbapi_error, dialect=dialect)


def _close(fairy: Any) -> None:
    """Close a detached connection without the pool's reset (see `DriverConnections`)."""
    # Closing a connection has nothing to report: one the server already
    # closed may complain, which says nothing new, and a transaction still
    # open is rolled back by the server.
    with contextlib.suppress(Exception):
        fairy.dbapi_connection.close()


def _sqlite_now() -> str:
    return sqlite_time(sqlite_clock())


def _sqlite_now_plus(seconds: float) -> str:
    return sqlite_time(sqlite_clock() + timedelta(seconds=seconds))
