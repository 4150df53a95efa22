"""What differs between SQLite and Postgres, as far as writing SQL goes.

This module holds the SQL fragments that are spelled differently per
dialect: clocks, row locks, JSON fields, time values and commit order; code
elsewhere calls these rather than spelling them itself. The database URL,
the engine and its connection settings, and the store's own driver
connections are resources, not SQL: they are `store/_db/engines.py`'s.

Logic does branch on the dialect outside this module, wherever a dialect
has SQL of its own: the one-statement fast paths of the append and of the
history read (`store/_sql/append.py`, `store/_sql/projector.py`), verify's
in-SQL recompute (`store/_sql/verify.py`), the claim of stale runs (`SKIP
LOCKED` on Postgres, `store/_sql/runs.py`), and the faces and
`store/_db/run.py`, which pick the fast path that fits the database.

SQLite: write transactions begin with `BEGIN IMMEDIATE`, because a deferred
transaction that reads and then upgrades to a write fails at once with
SQLITE_BUSY, ignoring `busy_timeout`. A connection marked for writing
carries the execution option `WRITE`; the engine's "begin" hook
(`store/_db/engines.py`) reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

T = TypeVar("T")

__all__ = [
    "InsertingTransaction",
    "commit_order",
    "db_now",
    "db_now_plus",
    "for_update",
    "hold_name",
    "is_sqlite",
    "json_text",
    "json_true",
    "on_cursor",
    "past_cursor",
    "settled_position",
    "snapshot_horizon",
    "sqlite_clock",
    "sqlite_time",
    "time_value",
]

WRITE = "chatledger_write"
"""The execution option that marks a connection for writing: its transactions begin
with `BEGIN IMMEDIATE` on SQLite (`store._db.engines.install_sqlite_hooks`)."""


def is_sqlite(bind: Engine | Connection) -> bool:
    """Whether `bind` talks to SQLite."""
    return bind.dialect.name == "sqlite"


def on_cursor(conn: Connection, fn: Callable[[Any], T], /) -> T:
    """`fn` on a DB-API cursor of `conn`'s driver connection."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        return fn(cursor)
    finally:
        cursor.close()


def sqlite_clock() -> datetime:
    """The embedded database's clock: this host's, in UTC."""
    return datetime.now(UTC)


def sqlite_time(moment: datetime) -> str:
    """`moment` (aware) as SQLite columns hold it: 'YYYY-MM-DD HH:MM:SS.ffffff' in
    UTC, which orders as time does."""
    # isoformat is several times faster than strftime, and writes the same.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def db_now(bind: Engine | Connection) -> ColumnElement[Any]:
    """The database's clock (never a worker's): what leases and timestamps use.

    On SQLite, timestamps are microsecond text ('YYYY-MM-DD HH:MM:SS.ffffff'),
    so they compare as strings and parse back. On Postgres, the time the
    statement began (`statement_timestamp()`): one reading for every row and
    condition of a statement, and a stable function, which a Citus
    coordinator evaluates itself for a statement on one shard.
    """
    if is_sqlite(bind):
        return sa.func.chatledger_now()
    return sa.func.statement_timestamp()


def db_now_plus(bind: Engine | Connection, seconds: float) -> ColumnElement[Any]:
    """The database's clock plus `seconds`."""
    if is_sqlite(bind):
        return sa.func.chatledger_now_plus(float(seconds))
    return sa.func.statement_timestamp() + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))


def for_update(bind: Connection, stmt: sa.Select[Any]) -> sa.Select[Any]:
    """Lock the selected rows on Postgres; SQLite's writer lock already serializes."""
    return stmt if is_sqlite(bind) else stmt.with_for_update()


def hold_name(bind: Connection, name: str) -> None:
    """Serialize the transactions that use `name` until this one ends.

    For a uniqueness the keys cannot enforce (a run id across conversations:
    its key is `(conversation_id, id)` on Postgres, docs/adr/0022). Postgres
    takes a transaction-scoped advisory lock on the name's hash (a collision
    only serializes two unrelated writers); SQLite's writer lock already
    serializes.
    """
    if not is_sqlite(bind):
        bind.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(name, 0))))


# -- JSON text and time values (audit queries) ------------------------------------------

_NUL_ESCAPE = "\\u0000"
_REPLACEMENT_ESCAPE = "\\ufffd"


def json_text(bind: Connection, column: ColumnElement[Any], key: str) -> ColumnElement[Any]:
    """A top-level field of a JSON text column, as SQL text (NULL when absent).

    Postgres cannot extract any field from JSON text that holds the escape
    `\\u0000` (see docs/tables.md, "JSON columns"), so the escape is read as
    U+FFFD; the stored payload is never changed.
    """
    if is_sqlite(bind):
        return sa.func.json_extract(column, f"$.{key}", type_=sa.Text)
    from sqlalchemy.dialects.postgresql import JSON  # only a Postgres process loads it

    parsed = sa.cast(sa.func.replace(column, _NUL_ESCAPE, _REPLACEMENT_ESCAPE), JSON)
    return parsed.op("->>", return_type=sa.Text)(sa.literal(key, sa.Text))


def json_true(bind: Connection, column: ColumnElement[Any], key: str) -> ColumnElement[bool]:
    """Whether a top-level field of a JSON text column is `true` (false when absent, not NULL)."""
    if is_sqlite(bind):
        flag = sa.func.json_extract(column, f"$.{key}") == 1
    else:
        flag = json_text(bind, column, key) == "true"
    return sa.func.coalesce(flag, sa.false(), type_=sa.Boolean)


def time_value(bind: Connection, when: datetime) -> ColumnElement[Any]:
    """`when` (naive means UTC) as a value that compares with a timestamp column."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    if is_sqlite(bind):
        # The stored text form (see db_now), which orders as time does.
        return sa.literal(sqlite_time(when), sa.Text)
    return sa.literal(when, sa.DateTime(timezone=True))


# -- commit order (audit pagination; docs/adr/0005-audit-pagination.md) -----------------


class InsertingTransaction(ColumnElement[int]):
    """A column default: the id of the transaction inserting the row.

    Postgres: its 64-bit transaction id, which never wraps around. SQLite: 0,
    since one writer at a time makes rowid order commit order.
    """

    inherit_cache = True
    type = sa.BigInteger()


@compiles(InsertingTransaction)
def _no_transaction_id(_element: InsertingTransaction, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "0"


@compiles(InsertingTransaction, "postgresql")
def _transaction_id(_element: InsertingTransaction, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "(pg_current_xact_id()::text::bigint)"


def commit_order(
    bind: Connection, txid: ColumnElement[int], seq: ColumnElement[int]
) -> list[ColumnElement[int]]:
    """The columns that order events as they committed (see `snapshot_horizon`)."""
    return [seq] if is_sqlite(bind) else [txid, seq]


def past_cursor(
    bind: Connection, txid: ColumnElement[int], seq: ColumnElement[int], cursor: tuple[int, int]
) -> ColumnElement[bool]:
    """Rows after `cursor`, a (txid, seq) pair, in `commit_order`."""
    if is_sqlite(bind):
        return seq > cursor[1]
    after = sa.tuple_(sa.literal(cursor[0], sa.BigInteger), sa.literal(cursor[1], sa.BigInteger))
    return sa.tuple_(txid, seq) > after


# The largest `seq` a cursor can name: (txid, MAX_SEQ) is after every event of `txid`.
MAX_SEQ = 2**63 - 1


def settled_position(conn: Connection) -> tuple[int, int] | None:
    """The last (txid, seq) cursor position in commit order that nothing can
    commit behind any more, as of the transaction's snapshot; None for an
    empty log (SQLite).

    Postgres: every transaction below the snapshot's xmin has ended, and
    every later one sorts at or after it, so `(xmin - 1, MAX_SEQ)`. Read it
    in the snapshot of the page it extends (REPEATABLE READ). SQLite: the
    last `seq` (one writer: every row is settled).
    """
    if is_sqlite(conn):
        last = conn.exec_driver_sql("SELECT max(seq) FROM chatledger_events").scalar_one()
        return None if last is None else (0, int(last))
    horizon = conn.exec_driver_sql(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    ).scalar_one()
    return (int(horizon) - 1, MAX_SEQ)


def snapshot_horizon(bind: Connection) -> int | None:
    """The txid below which every transaction has ended, or None when all have (SQLite).

    Postgres: the xmin of a snapshot taken now, in a statement of its own, before
    the query it guards: every row with a txid below it committed before that
    query's snapshot, so the query sees them all. A statement without tables
    runs on a Citus coordinator, whose transaction ids are the ones the rows
    carry (the coordinator evaluates the `txid` default), and a transaction on
    one shard commits on its worker before it ends on the coordinator
    (docs/adr/0054-citus-distributed-by-tenant.md).
    """
    if is_sqlite(bind):
        return None
    found = bind.exec_driver_sql("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
    return int(found.scalar_one())
