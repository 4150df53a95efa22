"""Events -> history views.

The history at a position (branch, p) is the ordered `message.recorded`
payloads along the lineage: the branch's own events up to p, preceded by the
lineage of its parent at the fork position. Each conversation's *head* view is
materialized in `chatledger_view_entries` (one row per message, pointing at
its event) and kept current in the same transaction as every append or head
move, so reading a head is one indexed range scan. Any other position is read
from the events by walking the ancestry.

The invariant, checked by a property test: the incrementally maintained view
of every conversation equals `rebuild_views`' recomputation from the events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._sql.dialect import time_value
from chatledger.store._values import Position
from chatledger.store.schema import branches, conversations, events, runs, view_entries

__all__ = [
    "Segment",
    "advance_view",
    "common_prefix",
    "fill_view",
    "head_at",
    "head_is_open",
    "in_segments",
    "lineage",
    "message_payloads",
    "message_rows",
    "move_view",
    "rebuild_views",
    "view_payloads",
    "view_rows",
]

MESSAGE = "message.recorded"

Segment = tuple[str, str, int, int]
"""A piece of a lineage: (conversation id, branch id, first position, last position)."""


def lineage(conn: Connection, tenant: str, at: Position) -> list[Segment]:
    """The segments of the lineage ending at `at`, a branch of `tenant`'s, oldest first.

    A fork's lineage continues in its source, the same tenant's: every step names
    the tenant, which keeps the walk on one shard on Citus."""
    chain = (
        sa.select(
            branches.c.id,
            branches.c.conversation_id,
            branches.c.parent_branch_id,
            branches.c.parent_position,
            sa.literal(0).label("depth"),
        )
        .where(branches.c.id == at.branch_id, branches.c.tenant == tenant)
        .cte("chain", recursive=True)
    )
    parent = branches.alias("parent")
    chain = chain.union_all(
        sa.select(
            parent.c.id,
            parent.c.conversation_id,
            parent.c.parent_branch_id,
            parent.c.parent_position,
            (chain.c.depth + 1).label("depth"),
        ).where(parent.c.id == chain.c.parent_branch_id, parent.c.tenant == tenant)
    )
    rows = conn.execute(
        sa.select(chain.c.conversation_id, chain.c.id, chain.c.parent_position).order_by(
            chain.c.depth
        )
    ).all()
    segments: list[Segment] = []
    last = at.position
    for conversation_id, branch_id, parent_position in rows:
        first = (parent_position or 0) + 1
        if last >= first:
            segments.append((conversation_id, branch_id, first, last))
        last = parent_position or 0
    segments.reverse()
    return segments


def common_prefix(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """The last position up to which two lineages hold the same events."""
    agreed = 0
    for (_, branch_a, _, last_a), (_, branch_b, _, last_b) in zip(a, b, strict=False):
        if branch_a != branch_b:
            break
        agreed = min(last_a, last_b)
        if last_a != last_b:
            break
    return agreed


def in_segments(segments: Sequence[Segment], after: int = 0) -> sa.ColumnElement[bool]:
    clauses = [
        sa.and_(
            events.c.conversation_id == conversation_id,
            events.c.branch_id == branch_id,
            events.c.position.between(max(first, after + 1), last),
        )
        for conversation_id, branch_id, first, last in segments
        if last > after
    ]
    return sa.or_(*clauses) if clauses else sa.false()


def message_rows(
    conn: Connection, tenant: str, segments: Sequence[Segment]
) -> list[tuple[int, str]]:
    """The `message.recorded` (seq, payload) rows along `segments`, in order."""
    rows = conn.execute(
        sa.select(events.c.seq, events.c.payload)
        .where(in_segments(segments), events.c.kind == MESSAGE, events.c.tenant == tenant)
        .order_by(events.c.position)
    ).all()
    return [(seq, payload) for seq, payload in rows]


def message_payloads(conn: Connection, tenant: str, segments: Sequence[Segment]) -> list[str]:
    """The `message.recorded` payloads along `segments`, in order."""
    rows = conn.execute(
        sa.select(events.c.payload)
        .where(in_segments(segments), events.c.kind == MESSAGE, events.c.tenant == tenant)
        .order_by(events.c.position)
    ).scalars()
    return list(rows)


def view_payloads(conn: Connection, tenant: str, conversation_id: str, fork: bool) -> list[str]:
    """The head view's message payloads: one indexed range scan."""
    head = view_rows(tenant, conversation_id, [events.c.payload], fork)
    rows = conn.execute(sa.select(head.c.payload).order_by(head.c.view_position)).scalars()
    return list(rows)


def view_rows(
    tenant: str, conversation_id: str, columns: Sequence[sa.ColumnElement[Any]], fork: bool
) -> sa.Subquery:
    """The head view's events as `columns` of `events`, with the entry's `view_position`.

    The conversation's own entries, whose events are found by
    `(conversation_id, seq)` with the conversation id known when the query is
    planned (on a partitioned log, one partition); for a `fork`, also its
    inherited entries, which name the conversation holding their events.
    """

    def part(holder: sa.ColumnElement[Any], own: bool) -> sa.Select[Any]:
        entry = view_entries.c.event_conversation_id
        return (
            sa.select(view_entries.c.position.label("view_position"), *columns)
            .select_from(
                view_entries.join(
                    events,
                    sa.and_(
                        events.c.conversation_id == holder,
                        events.c.seq == view_entries.c.event_seq,
                        events.c.tenant == view_entries.c.tenant,
                    ),
                )
            )
            .where(
                view_entries.c.conversation_id == conversation_id,
                view_entries.c.tenant == tenant,
                entry.is_(None) if own else entry.is_not(None),
            )
        )

    own = part(view_entries.c.conversation_id, True)
    if not fork:
        return own.subquery("head_view")
    return sa.union_all(own, part(view_entries.c.event_conversation_id, False)).subquery(
        "head_view"
    )


def advance_view(
    conn: Connection, tenant: str, conversation_id: str, rows: Sequence[tuple[int, int]]
) -> None:
    """Add messages appended at the head: `rows` are (position, event seq)."""
    if rows:
        conn.execute(
            view_entries.insert(),
            [
                {
                    "conversation_id": conversation_id,
                    "position": p,
                    "event_seq": s,
                    "tenant": tenant,
                }
                for p, s in rows
            ],
        )


def move_view(
    conn: Connection, tenant: str, conversation_id: str, old: Position, new: Position
) -> None:
    """Bring the head view from lineage `old` to lineage `new`.

    Only the part after the lineages' common prefix is rewritten.
    """
    new_segments = lineage(conn, tenant, new)
    agreed = common_prefix(lineage(conn, tenant, old), new_segments)
    conn.execute(
        view_entries.delete().where(
            view_entries.c.conversation_id == conversation_id,
            view_entries.c.position > agreed,
            view_entries.c.tenant == tenant,
        )
    )
    _fill_view(conn, tenant, conversation_id, new_segments, after=agreed)


def fill_view(conn: Connection, tenant: str, conversation_id: str, head: Position) -> None:
    """Materialize the view of a conversation that has none yet (a new fork)."""
    _fill_view(conn, tenant, conversation_id, lineage(conn, tenant, head))


def _fill_view(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    segments: Sequence[Segment],
    after: int = 0,
) -> None:
    if not any(last > after for *_, last in segments):
        return
    own = sa.literal(conversation_id, type_=view_entries.c.conversation_id.type)
    conn.execute(
        view_entries.insert().from_select(
            ["conversation_id", "position", "event_seq", "event_conversation_id", "tenant"],
            sa.select(
                own,
                events.c.position,
                events.c.seq,
                sa.func.nullif(events.c.conversation_id, own),
                events.c.tenant,
            ).where(
                in_segments(segments, after), events.c.kind == MESSAGE, events.c.tenant == tenant
            ),
        )
    )


def rebuild_views(
    conn: Connection,
    conversation_ids: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    tenant: str | None = None,
) -> int:
    """Drop and recompute head views from the events (of `tenant`'s conversations
    only, when given); return how many were rebuilt.

    `progress(done, total)` is called after each view.
    """
    query = sa.select(
        conversations.c.tenant,
        conversations.c.id,
        conversations.c.head_branch_id,
        conversations.c.head_position,
    )
    if tenant is not None:
        ids = sa.select(conversations.c.id).where(conversations.c.tenant == tenant)
        query = query.where(conversations.c.tenant == tenant)
        conn.execute(
            view_entries.delete().where(
                view_entries.c.tenant == tenant, view_entries.c.conversation_id.in_(ids)
            )
        )
    elif conversation_ids is not None:
        query = query.where(conversations.c.id.in_(conversation_ids))
        conn.execute(
            view_entries.delete().where(view_entries.c.conversation_id.in_(conversation_ids))
        )
    else:
        conn.execute(view_entries.delete())
    heads = conn.execute(query).all()
    for done, (owner, conversation_id, branch_id, position) in enumerate(heads, 1):
        head = Position(branch_id, position)
        _fill_view(conn, owner, conversation_id, lineage(conn, owner, head))
        head_hash = conn.execute(
            sa.select(events.c.hash).where(
                events.c.conversation_id == conversation_id,
                events.c.branch_id == branch_id,
                events.c.position == position,
                events.c.tenant == owner,
            )
        ).scalar_one()
        conn.execute(
            conversations.update()
            .where(conversations.c.id == conversation_id, conversations.c.tenant == owner)
            .values(
                head_open=head_is_open(conn, owner, conversation_id, head),
                head_hash=head_hash,
            )
        )
        if progress is not None:
            progress(done, len(heads))
    return len(heads)


def head_is_open(conn: Connection, tenant: str, conversation_id: str, head: Position) -> bool:
    """Whether `head` is its branch's tip and no running run writes that branch."""
    tip = conn.execute(
        sa.select(sa.func.max(events.c.position)).where(
            events.c.conversation_id == conversation_id,
            events.c.branch_id == head.branch_id,
            events.c.tenant == tenant,
        )
    ).scalar_one()
    busy = conn.execute(
        sa.select(runs.c.id)
        .where(
            runs.c.tenant == tenant,
            runs.c.conversation_id == conversation_id,
            runs.c.branch_id == head.branch_id,
            runs.c.status == "running",
        )
        .limit(1)
    ).first()
    return tip == head.position and busy is None


def head_at(conn: Connection, tenant: str, conversation_id: str, when: datetime) -> Position | None:
    """The conversation's head as of `when`: the last head-setting event by then."""
    row = conn.execute(
        sa.select(events.c.branch_id, events.c.position)
        .where(
            events.c.tenant == tenant,
            events.c.conversation_id == conversation_id,
            events.c.head.is_(True),
            events.c.recorded_at <= time_value(conn, when),
        )
        .order_by(events.c.seq.desc())
        .limit(1)
    ).first()
    return None if row is None else Position(row[0], row[1])


# -- the head read in one query, on a DB-API cursor (Store.execute's fast tier) -----

# A conversation's own entries, then a fork's inherited ones (see `view_rows`).
_OWN_HEAD = (
    "SELECT v.position, e.seq, e.payload FROM chatledger_conversations c "
    "JOIN chatledger_view_entries v ON v.conversation_id = c.id AND v.tenant = c.tenant "
    "JOIN chatledger_events e ON e.conversation_id = v.conversation_id AND e.seq = v.event_seq "
    "AND e.tenant = v.tenant "
    "WHERE c.id = {id} AND c.tenant = {tenant} AND v.event_conversation_id IS NULL"
)
_HEAD_PAYLOADS = (
    "SELECT seq, payload FROM (" + _OWN_HEAD + " UNION ALL "
    "SELECT v.position, e.seq, e.payload FROM chatledger_conversations c "
    "JOIN chatledger_view_entries v ON v.conversation_id = c.id AND v.tenant = c.tenant "
    "JOIN chatledger_events e ON e.conversation_id = v.event_conversation_id "
    "AND e.seq = v.event_seq AND e.tenant = v.tenant "
    "WHERE c.id = {id} AND c.tenant = {tenant}"
    ") h ORDER BY position"
)
# On Postgres, each inherited entry's event is looked up on its own (a
# lateral subquery the planner keeps): a conversation that is no fork has
# none, so no other partition of a partitioned log is read.
_PG_HEAD_PAYLOADS = (
    "SELECT seq, payload FROM (" + _OWN_HEAD + " UNION ALL "
    "SELECT v.position, x.seq, x.payload FROM chatledger_conversations c "
    "JOIN chatledger_view_entries v ON v.conversation_id = c.id AND v.tenant = c.tenant "
    "CROSS JOIN LATERAL (SELECT e.seq, e.payload FROM chatledger_events e "
    "WHERE e.conversation_id = v.event_conversation_id AND e.seq = v.event_seq "
    "AND e.tenant = v.tenant OFFSET 0) x "
    "WHERE c.id = {id} AND c.tenant = {tenant} AND v.event_conversation_id IS NOT NULL"
    ") h ORDER BY position"
).format(id="%(id)s", tenant="%(tenant)s")
_SQLITE_HEAD_PAYLOADS = _HEAD_PAYLOADS.format(id="?", tenant="?")
# A conversation that is no fork (most) has only its own entries: one join,
# ordered by the view's key, planned in a fraction of the time of the union
# above. It reads nothing for a fork, whose inherited entries need the union;
# a reader then runs that.
_OWN_HEAD_FIRST = (
    "SELECT e.seq, e.payload "
    "FROM chatledger_conversations c "
    "JOIN chatledger_view_entries v ON v.conversation_id = c.id AND v.tenant = c.tenant "
    "JOIN chatledger_events e ON e.conversation_id = v.conversation_id AND e.seq = v.event_seq "
    "AND e.tenant = v.tenant "
    "WHERE c.id = {id} AND c.tenant = {tenant} AND c.forked_from_conversation_id IS NULL "
    "AND v.event_conversation_id IS NULL "
    "ORDER BY v.position"
)
_PG_OWN_HEAD = _OWN_HEAD_FIRST.format(id="%(id)s", tenant="%(tenant)s")
_SQLITE_OWN_HEAD = _OWN_HEAD_FIRST.format(id="?", tenant="?")


def head_payloads_postgres(
    cursor: Any, tenant: str, conversation_id: str
) -> list[tuple[Any, ...]] | None:
    """The head view's (seq, payload) rows, in one query for a conversation that is
    no fork; None when there are none.

    None covers both an empty history and a conversation that does not exist
    for this tenant; the caller tells them apart.
    """
    params = {"id": conversation_id, "tenant": tenant}
    cursor.execute(_PG_OWN_HEAD, params)
    own: list[tuple[Any, ...]] = cursor.fetchall()
    if own:
        return own
    # A fork (the first query reads none), or no entries: its inherited entries too.
    cursor.execute(_PG_HEAD_PAYLOADS, params)
    rows: list[tuple[int, str]] = cursor.fetchall()
    return rows or None


def head_payloads_sqlite(
    cursor: Any, tenant: str, conversation_id: str
) -> list[tuple[Any, ...]] | None:
    """`head_payloads_postgres` through a SQLite DB-API cursor."""
    cursor.execute(_SQLITE_OWN_HEAD, (conversation_id, tenant))
    own: list[tuple[Any, ...]] = cursor.fetchall()
    if own:
        return own
    cursor.execute(_SQLITE_HEAD_PAYLOADS, (conversation_id, tenant) * 2)
    rows: list[tuple[int, str]] = cursor.fetchall()
    return rows or None
