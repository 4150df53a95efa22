"""The schema: append-only enforcement, migrations up and down, no drift."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from chatledger.store import Ledger, Message, SchemaError, StorageError, Store
from chatledger.store._sql import migrate as _migrate
from chatledger.store.schema import metadata

# A hash partition of a table (store/_sql/partitions.py), as migrations/env.py skips it.
PARTITION = re.compile(r"chatledger_\w+_p\d+")


def chatledger_tables(engine: sa.Engine) -> set[str]:
    return {t for t in sa.inspect(engine).get_table_names() if t.startswith("chatledger_")}


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE chatledger_events SET payload = '{}'",
        "DELETE FROM chatledger_events",
    ],
)
def test_database_refuses_changes_to_events(store: Store, ledger: Ledger, statement: str) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [Message(role="user", content="keep me")])
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
        conn.exec_driver_sql(statement)
    assert ledger.history(conv.id)[0].content == "keep me"


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    with Store.open(empty_url) as store:
        store.migrate()
        assert len(chatledger_tables(store.engine)) == len(metadata.tables) + 1
        with store.engine.begin() as conn:
            _migrate.downgrade(conn, "base")
        assert chatledger_tables(store.engine) == {"chatledger_alembic_version"}
        store.migrate()
        ledger = store.tenant("t")
        conv = ledger.create_conversation()
        ledger.append_messages(conv.id, [Message(role="user", content="after")])
        assert ledger.history(conv.id)[0].content == "after"
        store.check_schema()


def test_tables_and_migrations_do_not_drift(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, type_, _p: (
                        type_ != "table"
                        or bool(
                            name
                            and name.startswith("chatledger_")
                            and not PARTITION.fullmatch(name)
                        )
                    ),
                    "version_table": _migrate.VERSION_TABLE,
                },
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_migrate_runs_inside_the_callers_transaction(empty_url: str) -> None:
    engine = sa.create_engine(empty_url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("CREATE TABLE app_users (id INTEGER PRIMARY KEY)")
            Store.open(engine=engine).migrate(connection=conn)
        assert "chatledger_events" in chatledger_tables(engine)
        assert "app_users" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_unmigrated_database_gives_a_schema_error(empty_url: str) -> None:
    with Store.open(empty_url) as store:
        with pytest.raises(SchemaError, match="migrate"):
            store.tenant("t").create_conversation()
        with pytest.raises(SchemaError, match="migrate"):
            store.check_schema()


def test_storage_error_is_a_chatledger_error() -> None:
    from chatledger.store import ChatledgerError

    assert issubclass(StorageError, ChatledgerError)


def test_the_head_a_store_checks_against_is_the_newest_script(empty_url: str) -> None:
    """`check_schema` compares with `migrate.HEAD`, not Alembic's reading of the
    scripts (which costs every command the import of Alembic): the two agree, and
    the version table read without Alembic says what Alembic says."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_migrate.alembic_config())
    assert script.get_current_head() == _migrate.HEAD
    engine = sa.create_engine(empty_url)
    try:
        with engine.begin() as conn:
            assert _migrate.current_revision(conn) is None
            _migrate.upgrade(conn)
            context = MigrationContext.configure(
                conn, opts={"version_table": _migrate.VERSION_TABLE}
            )
            assert (
                _migrate.current_revision(conn) == context.get_current_revision() == _migrate.HEAD
            )
    finally:
        engine.dispose()
