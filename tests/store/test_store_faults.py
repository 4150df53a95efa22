"""Faults: Postgres ends a connection under the store (docs/adr/0012-connection-faults.md).

A connection the server closed while it sat idle is replaced before any
statement is sent on it, so the call that takes it succeeds. A connection
that breaks during a call fails that call alone, with a `StorageError` and
nothing written; the next call works. Neither logs a traceback.

Each operation is tried on both of the store's paths: the driver connections
of its own (`append_messages`, `history`) and SQLAlchemy's pool
(`conversation`, `create_conversation`). The tests run on a database of their
own, since they end every other session on it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from chatledger.store import Ledger, Message, StorageError, Store
from tests.conftest import _libpq, create_postgres_database, drop_postgres_database

Operation = Callable[[Ledger, str], Any]

OPERATIONS: dict[str, Operation] = {
    "append_messages": lambda ledger, conv: ledger.append_messages(
        conv, [Message(role="user", content="during")]
    ),
    "history": lambda ledger, conv: ledger.history(conv),
    "conversation": lambda ledger, conv: ledger.conversation(conv),
    "create_conversation": lambda ledger, _: ledger.create_conversation(),
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    created = create_postgres_database("chatledger_faults")
    with Store.open(created) as store:
        store.migrate()
    yield created
    drop_postgres_database(created)


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    with Store.open(url) as store:
        yield store.tenant(f"faults-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def admin(url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        yield conn


@pytest.fixture
def conversation(ledger: Ledger) -> str:
    """A conversation with one message, read on both paths, so each holds a connection."""
    conv = ledger.create_conversation().id
    ledger.append_messages(conv, [Message(role="user", content="before")])
    ledger.history(conv)
    ledger.conversation(conv)
    return conv


def end_sessions(admin: psycopg.Connection[Any], *pids: int) -> int:
    """End the given sessions, or every other client session on the database, and
    wait until they are gone; return how many there were."""
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND backend_type = 'client backend' "
        "AND pid <> pg_backend_pid() AND (cardinality(%s::int[]) = 0 OR pid = ANY(%s::int[]))",
        [list(pids), list(pids)],
    ).fetchone()
    assert row is not None
    return int(row[0])


def waiting_for_lock(admin: psycopg.Connection[Any]) -> int:
    """The pid of the session that waits for the lock `admin` holds, once one does."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # pg_locks is live, even inside a transaction
        row = admin.execute(
            "SELECT pid FROM pg_locks WHERE NOT granted "
            "AND relation = 'chatledger_conversations'::regclass"
        ).fetchone()
        if row is not None:
            return int(row[0])
    raise AssertionError("no session waited for the lock")


def assert_quiet(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """Nothing logged above INFO, no traceback at any level, nothing on stderr."""
    loud = [r.getMessage() for r in caplog.records if r.levelno > logging.INFO]
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]
    assert (loud, tracebacks) == ([], [])
    assert capfd.readouterr().err == ""


def texts(ledger: Ledger, conv: str) -> list[str]:
    return [str(m.content) for m in ledger.history(conv)]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_connection_closed_while_idle_is_replaced_before_the_call_uses_it(
    ledger: Ledger,
    conversation: str,
    admin: psycopg.Connection[Any],
    operation: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    assert end_sessions(admin) >= 2  # the driver connection and the pooled one
    OPERATIONS[operation](ledger, conversation)
    expected = ["before", "during"] if operation == "append_messages" else ["before"]
    assert texts(ledger, conversation) == expected  # written once, if it writes
    assert_quiet(caplog, capfd)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_connection_that_breaks_during_a_call_fails_that_call_alone(
    ledger: Ledger,
    conversation: str,
    admin: psycopg.Connection[Any],
    operation: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    call = OPERATIONS[operation]
    conversations = len(ledger.conversations())
    with ThreadPoolExecutor(1) as executor:
        with admin.transaction():
            # The call waits for this lock, so its session can be ended mid-statement.
            admin.execute("LOCK TABLE chatledger_conversations IN ACCESS EXCLUSIVE MODE")
            pending = executor.submit(call, ledger, conversation)
            assert end_sessions(admin, waiting_for_lock(admin)) == 1
        with pytest.raises(StorageError, match="The connection to the database broke while"):
            pending.result(timeout=30)
    assert len(ledger.conversations()) == conversations
    assert texts(ledger, conversation) == ["before"]  # nothing written
    call(ledger, conversation)  # the next call works
    assert_quiet(caplog, capfd)
