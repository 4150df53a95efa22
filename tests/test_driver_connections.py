"""The store's own driver connections, which run the plain-SQL operations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import Engine

from store import Message, StorageError, Store
from store._dialect import DriverConnections, create_engine
from tests.conftest import _libpq


def test_a_connection_the_server_dropped_fails_one_append_and_writes_nothing(
    postgres_url: str,
) -> None:
    with Store.open(postgres_url) as store:
        ledger = store.tenant("dropped")
        conv = ledger.create_conversation()
        ledger.append_messages(conv.id, [Message(role="user", content="before")])
        with psycopg.connect(_libpq(postgres_url), autocommit=True) as admin:
            killed = admin.execute(
                # CASE, not AND: SQL does not promise to test the pid first.
                "SELECT count(*) FILTER (WHERE CASE WHEN pid <> pg_backend_pid() "
                "THEN pg_terminate_backend(pid) ELSE false END) "
                "FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        with pytest.raises(StorageError):
            ledger.append_messages(conv.id, [Message(role="user", content="lost")])
        # The broken connection was thrown away: the next append gets a new one.
        ledger.append_messages(conv.id, [Message(role="user", content="after")])
        assert [m.content for m in ledger.history(conv.id)] == ["before", "after"]


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
