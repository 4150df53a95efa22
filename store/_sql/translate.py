"""Driver errors become chatledger errors here, and only here."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from store._errors import ChatledgerError, InvalidInputError, SchemaError, StorageError

__all__ = ["translating", "unique_violation"]

_MISSING_TABLE = ("no such table", "does not exist", "undefinedtable")
# SQLSTATEs of a session the server ended: terminated or shut down (57P01,
# 57P02), idle too long (57P05), and the connection exceptions (class 08).
_SESSION_ENDED = ("57P01", "57P02", "57P05", "08")
# What psycopg says when it finds the connection gone itself.
_CONNECTION_GONE = ("connection is closed", "connection is lost", "server closed the connection")


def unique_violation(error: BaseException, table: sa.Table, columns: Sequence[str]) -> bool:
    """Whether `error` violates the unique key of `table` over `columns`.

    Postgres names the violated constraint; SQLite names its columns.
    """
    if not isinstance(error, sa_exc.IntegrityError):
        return False
    diag = getattr(error.orig, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name:
        for constraint in [*table.constraints, *table.indexes]:
            cols = [c.name for c in getattr(constraint, "columns", [])]
            if getattr(constraint, "name", None) == name and cols == list(columns):
                return True
        return False
    return f"failed: {', '.join(f'{table.name}.{c}' for c in columns)}" in str(error.orig)


@contextmanager
def translating(action: str) -> Iterator[None]:
    """Translate driver errors raised while doing `action` (a gerund phrase)."""
    try:
        yield
    except ChatledgerError:
        raise
    except (sa_exc.DBAPIError, sqlite3.Error, psycopg.Error) as error:
        # The fast paths use the driver's cursor directly, so its own errors
        # arrive here unwrapped; both kinds are read the same way.
        orig = error.orig if isinstance(error, sa_exc.DBAPIError) else error
        text = str(orig).lower()
        if any(m in text for m in _MISSING_TABLE) and "chatledger_" in text:
            raise SchemaError(
                f"The database has no chatledger tables (while {action}). Run "
                f"`store.migrate()` or `chatledger migrate` once to create them."
            ) from error
        if _connection_lost(error, orig, text):
            raise StorageError(
                f"The connection to the database broke while {action}: {orig}. It was "
                f"closed, and the next operation opens a new one. A write may have "
                f"committed just before the break: read it back before repeating it "
                f"(an append with an idempotency key can simply be repeated)."
            ) from error
        if isinstance(error, sa_exc.OperationalError | psycopg.OperationalError) and (
            "connect" in text or "connection" in text
        ):
            raise StorageError(
                f"Cannot reach the database (while {action}): {orig}. Check that the "
                f"server is running and that the URL, user and password are right."
            ) from error
        if "append-only" in text:
            raise StorageError(
                f"The database refused {action}: chatledger's events are append-only, "
                f"and rows are never updated or deleted."
            ) from error
        if "nul" in text and ("0x00" in text or "character" in text):
            raise InvalidInputError(
                f"The database refused {action} because a value contains a NUL "
                f"character. Remove NUL characters from tenant names and keys."
            ) from error
        if "database is locked" in text or "busy" in text:
            raise StorageError(
                f"The database stayed locked by another writer for longer than the busy "
                f"timeout while {action}. Retry, or raise the busy timeout of Store.open()."
            ) from error
        raise StorageError(
            f"The database failed while {action}: {orig}. Nothing was written by "
            f"this operation; check the database and retry."
        ) from error


def _connection_lost(error: BaseException, orig: BaseException | None, text: str) -> bool:
    """Whether an open connection broke (not: a new one could not be opened)."""
    if isinstance(error, sa_exc.DBAPIError):
        return error.connection_invalidated  # SQLAlchemy asked the dialect
    state = getattr(orig, "sqlstate", None) or ""
    return state.startswith(_SESSION_ENDED) or (
        isinstance(orig, psycopg.OperationalError) and any(m in text for m in _CONNECTION_GONE)
    )
