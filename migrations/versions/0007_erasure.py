"""Erasure: per-subject data keys, the erased mark, retention policies.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

A store opened with a key-encryption key seals the messages and metadata of
new conversations with a data key per erasure subject; `ledger.erase`
destroys the key (docs/erasure.md, docs/adr/0025-crypto-shredding.md). This
adds:

- `chatledger_subject_keys`: one wrapped data key per (tenant, subject);
- `chatledger_conversations.subject` (NULL: stored in the clear, as every
  conversation written before this revision) and `.erased_at`, and an index
  on a tenant's subjects;
- `chatledger_retention_policies`: a tenant's retention policy.

Nothing existing is rewritten: old conversations stay in the clear and keep
working; new ones are sealed once the store is opened with a key.
Downgrade drops the three; it refuses while any conversation is sealed,
since its messages could not be read without them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Id, Timestamp, create_index

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chatledger_subject_keys",
        sa.Column("key_id", Id, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("kek_id", sa.String(200), nullable=False),
        sa.Column("wrapped", sa.LargeBinary, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_chatledger_subject_keys")),
        sa.UniqueConstraint(
            "tenant", "subject", name=op.f("uq_chatledger_subject_keys_tenant_subject")
        ),
    )
    op.create_table(
        "chatledger_retention_policies",
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("idle_days", sa.Integer, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_chatledger_retention_policies")),
        sa.CheckConstraint(
            "action IN ('erase', 'export-erase')",
            name=op.f("ck_chatledger_retention_policies_action"),
        ),
        sa.CheckConstraint(
            "idle_days > 0", name=op.f("ck_chatledger_retention_policies_idle_days")
        ),
    )
    with op.batch_alter_table("chatledger_conversations", recreate="never") as batch:
        batch.add_column(sa.Column("subject", sa.String(200), nullable=True))
        batch.add_column(sa.Column("erased_at", Timestamp, nullable=True))
    create_index(
        "ix_chatledger_conversations_tenant_subject",
        "chatledger_conversations",
        ["tenant", "subject"],
        where="subject IS NOT NULL",
    )


def downgrade() -> None:
    sealed = op.get_bind().execute(
        sa.text("SELECT count(*) FROM chatledger_conversations WHERE subject IS NOT NULL")
    ).scalar_one()
    if sealed:
        raise RuntimeError(
            f"{sealed} conversations are sealed with subject keys; downgrading below 0007 "
            f"would leave them unreadable. Export them first (chatledger export)."
        )
    op.drop_index(
        "ix_chatledger_conversations_tenant_subject", table_name="chatledger_conversations"
    )
    with op.batch_alter_table("chatledger_conversations", recreate="never") as batch:
        batch.drop_column("erased_at")
        batch.drop_column("subject")
    op.drop_table("chatledger_retention_policies")
    op.drop_table("chatledger_subject_keys")
