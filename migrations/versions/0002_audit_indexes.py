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

# Frozen copy of store/schema.py's Seq type as of this revision.
Seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

TOOL_STARTED = sa.text("kind = 'tool.started'")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "chatledger_events",
        sa.Column("txid", Seq, nullable=False, server_default=sa.text("0")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "chatledger_events",
            "txid",
            server_default=sa.text("(pg_current_xact_id()::text::bigint)"),
        )
    op.create_index(
        "ix_chatledger_events_conversation",
        "chatledger_events",
        ["conversation_id", "txid", "seq"],
        unique=False,
    )
    op.create_index(
        "ix_chatledger_events_tool_started",
        "chatledger_events",
        ["recorded_at"],
        unique=False,
        sqlite_where=TOOL_STARTED,
        postgresql_where=TOOL_STARTED,
    )


def downgrade() -> None:
    op.drop_index(
        "ix_chatledger_events_tool_started",
        table_name="chatledger_events",
        sqlite_where=TOOL_STARTED,
        postgresql_where=TOOL_STARTED,
    )
    op.drop_index("ix_chatledger_events_conversation", table_name="chatledger_events")
    op.drop_column("chatledger_events", "txid")
