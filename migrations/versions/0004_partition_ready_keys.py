"""Partition-ready keys: every unique key of a conversation's rows includes its id.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Postgres only (docs/adr/0022-partition-ready-schema.md). A table partitioned
or distributed by `conversation_id` can enforce a unique key only if the key
includes `conversation_id`, so:

- `chatledger_events`: primary key `(conversation_id, seq)` instead of
  `(seq)`. `seq` still comes from one sequence, so it stays unique; the
  database no longer checks that, and nothing looks an event up by `seq`
  without its conversation.
- `chatledger_branches`, `chatledger_runs`: primary key `(conversation_id, id)`
  instead of `(id)`, plus a plain index on `id` for the lookups by id alone
  (a fork's parent branch lives in another conversation; `run(run_id)`).

- `chatledger_view_entries` gains `event_conversation_id`: the conversation
  whose events hold the entry's message when it is not the entry's own (a
  fork's inherited messages), NULL otherwise, so a head read finds each
  event by its key `(conversation_id, seq)`. Existing fork views are filled
  in here; every other row stays NULL.

Changing a primary key rebuilds its index but rewrites no row: data stays
in place, byte for byte. SQLite keeps its layout (docs/adr/0017): one file
is never partitioned. The plain `id` indexes are made on both backends, so
both follow store/schema.py (on SQLite they duplicate the primary key of two
small tables).

Downgrade restores the single-column primary keys; it fails, changing
nothing, if two runs (or branches) of different conversations share an id.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Id, on_postgres

# Only a fork's inherited entries point into another conversation.
FILL_INHERITED = """
UPDATE chatledger_view_entries SET event_conversation_id = (
    SELECT e.conversation_id FROM chatledger_events e
    WHERE e.seq = chatledger_view_entries.event_seq
      AND e.conversation_id <> chatledger_view_entries.conversation_id
)
WHERE conversation_id IN (
    SELECT id FROM chatledger_conversations WHERE forked_from_conversation_id IS NOT NULL
)
"""

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# (table, old primary key columns, new primary key columns)
KEYS = [
    ("chatledger_events", ["seq"], ["conversation_id", "seq"]),
    ("chatledger_branches", ["id"], ["conversation_id", "id"]),
    ("chatledger_runs", ["id"], ["conversation_id", "id"]),
]
ID_INDEXES = [
    ("ix_chatledger_branches_id", "chatledger_branches"),
    ("ix_chatledger_runs_id", "chatledger_runs"),
]


def _primary_keys(keys: int) -> None:
    for table, *columns in KEYS:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        op.create_primary_key(f"pk_{table}", table, columns[keys])


def upgrade() -> None:
    op.add_column("chatledger_view_entries", sa.Column("event_conversation_id", Id, nullable=True))
    # Before the primary keys change: `seq` alone is still indexed.
    op.execute(FILL_INHERITED)
    for name, table in ID_INDEXES:
        op.create_index(name, table, ["id"], unique=False)
    if on_postgres():
        _primary_keys(1)


def downgrade() -> None:
    if on_postgres():
        _primary_keys(0)
    for name, table in ID_INDEXES:
        op.drop_index(name, table_name=table)
    with op.batch_alter_table("chatledger_view_entries") as batch:
        batch.drop_column("event_conversation_id")
