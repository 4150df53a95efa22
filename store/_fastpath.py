"""The chat-loop append and the head read, with as little machinery as possible.

The common append continues the head's branch in place: lock the
conversation row, check the head is open (and where the caller expected it,
and the idempotency key unused), insert the events, add them to the head
view and move the head. The general path (`_log.append_messages`) does this
and every other case with SQLAlchemy Core; this module does only the common
case, in plain SQL prepared once:

- on Postgres, each statement is a network round trip, so the five steps are
  one statement of data-modifying CTEs, run in autocommit mode (a single
  statement is atomic by itself): one round trip per append;
- on SQLite, statements cost microseconds in-process but building SQLAlchemy
  expressions costs more than executing them, so the steps are plain SQL
  inside the caller's `BEGIN IMMEDIATE` transaction.

When the common case does not apply, nothing is written and None is returned;
the general path decides (on SQLite in the same transaction). Both paths run
under the one conformance suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from store import _chain
from store._values import NewEvent
from store.ids import new_id

__all__ = ["InPlace", "append_in_place", "head_payloads", "one_statement", "supported"]

_APPEND = """
WITH RECURSIVE c AS (
    SELECT id, head_branch_id, head_position, head_open, head_hash
    FROM chatledger_conversations
    WHERE id = %(cid)s AND tenant = %(tenant)s
    FOR UPDATE
), ok AS (
    SELECT id, head_branch_id, head_position, head_hash FROM c
    WHERE head_open
      AND (%(expected)s::int IS NULL OR head_position = %(expected)s::int)
      AND (%(key)s::text IS NULL OR NOT EXISTS (
          SELECT 1 FROM chatledger_events k
          WHERE k.conversation_id = %(cid)s AND k.idempotency_key = %(key)s::text))
), new AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(kinds)s::text[], %(origins)s::text[],
                         %(payloads)s::text[]) WITH ORDINALITY AS n(id, kind, origin, payload, ord)
), chain (ord, hash) AS (
    SELECT 0::bigint, ok.head_hash FROM ok
    UNION ALL
    SELECT new.ord, sha256(chain.hash || {content})
    FROM chain JOIN new ON new.ord = chain.ord + 1 CROSS JOIN ok
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload, hash)
    SELECT new.id, ok.id, ok.head_branch_id, ok.head_position + new.ord::int, %(run_id)s::uuid,
           new.kind, new.origin, new.ord = %(count)s, clock_timestamp(),
           CASE WHEN new.ord = 1 THEN %(key)s::text END, new.payload, chain.hash
    FROM ok CROSS JOIN new JOIN chain ON chain.ord = new.ord
    ORDER BY new.ord
    RETURNING seq, position, kind, recorded_at, hash
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq)
    SELECT %(cid)s, position, seq FROM ins WHERE kind = 'message.recorded'
), moved AS (
    UPDATE chatledger_conversations AS t
    SET head_position = ok.head_position + %(count)s, head_open = true,
        head_hash = (SELECT hash FROM chain WHERE ord = %(count)s)
    FROM ok WHERE t.id = ok.id
)
SELECT c.head_branch_id, c.head_position, ins.seq, ins.position, ins.recorded_at, ins.kind,
       ins.hash
FROM c LEFT JOIN ins ON true
ORDER BY ins.position
""".replace(
    "{content}",
    _chain.content_sql(
        id="new.id",
        conversation_id="ok.id",
        branch_id="ok.head_branch_id",
        position="ok.head_position + new.ord::int",
        run_id="%(run_id)s::uuid",
        kind="new.kind",
        origin="new.origin",
        head="new.ord = %(count)s",
        idempotency_key="CASE WHEN new.ord = 1 THEN %(key)s::text END",
        payload="new.payload",
    ),
)


@dataclass(frozen=True)
class InPlace:
    """What the in-place append wrote: ids and (seq, position, recorded_at, hash) per event."""

    branch_id: str
    ids: list[str]
    written: list[tuple[int, int, datetime, bytes]]


_SQLITE_HEAD = (
    "SELECT head_branch_id, head_position, head_open, head_hash FROM chatledger_conversations "
    "WHERE id = ? AND tenant = ?"
)
_SQLITE_KEY = "SELECT 1 FROM chatledger_events WHERE conversation_id = ? AND idempotency_key = ?"
_SQLITE_INSERT = (
    "INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind, "
    "origin, head, recorded_at, idempotency_key, payload, hash) VALUES {values} "
    "RETURNING seq, position, recorded_at"
)
_SQLITE_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, chatledger_now(), ?, ?, ?)"
_SQLITE_VIEW = (
    "INSERT INTO chatledger_view_entries (conversation_id, position, event_seq) VALUES {values}"
)
_SQLITE_MOVE = (
    "UPDATE chatledger_conversations SET head_position = ?, head_open = 1, head_hash = ? "
    "WHERE id = ?"
)


def one_statement(conn: Connection) -> bool:
    """Whether the append runs as one autocommit statement (Postgres) or in a transaction."""
    return conn.dialect.name == "postgresql"


def supported(conn: Connection) -> bool:
    """Whether this dialect has a fast path here."""
    return conn.dialect.name in ("postgresql", "sqlite")


def append_in_place(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    expected: int | None,
    run_id: str | None,
    idempotency_key: str | None,
) -> InPlace | None:
    """Append in place, or return None having written nothing.

    Raises nothing for a missing conversation: the general path that follows
    reports it.
    """
    ids = [new_id() for _ in encoded]
    if not one_statement(conn):
        return _sqlite_in_place(
            conn, tenant, conversation_id, encoded, ids, expected, run_id, idempotency_key
        )
    rows = conn.exec_driver_sql(
        _APPEND,
        {
            "cid": conversation_id,
            "tenant": tenant,
            "expected": expected,
            "key": idempotency_key,
            "ids": ids,
            "kinds": [item.kind for item, _ in encoded],
            "origins": [item.origin for item, _ in encoded],
            "payloads": [text for _, text in encoded],
            "run_id": run_id,
            "count": len(encoded),
        },
    ).all()
    if not rows or rows[0].seq is None:
        return None
    return InPlace(
        branch_id=str(rows[0].head_branch_id),
        ids=ids,
        written=[(r.seq, r.position, r.recorded_at, bytes(r.hash)) for r in rows],
    )


def _sqlite_in_place(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    ids: list[str],
    expected: int | None,
    run_id: str | None,
    key: str | None,
) -> InPlace | None:
    # Inside BEGIN IMMEDIATE: the writer lock is ours, so read-then-write is
    # safe. The driver's cursor is used directly: SQLAlchemy's per-statement
    # machinery would cost more than SQLite's work here.
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        return _sqlite_write(cursor, tenant, conversation_id, encoded, ids, expected, run_id, key)
    finally:
        cursor.close()


def _sqlite_write(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    ids: list[str],
    expected: int | None,
    run_id: str | None,
    key: str | None,
) -> InPlace | None:
    cursor.execute(_SQLITE_HEAD, (conversation_id, tenant))
    head = cursor.fetchone()
    if head is None or not head[2]:
        return None
    branch_id, start, previous = head[0], head[1], bytes(head[3])
    if expected is not None and start != expected:
        return None
    if key is not None:
        cursor.execute(_SQLITE_KEY, (conversation_id, key))
        if cursor.fetchone() is not None:
            return None
    last = len(encoded)
    params: list[object] = []
    hashes: dict[int, bytes] = {}
    for i, (item, text) in enumerate(encoded, 1):
        fields = (
            ids[i - 1],
            conversation_id,
            branch_id,
            start + i,
            run_id,
            item.kind,
            item.origin,
            i == last,
            key if i == 1 else None,
            text,
        )
        previous = hashes[start + i] = _chain.link(
            previous, _chain.content(**dict(zip(_chain.FIELDS, fields, strict=True)))
        )
        params += [*fields, previous]
    values = ", ".join([_SQLITE_ROW] * last)
    cursor.execute(_SQLITE_INSERT.format(values=values), params)
    rows = cursor.fetchall()
    written = sorted(
        (seq, position, datetime.fromisoformat(recorded_at), hashes[position])
        for seq, position, recorded_at in rows
    )
    views = [
        (conversation_id, position, seq)
        for (seq, position, _, _), (item, _) in zip(written, encoded, strict=True)
        if item.kind == "message.recorded"
    ]
    if views:
        cursor.execute(
            _SQLITE_VIEW.format(values=", ".join(["(?, ?, ?)"] * len(views))),
            [v for row in views for v in row],
        )
    cursor.execute(_SQLITE_MOVE, (start + last, previous, conversation_id))
    return InPlace(branch_id=branch_id, ids=ids, written=written)


_HEAD_PAYLOADS = (
    "SELECT e.seq, e.payload FROM chatledger_conversations c "
    "JOIN chatledger_view_entries v ON v.conversation_id = c.id "
    "JOIN chatledger_events e ON e.seq = v.event_seq "
    "WHERE c.id = {id} AND c.tenant = {tenant} ORDER BY v.position"
)
_PG_HEAD_PAYLOADS = _HEAD_PAYLOADS.format(id="%(id)s", tenant="%(tenant)s")
_SQLITE_HEAD_PAYLOADS = _HEAD_PAYLOADS.format(id="?", tenant="?")


def head_payloads(
    conn: Connection, tenant: str, conversation_id: str
) -> list[tuple[int, str]] | None:
    """The head view's (seq, payload) rows in one query; None when there are none.

    None covers both an empty history and a conversation that does not exist
    for this tenant; the caller tells them apart.
    """
    if one_statement(conn):
        rows = conn.exec_driver_sql(
            _PG_HEAD_PAYLOADS, {"id": conversation_id, "tenant": tenant}
        ).all()
    else:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(_SQLITE_HEAD_PAYLOADS, (conversation_id, tenant))
            rows = cursor.fetchall()
        finally:
            cursor.close()
    return [(r[0], r[1]) for r in rows] or None
