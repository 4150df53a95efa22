"""Driver errors become chatledger errors here, and only here.

Errors are told apart by the codes the drivers attach, not by their wording:
Postgres's SQLSTATE (psycopg raises one class per code, `psycopg.errors`) and
SQLite's extended result code (`sqlite3.Error.sqlite_errorcode`). Message
text is read only where the driver attaches no code; each such place says so.

Condition (error raised): Postgres; SQLite.

- tables missing (`SchemaError`): `UndefinedTable` 42P01; `SQLITE_ERROR`
  with "no such table".
- a connection broke in use (`StorageError`): 57P01, 57P02, 57P05, class 08,
  or psycopg's own `OperationalError` on an open connection; none on SQLite.
- the database is unreachable (`StorageError`): psycopg's own
  `OperationalError` while connecting; none on SQLite.
- events changed (`StorageError`, append-only): `RestrictViolation` 23001,
  which the triggers raise; `SQLITE_CONSTRAINT_TRIGGER`.
- NUL in text (`InvalidInputError`): psycopg's own `DataError` saying
  "NUL (0x00)"; none, SQLite stores NUL.
- the writer lock not granted in time (`StorageError`): none; `SQLITE_BUSY`
  and its extended codes.
- a unique key violated (`unique_violation`): `UniqueViolation` 23505 and the
  constraint's name; `SQLITE_CONSTRAINT_UNIQUE` or `_PRIMARYKEY` and the
  columns named in the message.

Anything else is a `StorageError` that quotes the driver.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from chatledger.store._errors import ChatledgerError, InvalidInputError, SchemaError, StorageError

__all__ = ["key_name", "translating", "unique_violation", "violated_key"]

# Postgres's SQLSTATEs read here (psycopg raises one class per code).
_UNIQUE_VIOLATION = "23505"
_RESTRICT_VIOLATION = "23001"  # what the append-only triggers raise
_UNDEFINED_TABLE = "42P01"
# A session the server ended: terminated or shut down (57P01, 57P02), or idle
# too long (57P05).
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P05"})
# The SQLSTATE class of connection exceptions (08000, 08003, 08006, ...).
_CONNECTION_EXCEPTION = "08"
# SQLite's primary result code is the low byte of the extended one.
_PRIMARY = 0xFF
_PARTITION_KEY = re.compile(r"(_p\d+)?(_\d+)?$")
# A Citus coordinator relays a worker's unique violation without the
# constraint's name field, but with the message that names it; from a
# data-modifying CTE's subplan, even as an internal error (XX000).
_NAMED_KEY = re.compile(r'^duplicate key value violates unique constraint "([^"]+)"')
_INTERNAL_ERROR = "XX000"
_SQLITE_UNIQUE = (sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)


def key_name(name: str | None) -> str | None:
    """The name of the table's key that `name`, a key Postgres reported, belongs to.

    On a hash-partitioned table (store/_sql/partitions.py) a violation names
    the partition's index, `<key>_p<i>`; on Citus, the shard's, `<key>_<shard id>`
    (store/_sql/citus.py).
    """
    if name is None:
        return None
    return _PARTITION_KEY.sub("", name)


def _violated(error: BaseException | None) -> str | None:
    """The key a Postgres unique violation names, by its field or its message; None
    for any other error."""
    state = _sqlstate(error)
    if state not in (_UNIQUE_VIOLATION, _INTERNAL_ERROR):
        return None
    diag: Any = getattr(error, "diag", None)
    found = _NAMED_KEY.search(diag.message_primary or "")
    if state == _INTERNAL_ERROR and found is None:
        return None
    name: str | None = diag.constraint_name or (None if found is None else found.group(1))
    return key_name(name) or ""


def violated_key(error: BaseException) -> str | None:
    """The table key a Postgres unique violation names (`key_name`), raised by a
    driver cursor; None for any other error."""
    return _violated(error)


def unique_violation(error: BaseException, table: sa.Table, columns: Sequence[str]) -> bool:
    """Whether `error` (SQLAlchemy's, or a driver's raised through a cursor) violates
    the unique key of `table` over `columns`.

    Postgres names the violated constraint; SQLite names its columns.
    """
    orig = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    name = _violated(orig)
    if name is not None:
        return any(
            getattr(constraint, "name", None) == name
            and [c.name for c in getattr(constraint, "columns", [])] == list(columns)
            for constraint in [*table.constraints, *table.indexes]
        )
    if _sqlite_code(orig) in _SQLITE_UNIQUE:
        # SQLite names the violated key only in the message's text:
        # "UNIQUE constraint failed: table.a, table.b".
        named = str(orig).partition("failed: ")[2]
        return named == ", ".join(f"{table.name}.{c}" for c in columns)
    return False


class translating:
    """Translate driver errors raised while doing `action` (a gerund phrase), in a
    `with` block. A class, not a generator: it wraps every operation."""

    __slots__ = ("action",)

    def __init__(self, action: str) -> None:
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> Literal[False]:
        if not isinstance(error, Exception) or isinstance(error, ChatledgerError):
            return False
        if isinstance(error, sa_exc.DBAPIError | sqlite3.Error) or _psycopg_error(error):
            # The fast paths use the driver's cursor directly, so its own errors
            # arrive here unwrapped; both kinds are read the same way.
            orig = error.orig if isinstance(error, sa_exc.DBAPIError) else error
            raise _translated(self.action, error, orig) from error
        return False


def _translated(action: str, error: Exception, orig: BaseException | None) -> ChatledgerError:
    """The chatledger error for the driver's `error` (with `orig`, the driver's own)."""
    sqlite_code = _sqlite_code(orig)
    if _sqlstate(orig) == _UNDEFINED_TABLE or _no_such_table(orig, sqlite_code):
        return SchemaError(
            f"The database has no chatledger tables (while {action}). Run "
            f"`store.migrate()` or `chatledger migrate` once to create them."
        )
    if _connection_lost(error, orig):
        return StorageError(
            f"The connection to the database broke while {action}: {_sentences(orig)} It was "
            f"closed, and the next operation opens a new one. A write may have "
            f"committed just before the break: read it back before repeating it "
            f"(an append with an idempotency key can simply be repeated)."
        )
    if _client_side(orig, "OperationalError"):
        # Not a connection that broke (above): so opening one failed. libpq
        # reports a refused, unreachable or rejected connection (a wrong
        # password or database name included) without a SQLSTATE.
        return StorageError(
            f"Cannot reach the database (while {action}): {_sentences(orig)} Check that the "
            f"server is running and that the URL, user and password are right."
        )
    if _sqlstate(orig) == _RESTRICT_VIOLATION or (sqlite_code == sqlite3.SQLITE_CONSTRAINT_TRIGGER):
        # What the append-only triggers raise (migrations/versions/0001_event_log.py);
        # no other trigger or RESTRICT key of chatledger's raises these.
        return StorageError(
            f"The database refused {action}: chatledger's events are append-only, "
            f"and rows are never updated or deleted."
        )
    if _client_side(orig, "DataError") and "NUL (0x00)" in str(orig):
        # psycopg refuses a string with NUL before sending it, with a DataError
        # that has no SQLSTATE, like its other client-side refusals (a date
        # out of range, ...): only the text tells this one apart.
        return InvalidInputError(
            f"The database refused {action} because a value contains a NUL "
            f"character. Remove NUL characters from tenant names and keys."
        )
    if sqlite_code is not None and sqlite_code & _PRIMARY == sqlite3.SQLITE_BUSY:
        return StorageError(
            f"The database stayed locked by another writer for longer than the busy "
            f"timeout while {action}. Retry, or raise the busy timeout of Store.open()."
        )
    return StorageError(
        f"The database failed while {action}: {_sentences(orig)} Nothing was written by "
        f"this operation; check the database and retry."
    )


def _sentences(orig: BaseException | None) -> str:
    """The driver's message as sentences: each of its lines ends with a full stop unless
    it ends with other punctuation (libpq's "Connection refused" / "Is the server
    running...?" come on two lines, the second already punctuated)."""
    lines = [" ".join(line.split()) for line in str(orig).splitlines()]
    return " ".join(line if line[-1] in ".?!" else f"{line}." for line in lines if line)


def _sqlite_code(orig: BaseException | None) -> int | None:
    """SQLite's extended result code of `orig`, or None for any other error.

    sqlite3's own refusals (a closed connection, a bad parameter) have none.
    """
    code = getattr(orig, "sqlite_errorcode", None) if isinstance(orig, sqlite3.Error) else None
    return code if isinstance(code, int) else None


def _no_such_table(orig: BaseException | None, sqlite_code: int | None) -> bool:
    # SQLite reports a missing table with its generic SQLITE_ERROR (as it does
    # a syntax error or a missing column), so only the text names the case.
    return sqlite_code == sqlite3.SQLITE_ERROR and str(orig).startswith("no such table")


def _psycopg_error(orig: BaseException | None, kind: str = "Error") -> bool:
    """Whether `orig` is an instance of psycopg's class `kind` (`Error`,
    `OperationalError`, ...). psycopg is imported only by a process that uses
    Postgres, and only there can it have raised anything: a process on SQLite
    does not load it for this."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(orig, getattr(psycopg, kind))


def _sqlstate(orig: BaseException | None) -> str | None:
    """Postgres's SQLSTATE of `orig` (None: not the server's error, or not Postgres's)."""
    return getattr(orig, "sqlstate", None) if _psycopg_error(orig) else None


def _client_side(orig: BaseException | None, kind: str) -> bool:
    """Whether `orig` is psycopg's `kind`, raised by psycopg or libpq itself, not by
    the server.

    Errors from the server carry a SQLSTATE; the client's own do not.
    """
    return _psycopg_error(orig, kind) and _sqlstate(orig) is None


def _connection_lost(error: Exception, orig: BaseException | None) -> bool:
    """Whether an open connection broke (not: a new one could not be opened)."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True  # SQLAlchemy asked the dialect
    sqlstate = _sqlstate(orig) or ""
    if sqlstate in _SESSION_ENDED or sqlstate.startswith(_CONNECTION_EXCEPTION):
        return True
    # An error that arrives unwrapped came from the cursor of a connection in
    # use (opening one is wrapped, see `DriverConnections`), so a client-side
    # OperationalError there means psycopg found that connection gone.
    return not isinstance(error, sa_exc.DBAPIError) and _client_side(orig, "OperationalError")
