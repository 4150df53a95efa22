"""What differs between SQLite and Postgres: setup, clocks and locking.

Logic never branches on the dialect outside this module.

SQLite: write transactions begin with `BEGIN IMMEDIATE`, because a deferred
transaction that reads and then upgrades to a write fails at once with
SQLITE_BUSY, ignoring `busy_timeout`. To issue our own BEGIN, the driver's
implicit transaction handling is switched off (`isolation_level = None`) and
SQLAlchemy's "begin" event emits BEGIN itself: `BEGIN IMMEDIATE` on
connections marked for writing, a plain (deferred) `BEGIN` for reads.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

__all__ = [
    "DEFAULT_URL",
    "Durability",
    "create_engine",
    "db_now",
    "db_now_plus",
    "for_update",
    "install_sqlite_hooks",
    "is_sqlite",
    "normalize_url",
]

DEFAULT_URL = "sqlite:///chatledger.db"
WRITE = "chatledger_write"
Durability = Literal["full", "normal"]


def normalize_url(url: str | None) -> str:
    """The SQLAlchemy URL to use: the argument, `CHATLEDGER_DATABASE_URL`, or the default."""
    url = url or os.environ.get("CHATLEDGER_DATABASE_URL") or DEFAULT_URL
    if url.startswith(("postgresql://", "postgres://")):
        # psycopg 3 is the Postgres driver chatledger ships with.
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_sqlite(bind: Engine | Connection) -> bool:
    """Whether `bind` talks to SQLite."""
    return bind.dialect.name == "sqlite"


def create_engine(
    url: str | None = None, *, durability: Durability = "full", busy_timeout: float = 30.0
) -> Engine:
    """An engine for `url` with chatledger's connection settings."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": busy_timeout})
        install_sqlite_hooks(engine, durability=durability, busy_timeout=busy_timeout)
        return engine
    # No pre-ping: it would cost a round trip on every operation. A connection
    # the server dropped fails its operation once (a StorageError, nothing
    # written) and is replaced; pool_recycle retires connections before
    # typical idle timeouts close them.
    return sa.create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800)


def install_sqlite_hooks(
    engine: Engine, *, durability: Durability = "full", busy_timeout: float = 30.0
) -> None:
    """Pragmas and BEGIN handling on every connection of a SQLite `engine`."""
    synchronous = "FULL" if durability == "full" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
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
        if conn.get_execution_options().get(WRITE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def db_now(bind: Engine | Connection) -> ColumnElement[Any]:
    """The database's clock (never a worker's): what leases and timestamps use."""
    if is_sqlite(bind):
        # Microsecond-form text, so that timestamps compare as strings and parse back.
        return sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now")
    return sa.func.clock_timestamp()


def db_now_plus(bind: Engine | Connection, seconds: float) -> ColumnElement[Any]:
    """The database's clock plus `seconds`."""
    if is_sqlite(bind):
        return sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now", f"{float(seconds):+f} seconds")
    return sa.func.clock_timestamp() + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))


def for_update(bind: Connection, stmt: sa.Select[Any]) -> sa.Select[Any]:
    """Lock the selected rows on Postgres; SQLite's writer lock already serializes."""
    return stmt if is_sqlite(bind) else stmt.with_for_update()
