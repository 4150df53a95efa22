"""Wrapped data keys out of the planner's statistics.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

`ANALYZE` (which autovacuum runs by itself) copies a sample of each column's
values into `pg_statistic`: for `chatledger_subject_keys.wrapped`, the wrapped
data keys themselves. An erasure deletes a subject's key row, but not the
sample, so a later backup and the key-encryption key would open the erased
content again (docs/erasure.md). No query filters or sorts on the column, so
the planner loses nothing without it:

- `SET STATISTICS 0`: `ANALYZE` samples the column no more;
- `TYPE bytea` (its own type: nothing is rewritten) deletes the statistics an
  earlier `ANALYZE` took, which `SET STATISTICS 0` leaves in place. Their
  bytes stay in `pg_statistic`'s free space until it is rewritten: after
  this upgrade, run `VACUUM FULL pg_statistic` once (docs/erasure.md).

SQLite's `ANALYZE` samples only indexed columns (`sqlite_stat4`), and no
index holds `wrapped`: nothing to do there. Statistics targets are storage
settings, like the triggers of 0001, which `store/schema.py`'s tables do
not express. Downgrade restores the default target.
"""

from __future__ import annotations

from alembic import op

from chatledger.migrations._frozen import on_postgres

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if on_postgres():
        op.execute("ALTER TABLE chatledger_subject_keys ALTER COLUMN wrapped SET STATISTICS 0")
        op.execute("ALTER TABLE chatledger_subject_keys ALTER COLUMN wrapped TYPE bytea")


def downgrade() -> None:
    if on_postgres():
        op.execute("ALTER TABLE chatledger_subject_keys ALTER COLUMN wrapped SET STATISTICS -1")
