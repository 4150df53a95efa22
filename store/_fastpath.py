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
- on SQLite, statements cost microseconds in-process but SQLAlchemy's
  connection and expression machinery costs more than executing them, so the
  steps are plain SQL on a DB-API cursor inside the caller's
  `BEGIN IMMEDIATE` transaction (`Store.execute` opens it on the pooled
  driver connection directly).

When the common case does not apply, nothing is written (on SQLite the
transaction is rolled back) and None is returned; the general path then
decides in a transaction of its own, reading everything afresh. Both paths
run under the one conformance suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from hashlib import sha256
from typing import Any, Protocol

from store import _chain
from store._dialect import sqlite_clock, sqlite_time
from store._values import NewEvent
from store.ids import new_id

__all__ = [
    "Append",
    "InPlace",
    "append_postgres",
    "append_sqlite",
    "head_payloads_postgres",
    "head_payloads_sqlite",
]

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
    "origin, head, recorded_at, idempotency_key, payload, hash) VALUES {values}"
)
_SQLITE_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQLITE_VIEW = (
    "INSERT INTO chatledger_view_entries (conversation_id, position, event_seq) VALUES {values}"
)
_SQLITE_MOVE = (
    "UPDATE chatledger_conversations SET head_position = ?, head_open = 1, head_hash = ? "
    "WHERE id = ?"
)


def append_postgres(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    expected: int | None,
    run_id: str | None,
    idempotency_key: str | None,
) -> InPlace | None:
    """Append in place as one statement on an autocommit DB-API cursor, or
    return None having written nothing.

    Raises nothing for a missing conversation: the general path that follows
    reports it.
    """
    ids = [new_id() for _ in encoded]
    cursor.execute(
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
    )
    rows = cursor.fetchall()
    # Columns: head_branch_id, head_position, seq, position, recorded_at, kind, hash.
    if not rows or rows[0][2] is None:
        return None
    return InPlace(
        branch_id=str(rows[0][0]),
        ids=ids,
        written=[(r[2], r[3], r[4], bytes(r[6])) for r in rows],
    )


class Append(Protocol):
    """`append_postgres` and `append_sqlite`: the in-place append over a DB-API cursor."""

    def __call__(
        self,
        cursor: Any,
        tenant: str,
        conversation_id: str,
        encoded: Sequence[tuple[NewEvent, str]],
        *,
        expected: int | None,
        run_id: str | None,
        idempotency_key: str | None,
    ) -> InPlace | None: ...


@lru_cache(maxsize=64)
def _sqlite_values(statement: str, row: str, count: int) -> str:
    return statement.format(values=", ".join([row] * count))


def append_sqlite(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    expected: int | None,
    run_id: str | None,
    idempotency_key: str | None,
) -> InPlace | None:
    """Append in place through a DB-API cursor inside the caller's `BEGIN IMMEDIATE`.

    The writer lock is held, so read-then-write is safe. Returns None having
    written nothing when the common case does not apply.
    """
    cursor.execute(_SQLITE_HEAD, (conversation_id, tenant))
    head = cursor.fetchone()
    if head is None or not head[2]:
        return None
    branch_id, start, previous = head[0], head[1], bytes(head[3])
    if expected is not None and start != expected:
        return None
    key = idempotency_key
    if key is not None:
        cursor.execute(_SQLITE_KEY, (conversation_id, key))
        if cursor.fetchone() is not None:
            return None
    last = len(encoded)
    ids = [new_id() for _ in encoded]
    # The embedded database's clock is this host's: read once, the events of
    # one append share the moment they were recorded.
    now = sqlite_clock()
    recorded_at = sqlite_time(now)
    params: list[object] = []
    hashes: list[bytes] = []
    header = _chain.header
    for i, (item, text) in enumerate(encoded, 1):
        event_key = key if i == 1 else None
        fields = (
            ids[i - 1],
            conversation_id,
            branch_id,
            start + i,
            run_id,
            item.kind,
            item.origin,
            i == last,
        )
        previous = sha256(previous + header(*fields, event_key) + text.encode()).digest()
        hashes.append(previous)
        params += (*fields, recorded_at, event_key, text, previous)
    cursor.execute(_sqlite_values(_SQLITE_INSERT, _SQLITE_ROW, last), params)
    # No RETURNING (it cost a third of a ten-row insert): `seq` is the rowid,
    # and under the writer lock each row of the VALUES list, inserted in order,
    # gets the largest rowid so far plus one (SQLite's documented rule while
    # rowids stay below 2**63 - 1), so this insert's rows end at `lastrowid`.
    first = cursor.lastrowid - last + 1
    written = [(first + i, start + i + 1, now, hashes[i]) for i in range(last)]
    views = [
        v
        for (seq, position, _, _), (item, _) in zip(written, encoded, strict=True)
        if item.kind == "message.recorded"
        for v in (conversation_id, position, seq)
    ]
    if views:
        cursor.execute(_sqlite_values(_SQLITE_VIEW, "(?, ?, ?)", len(views) // 3), views)
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


def head_payloads_postgres(
    cursor: Any, tenant: str, conversation_id: str
) -> list[tuple[int, str]] | None:
    """The head view's (seq, payload) rows in one query; None when there are none.

    None covers both an empty history and a conversation that does not exist
    for this tenant; the caller tells them apart.
    """
    cursor.execute(_PG_HEAD_PAYLOADS, {"id": conversation_id, "tenant": tenant})
    rows: list[tuple[int, str]] = cursor.fetchall()
    return rows or None


def head_payloads_sqlite(
    cursor: Any, tenant: str, conversation_id: str
) -> list[tuple[int, str]] | None:
    """`head_payloads_postgres` through a SQLite DB-API cursor."""
    cursor.execute(_SQLITE_HEAD_PAYLOADS, (conversation_id, tenant))
    rows: list[tuple[int, str]] = cursor.fetchall()
    return rows or None
