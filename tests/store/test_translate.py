"""Driver errors become chatledger's, told apart by the drivers' codes (store/_sql/translate.py).

Each condition is provoked on the real database, on both of the store's
paths where it applies: the driver connections (an `Op`'s plain-SQL form,
whose errors arrive unwrapped) and SQLAlchemy's pool (`Op.fn`, wrapped).
A broken connection is in tests/store/test_store_faults.py; tables that are
missing, through the public calls, in tests/store/test_schema.py.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store import (
    AsyncStore,
    InvalidInputError,
    Ledger,
    Message,
    SchemaError,
    StorageError,
    Store,
)
from chatledger.store._sql.ops import Op
from chatledger.store._sql.translate import unique_violation
from chatledger.store.ids import new_id
from chatledger.store.schema import branches, conversations
from tests.conftest import postgres_admin_url


def driver_op(sql: str, *params: Any) -> Op[int]:
    """An operation whose plain-SQL form runs `sql` on the driver's cursor (`%s` or `?`)."""

    def on(cursor: Any, marker: str) -> int:
        cursor.execute(sql.replace("%s", marker), params)
        return 1

    return Op(
        "running a driver statement",
        write=True,
        fn=lambda conn: pytest.fail("the plain-SQL form did not run"),
        postgres=lambda cursor: on(cursor, "%s"),
        sqlite=lambda cursor: on(cursor, "?"),
    )


def pool_op(sql: str, *params: Any) -> Op[int]:
    """An operation that runs `sql` through SQLAlchemy's pool (`%s` becomes a bound value)."""

    def run(conn: Connection) -> int:
        names = {f"p{i}": p for i, p in enumerate(params)}
        text = sql
        for name in names:
            text = text.replace("%s", f":{name}", 1)
        conn.execute(sa.text(text), names)
        return 1

    return Op("running a pooled statement", write=True, fn=run)


PATHS: dict[str, Callable[..., Op[int]]] = {"driver": driver_op, "pool": pool_op}


# The driver path (a fast path's connection) is one of the two under test, so
# the conftest store runs here with its fast paths on only.
pytestmark = pytest.mark.fast_paths_only


# --- tables missing: SchemaError ------------------------------------------------------


def test_missing_tables_are_a_schema_error_on_the_driver_path(empty_url: str) -> None:
    # `history` and `append_messages` run on the driver connections first.
    with Store.open(empty_url) as store:
        ledger = store.tenant("t")
        with pytest.raises(SchemaError, match="no chatledger tables"):
            ledger.history(new_id())
        with pytest.raises(SchemaError, match="no chatledger tables"):
            ledger.append_messages(new_id(), [Message(role="user", content="x")])


async def test_missing_tables_are_a_schema_error_on_the_async_face(empty_url: str) -> None:
    store = AsyncStore.open(empty_url)
    try:
        with pytest.raises(SchemaError, match="no chatledger tables"):
            await store.tenant("t").create_conversation()
    finally:
        await store.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_missing_column_is_a_storage_error_not_a_missing_schema(store: Store, path: str) -> None:
    with pytest.raises(StorageError, match="The database failed while") as caught:
        store.execute(PATHS[path]("SELECT no_such_column FROM chatledger_events"))
    assert not isinstance(caught.value, SchemaError)


# --- the database cannot be reached: StorageError -------------------------------------


def _unreachable() -> dict[str, str]:
    admin = sa.make_url(postgres_admin_url())
    return {
        "refused": admin.set(host="127.0.0.1", port=1).render_as_string(hide_password=False),
        "unknown host": admin.set(host="chatledger.invalid").render_as_string(hide_password=False),
        # The server answers "database ... does not exist", words that once
        # read as missing tables.
        "unknown database": admin.set(
            database=f"chatledger_{uuid.uuid4().hex[:12]}"
        ).render_as_string(hide_password=False),
    }


@pytest.mark.parametrize("where", ["refused", "unknown host", "unknown database"])
def test_a_database_that_cannot_be_reached_is_a_storage_error_saying_so(where: str) -> None:
    with Store.open(_unreachable()[where]) as store:
        ledger = store.tenant("t")
        # The driver connections' path, then the pool's.
        with pytest.raises(StorageError, match="Cannot reach the database"):
            ledger.append_messages(new_id(), [Message(role="user", content="x")])
        with pytest.raises(StorageError, match="Cannot reach the database"):
            ledger.create_conversation()


def test_a_sqlite_file_that_cannot_be_opened_is_a_storage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    with Store.open(url) as store, pytest.raises(StorageError, match="unable to open database"):
        store.tenant("t").create_conversation()


# --- a connection psycopg finds closed: StorageError ----------------------------------


def test_a_connection_psycopg_finds_closed_on_the_driver_path_broke(postgres_url: str) -> None:
    # psycopg's own error, with no SQLSTATE; the server ending a session
    # (57P01) is in tests/store/test_store_faults.py.
    def close_then_use(cursor: Any) -> int:
        cursor.connection.close()
        cursor.execute("SELECT 1")
        return 1

    op = Op(
        "using a closed connection",
        write=False,
        fn=lambda conn: 2,
        postgres=close_then_use,
    )
    with Store.open(postgres_url) as store:
        with pytest.raises(StorageError, match="The connection to the database broke while"):
            store.execute(op)
        assert store.execute(Op("reading", write=False, fn=lambda conn: 2)) == 2


# --- events are append-only: StorageError ---------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "statement", ["UPDATE chatledger_events SET payload = '{}'", "DELETE FROM chatledger_events"]
)
def test_changing_events_is_refused_as_append_only(
    store: Store, ledger: Ledger, path: str, statement: str
) -> None:
    conv = ledger.create_conversation()
    with pytest.raises(StorageError, match="chatledger's events are append-only"):
        store.execute(PATHS[path](statement))
    assert [e.kind for e in ledger.events(conversation_id=conv.id)] == ["conversation.created"]


# --- NUL in text: InvalidInputError (Postgres; SQLite stores NUL) ----------------------


@pytest.mark.parametrize("path", PATHS)
def test_text_with_a_nul_character_is_invalid_input_on_postgres(
    postgres_url: str, path: str
) -> None:
    refused = pytest.raises(InvalidInputError, match="contains a NUL character")
    with Store.open(postgres_url) as store, refused:
        store.execute(PATHS[path]("SELECT CAST(%s AS text)", "a\x00b"))


# --- SQLite's writer lock: StorageError -----------------------------------------------


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Store]:
    with Store.open(sqlite_url, busy_timeout=0.05) as store:
        yield store


def test_a_writer_kept_waiting_past_the_busy_timeout_gets_a_storage_error(
    sqlite_store: Store, sqlite_url: str
) -> None:
    ledger = sqlite_store.tenant("t")
    conv = ledger.create_conversation().id
    holder = sqlite3.connect(sa.make_url(sqlite_url).database or "", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        # The driver connections' path, then the pool's.
        with pytest.raises(StorageError, match="stayed locked by another writer"):
            ledger.append_messages(conv, [Message(role="user", content="x")])
        with pytest.raises(StorageError, match="stayed locked by another writer"):
            ledger.create_conversation()
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    ledger.append_messages(conv, [Message(role="user", content="after")])
    assert [m.content for m in ledger.history(conv)] == ["after"]


# --- unique keys: unique_violation ----------------------------------------------------


def _violation(store: Store, insert: Callable[[Connection], object]) -> sa.exc.IntegrityError:
    with pytest.raises(sa.exc.IntegrityError) as caught, store.engine.begin() as conn:
        insert(conn)
    return caught.value


def _row(conn: Connection, table: sa.Table, where: sa.ColumnElement[bool]) -> dict[str, Any]:
    return dict(conn.execute(sa.select(table).where(where)).mappings().one())


def test_unique_violation_names_a_primary_key(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()

    def insert_again(conn: Connection) -> None:
        conn.execute(
            conversations.insert(), _row(conn, conversations, conversations.c.id == conv.id)
        )

    error = _violation(store, insert_again)
    assert unique_violation(error, conversations, ["id"])
    assert not unique_violation(error, conversations, ["tenant"])
    assert not unique_violation(error, branches, ["id"])


def test_unique_violation_names_a_key_of_several_columns(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    run_id = new_id()

    def resume_twice(conn: Connection) -> None:
        root = _row(conn, branches, branches.c.conversation_id == conv.id)
        for _ in range(2):
            conn.execute(branches.insert(), {**root, "id": new_id(), "resumes_run_id": run_id})

    error = _violation(store, resume_twice)
    assert unique_violation(error, branches, ["conversation_id", "resumes_run_id"])
    assert not unique_violation(error, branches, ["conversation_id"])  # a part is not the key


def test_unique_violation_is_false_for_other_integrity_errors(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()

    def bad_reason(conn: Connection) -> None:
        root = _row(conn, branches, branches.c.conversation_id == conv.id)
        conn.execute(branches.insert(), {**root, "id": new_id(), "reason": "bogus"})

    error = _violation(store, bad_reason)
    assert not unique_violation(error, branches, ["id"])
    assert not unique_violation(error, branches, ["conversation_id", "resumes_run_id"])
