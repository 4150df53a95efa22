"""Hash partitioning of the events and head-view tables by conversation, on Postgres.

`Store.migrate(partitions=N)` runs `partition` after the migrations: it turns
`chatledger_events` and `chatledger_view_entries` into tables
`PARTITION BY HASH (conversation_id)` with `N` partitions named
`<table>_p0` ... `<table>_p{N-1}` (docs/adr/0022-partition-ready-schema.md).

A table is converted in the caller's transaction, under an ACCESS EXCLUSIVE
lock: a partitioned twin is created with the same columns and defaults (the
`seq` sequence and the `txid` default included), the rows are copied as they
are, the old table is dropped and the twin takes its name, and then its
constraints, indexes and triggers are recreated from the definitions the
catalog gave for the old table, so they keep their names. A trigger for
each statement (the TRUNCATE refusal) is also put on every partition, since
Postgres clones only row triggers to partitions. Readers and writers wait
for the commit; a failure changes nothing.

SQLite is one file and is never partitioned (docs/adr/0017).
"""

from __future__ import annotations

import re

from sqlalchemy.engine import Connection

from chatledger.store._checks import check_int
from chatledger.store._errors import InvalidInputError
from chatledger.store._sql.dialect import is_sqlite

__all__ = ["MAX_PARTITIONS", "PARTITIONED", "partition", "partition_count", "refuse_sqlite"]

PARTITIONED = ("chatledger_events", "chatledger_view_entries")
"""The tables `partition` converts, each by `conversation_id`."""

MAX_PARTITIONS = 1024

_COUNT = """
SELECT count(i.inhrelid)
FROM pg_partitioned_table p LEFT JOIN pg_inherits i ON i.inhparent = p.partrelid
WHERE p.partrelid = to_regclass(%(table)s)
GROUP BY p.partrelid
"""
_CONSTRAINTS = """
SELECT quote_ident(conname), pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = to_regclass(%(table)s) AND contype IN ('p', 'u', 'c', 'x', 'f')
ORDER BY contype <> 'p', conname
"""
_INDEXES = """
SELECT pg_get_indexdef(x.indexrelid) FROM pg_index x
WHERE x.indrelid = to_regclass(%(table)s)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
ORDER BY x.indexrelid
"""
_TRIGGERS = """
SELECT pg_get_triggerdef(oid), (tgtype & 1) = 0 FROM pg_trigger
WHERE tgrelid = to_regclass(%(table)s) AND NOT tgisinternal
ORDER BY tgname
"""
# Each partition's index of a parent index, with the partition's name.
_CHILD_INDEXES = """
SELECT quote_ident(c.relname), p.relname, t.relname FROM pg_index x
JOIN pg_inherits i ON i.inhparent = x.indexrelid
JOIN pg_class p ON p.oid = x.indexrelid
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_index cx ON cx.indexrelid = c.oid
JOIN pg_class t ON t.oid = cx.indrelid
WHERE x.indrelid = to_regclass(%(table)s)
"""
_SEQUENCES = """
SELECT quote_ident(attname), pg_get_serial_sequence(%(table)s, attname) FROM pg_attribute
WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped
  AND pg_get_serial_sequence(%(table)s, attname) IS NOT NULL
"""


def refuse_sqlite(conn: Connection) -> None:
    """Raise `InvalidInputError` on SQLite, which is never partitioned."""
    if is_sqlite(conn):
        raise InvalidInputError(
            "SQLite databases are not partitioned: a SQLite database is one file. "
            "Migrate without partitions (`chatledger migrate`, `Store.migrate()`), "
            "or use Postgres."
        )


def partition_count(conn: Connection, table: str) -> int | None:
    """How many hash partitions `table` has; None when it is not partitioned."""
    found = conn.exec_driver_sql(_COUNT, {"table": table}).scalar()
    return None if found is None else int(found)


def partition(conn: Connection, count: int) -> None:
    """Make the events and head-view tables hash-partitioned into `count` partitions.

    Tables already partitioned into `count` are left alone; a different
    count is refused, since changing it means copying the table again.
    """
    refuse_sqlite(conn)
    check_int(count, "partitions", minimum=1, maximum=MAX_PARTITIONS)
    for table in PARTITIONED:
        now = partition_count(conn, table)
        if now is None:
            _convert(conn, table, count)
        elif now != count:
            raise InvalidInputError(
                f"Table {table} is already hash-partitioned into {now} partitions, not "
                f"{count}. Migrate with {now} (`chatledger migrate --partitions {now}`, "
                f"`Store.migrate(partitions={now})`) or without a count; changing "
                f"the count means copying the table into a new one, which chatledger "
                f"does not do on its own."
            )


def _rows(conn: Connection, sql: str, table: str) -> list[tuple[str, ...]]:
    return [tuple(r) for r in conn.exec_driver_sql(sql, {"table": table}).all()]


def _convert(conn: Connection, table: str, count: int) -> None:
    conn.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    constraints = _rows(conn, _CONSTRAINTS, table)
    indexes = [sql for (sql,) in _rows(conn, _INDEXES, table)]
    triggers = _rows(conn, _TRIGGERS, table)
    sequences = _rows(conn, _SEQUENCES, table)
    twin = f"{table}__partitioned"
    # The sequence behind `seq` belongs to the old column: free it, or the
    # DROP TABLE below would drop it too.
    for _, sequence in sequences:
        conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} OWNED BY NONE")
    conn.exec_driver_sql(
        f"CREATE TABLE {twin} (LIKE {table} INCLUDING DEFAULTS INCLUDING STORAGE) "
        f"PARTITION BY HASH (conversation_id)"
    )
    partitions = [f"{table}_p{i}" for i in range(count)]
    for i, name in enumerate(partitions):
        conn.exec_driver_sql(
            f"CREATE TABLE {name} PARTITION OF {twin} "
            f"FOR VALUES WITH (MODULUS {count}, REMAINDER {i})"
        )
    conn.exec_driver_sql(f"INSERT INTO {twin} SELECT * FROM {table}")
    conn.exec_driver_sql(f"DROP TABLE {table}")
    conn.exec_driver_sql(f"ALTER TABLE {twin} RENAME TO {table}")
    for name, definition in constraints:
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
    for definition in indexes:
        conn.exec_driver_sql(definition)
    # A partition's index is named after its parent's (`<parent>_p<i>`), not
    # by Postgres: a unique violation names the partition's index, and
    # `translate.key_name` reads the parent's name back from it.
    for child, parent, part in _rows(conn, _CHILD_INDEXES, table):
        suffix = part.removeprefix(table)
        conn.exec_driver_sql(f'ALTER INDEX {child} RENAME TO "{parent}{suffix}"')
    on_table = re.compile(rf" ON (\S+\.)?{re.escape(table)} ")
    for definition, per_statement in triggers:
        conn.exec_driver_sql(definition)
        if per_statement:
            for name in partitions:
                conn.exec_driver_sql(on_table.sub(f" ON {name} ", definition, count=1))
    for column, sequence in sequences:
        conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} OWNED BY {table}.{column}")
