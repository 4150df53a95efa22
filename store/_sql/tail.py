"""The tail's notification inside a transaction: `NOTIFY chatledger_events` on its commit.

How tails are woken (the store's `Notifier`, the waiters' `LISTEN` and SQLite's
`PRAGMA data_version`) is `store/_db/tail.py`'s: each holds a thread or a
connection of its own. This is the one part that runs in a caller's transaction.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

__all__ = ["CHANNEL", "notify_on_commit"]

CHANNEL = "chatledger_events"


def notify_on_commit(conn: Connection) -> None:
    """`NOTIFY chatledger_events` inside the caller's open transaction: Postgres
    delivers it when that transaction commits, and never if it rolls back.

    For writes made in a caller's own transaction (`connection=`), whose
    commit the store does not see. Such a transaction takes the notify lock
    through its commit; a store's own writes notify from `Notifier` instead.
    """
    conn.exec_driver_sql(f"NOTIFY {CHANNEL}")
