"""Keyset pages over the event log, in commit order.

An audit reader pages through events with a cursor. The cursor must never
pass an event that becomes visible later, or that event is skipped for good.

On SQLite one writer at a time commits, and `seq` is the rowid of an insert
that saw every earlier commit, so `seq` order is commit order: the cursor is
the last `seq` read.

On Postgres `seq` comes from a sequence, taken when a row is inserted, not
when its transaction commits: a transaction can hold seq 10 uncommitted while
seq 11 commits, and a reader past 11 would skip 10. So pages follow `(txid,
seq)`, where `txid` is the id of the inserting transaction (stamped by the
column's default), and read only rows whose transaction is below the
snapshot's xmin: every transaction below xmin has ended, and every row that
becomes visible later belongs to a transaction at or above it, so it sorts
after everything already read. Rows that are committed but not yet below the
horizon (a newer transaction committed while an older one is still open) are
held back and the page says so (`pending`). docs/adr/0005-audit-pagination.md
records the choice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from chatledger.store._errors import InvalidInputError
from chatledger.store._sql.dialect import MAX_SEQ, commit_order, past_cursor, snapshot_horizon
from chatledger.store._values import VALUE_CONFIG

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Page",
    "check_cursor",
    "check_limit",
    "position",
    "read_page",
]

T = TypeVar("T")

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000

# As chatledger prints a cursor: ASCII digits (`\d` would take any script's), no
# leading zeros; each part a bigint, at most `MAX_SEQ` (checked after the match).
_CURSOR = re.compile(r"(0|[1-9][0-9]{0,18}):(0|[1-9][0-9]{0,18})")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of an audit query, in commit order.

    Attributes:
        items: the page's items.
        next_after: the cursor after the last item (or the `after` passed in
            when the page is empty): pass it as `after` to read on, now when
            `has_more`, or later to follow new events. None only when the
            query has matched nothing yet.
        has_more: another page is ready now.
        pending: newer matching events are committed but held back until an
            older transaction that is still open ends (Postgres); ask again
            with `next_after` to get them.
    """

    __pydantic_config__ = VALUE_CONFIG  # camelCase JSON, like every value's

    items: list[T]
    next_after: str | None
    has_more: bool = False
    pending: bool = False


def check_limit(limit: int) -> int:
    """`limit`, or `InvalidInputError` when it is not a sane page size."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(
            f"A page holds 1 to {MAX_LIMIT:,} items, not {limit!r}. Pass a limit in that range "
            f"and follow `next_after` for more."
        )
    return limit


def position(after: str) -> tuple[int, int]:
    """A cursor as the (txid, seq) pair it names (`InvalidInputError` if it is none)."""
    parsed = _parse(after)
    assert parsed is not None
    return parsed


def check_cursor(after: str | None) -> None:
    """`InvalidInputError` unless `after` is None or a cursor as chatledger returns it."""
    _parse(after)


def _parse(after: str | None) -> tuple[int, int] | None:
    if after is None:
        return None
    match = _CURSOR.fullmatch(after) if isinstance(after, str) else None
    parsed = None if match is None else (int(match[1]), int(match[2]))
    if parsed is None or max(parsed) > MAX_SEQ:
        raise InvalidInputError(
            f"{after!r} is not an audit cursor. Pass the `next_after` of a page exactly as "
            f"chatledger returned it."
        )
    return parsed


def read_page(
    conn: Connection,
    query: sa.Select[Any],
    keyed: sa.FromClause,
    *,
    after: str | None,
    limit: int,
    build: Callable[[Row[Any]], T],
) -> Page[T]:
    """Run `query` as one keyset page over the events table (or alias) `keyed`.

    `query` selects from `keyed` with its filters applied; this adds the
    cursor condition, the commit order, the limit and (on Postgres) the
    snapshot horizon, and builds each item with `build`.
    """
    check_limit(limit)
    cursor = _parse(after)
    txid, seq = keyed.c.txid, keyed.c.seq
    query = query.add_columns(txid.label("page_txid"), seq.label("page_seq"))
    if cursor is not None:
        query = query.where(past_cursor(conn, txid, seq, cursor))
    horizon = snapshot_horizon(conn)
    query = query.order_by(*commit_order(conn, txid, seq))
    rows = conn.execute(query.limit(limit + 1)).all()

    items: list[T] = []
    last = cursor
    pending = False
    for row in rows:
        m = row._mapping
        # Rows beyond the horizon sort after every settled row, so the first
        # one ends the page: nothing after it can be returned yet either.
        if horizon is not None and m["page_txid"] >= horizon:
            pending = True
            break
        if len(items) == limit:
            break
        items.append(build(row))
        last = (m["page_txid"], m["page_seq"])
    has_more = not pending and len(rows) > limit
    return Page(
        items,
        None if last is None else f"{last[0]}:{last[1]}",
        has_more=has_more,
        pending=pending,
    )
