"""Conversation keys and state, and caller-minted event ids.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

`chatledger_conversations` gains `key` (a caller's own name for the
conversation, unique within its tenant) and `state` (a JSON object that
changes after creation; existing conversations start at `{}`), and the new
table `chatledger_event_ids` maps the ids callers mint for their events to
those events (docs/adr/0018-framework-primitives.md). Adding a nullable
column and a column with a constant default rewrites no table on Postgres
11+ or SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Id, Seq, create_tenant_key_index

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("chatledger_conversations", sa.Column("key", sa.String(512), nullable=True))
    op.add_column(
        "chatledger_conversations",
        sa.Column("state", sa.Text(), nullable=False, server_default="{}"),
    )
    create_tenant_key_index()
    op.create_table(
        "chatledger_event_ids",
        sa.Column("id", Id, nullable=False),
        sa.Column("conversation_id", Id, nullable=False),
        sa.Column("event_seq", Seq, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chatledger_event_ids")),
    )


def downgrade() -> None:
    op.drop_table("chatledger_event_ids")
    op.drop_index("uq_chatledger_conversations_tenant_key", table_name="chatledger_conversations")
    with op.batch_alter_table("chatledger_conversations") as batch:
        batch.drop_column("state")
        batch.drop_column("key")
