"""The tables, as SQLAlchemy Core: the single source the migrations follow.

Every table is prefixed `chatledger_`, because it lives in the user's own
database beside the user's tables. docs/tables.md describes every column for
people who query the log with plain SQL.

Ids are UUIDv7 strings: native `uuid` on Postgres, the 36-character text form
on SQLite (so a plain-SQL query uses the same spelling on both).

Scale path: every table carries the conversation id and every secondary
unique key starts with it, so the log can be partitioned by conversation.
On Postgres, migration 0004 also puts it first in the primary keys of
events `(conversation_id, seq)`, branches and runs `(conversation_id, id)`;
SQLite keeps the single-column keys declared here (`seq` is its rowid;
docs/adr/0017-sqlite-keeps-its-layout.md). Alembic's comparison ignores
primary keys, so tests/store/test_partition_ready.py reads them from the catalog.
Two lookup tables are global by design, each keyed by what a caller looks up
before it knows the conversation: `chatledger_event_ids` (a caller-minted
event id) and `chatledger_conversation_keys` (a conversation key; migration
0005). docs/adr/0022-partition-ready-schema.md gives the reasons.
"""

from __future__ import annotations

import sqlalchemy as sa

from chatledger.store._sql.dialect import InsertingTransaction

__all__ = [
    "branches",
    "conversation_keys",
    "conversations",
    "event_ids",
    "events",
    "metadata",
    "retention_policies",
    "runs",
    "subject_keys",
    "view_entries",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

Id = sa.String(36).with_variant(sa.UUID(as_uuid=False), "postgresql")
"""A UUIDv7 id: native uuid on Postgres, canonical text on SQLite."""

Seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A global sequence number (on SQLite, INTEGER PRIMARY KEY is the rowid)."""

Timestamp = sa.DateTime(timezone=True)


def _partial_index(name: str, *columns: str, where: str, unique: bool = False) -> sa.Index:
    """An index of only the rows `where` holds for, on both backends."""
    condition = sa.text(where)
    return sa.Index(
        name, *columns, unique=unique, sqlite_where=condition, postgresql_where=condition
    )


conversations = sa.Table(
    "chatledger_conversations",
    metadata,
    sa.Column("id", Id, primary_key=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("head_branch_id", Id, nullable=False),
    sa.Column("head_position", sa.Integer, nullable=False),
    # True when the head is the tip of its branch and no run is writing that
    # branch: the next append continues the branch in place. Kept with the
    # head, under the conversation's row lock, so an append needs one read.
    sa.Column("head_open", sa.Boolean, nullable=False),
    # The hash of the head's event: the conversation's chain head, the digest
    # to anchor externally (store._sql.chain).
    sa.Column("head_hash", sa.LargeBinary(32), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
    sa.Column("forked_from_conversation_id", Id, nullable=True),
    sa.Column("forked_from_branch_id", Id, nullable=True),
    sa.Column("forked_from_position", sa.Integer, nullable=True),
    # A caller's own name for the conversation (a framework's session or
    # thread id), unique within the tenant: `chatledger_conversation_keys`
    # holds the uniqueness and the lookup, this copy is what a read returns.
    sa.Column("key", sa.String(512), nullable=True),
    # The conversation's current state: a JSON object that changes after
    # creation, each change a `state.changed` event; `{}` until the first.
    sa.Column("state", sa.Text, nullable=False, server_default="{}"),
    # The erasure subject whose data key seals the conversation's messages and
    # metadata (`chatledger_subject_keys`); NULL for a conversation stored in
    # the clear. Set at creation, never changed (docs/erasure.md).
    sa.Column("subject", sa.String(200), nullable=True),
    # When `ledger.erase` destroyed the subject's key: the conversation reads
    # as erased markers from then on and takes no more writes.
    sa.Column("erased_at", Timestamp, nullable=True),
    # Keyset pagination of a tenant's conversations, newest first (ids are UUIDv7).
    sa.Index("ix_chatledger_conversations_tenant_id", "tenant", "id"),
    # A subject's conversations (`erase`, retention): only sealed ones.
    _partial_index(
        "ix_chatledger_conversations_tenant_subject",
        "tenant",
        "subject",
        where="subject IS NOT NULL",
    ),
    # "Which conversations were forked from this one" (audit, lineage).
    _partial_index(
        "ix_chatledger_conversations_forked_from",
        "forked_from_conversation_id",
        where="forked_from_conversation_id IS NOT NULL",
    ),
)

branches = sa.Table(
    "chatledger_branches",
    metadata,
    sa.Column("id", Id, primary_key=True),
    sa.Column("conversation_id", Id, nullable=False),
    sa.Column("parent_branch_id", Id, nullable=True),
    sa.Column("parent_position", sa.Integer, nullable=True),
    sa.Column("reason", sa.String(16), nullable=False),
    sa.Column("run_id", Id, nullable=True),
    sa.Column("resumes_run_id", Id, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    # The conversation's tenant, copied on every row: the column Citus
    # distributes every table by (migration 0009; docs/adr/0054).
    sa.Column("tenant", sa.String(200), nullable=False),
    # At most one resume branch per failed run: this constraint is what makes
    # a resume exactly-once across racing workers.
    sa.UniqueConstraint("conversation_id", "resumes_run_id"),
    sa.CheckConstraint("reason IN ('root', 'run', 'resume', 'fork', 'edit')", name="reason"),
    # A branch by id alone: a fork's parent branch is in another conversation.
    sa.Index("ix_chatledger_branches_id", "id"),
)

events = sa.Table(
    "chatledger_events",
    metadata,
    sa.Column("seq", Seq, primary_key=True, autoincrement=True),
    sa.Column("id", Id, nullable=False),
    sa.Column("conversation_id", Id, nullable=False),
    sa.Column("branch_id", Id, nullable=False),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("run_id", Id, nullable=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("origin", sa.String(8), nullable=False),
    # True on the event whose commit set the conversation's head to this
    # event's (branch, position): the head at any moment is derivable from
    # the log alone.
    sa.Column("head", sa.Boolean, nullable=False),
    sa.Column("recorded_at", Timestamp, nullable=False),
    sa.Column("idempotency_key", sa.String(200), nullable=True),
    # Canonical JSON text. Kept as text (not jsonb) so that `\u0000` and the
    # exact bytes survive, and so a whole history is parsed in one call.
    sa.Column("payload", sa.Text, nullable=False),
    # sha256 of the previous event's hash and this row's content (store._sql.chain).
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
    # The inserting transaction (Postgres: its 64-bit id; SQLite: 0). Audit
    # pages follow (txid, seq), commit order, below the snapshot's xmin, so a
    # row that commits late is never skipped (docs/adr/0005-audit-pagination.md).
    sa.Column("txid", Seq, nullable=False, server_default=InsertingTransaction()),
    # The conversation's tenant, copied on every row: the column Citus
    # distributes every table by (migration 0009; docs/adr/0054).
    sa.Column("tenant", sa.String(200), nullable=False),
    # The lineage scan: one branch's events in position order.
    sa.UniqueConstraint("conversation_id", "branch_id", "position"),
    sa.CheckConstraint("origin IN ('run', 'client', 'repair')", name="origin"),
    _partial_index(
        "ix_chatledger_events_idempotency",
        "conversation_id",
        "idempotency_key",
        unique=True,
        where="idempotency_key IS NOT NULL",
    ),
    _partial_index("ix_chatledger_events_run", "run_id", "seq", where="run_id IS NOT NULL"),
    # A conversation's log in commit order, keyset-paginated (audit).
    sa.Index("ix_chatledger_events_conversation", "conversation_id", "txid", "seq"),
    # The whole log in commit order: a tenant's tail (docs/tail.md). On SQLite
    # commit order is `seq` (the rowid) and `txid` is always 0, so the index
    # is empty there by its condition and costs an append nothing.
    sa.Index(
        "ix_chatledger_events_commit_order",
        "txid",
        "seq",
        sqlite_where=sa.text("txid > 0"),
    ),
    # Tool calls in a time range, by name or not (audit): only tool.started rows.
    _partial_index(
        "ix_chatledger_events_tool_started", "recorded_at", where="kind = 'tool.started'"
    ),
)

runs = sa.Table(
    "chatledger_runs",
    metadata,
    sa.Column("id", Id, primary_key=True),
    sa.Column("conversation_id", Id, nullable=False),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("branch_id", Id, nullable=False),
    # The run's own tip: the position of its last recorded event.
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("base_branch_id", Id, nullable=False),
    sa.Column("base_position", sa.Integer, nullable=False),
    sa.Column("head_branch_id", Id, nullable=False),
    sa.Column("head_position", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stage", sa.String(32), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("request_count", sa.Integer, nullable=False),
    sa.Column("tool_count", sa.Integer, nullable=False),
    sa.Column("usage", sa.Text, nullable=False),
    sa.Column("model", sa.String(200), nullable=True),
    sa.Column("resumes", Id, nullable=True),
    sa.Column("lease_owner", sa.String(200), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    # The fencing token: incremented by every claim.
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("attention", sa.Text, nullable=True),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("ended_at", Timestamp, nullable=True),
    sa.CheckConstraint("status IN ('running', 'completed', 'failed', 'canceled')", name="status"),
    sa.Index("ix_chatledger_runs_conversation_id", "conversation_id", "id"),
    # `run(run_id)`: on Postgres the primary key is (conversation_id, id).
    sa.Index("ix_chatledger_runs_id", "id"),
    # A tenant's runs newest first, by status (`chatledger runs --status ...`).
    sa.Index("ix_chatledger_runs_tenant_status", "tenant", "status", "id"),
    # The resume worker's scan: running runs by lease expiry.
    _partial_index("ix_chatledger_runs_stale", "lease_expires_at", where="status = 'running'"),
)

event_ids = sa.Table(
    "chatledger_event_ids",
    metadata,
    # The ids a caller minted for its events (`append_messages(ids=...)`),
    # each pointing at its event: an event is found by such an id without
    # indexing every event's id. Ids are unique across tenants
    # (on Citus, within their tenant: docs/adr/0054-citus-distributed-by-tenant.md).
    sa.Column("id", Id, primary_key=True),
    sa.Column("conversation_id", Id, nullable=False),
    sa.Column("event_seq", Seq, nullable=False),
    # The conversation's tenant, copied on every row: the column Citus
    # distributes every table by (migration 0009; docs/adr/0054).
    sa.Column("tenant", sa.String(200), nullable=False),
)

conversation_keys = sa.Table(
    "chatledger_conversation_keys",
    metadata,
    # Each conversation key (`create_conversation(key=...)`) and its
    # conversation: a key is resolved before its conversation is known, so
    # its uniqueness cannot live in a table keyed by the conversation.
    # Written in the transaction that creates the conversation.
    sa.Column("tenant", sa.String(200), primary_key=True),
    sa.Column("key", sa.String(512), primary_key=True),
    sa.Column("conversation_id", Id, nullable=False),
)

subject_keys = sa.Table(
    "chatledger_subject_keys",
    metadata,
    # One data key per erasure subject of a tenant, wrapped by the store's
    # key-encryption key (store._crypto). Erasure deletes the row: what the
    # key sealed can never be read again. A lookup table by design: a subject
    # spans conversations (docs/adr/0025-crypto-shredding.md).
    sa.Column("key_id", Id, primary_key=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("subject", sa.String(200), nullable=False),
    # Which key-encryption key wrapped it (`KeyEncryptionKey.id`).
    sa.Column("kek_id", sa.String(200), nullable=False),
    # On Postgres, migration 0008 sets its statistics target to 0: `ANALYZE`
    # would copy wrapped keys into `pg_statistic`, where an erasure does not
    # reach them (a storage setting, which a Table does not express).
    sa.Column("wrapped", sa.LargeBinary, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.UniqueConstraint("tenant", "subject"),
)

retention_policies = sa.Table(
    "chatledger_retention_policies",
    metadata,
    # A tenant's retention policy (`chatledger retention`): conversations idle
    # for `idle_days` are erased, or exported and then erased.
    sa.Column("tenant", sa.String(200), primary_key=True),
    sa.Column("idle_days", sa.Integer, nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.CheckConstraint("action IN ('erase', 'export-erase')", name="action"),
    sa.CheckConstraint("idle_days > 0", name="idle_days"),
)

view_entries = sa.Table(
    "chatledger_view_entries",
    metadata,
    # The materialized head view: one row per message of a conversation's head
    # lineage, pointing at its event (payloads are not copied).
    sa.Column("conversation_id", Id, primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("event_seq", Seq, nullable=False),
    # The conversation whose events hold the message, when it is not this one
    # (a fork's inherited messages, shared, not copied); NULL otherwise. With
    # it, the event is found by its key (conversation_id, seq), so a head read
    # stays in the conversation's partition (docs/adr/0022).
    sa.Column("event_conversation_id", Id, nullable=True),
    # The conversation's tenant, copied on every row: the column Citus
    # distributes every table by (migration 0009; docs/adr/0054).
    sa.Column("tenant", sa.String(200), nullable=False),
    # Clustered by its key on SQLite: a head read is one contiguous range, and
    # an append writes one B-tree instead of a table and its index.
    sqlite_with_rowid=False,
)
