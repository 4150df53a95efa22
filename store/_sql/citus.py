"""The log laid out on a Citus cluster: every table distributed by tenant.

`Store.migrate(citus=True)` runs `distribute` after the migrations, on a
Citus coordinator (docs/adr/0054-citus-distributed-by-tenant.md): each
chatledger table becomes a distributed table with `tenant` as its
distribution column, all in one colocation group, so that a tenant's
conversations, their forks (which read their source's events) and their runs
live on one shard, and every operation of a tenant handle is a query of one
shard.

Citus accepts a unique key only if it holds the distribution column: each
primary key and unique key (and unique index) of a distributed table gets
`tenant` as its last column, under its own name, so a violation reads as it
does on one server (`translate.key_name` drops the shard's suffix). A caller's
conversation, event and run ids are then unique within a tenant; ids the store
mints are UUIDv7s, unique anyway.

Citus refuses triggers on distributed tables unless
`citus.enable_unsafe_triggers` is on, because a trigger that reads or writes
other tables could see another shard's rows. chatledger's only triggers refuse
every UPDATE, DELETE and TRUNCATE of the log and touch nothing: the setting is
turned on for this transaction only (`SET LOCAL`), to distribute the log with
them, and nowhere else.

Distributing copies the rows already in a table into its shards; run it on a
new database, or plan for the copy. SQLite and a partitioned database are
refused; `distribute` on a database already laid out does nothing.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from chatledger.store._errors import InvalidInputError
from chatledger.store._sql.dialect import is_sqlite

__all__ = ["COLOCATED", "distribute", "is_distributed"]

COLOCATED = (
    "chatledger_conversations",
    "chatledger_branches",
    "chatledger_events",
    "chatledger_view_entries",
    "chatledger_runs",
    "chatledger_event_ids",
    "chatledger_conversation_keys",
    "chatledger_subject_keys",
    "chatledger_retention_policies",
)
"""Every table of the log, distributed by `tenant` in this order, the first
one's colocation group taken by the others."""

_CITUS = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
_DISTRIBUTED = """
SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = to_regclass(%(table)s)
"""
_PARTITIONED = "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = to_regclass(%(table)s)"
# Each unique key without `tenant`: (name, is a constraint, its definition).
_KEYS = """
SELECT quote_ident(c.relname), k.conname IS NOT NULL,
       coalesce(pg_get_constraintdef(k.oid), pg_get_indexdef(x.indexrelid))
FROM pg_index x
JOIN pg_class c ON c.oid = x.indexrelid
LEFT JOIN pg_constraint k ON k.conindid = x.indexrelid AND k.contype IN ('p', 'u')
WHERE x.indrelid = to_regclass(%(table)s) AND x.indisunique
  AND NOT EXISTS (
      SELECT 1 FROM pg_attribute a
      WHERE a.attrelid = x.indrelid AND a.attname = 'tenant' AND a.attnum = ANY(x.indkey))
ORDER BY 1
"""


def is_distributed(conn: Connection) -> bool:
    """Whether the log is laid out on Citus (its conversations are distributed)."""
    if is_sqlite(conn) or conn.exec_driver_sql(_CITUS).scalar() is None:
        return False
    found = conn.exec_driver_sql(_DISTRIBUTED, {"table": "chatledger_conversations"}).scalar()
    return bool(found)


def distribute(conn: Connection) -> None:
    """Distribute every table of the log by tenant, in the caller's transaction."""
    if is_sqlite(conn):
        raise InvalidInputError(
            "Citus is for Postgres: a SQLite database is one file. Migrate without "
            "--citus (`chatledger migrate`, `Store.migrate()`), or use a Citus cluster."
        )
    if conn.exec_driver_sql(_CITUS).scalar() is None:
        raise InvalidInputError(
            "The database has no citus extension: connect to a Citus coordinator's "
            "database where `CREATE EXTENSION citus` has run (docs/scaling.md), or "
            "migrate without --citus."
        )
    if conn.exec_driver_sql(_PARTITIONED, {"table": "chatledger_events"}).scalar():
        raise InvalidInputError(
            "The log is hash-partitioned (`migrate --partitions`): on Citus it is split "
            "into shards instead. Lay out a new database with --citus alone and import "
            "the tenants' exports into it (docs/export.md)."
        )
    if is_distributed(conn):
        return
    conn.exec_driver_sql("SET LOCAL citus.enable_unsafe_triggers = on")
    for table in COLOCATED:
        _keys_with_tenant(conn, table)
        colocate = "" if table == COLOCATED[0] else f", colocate_with => '{COLOCATED[0]}'"
        conn.exec_driver_sql(f"SELECT create_distributed_table('{table}', 'tenant'{colocate})")
    conn.exec_driver_sql("SET LOCAL citus.enable_unsafe_triggers = off")


def _keys_with_tenant(conn: Connection, table: str) -> None:
    """Recreate each unique key of `table` that lacks `tenant` with it, last, under its name."""
    for name, constraint, definition in conn.exec_driver_sql(_KEYS, {"table": table}).all():
        if constraint:  # PRIMARY KEY (a, b) / UNIQUE (a, b)
            columns_end = definition.index(")")
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            conn.exec_driver_sql(
                f"ALTER TABLE {table} ADD CONSTRAINT {name} "
                f"{definition[:columns_end]}, tenant{definition[columns_end:]}"
            )
        else:  # CREATE UNIQUE INDEX name ON table USING btree (a, b) [WHERE ...]
            columns_end = definition.index(")", definition.index(" USING "))
            conn.exec_driver_sql(f"DROP INDEX {name}")
            conn.exec_driver_sql(f"{definition[:columns_end]}, tenant{definition[columns_end:]}")
