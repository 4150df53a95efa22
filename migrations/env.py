"""Alembic environment for chatledger's tables.

Run through `Store.migrate()` (which hands in a connection) or the `chatledger
migrate` command. The version table is `chatledger_alembic_version`, so the
user's own Alembic history in the same database is left alone, and
autogenerate only looks at `chatledger_` tables.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from alembic import context
from sqlalchemy.engine import Connection

from chatledger.store._db.engines import create_engine
from chatledger.store.schema import metadata

if TYPE_CHECKING:
    from alembic.runtime.environment import NameFilterParentNames, NameFilterType

VERSION_TABLE = "chatledger_alembic_version"
PARTITION = re.compile(r"chatledger_\w+_p\d+")


def include_name(name: str | None, type_: NameFilterType, _parents: NameFilterParentNames) -> bool:
    """Only chatledger's own tables are ours to compare and migrate.

    The hash partitions `Store.migrate(partitions=N)` makes (`<table>_p<i>`,
    store/_sql/partitions.py) are part of their table, not tables of their own.
    """
    if type_ == "table":
        return bool(name and name.startswith("chatledger_") and not PARTITION.fullmatch(name))
    return True


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        include_name=include_name,
        compare_type=True,
        # `Store.migrate(progress=...)`: called after each revision applied.
        on_version_apply=context.config.attributes.get("on_version_apply", ()),
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    # The URL is read as Store.open reads it: none means CHATLEDGER_DATABASE_URL.
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        run(conn)
        conn.commit()
    engine.dispose()
