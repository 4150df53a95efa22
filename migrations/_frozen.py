"""What the revision scripts share: column types, the dialect test, indexes.

A revision's meaning is fixed once it ships, so nothing here follows
`store/schema.py`: the types are copies of its types as revisions 0001 to
0007 wrote them, and a change here would change every revision that uses
them. A revision that needs another definition adds one under a new name.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

__all__ = ["Id", "Seq", "Timestamp", "create_index", "create_tenant_key_index", "on_postgres"]

Id = sa.String(length=36).with_variant(sa.UUID(as_uuid=False), "postgresql")
"""A UUIDv7 id: native uuid on Postgres, canonical text on SQLite."""

Seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A global sequence number (on SQLite, INTEGER PRIMARY KEY is the rowid)."""

Timestamp = sa.DateTime(timezone=True)


def on_postgres() -> bool:
    """Whether the revision runs on Postgres; the one other backend is SQLite."""
    return op.get_bind().dialect.name == "postgresql"


def create_index(
    name: str, table: str, columns: list[str], *, where: str | None = None, unique: bool = False
) -> None:
    """`op.create_index`; with `where`, an index of only the rows it holds for,
    on both backends."""
    partial: dict[str, Any] = {}
    if where is not None:
        partial = {"sqlite_where": sa.text(where), "postgresql_where": sa.text(where)}
    op.create_index(name, table, columns, unique=unique, **partial)


def create_tenant_key_index() -> None:
    """The unique index on a tenant's conversation keys, as revision 0003 made
    it; revision 0005 moves the uniqueness to a table, and its downgrade makes
    the index again."""
    create_index(
        "uq_chatledger_conversations_tenant_key",
        "chatledger_conversations",
        ["tenant", "key"],
        where="key IS NOT NULL",
        unique=True,
    )
