"""Alembic, driven from the installed package (no alembic.ini needed).

Alembic is imported when a function here is first called: a command or a
process that never migrates nor checks the schema does not load it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger import migrations
from chatledger.store._errors import SchemaError

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["HEAD", "alembic_config", "current_revision", "upgrade"]

VERSION_TABLE = "chatledger_alembic_version"
HEAD = "0009"
"""The newest revision in migrations/versions/, which a store checks a database
against on every `check_schema` without loading Alembic; tests/store/test_schema.py
holds it to Alembic's own reading of the scripts."""


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config pointing at the migrations shipped in this package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(
    connection: Connection,
    revision: str = "head",
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Upgrade the schema on `connection`, inside the caller's transaction;
    `progress(done, total)` after each revision applied."""
    from alembic import command
    from alembic.script import ScriptDirectory

    config = alembic_config(connection)
    if progress is not None:
        script = ScriptDirectory.from_config(config)
        current = current_revision(connection)
        total = len(list(script.iterate_revisions(revision, current)))
        done = iter(range(1, total + 1))
        config.attributes["on_version_apply"] = lambda **_: progress(next(done), total)
    command.upgrade(config, revision)


def downgrade(connection: Connection, revision: str) -> None:
    """Downgrade the schema on `connection`."""
    from alembic import command

    command.downgrade(alembic_config(connection), revision)


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None when unmigrated: one read of
    Alembic's version table (Alembic itself is not needed for it)."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    if len(rows) > 1:
        raise SchemaError(
            f"The database's {VERSION_TABLE} holds {len(rows)} revisions; chatledger's "
            f"migrations are one line, so it was changed by hand. Restore it from a backup."
        )
    return str(rows[0][0]) if rows else None
