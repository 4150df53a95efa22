"""Conversation keys move to their own lookup table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

A conversation key is resolved before its conversation is known, so a unique
index on `chatledger_conversations (tenant, key)` cannot include the
conversation id: a table distributed by `id` (Citus) could not enforce it
(docs/adr/0022-partition-ready-schema.md). The new table
`chatledger_conversation_keys (tenant, key) -> conversation_id` holds the
uniqueness and the lookup; the conversation row keeps its `key` column, now
a copy that reads return. Existing keys are copied over, and the unique index
is dropped. Downgrade recreates the index from the conversation rows and
drops the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Id, create_tenant_key_index

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chatledger_conversation_keys",
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("conversation_id", Id, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "key", name=op.f("pk_chatledger_conversation_keys")),
    )
    op.execute(
        "INSERT INTO chatledger_conversation_keys (tenant, key, conversation_id) "
        "SELECT tenant, key, id FROM chatledger_conversations WHERE key IS NOT NULL"
    )
    op.drop_index("uq_chatledger_conversations_tenant_key", table_name="chatledger_conversations")


def downgrade() -> None:
    create_tenant_key_index()
    op.drop_table("chatledger_conversation_keys")
