"""Read replicas: where a read that tolerates staleness runs, and what happens when it cannot.

A store opened with `replicas=[...]` (Postgres only) keeps one engine per
replica here. An `Op` marked `replica` (its own property, set where the
operation is built: the audit queries, reads at an explicit position or
time, verify) runs on a replica; every other operation runs on the primary
and never comes here. docs/adr/0023-read-replicas.md records the choice.

Which replica: the replicas take turns (round-robin), skipping one that
failed within the last `RETRY_AFTER` seconds.

When a replica does not answer, the primary does, and its answer (or error)
is the call's: a read that tolerates a stale answer tolerates a fresh one.
That covers a replica that cannot be reached or broke mid-read, a query the
standby cancelled for a conflict with recovery (`StorageError`: the replica
is then skipped for `RETRY_AFTER` seconds, and the first such failure is
logged), and an answer of "no such thing" (`NotFoundError`, a position out
of range, a table not there yet): the replica may simply not have replayed
it yet, so a caller who reads at a position it just wrote gets it from the
primary. No `ChatledgerError` of a replica reaches the caller.

Replicas must be physical streaming standbys of the primary (`pg_basebackup`,
streaming replication): audit pages order events by the id of the
transaction that wrote them and compare it with the reading snapshot's
xmin (`store._sql.pages`), which only a physical copy shares with the
primary. A standby's snapshot keeps every transaction that is still open on
the primary below the horizon (it records each transaction id it sees in
the WAL, and every lower one, as running until their end is replayed), so
a page cursor is valid on the primary and every replica alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from chatledger.store._db.engines import create_engine, database_url, sync_driver_url
from chatledger.store._db.run import general
from chatledger.store._errors import ChatledgerError, InvalidInputError, StorageError
from chatledger.store._sql.ops import Op
from chatledger.store._sql.translate import translating

__all__ = ["CONNECT_TIMEOUT", "RETRY_AFTER", "Replicas", "check_replicas"]

T = TypeVar("T")

RETRY_AFTER = 30.0
"""Seconds a replica that failed is skipped before it is tried again."""
CONNECT_TIMEOUT = 5
"""Seconds to wait for a replica's connection, unless its URL says
(`?connect_timeout=`): a replica that does not answer costs the read that
tries it at most this long before the primary answers."""

_log = logging.getLogger("chatledger.store")


def check_replicas(replicas: Sequence[str], primary_backend: str) -> list[URL]:
    """The replica URLs, checked: a list of Postgres URLs, for a Postgres primary."""
    if isinstance(replicas, str | bytes | URL) or not isinstance(replicas, Sequence):
        raise InvalidInputError(
            f"replicas takes a list of Postgres URLs, not {type(replicas).__name__}: "
            f"write replicas=[url] for one replica."
        )
    if not replicas:
        return []
    if primary_backend != "postgresql":
        raise InvalidInputError(
            f"Read replicas are for a store on Postgres, and this one is on "
            f"{'SQLite' if primary_backend == 'sqlite' else primary_backend}, a database in "
            f"one file that every reader opens itself. Open it without `replicas`."
        )
    return [_replica_url(url, n, len(replicas)) for n, url in enumerate(replicas, 1)]


def _replica_url(url: object, n: int, count: int) -> URL:
    which = f"Read replica {n} of {count}"
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError(
            f"{which} is {url!r}, but a replica is a URL: "
            f"`postgresql://user:password@host:port/database`."
        )
    try:
        backend = sa.make_url(url).get_backend_name()
    except (sa_exc.ArgumentError, ValueError):
        backend = "postgresql"  # not a URL at all: `database_url` says what is wrong
    if backend not in ("postgresql", "postgres"):
        raise InvalidInputError(
            f"{which} is a '{backend}' URL, but a replica of a Postgres store is a Postgres "
            f"standby of it: write it as `postgresql://user:password@host:port/database`."
        )
    try:
        parsed = database_url(url)
    except InvalidInputError as error:
        raise InvalidInputError(f"{which}: {error}") from error
    # Read with psycopg 3 in its sync mode, whatever driver the URL names: the
    # async face, too, reads a replica in a worker thread.
    sync = sync_driver_url(parsed)
    assert sync is not None  # a Postgres URL always has one
    if "connect_timeout" not in sync.query:
        sync = sync.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT)})
    return sync


class Replicas:
    """A store's read replicas: an engine each, taking turns, skipped for a while after failing.

    Thread-safe: the async face calls `read` from worker threads.
    """

    def __init__(self, urls: Sequence[URL]) -> None:
        self._urls = list(urls)
        self._engines: list[Engine] = [create_engine(url) for url in self._urls]
        self._skip_until = [0.0] * len(self._engines)
        self._turn = 0
        self._lock = threading.Lock()

    def read(self, op: Op[T]) -> T | None:
        """`op` on the next replica that is up, by its general path in its own transaction.

        None when no replica is up or the one asked failed: the primary then
        answers (see the module docstring). A `replica` operation returns a
        value, never None, so None can mean only that.
        """
        assert op.replica and not op.write
        index = self._next()
        if index is None:
            return None
        try:
            with translating(op.action):
                done = general(self._engines[index], op, fast=False, tried=True)
        except StorageError as error:
            self._failed(index, error)
            return None
        except ChatledgerError:
            return None  # perhaps not replayed there yet: the primary's answer stands
        if self._skip_until[index]:
            with self._lock:
                self._skip_until[index] = 0.0  # up again: a new failure is logged again
        return done

    def close(self) -> None:
        """Release the replicas' connection pools."""
        for engine in self._engines:
            engine.dispose()

    def _next(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            count = len(self._engines)
            for step in range(count):
                index = (self._turn + step) % count
                if self._skip_until[index] <= now:
                    self._turn = index + 1
                    return index
        return None

    def _failed(self, index: int, error: StorageError) -> None:
        with self._lock:
            was_up = self._skip_until[index] == 0.0
            self._skip_until[index] = time.monotonic() + RETRY_AFTER
        if was_up:  # logged once, not on every read while it stays down
            shown = self._urls[index].render_as_string(hide_password=True)
            _log.warning(
                "Read replica %s failed, so the primary answered: %s It is tried again "
                "in %.0f seconds; until then its reads go to the other replicas or the primary.",
                shown,
                error,
                RETRY_AFTER,
            )
