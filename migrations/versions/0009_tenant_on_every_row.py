"""The tenant on every row of a conversation's tables.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

`chatledger_events`, `chatledger_view_entries`, `chatledger_branches` and
`chatledger_event_ids` take a `tenant` column, a copy of their conversation's,
so that every table can be distributed by tenant on Citus and every query of a
tenant's rows names the one shard that holds them
(docs/adr/0054-citus-distributed-by-tenant.md). The existing rows are filled
from their conversations; `chatledger_events` is append-only, so its refusal
of updates is set aside for this one statement and put back in the same
transaction. On a large log this rewrites the four tables: plan for it.

Downgrade drops the columns.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import on_postgres

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLES = (
    "chatledger_events",
    "chatledger_view_entries",
    "chatledger_branches",
    "chatledger_event_ids",
)
_SQLITE_REFUSALS = ("chatledger_events_no_update", "chatledger_events_no_delete")


def upgrade() -> None:
    postgres = on_postgres()
    for table in TABLES:
        if postgres:
            op.execute(f"ALTER TABLE {table} ADD COLUMN tenant varchar(200)")
        else:  # SQLite adds a NOT NULL column only with a default
            op.execute(f"ALTER TABLE {table} ADD COLUMN tenant VARCHAR(200) NOT NULL DEFAULT ''")
    if postgres:
        op.execute("ALTER TABLE chatledger_events DISABLE TRIGGER chatledger_events_no_change")
    else:
        saved = _sqlite_triggers()
        for name in _SQLITE_REFUSALS:
            op.execute(f"DROP TRIGGER {name}")
    for table in TABLES:
        op.execute(
            f"UPDATE {table} SET tenant = (SELECT c.tenant FROM chatledger_conversations c "
            f"WHERE c.id = {table}.conversation_id)"
        )
    if postgres:
        op.execute("ALTER TABLE chatledger_events ENABLE TRIGGER chatledger_events_no_change")
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN tenant SET NOT NULL")
    else:
        for sql in saved:
            op.execute(sql)


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN tenant")


def _sqlite_triggers() -> list[str]:
    """The append-only triggers' definitions, as SQLite keeps them."""
    rows = op.get_bind().execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name IN (:a, :b)"),
        {"a": _SQLITE_REFUSALS[0], "b": _SQLITE_REFUSALS[1]},
    )
    return [str(sql) for (sql,) in rows]
