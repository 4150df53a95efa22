"""The event log: conversations, branches, events, runs and head views.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Generated from store/schema.py and reviewed by hand: the append-only triggers
on chatledger_events are added here, since the tables cannot express them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from chatledger.migrations._frozen import Id, Seq, create_index, on_postgres

APPEND_ONLY = "chatledger_events is append-only: its rows are never updated or deleted"

SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER chatledger_events_no_update BEFORE UPDATE ON chatledger_events
    BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END""",
    f"""CREATE TRIGGER chatledger_events_no_delete BEFORE DELETE ON chatledger_events
    BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END""",
]

POSTGRES_TRIGGERS = [
    f"""CREATE FUNCTION chatledger_refuse_change() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{APPEND_ONLY}' USING ERRCODE = 'restrict_violation';
    END
    $$""",
    """CREATE TRIGGER chatledger_events_no_change BEFORE UPDATE OR DELETE ON chatledger_events
    FOR EACH ROW EXECUTE FUNCTION chatledger_refuse_change()""",
    """CREATE TRIGGER chatledger_events_no_truncate BEFORE TRUNCATE ON chatledger_events
    FOR EACH STATEMENT EXECUTE FUNCTION chatledger_refuse_change()""",
]

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chatledger_branches",
        sa.Column("id", Id, nullable=False),
        sa.Column("conversation_id", Id, nullable=False),
        sa.Column("parent_branch_id", Id, nullable=True),
        sa.Column("parent_position", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("run_id", Id, nullable=True),
        sa.Column("resumes_run_id", Id, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "reason IN ('root', 'run', 'resume', 'fork', 'edit')",
            name=op.f("ck_chatledger_branches_reason"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chatledger_branches")),
        sa.UniqueConstraint(
            "conversation_id",
            "resumes_run_id",
            name=op.f("uq_chatledger_branches_conversation_id_resumes_run_id"),
        ),
    )
    op.create_table(
        "chatledger_conversations",
        sa.Column("id", Id, nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("head_branch_id", Id, nullable=False),
        sa.Column("head_position", sa.Integer(), nullable=False),
        sa.Column("head_open", sa.Boolean(), nullable=False),
        sa.Column("head_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("forked_from_conversation_id", Id, nullable=True),
        sa.Column("forked_from_branch_id", Id, nullable=True),
        sa.Column("forked_from_position", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chatledger_conversations")),
    )
    create_index(
        "ix_chatledger_conversations_forked_from",
        "chatledger_conversations",
        ["forked_from_conversation_id"],
        where="forked_from_conversation_id IS NOT NULL",
    )
    create_index(
        "ix_chatledger_conversations_tenant_id", "chatledger_conversations", ["tenant", "id"]
    )
    op.create_table(
        "chatledger_events",
        sa.Column("seq", Seq, autoincrement=True, nullable=False),
        sa.Column("id", Id, nullable=False),
        sa.Column("conversation_id", Id, nullable=False),
        sa.Column("branch_id", Id, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("run_id", Id, nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("origin", sa.String(length=8), nullable=False),
        sa.Column("head", sa.Boolean(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("hash", sa.LargeBinary(length=32), nullable=False),
        sa.CheckConstraint(
            "origin IN ('run', 'client', 'repair')", name=op.f("ck_chatledger_events_origin")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_chatledger_events")),
        sa.UniqueConstraint(
            "conversation_id",
            "branch_id",
            "position",
            name=op.f("uq_chatledger_events_conversation_id_branch_id_position"),
        ),
    )
    create_index(
        "ix_chatledger_events_idempotency",
        "chatledger_events",
        ["conversation_id", "idempotency_key"],
        where="idempotency_key IS NOT NULL",
        unique=True,
    )
    create_index(
        "ix_chatledger_events_run",
        "chatledger_events",
        ["run_id", "seq"],
        where="run_id IS NOT NULL",
    )
    op.create_table(
        "chatledger_runs",
        sa.Column("id", Id, nullable=False),
        sa.Column("conversation_id", Id, nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("branch_id", Id, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("base_branch_id", Id, nullable=False),
        sa.Column("base_position", sa.Integer(), nullable=False),
        sa.Column("head_branch_id", Id, nullable=False),
        sa.Column("head_position", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("request_count", sa.Integer(), nullable=False),
        sa.Column("tool_count", sa.Integer(), nullable=False),
        sa.Column("usage", sa.Text(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("resumes", Id, nullable=True),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("attention", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'failed', 'canceled')",
            name=op.f("ck_chatledger_runs_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chatledger_runs")),
    )
    create_index("ix_chatledger_runs_conversation_id", "chatledger_runs", ["conversation_id", "id"])
    create_index("ix_chatledger_runs_tenant_status", "chatledger_runs", ["tenant", "status", "id"])
    create_index(
        "ix_chatledger_runs_stale",
        "chatledger_runs",
        ["lease_expires_at"],
        where="status = 'running'",
    )
    op.create_table(
        "chatledger_view_entries",
        sa.Column("conversation_id", Id, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("event_seq", Seq, nullable=False),
        sa.PrimaryKeyConstraint(
            "conversation_id", "position", name=op.f("pk_chatledger_view_entries")
        ),
        sqlite_with_rowid=False,
    )
    triggers = POSTGRES_TRIGGERS if on_postgres() else SQLITE_TRIGGERS
    for statement in triggers:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("chatledger_view_entries")
    op.drop_index("ix_chatledger_runs_stale", table_name="chatledger_runs")
    op.drop_index("ix_chatledger_runs_conversation_id", table_name="chatledger_runs")
    op.drop_table("chatledger_runs")
    op.drop_index("ix_chatledger_events_run", table_name="chatledger_events")
    op.drop_index("ix_chatledger_events_idempotency", table_name="chatledger_events")
    if on_postgres():
        op.execute("DROP TRIGGER chatledger_events_no_truncate ON chatledger_events")
    op.drop_table("chatledger_events")
    op.drop_index("ix_chatledger_conversations_tenant_id", table_name="chatledger_conversations")
    op.drop_table("chatledger_conversations")
    op.drop_table("chatledger_branches")
    if on_postgres():
        op.execute("DROP FUNCTION chatledger_refuse_change()")
