"""The append's Postgres forms as a transaction of plain statements, for Citus.

On one Postgres server an append, a creation and a creating append are each
one statement of data-modifying CTEs (store/_sql/append.py). A Citus
coordinator runs such a statement as a chain of subplans whose intermediate
results it sends to every worker, and commits it on all of them by two-phase
commit: correct, but it measured 8 to 9 ms an append on a three-node cluster
on one machine. Each statement here names one tenant's rows, so Citus routes
it to the one shard that holds them, and the transaction commits on that one
worker (docs/adr/0054-citus-distributed-by-tenant.md).

Each function writes what its one-statement twin writes, and returns what it
returns: None having written nothing when the head moved, the id was taken,
or (on an autocommit connection) a concurrent append took a key. On an
autocommit connection the statements run in a transaction of their own; in
the caller's transaction (the general path), in that one.

`is_citus` tells, once per driver connection, whether its database has the
citus extension.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["autocommit", "in_transaction", "is_citus"]

_CITUS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _driver(cursor: Any) -> Any:
    """The driver connection of a cursor: psycopg's, or the one under SQLAlchemy's
    adapter of an async connection (whose cursor does not name it)."""
    found = getattr(cursor, "connection", None)
    return cursor._connection if found is None else found


def autocommit(cursor: Any) -> bool:
    """Whether the cursor's connection is in autocommit mode (each statement its own
    transaction)."""
    return bool(_driver(cursor).autocommit)


def is_citus(cursor: Any) -> bool:
    """Whether the cursor's connection is to a Citus database (asked once per connection)."""
    connection = _driver(cursor)
    found = _CITUS.get(connection)
    if found is None:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
        found = bool(cursor.fetchone()[0])
        _CITUS[connection] = found
    return found


@contextmanager
def in_transaction(cursor: Any) -> Iterator[Callable[[], None]]:
    """A transaction for the statements run in the block, when the connection is in
    autocommit mode (else the caller's). Yields `abandon`: roll back now, having
    written nothing; leaving the block otherwise commits, and an error rolls back."""
    own = autocommit(cursor)
    done = False

    def abandon() -> None:
        nonlocal done
        if own and not done:
            cursor.execute("ROLLBACK")
            done = True

    if own:
        cursor.execute("BEGIN")
    try:
        yield abandon
    except BaseException:
        if own and not done:
            done = True
            cursor.execute("ROLLBACK")
        raise
    if own and not done:
        cursor.execute("COMMIT")
