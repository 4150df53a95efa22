"""An index on the whole log in commit order, for the tail.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

`ledger.tail()` follows a tenant's events in commit order, `(txid, seq)`,
past a cursor (docs/tail.md, docs/adr/0024-tail.md). The per-conversation
index `(conversation_id, txid, seq)` serves a conversation's tail; a
tenant's needs `(txid, seq)` over the whole log. On SQLite commit order is
`seq` (the rowid) and `txid` is always 0: the index is partial, `txid > 0`,
so it stays empty there and costs an append nothing.

On a large Postgres log, building the index holds appends back while it
runs; on an unpartitioned log, build it beforehand with `CREATE INDEX
CONCURRENTLY` under the same name and definition to avoid that (this
migration then finds it; check that the build succeeded, as a failed one
leaves an invalid index of that name). A partitioned log takes no
CONCURRENTLY on its parent table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import on_postgres

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

NAME = "ix_chatledger_events_commit_order"


def upgrade() -> None:
    if on_postgres():
        op.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON chatledger_events (txid, seq)")
    else:
        op.create_index(
            NAME, "chatledger_events", ["txid", "seq"], sqlite_where=sa.text("txid > 0")
        )


def downgrade() -> None:
    op.drop_index(NAME, table_name="chatledger_events")
