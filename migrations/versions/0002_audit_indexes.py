"""Audit: the inserting transaction of each event, and the audit indexes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

`chatledger_events.txid` lets audit pages follow commit order on Postgres
(docs/adr/0005-audit-pagination.md). It is added with the constant default 0,
which Postgres 11+ records in the catalog without rewriting the table, and
only then given its real default, which applies to new rows: existing rows
read 0 and sort first, which is right, since they all committed before this
migration took its lock on the table. On SQLite the default stays 0.

The indexes and the queries they serve are documented in docs/audit.md.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Seq, create_index, on_postgres

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "chatledger_events",
        sa.Column("txid", Seq, nullable=False, server_default=sa.text("0")),
    )
    if on_postgres():
        op.alter_column(
            "chatledger_events",
            "txid",
            server_default=sa.text("(pg_current_xact_id()::text::bigint)"),
        )
    create_index(
        "ix_chatledger_events_conversation", "chatledger_events", ["conversation_id", "txid", "seq"]
    )
    create_index(
        "ix_chatledger_events_tool_started",
        "chatledger_events",
        ["recorded_at"],
        where="kind = 'tool.started'",
    )


def downgrade() -> None:
    op.drop_index("ix_chatledger_events_tool_started", table_name="chatledger_events")
    op.drop_index("ix_chatledger_events_conversation", table_name="chatledger_events")
    op.drop_column("chatledger_events", "txid")
