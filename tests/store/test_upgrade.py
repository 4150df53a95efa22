"""A database written before a migration upgrades in place and reads back byte for byte.

`tests/fixtures/revision_0002.db` (SQLite) and `revision_0002.sql` (Postgres,
`pg_dump --inserts`) were written by chatledger at schema revision 0002 with
`tests/fixtures/write_revision_0002.py`: two tenants, appends with and without
idempotency keys, tool calls, completed and failed runs, head moves, an edit
branch, a fork, and payloads with NUL, U+2028 and astral characters.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import ConflictError, Message, NotFoundError, Store, new_id
from chatledger.store._sql import migrate as _migrate
from chatledger.store.messages import dump_message
from tests.conftest import _libpq, create_postgres_database, drop_postgres_database

FIXTURES = Path(__file__).parents[1] / "fixtures"
TABLES = [
    "chatledger_conversations",
    "chatledger_branches",
    "chatledger_events",
    "chatledger_runs",
    "chatledger_view_entries",
]


@pytest.fixture
def written_at_0002(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database as chatledger wrote it at revision 0002."""
    if backend == "sqlite":
        path = tmp_path / "revision_0002.db"
        shutil.copy(FIXTURES / "revision_0002.db", path)
        yield f"sqlite:///{path}"
        return
    url = create_postgres_database("chatledger_upgrade")
    load_postgres_fixture(url)
    yield url
    drop_postgres_database(url)


def load_postgres_fixture(url: str) -> None:
    """Restore `revision_0002.sql` into the empty database at `url`."""
    # psql's meta-commands (`\restrict`) are not SQL; the rest runs as one script.
    # (Split on newlines only: `splitlines` would also split the U+2028 in a payload.)
    script = "\n".join(
        line
        for line in (FIXTURES / "revision_0002.sql").read_text(encoding="utf-8").split("\n")
        if not line.startswith("\\")
    )
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(script.encode())


def rows(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        found = conn.execute(sa.text(f"SELECT * FROM {table}")).mappings().all()
    return in_order(
        table,
        [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in r.items()} for r in found],
    )


def in_order(table: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if table == "chatledger_events":
        return sorted(found, key=lambda r: int(r["seq"]))
    return sorted(found, key=lambda r: tuple(str(r[c]) for c in sorted(r.keys())))


def test_a_database_written_at_revision_0002_upgrades_in_place(written_at_0002: str) -> None:
    engine = sa.create_engine(written_at_0002)
    try:
        with engine.connect() as conn:
            assert _migrate.current_revision(conn) == "0002"
        before = {table: rows(engine, table) for table in TABLES}
    finally:
        engine.dispose()
    assert len(before["chatledger_events"]) == 40

    with Store.open(written_at_0002) as store:
        store.migrate()
        store.check_schema()
        after = {table: rows(store.engine, table) for table in TABLES}
        # Every row and every column it had is as it was, byte for byte;
        # the new columns hold their defaults.
        for table in TABLES:
            old = in_order(table, [{k: r[k] for k in before[table][0]} for r in after[table]])
            assert old == before[table], table
        assert {(r["key"], r["state"]) for r in after["chatledger_conversations"]} == {(None, "{}")}

        payloads = {str(r["id"]): r["payload"] for r in before["chatledger_events"]}
        tenants = {r["tenant"] for r in before["chatledger_conversations"]}
        assert len(tenants) == 2
        for tenant in tenants:
            ledger = store.tenant(tenant)
            for conv in ledger.conversations():
                assert ledger.verify(conv.id).ok
                # What the API reads is what the log held: the payload text
                # of every event, and every message serialized as it was stored.
                for event in ledger.events(conversation_id=conv.id):
                    assert event.payload_json == payloads[str(event.id)]
                for entry in ledger.entries(conv.id):
                    assert dump_message(entry.message) == payloads[entry.event_id]
        # And the upgraded log takes the new kinds of writes.
        ledger = store.tenant(sorted(tenants)[0])
        conv = ledger.conversations()[-1]
        minted = new_id()
        ledger.append_messages(
            conv.id, [Message(role="user", content="after")], ids=[minted], state={"r": 1}
        )
        assert ledger.entry(minted).message.content == "after"
        assert ledger.conversation(conv.id).state == {"r": 1}
        assert ledger.create_conversation(key=f"k-{uuid.uuid4().hex}").key is not None
        assert ledger.verify(conv.id).ok


def test_conversation_keys_move_to_their_lookup_table_and_back(written_at_0002: str) -> None:
    """Migration 0005: the keys of a database at 0004 move to `chatledger_conversation_keys`."""
    engine = sa.create_engine(written_at_0002)
    try:
        with engine.begin() as conn:
            _migrate.upgrade(conn, "0004")
            ids = conn.execute(
                sa.text("SELECT id, tenant FROM chatledger_conversations ORDER BY id")
            ).all()
            # Keys as chatledger wrote them at 0004: on the conversation row.
            keyed = {
                str(cid): (tenant, f"session {i} \u2028 ünïcode")
                for i, (cid, tenant) in enumerate(ids[:3])
            }
            for cid, (_, key) in keyed.items():
                conn.execute(
                    sa.text("UPDATE chatledger_conversations SET key = :key WHERE id = :id"),
                    {"key": key, "id": cid},
                )
        before = {table: rows(engine, table) for table in TABLES}
    finally:
        engine.dispose()

    with Store.open(written_at_0002) as store:
        store.migrate()
        store.check_schema()
        after = {table: rows(store.engine, table) for table in TABLES}
        # Every column the rows had is as it was (later revisions add columns).
        assert {
            table: in_order(table, [{k: r[k] for k in before[table][0]} for r in after[table]])
            for table in TABLES
        } == before
        with store.engine.connect() as conn:
            moved = conn.execute(
                sa.text("SELECT tenant, key, conversation_id FROM chatledger_conversation_keys")
            ).all()
        assert {str(cid): (tenant, key) for tenant, key, cid in moved} == keyed
        for cid, (tenant, key) in keyed.items():
            ledger = store.tenant(tenant)
            assert ledger.conversation_by_key(key).id == cid
            with pytest.raises(ConflictError, match="is taken"):
                ledger.create_conversation(key=key)
            other = "globex" if tenant == "acme" else "acme"
            with pytest.raises(NotFoundError):
                store.tenant(other).conversation_by_key(key)
        # A key made after the upgrade goes through the table too, and back.
        tenant = next(iter(keyed.values()))[0]
        made = store.tenant(tenant).create_conversation(key="made at 0005")
        assert store.tenant(tenant).conversation_by_key("made at 0005").id == made.id

        with store.engine.begin() as conn:
            _migrate.downgrade(conn, "0004")
        assert "chatledger_conversation_keys" not in sa.inspect(store.engine).get_table_names()
        with store.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
            # The unique index is back on the conversation rows.
            conn.execute(
                sa.text("UPDATE chatledger_conversations SET key = 'made at 0005' WHERE id = :id"),
                {"id": next(iter(keyed))},
            )
        with store.engine.begin() as conn:
            _migrate.upgrade(conn)
        store.check_schema()
        assert store.tenant(tenant).conversation_by_key("made at 0005").id == made.id
