"""The chat-loop append on Postgres, in one statement.

The common append continues the head's branch in place: lock the
conversation row, check the head is open (and where the caller expected it),
insert the events, add them to the head view and move the head. Over the
network each statement is a round trip, so on Postgres these five steps are
one statement of data-modifying CTEs. When the in-place path does not apply
(the head is not open, the expectation fails, the idempotency key was used)
it writes nothing but still takes the row lock, and the caller continues
with the general path in the same transaction, which decides what to do.

SQLite runs in-process (a statement costs microseconds, not a round trip), so
it always takes the general path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from store._values import NewEvent
from store.ids import new_id

__all__ = ["InPlace", "append_in_place", "supported"]

_APPEND = """
WITH c AS (
    SELECT id, head_branch_id, head_position, head_open
    FROM chatledger_conversations
    WHERE id = %(cid)s AND tenant = %(tenant)s
    FOR UPDATE
), ok AS (
    SELECT id, head_branch_id, head_position FROM c
    WHERE head_open
      AND (%(expected)s::int IS NULL OR head_position = %(expected)s::int)
      AND (%(key)s::text IS NULL OR NOT EXISTS (
          SELECT 1 FROM chatledger_events k
          WHERE k.conversation_id = %(cid)s AND k.idempotency_key = %(key)s::text))
), new AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(kinds)s::text[], %(origins)s::text[],
                         %(payloads)s::text[]) WITH ORDINALITY AS n(id, kind, origin, payload, ord)
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload)
    SELECT new.id, ok.id, ok.head_branch_id, ok.head_position + new.ord::int, %(run_id)s::uuid,
           new.kind, new.origin, new.ord = %(count)s, clock_timestamp(),
           CASE WHEN new.ord = 1 THEN %(key)s::text END, new.payload
    FROM ok CROSS JOIN new
    ORDER BY new.ord
    RETURNING seq, position, kind, recorded_at
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq)
    SELECT %(cid)s, position, seq FROM ins WHERE kind = 'message.recorded'
), moved AS (
    UPDATE chatledger_conversations AS t
    SET head_position = ok.head_position + %(count)s, head_open = true
    FROM ok WHERE t.id = ok.id
)
SELECT c.head_branch_id, c.head_position, ins.seq, ins.position, ins.recorded_at, ins.kind
FROM c LEFT JOIN ins ON true
ORDER BY ins.position
"""


@dataclass(frozen=True)
class InPlace:
    """What the in-place append wrote: ids and (seq, position, recorded_at) per event."""

    branch_id: str
    ids: list[str]
    written: list[tuple[int, int, datetime]]


def supported(conn: Connection) -> bool:
    """Whether this connection takes the one-statement path."""
    return conn.dialect.name == "postgresql"


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
    """Append in place, or return None having written nothing (the row stays locked).

    Raises nothing for a missing conversation: the general path that follows
    reports it.
    """
    ids = [new_id() for _ in encoded]
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
        written=[(r.seq, r.position, r.recorded_at) for r in rows],
    )
