"""Running an `Op` on an engine: a pooled connection of its own, and its transaction.

The tiers over one connection (`run_fast`, `in_transaction`) are
`store._sql.ops`'s; this takes the connection from the engine's pool.
"""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.engine import Engine

from chatledger.store._db.engines import sqlite_writer
from chatledger.store._sql.dialect import WRITE, is_sqlite
from chatledger.store._sql.ops import Op, in_transaction, run_fast

__all__ = ["general"]

T = TypeVar("T")


def general(engine: Engine, op: Op[T], /, *, fast: bool, tried: bool) -> T:
    """`op` on a pooled connection of `engine`: its Postgres form in autocommit unless
    its plain-SQL form was `tried` already, then its own transaction (`BEGIN
    IMMEDIATE` for a write on SQLite) with the SQLite form first unless tried."""
    with engine.connect() as conn:
        if fast and op.postgres is not None and not tried and not is_sqlite(conn):
            done = run_fast(conn, op.postgres)
            if done is not None:
                return done
        if op.write:
            conn.execution_options(**{WRITE: True})
        with sqlite_writer(engine, op.write), conn.begin():  # a turn among writers, on SQLite
            return in_transaction(conn, op, fast=fast and not tried)
