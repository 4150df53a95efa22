"""Alembic, driven from the installed package (no alembic.ini needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from chatledger import migrations

__all__ = ["alembic_config", "current_revision", "head_revision", "upgrade"]

VERSION_TABLE = "chatledger_alembic_version"


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config pointing at the migrations shipped in this package."""
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
    command.downgrade(alembic_config(connection), revision)


def head_revision() -> str | None:
    """The newest revision this package ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None when unmigrated."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()
