"""`verify`: recompute the hash chains and name the first event that does not match."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store import _chain
from store._dialect import is_sqlite
from store._log import get_conversation
from store.schema import branches, conversations, events, runs

__all__ = ["Verification", "verify_conversation", "verify_many"]


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one conversation's chain.

    Attributes:
        ok: every event matches its chain and nothing is missing.
        checked: how many events were recomputed.
        problem: what is wrong, as a sentence, when not ok.
        event_seq: the `seq` of the first event that does not match (or of
            the event after a gap), when there is one.
        head_digest: the conversation's chain head (hex sha256): anchor it
            externally to detect a rewrite of the whole chain.
    """

    conversation_id: str
    ok: bool
    checked: int
    head_digest: str
    problem: str | None = None
    event_seq: int | None = None
    event_id: str | None = None


_ROWS = (
    "SELECT CAST(id AS TEXT), CAST(conversation_id AS TEXT), CAST(branch_id AS TEXT), position, "
    "CAST(run_id AS TEXT), kind, origin, head, idempotency_key, {payload}, seq, hash "
    "FROM chatledger_events WHERE conversation_id = {param} ORDER BY branch_id, position"
)


def _event_rows(conn: Connection, conversation_id: str) -> list[tuple[Any, ...]]:
    """Every event of the conversation as plain tuples, in (branch, position) order.

    Straight from the driver: a verify reads every row of the log, and
    SQLAlchemy's per-row machinery would cost more than the hashing.
    """
    named = conn.dialect.paramstyle in ("pyformat", "format")
    # The payload comes as its UTF-8 bytes: what the hash covers, with no
    # decoding and re-encoding of every row's text.
    sql = _ROWS.format(
        param="%(c)s" if named else "?",
        payload="CAST(payload AS BLOB)" if is_sqlite(conn) else "convert_to(payload, 'UTF8')",
    )
    dbapi: Any = conn.connection.dbapi_connection
    # On Postgres, the binary protocol: bytea arrives as bytes, not as hex text.
    try:
        cursor = dbapi.cursor() if is_sqlite(conn) else dbapi.cursor(binary=True)
    except TypeError:  # SQLAlchemy's async psycopg adapter takes no options
        cursor = dbapi.cursor()
    try:
        cursor.execute(sql, {"c": conversation_id} if named else (conversation_id,))
        rows = cursor.fetchall()
    finally:
        cursor.close()
    return [(*row[:9], bytes(row[9]), row[10], bytes(row[11])) for row in rows]


def verify_conversation(conn: Connection, tenant: str, conversation_id: str) -> Verification:
    """Recompute every event hash of one conversation and check nothing is missing."""
    conv = get_conversation(conn, tenant, conversation_id)
    head_hash = conn.execute(
        sa.select(conversations.c.head_hash).where(conversations.c.id == conv.id)
    ).scalar_one()
    digest = bytes(head_hash).hex()
    tree = conn.execute(
        sa.select(branches.c.id, branches.c.parent_branch_id, branches.c.parent_position).where(
            branches.c.conversation_id == conv.id
        )
    ).all()
    stored: dict[tuple[str, int], bytes] = {}
    rows_by_branch: dict[str, list[Any]] = {b.id: [] for b in tree}
    for row in _event_rows(conn, conv.id):
        rows_by_branch.setdefault(row[2], []).append(row)
        stored[(row[2], row[3])] = bytes(row[11])
    checked = 0

    def parent_hash(parent_id: str | None, position: int | None) -> bytes | None:
        if parent_id is None or position is None:
            return _chain.GENESIS
        if (parent_id, position) in stored:
            return stored[(parent_id, position)]
        found = conn.execute(  # a fork's root branch continues another conversation
            sa.select(events.c.hash).where(
                events.c.branch_id == parent_id, events.c.position == position
            )
        ).scalar()
        return None if found is None else bytes(found)

    def bad(problem: str, row: Any = None) -> Verification:
        return Verification(
            conv.id,
            False,
            checked,
            digest,
            problem,
            None if row is None else row[10],
            None if row is None else row[0],
        )

    for branch in tree:
        previous = parent_hash(branch.parent_branch_id, branch.parent_position)
        expected = (branch.parent_position or 0) + 1
        if previous is None:
            return bad(
                f"Branch '{branch.id}' continues event {branch.parent_position} of branch "
                f"'{branch.parent_branch_id}', which is missing: it was deleted."
            )
        header, sha256 = _chain.header, hashlib.sha256
        for row in rows_by_branch.get(branch.id, []):
            i, c, b, position, run_id, kind, origin, head, key, payload, seq, stored_hash = row
            if position != expected:
                return bad(
                    f"Event at position {expected} of branch '{branch.id}' is missing: it was "
                    f"deleted (the next one recorded is at position {position}).",
                    row,
                )
            computed = sha256(
                previous + header(i, c, b, position, run_id, kind, origin, head, key) + payload
            ).digest()
            checked += 1
            if computed != stored_hash:
                return bad(
                    f"Event {seq} (id '{i}', position {position} of branch "
                    f"'{branch.id}', {kind}) does not match its hash: its content or its "
                    f"place in the chain was changed after it was recorded.",
                    row,
                )
            previous = stored_hash
            expected += 1
    return _check_ends(
        conn, conv.id, conv.head.branch_id, conv.head.position, stored, bytes(head_hash)
    ) or Verification(conv.id, True, checked, digest)


def _check_ends(
    conn: Connection,
    conversation_id: str,
    head_branch: str,
    head_position: int,
    stored: dict[tuple[str, int], bytes],
    head_hash: bytes,
) -> Verification | None:
    """Deleted tails leave no gap: check what points at the ends of branches."""

    def missing(what: str) -> Verification:
        return Verification(
            conversation_id,
            False,
            len(stored),
            head_hash.hex(),
            f"{what} is missing: it was deleted.",
        )

    if stored.get((head_branch, head_position)) != head_hash:
        return missing(f"The head's event (position {head_position} of branch '{head_branch}')")
    for run_id, branch_id, position in conn.execute(
        sa.select(runs.c.id, runs.c.branch_id, runs.c.position).where(
            runs.c.conversation_id == conversation_id
        )
    ):
        if (branch_id, position) not in stored:
            return missing(f"The last event of run '{run_id}' (position {position})")
    return None


def verify_many(
    conn: Connection,
    tenant: str | None,
    conversation_ids: list[str] | None,
    progress: Callable[[Verification], None] | None = None,
) -> list[Verification]:
    """Verify the given conversations, or every one (of `tenant`, or of all tenants)."""
    query = sa.select(conversations.c.id, conversations.c.tenant).order_by(conversations.c.id)
    if tenant is not None:
        query = query.where(conversations.c.tenant == tenant)
    if conversation_ids is not None:
        query = query.where(conversations.c.id.in_(conversation_ids))
    results = []
    for conversation_id, owner in conn.execute(query).all():
        result = verify_conversation(conn, owner, str(conversation_id))
        results.append(result)
        if progress is not None:
            progress(result)
    return results
