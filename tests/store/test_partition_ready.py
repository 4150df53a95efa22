"""The Postgres schema can be partitioned or distributed by conversation.

A table partitioned (or, with Citus, distributed) by `conversation_id` can
enforce only the unique keys that include `conversation_id`, and can join
its rows cheaply only on keys that include it. These tests read the catalog
of a database made by the migrations (docs/adr/0022-partition-ready-schema.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import InvalidInputError, Message, NewEvent, SchemaError, Store, new_id
from chatledger.store._sql import migrate as _migrate
from chatledger.store._sql import projector
from chatledger.store.messages import dump_message
from chatledger.store.schema import events
from tests.conftest import create_postgres_database, drop_postgres_database
from tests.store.test_upgrade import load_postgres_fixture

# Each per-conversation table and its distribution column.
PER_CONVERSATION = {
    "chatledger_conversations": "id",
    "chatledger_branches": "conversation_id",
    "chatledger_events": "conversation_id",
    "chatledger_runs": "conversation_id",
    "chatledger_view_entries": "conversation_id",
}
# Global by design, each with its reason in docs/adr/0022-partition-ready-schema.md:
# each is keyed by what a caller looks up before it knows the conversation.
LOOKUP_TABLES = {
    "chatledger_event_ids",
    "chatledger_conversation_keys",
    # Keyed by what a caller names across conversations: a tenant's erasure
    # subject (one data key for all its conversations), a tenant's policy.
    "chatledger_subject_keys",
    "chatledger_retention_policies",
}

_UNIQUE_KEYS = """
SELECT t.relname, i.relname, array_agg(a.attname::text ORDER BY a.attname)
FROM pg_index x
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(x.indkey)
WHERE x.indisunique AND n.nspname = current_schema() AND t.relname LIKE 'chatledger\\_%%'
  AND NOT x.indrelid IN (SELECT inhrelid FROM pg_inherits)
GROUP BY t.relname, i.relname
"""

_FOREIGN_KEYS = """
SELECT t.relname, c.conname, array_agg(a.attname::text)
FROM pg_constraint c
JOIN pg_class t ON t.oid = c.conrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(c.conkey)
WHERE c.contype = 'f' AND n.nspname = current_schema() AND t.relname LIKE 'chatledger\\_%%'
GROUP BY t.relname, c.conname
"""


def _keys(url: str, sql: str) -> list[tuple[str, str, list[str]]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [(t, k, list(cols)) for t, k, cols in conn.exec_driver_sql(sql)]
    finally:
        engine.dispose()


_TABLES = """
SELECT relname, '', ARRAY[]::text[] FROM pg_class
WHERE relkind IN ('r', 'p') AND NOT relispartition
  AND relnamespace = current_schema()::regnamespace AND relname LIKE 'chatledger\\_%%'
"""


def _tables(url: str) -> set[str]:
    """The tables, a partitioned one once (not its partitions), without Alembic's."""
    return {t for t, _, _ in _keys(url, _TABLES)} - {_migrate.VERSION_TABLE}


def test_every_table_is_per_conversation_or_a_named_lookup_table(postgres_url: str) -> None:
    assert _tables(postgres_url) == set(PER_CONVERSATION) | LOOKUP_TABLES


def _unique_keys_without_the_conversation(url: str) -> list[tuple[str, str, list[str]]]:
    keys = _keys(url, _UNIQUE_KEYS)
    assert {t for t, _, _ in keys} >= set(PER_CONVERSATION)
    return [
        (table, key, columns)
        for table, key, columns in keys
        if table in PER_CONVERSATION and PER_CONVERSATION[table] not in columns
    ]


def test_every_unique_key_includes_the_conversation_id(postgres_url: str) -> None:
    assert _unique_keys_without_the_conversation(postgres_url) == []


def test_every_foreign_key_includes_the_conversation_id(postgres_url: str) -> None:
    breaking = [
        (table, key, columns)
        for table, key, columns in _keys(postgres_url, _FOREIGN_KEYS)
        if table not in LOOKUP_TABLES and PER_CONVERSATION.get(table) not in columns
    ]
    assert breaking == []


def test_primary_keys_lead_with_the_conversation_id(postgres_url: str) -> None:
    keys = {t: sorted(cols) for t, k, cols in _keys(postgres_url, _UNIQUE_KEYS) if k == f"pk_{t}"}
    assert keys["chatledger_events"] == ["conversation_id", "seq"]
    assert keys["chatledger_branches"] == ["conversation_id", "id"]
    assert keys["chatledger_runs"] == ["conversation_id", "id"]
    assert keys["chatledger_view_entries"] == ["conversation_id", "position"]


@pytest.fixture
def at_0003() -> Iterator[str]:
    """The fixture log of tests/store/test_upgrade.py, upgraded to revision 0003."""
    url = create_postgres_database("chatledger_at_0003")
    load_postgres_fixture(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            _migrate.upgrade(conn, "0003")
    finally:
        engine.dispose()
    yield url
    drop_postgres_database(url)


def _read_back(engine: sa.Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every event, view entry, branch and run: columns as of 0003, as text or bytes."""
    queries = {
        "events": "SELECT seq, id::text, conversation_id::text, branch_id::text, position, "
        "run_id::text, kind, origin, head, recorded_at, idempotency_key, payload, hash, txid "
        "FROM chatledger_events ORDER BY seq",
        "views": "SELECT conversation_id::text, position, event_seq "
        "FROM chatledger_view_entries ORDER BY 1, 2",
        "branches": "SELECT id, conversation_id, parent_branch_id, parent_position, reason, "
        "run_id, resumes_run_id, created_at FROM chatledger_branches ORDER BY id",
        "runs": "SELECT * FROM chatledger_runs ORDER BY id",
        "conversations": "SELECT id, tenant, head_branch_id, head_position, head_open, "
        "head_hash, created_at, metadata, forked_from_conversation_id, forked_from_branch_id, "
        "forked_from_position, key, state FROM chatledger_conversations ORDER BY id",
    }
    with engine.connect() as conn:
        return {
            name: [
                tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in conn.exec_driver_sql(sql)
            ]
            for name, sql in queries.items()
        }


def test_a_database_at_revision_0003_upgrades_in_place_and_back(at_0003: str) -> None:
    with Store.open(at_0003) as store:
        before = _read_back(store.engine)
        assert len(before["events"]) == 40
        with store.engine.begin() as conn:
            _migrate.upgrade(conn, "0004")
            assert _migrate.current_revision(conn) == "0004"
        assert _read_back(store.engine) == before
        with store.engine.connect() as conn:
            # A fork's inherited entries name the conversation holding their events.
            inherited = conn.exec_driver_sql(
                "SELECT count(*) FROM chatledger_view_entries v JOIN chatledger_events e "
                "ON e.seq = v.event_seq WHERE e.conversation_id <> v.conversation_id "
                "AND v.event_conversation_id IS DISTINCT FROM e.conversation_id"
            ).scalar_one()
            named = conn.exec_driver_sql(
                "SELECT count(*) FROM chatledger_view_entries WHERE event_conversation_id IS NOT NULL"
            ).scalar_one()
        assert (inherited, named > 0) == (0, True)
        with store.engine.begin() as conn:
            _migrate.downgrade(conn, "0003")
        assert _read_back(store.engine) == before
        # The old keys are back, and the catalog check names them.
        assert {k for _, k, _ in _unique_keys_without_the_conversation(at_0003)} == {
            "pk_chatledger_events",
            "pk_chatledger_branches",
            "pk_chatledger_runs",
            "uq_chatledger_conversations_tenant_key",  # until 0005
        }
        with store.engine.begin() as conn:
            _migrate.upgrade(conn)
        store.check_schema()
        assert _read_back(store.engine) == before
        assert _unique_keys_without_the_conversation(at_0003) == []
        # The head read (through the view, forks' inherited messages included)
        # gives each message as the log holds it (read at the head revision:
        # the store reads the columns of every migration).
        payloads = {row[0]: row[11] for row in before["events"]}
        for tenant in ("acme", "globex"):
            ledger = store.tenant(tenant)
            for conv in ledger.conversations():
                assert ledger.verify(conv.id).ok
                view = [payloads[seq] for cid, _, seq in before["views"] if cid == conv.id]
                assert [dump_message(e.message) for e in ledger.entries(conv.id)] == view

        # And the upgraded log takes new writes: appends, a run with a caller's id, a fork.
        ledger = store.tenant("acme")
        conv = ledger.conversations()[0]
        ledger.append_messages(conv.id, [Message(role="user", content="after")], ids=[new_id()])
        run = ledger.runs.start(
            conv.id,
            owner="w",
            run_id=new_id(),
            events=[NewEvent.of_message(Message(role="user", content="run"))],
        )
        ledger.runs.complete(run)
        fork = ledger.fork(conv.id, at=2)
        ledger.append_messages(fork.id, [Message(role="user", content="in the fork")])
        assert [m.content for m in ledger.history(fork.id)][-1] == "in the fork"
        assert ledger.verify(conv.id).ok and ledger.verify(fork.id).ok


# -- Store.migrate(partitions=N) ------------------------------------------------------

PARTITIONED = ("chatledger_events", "chatledger_view_entries")


@pytest.fixture
def written() -> Iterator[str]:
    """A database with the fixture log of tests/store/test_upgrade.py, at the head revision."""
    url = create_postgres_database("chatledger_partitioned")
    load_postgres_fixture(url)
    with Store.open(url) as store:
        store.migrate()
    yield url
    drop_postgres_database(url)


def _partitions(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.exec_driver_sql(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%(t)s)", {"t": t}
            ).scalar_one()
            for t in PARTITIONED
        }


def test_migrate_partitions_converts_the_log_in_place(written: str) -> None:
    with Store.open(written) as store:
        before = _read_back(store.engine)
        store.migrate(partitions=4)
        assert _partitions(store.engine) == {t: 4 for t in PARTITIONED}
        assert _read_back(store.engine) == before
        assert _unique_keys_without_the_conversation(written) == []
        store.migrate(partitions=4)  # already so: nothing to do
        store.migrate()
        with pytest.raises(InvalidInputError, match="already hash-partitioned into 4"):
            store.migrate(partitions=8)
        ledger = store.tenant("acme")
        for conv in ledger.conversations():
            assert ledger.verify(conv.id).ok
        conv = ledger.conversations()[0]
        ledger.append_messages(conv.id, [Message(role="user", content="after")])
        assert ledger.history(conv.id)[-1].content == "after"
        assert ledger.verify(conv.id).ok
        with store.engine.connect() as conn:
            # A partition's indexes are named after their parent's, so that a
            # unique violation is read as the table's own (translate.key_name).
            names = conn.exec_driver_sql(
                "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
                "WHERE x.indrelid = 'chatledger_events_p1'::regclass"
            ).scalars()
            parents = {i.name for i in events.indexes} | {
                c.name for c in events.constraints if c.name
            }
            assert {n.removesuffix("_p1") for n in names} <= parents | {"pk_chatledger_events"}
            # The sequence carries on past the copied rows, still owned by `seq`.
            assert (
                conn.exec_driver_sql("SELECT max(seq) FROM chatledger_events").scalar_one()
                == max(r[0] for r in before["events"]) + 1
            )
            assert conn.exec_driver_sql(
                "SELECT pg_get_serial_sequence('chatledger_events', 'seq')"
            ).scalar_one()


@pytest.mark.parametrize("table", ["chatledger_events", "chatledger_events_p0"])
@pytest.mark.parametrize(
    "statement", ["UPDATE {} SET payload = '{{}}'", "DELETE FROM {}", "TRUNCATE {}"]
)
def test_a_partitioned_log_stays_append_only(written: str, table: str, statement: str) -> None:
    with Store.open(written) as store:
        store.migrate(partitions=2)
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
            conn.exec_driver_sql(statement.format(table))


def test_sqlite_refuses_partitions(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'one.db'}") as store:
        with pytest.raises(InvalidInputError, match="one file"):
            store.migrate(partitions=4)
        with pytest.raises(SchemaError):
            store.check_schema()  # refused before anything was migrated


# -- the hot queries touch one partition ------------------------------------------------


def _touched(plan: dict[str, Any]) -> set[str]:
    """The partitions an `EXPLAIN (ANALYZE, FORMAT JSON)` plan actually read."""
    found = set()
    if plan.get("Actual Loops", 1) > 0 and re.fullmatch(
        r"chatledger_\w+_p\d+", plan.get("Relation Name", "")
    ):
        found.add(plan["Relation Name"])
    for child in plan.get("Plans", []):
        found |= _touched(child)
    return found


def test_hot_queries_touch_one_partition(partitioned: str) -> None:
    """Every statement of an append, a head read, a history and a run timeline.

    With the fast paths off, every statement goes through SQLAlchemy, where
    it is caught; each read is then run again under EXPLAIN ANALYZE, and each
    write is explained (Postgres routes an inserted row to its one partition).
    """
    statements: list[tuple[str, Any]] = []
    with Store.open(partitioned, fast_paths=False) as store:
        ledger = store.tenant("t")
        others = [ledger.create_conversation() for _ in range(8)]
        for other in others:
            ledger.append_messages(other.id, [Message(role="user", content="elsewhere")])
        conv = ledger.create_conversation()

        def catch(_conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
            if "chatledger_events" in sql or "chatledger_view_entries" in sql:
                statements.append((sql, params))

        sa.event.listen(store.engine, "before_cursor_execute", catch)
        ledger.append_messages(conv.id, [Message(role="user", content="hi")], idempotency_key="k")
        ledger.history(conv.id)
        ledger.entries(conv.id)
        run = ledger.runs.start(conv.id, owner="w")
        _, run = ledger.runs.record(
            run, [NewEvent.of_message(Message(role="assistant", content="o"))]
        )
        ledger.runs.complete(run)
        ledger.audit.run_timeline(run.run_id)
        ledger.events(conversation_id=conv.id)
        sa.event.remove(store.engine, "before_cursor_execute", catch)
        assert len(statements) > 10
        # The head reads of the fast paths, which run on the driver's own cursor.
        for head in (projector._PG_OWN_HEAD, projector._PG_HEAD_PAYLOADS):
            statements.append((head, {"id": conv.id, "tenant": "t"}))

        wide = []
        with store.engine.connect() as conn:
            for sql, params in statements:
                reads = sql.lstrip().upper().startswith(("SELECT", "WITH"))
                explain = "EXPLAIN (ANALYZE, FORMAT JSON) " if reads else "EXPLAIN (FORMAT JSON) "
                with conn.begin():
                    (plan,) = conn.exec_driver_sql(explain + sql, params).scalar_one()
                    conn.rollback()
                touched = _touched(plan["Plan"])
                if len({p.rsplit("_p", 1)[0] for p in touched}) < len(touched):
                    wide.append((sql, sorted(touched)))
        assert wide == []


def test_the_store_plans_its_head_read_once_and_it_reads_one_partition(partitioned: str) -> None:
    """On a partitioned log Postgres would plan the head read afresh on every call
    (its generic plan's estimate counts every partition); the store's own
    connections take the generic plan, which prunes when the executor starts.

    psycopg prepares a statement on its sixth run (its default threshold, which
    the store keeps); every run since is counted in `pg_prepared_statements`.
    """
    with Store.open(partitioned) as store:
        ledger = store.tenant("t")
        convs = [ledger.create_conversation().id for _ in range(8)]
        for conv in convs:
            ledger.append_messages(conv, [Message(role="user", content=conv)])
        for _ in range(3):
            for conv in convs:
                assert ledger.history(conv) == [Message(role="user", content=conv)]

        def head_plan(cursor: Any) -> tuple[int, int, dict[str, Any]]:
            # The head read as the store's connection prepared it; none of its runs re-planned.
            cursor.execute(
                "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'SELECT e.seq, e.payload FROM %'"
            )
            ((name, generic, custom),) = cursor.fetchall()
            # That plan, run for one conversation (a UUID of the store's: safe as a literal).
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}('{convs[0]}', 't')")
            ((plan,),) = cursor.fetchone()
            return generic, custom, plan

        ran, found = store._driver.run(False, head_plan)
        assert ran and found is not None
        generic, custom, plan = found
        assert generic > 0 and custom == 0
        # It reads one partition of each partitioned table.
        touched = _touched(plan["Plan"])
        assert sorted(p.rsplit("_p", 1)[0] for p in touched) == [
            "chatledger_events",
            "chatledger_view_entries",
        ]
