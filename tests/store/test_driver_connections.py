"""The store's own driver connections, which run the plain-SQL operations.

How the whole store behaves when Postgres ends its connections is in
tests/store/test_store_faults.py.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from chatledger.store import EncryptionError
from chatledger.store._db.engines import (
    _WRITERS,
    DriverConnections,
    create_engine,
    cut_off,
    normalize_url,
)
from tests.conftest import _libpq, postgres_admin_url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    created = create_engine(database_url)
    yield created
    created.dispose()


def test_driver_connections_are_reused_and_closed_by_close(engine: Engine) -> None:
    connections = DriverConnections(engine)
    seen: list[Any] = []

    def remember(cursor: Any) -> int:
        seen.append(cursor.connection)
        cursor.execute("SELECT 1")
        return int(cursor.fetchone()[0])

    assert connections.run(False, remember) == (True, 1)
    assert connections.run(True, remember) == (True, 1)
    assert seen[0] is seen[1]  # one connection, taken and given back
    connections.close()
    with pytest.raises(Exception, match=r"(?i)closed"):
        seen[0].cursor().execute("SELECT 1")


def test_postgres_driver_connections_take_generic_plans_and_the_pool_does_not(
    postgres_url: str,
) -> None:
    # docs/adr/0030-generic-plans-on-the-store-connections.md
    engine = create_engine(postgres_url)
    connections = DriverConnections(engine)

    def mode(cursor: Any) -> str:
        cursor.execute("SHOW plan_cache_mode")
        return str(cursor.fetchone()[0])

    try:
        assert connections.run(False, mode) == (True, "force_generic_plan")
        with engine.connect() as conn:  # the engine's own connections keep the default
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one() == "auto"
    finally:
        connections.close()
        engine.dispose()


def test_when_every_driver_connection_is_busy_run_declines(engine: Engine) -> None:
    # The store then takes the pool's path, where the pool's limits apply.
    connections = DriverConnections(engine, size=1)
    inner: list[tuple[bool, int | None]] = []

    def nested(cursor: Any) -> int:
        inner.append(connections.run(False, lambda c: 2))
        return 1

    assert connections.run(False, nested) == (True, 1)
    assert inner == [(False, None)]
    assert connections.run(False, lambda c: 3) == (True, 3)  # the slot came back
    connections.close()


def test_a_connection_that_saw_an_error_is_not_reused(engine: Engine) -> None:
    connections = DriverConnections(engine)
    seen: list[Any] = []

    def fail(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT no_such_column FROM chatledger_conversations")

    with pytest.raises(Exception, match="no_such_column"):
        connections.run(True, fail)
    with pytest.raises(Exception, match="no_such_column"):
        connections.run(True, fail)
    assert seen[0] is not seen[1]
    connections.close()


def end_session(url: str, pid: int) -> None:
    """End the Postgres session `pid` and wait until it is gone."""
    with psycopg.connect(_libpq(url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])


def test_cut_off_sees_a_session_the_server_ended(postgres_url: str) -> None:
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        conn.execute("SELECT 1")
        assert not cut_off(conn)
        end_session(postgres_url, conn.info.backend_pid)
        assert cut_off(conn)
        conn.close()
        assert cut_off(conn)


def test_an_idle_connection_the_server_closed_is_not_handed_out(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    connections = DriverConnections(engine)
    pids: list[int] = []

    def remember(cursor: Any) -> int:
        pids.append(cursor.connection.info.backend_pid)
        cursor.execute("SELECT 1")
        return int(cursor.fetchone()[0])

    assert connections.run(False, remember) == (True, 1)
    end_session(postgres_url, pids[0])
    assert connections.run(True, remember) == (True, 1)
    assert pids[0] != pids[1]
    connections.close()
    engine.dispose()


def test_a_closed_connection_from_the_pool_of_a_callers_engine_is_replaced(
    postgres_url: str,
) -> None:
    engine = sa.create_engine(normalize_url(postgres_url))  # without chatledger's checkout check
    with engine.connect() as conn:
        pooled = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    end_session(postgres_url, pooled)
    connections = DriverConnections(engine)
    ok, pid = connections.run(False, lambda cursor: cursor.connection.info.backend_pid)
    assert ok and pid != pooled
    connections.close()
    engine.dispose()


def test_a_connection_that_breaks_in_use_is_closed_quietly(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Not through the pool's reset, whose rollback would fail and log a traceback.
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.pool")
    engine = create_engine(postgres_url)
    connections = DriverConnections(engine)
    seen: list[Any] = []

    def end_itself(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    with pytest.raises(psycopg.OperationalError, match="terminating connection"):
        connections.run(True, end_itself)
    assert seen[0].closed
    assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
    assert connections.run(False, lambda c: 1) == (True, 1)
    connections.close()
    engine.dispose()


def test_a_connection_that_cannot_be_opened_fails_wrapped_as_the_pool_reports_it() -> None:
    # Errors of a connection in use come unwrapped; one that never opened is
    # wrapped, so store/_sql/translate.py tells "cannot reach" from "broke".
    refused = sa.make_url(postgres_admin_url()).set(host="127.0.0.1", port=1)
    engine = create_engine(refused)
    connections = DriverConnections(engine, size=1)
    for _ in range(2):  # the second try shows the slot came back
        with pytest.raises(sa.exc.OperationalError) as caught:
            connections.run(False, lambda cursor: 1)
        assert isinstance(caught.value.orig, psycopg.OperationalError)
        assert not caught.value.connection_invalidated
    connections.close()
    engine.dispose()


def test_the_operations_own_refusal_keeps_its_connection(engine: Engine) -> None:
    # A chatledger error (a refusal the fast path decided, say a sealed history on a
    # store without a key) says nothing against the connection: it is reused.
    connections = DriverConnections(engine)
    seen: list[Any] = []

    def refuse(cursor: Any) -> None:
        seen.append(cursor.connection)
        cursor.execute("SELECT 1")
        raise EncryptionError("refused")

    for _ in range(2):
        with pytest.raises(EncryptionError):
            connections.run(False, refuse)
    assert seen[0] is seen[1]
    connections.close()


def test_a_child_forked_while_a_sqlite_writer_has_its_turn_can_write(sqlite_url: str) -> None:
    # The writer's thread does not exist in the child: its turn, copied held, would
    # make every write of the child wait out the busy timeout.
    engine = create_engine(sqlite_url)
    connections = DriverConnections(engine)
    turn, done = threading.Event(), threading.Event()

    def writer(cursor: Any) -> int:
        turn.set()
        done.wait(30)
        cursor.execute("SELECT 1")
        return 1

    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(connections.run, True, writer)
        assert turn.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: free to write at once, or exit 1
            lock, _ = _WRITERS[engine]
            os._exit(0 if lock.acquire(blocking=False) else 1)
        done.set()
        assert writing.result(timeout=30) == (True, 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    engine.dispose()
