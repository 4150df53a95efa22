"""`verify`: recompute the hash chains and name the first event that does not match."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store import _chain
from store._dialect import is_sqlite
from store._errors import InvalidInputError
from store._values import Position
from store.schema import branches, conversations, events

__all__ = ["CHUNK", "Recompute", "Verification", "verify_many"]


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one conversation's chain.

    Attributes:
        ok: every event matches its chain and nothing is missing.
        checked: how many events were hashed (when the client finds a
            mismatch, those up to it; the database hashes them all).
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


Recompute = Literal["auto", "database", "client"]
"""Where `verify` recomputes hashes: `"database"` (in SQL, Postgres only),
`"client"` (in this process, independent of the server's functions), or
`"auto"` (the database on Postgres, the client on SQLite)."""

CHUNK = 200
"""Conversations verified per round of queries: one round serves them all,
so ten thousand small conversations cost fifty rounds, not ten thousand."""


@dataclass(frozen=True)
class _Conversation:
    id: str
    head: Position
    head_hash: bytes


def verify_many(
    conn: Connection,
    tenant: str | None,
    conversation_ids: list[str] | None,
    progress: Callable[[Verification], None] | None = None,
    recompute: Recompute = "auto",
) -> list[Verification]:
    """Verify the given conversations, or every one (of `tenant`, or of all tenants)."""
    check_recompute(recompute)
    if recompute == "database" and is_sqlite(conn):
        raise InvalidInputError(
            "SQLite cannot recompute sha256 in SQL: verify with recompute='client' "
            "(or 'auto', which picks it on SQLite)."
        )
    here = recompute == "client" or is_sqlite(conn)
    results = []
    for chunk in _chunks(conn, tenant, conversation_ids):
        ids = [c.id for c in chunk]
        counts = _counts(conn, ids)
        broken = _orphans(conn, ids)
        chains, hashed = (_verify_here if here else _verify_in_database)(conn, ids)
        ends = _check_ends(conn, ids)
        for conv in chunk:
            result = broken.get(conv.id) or chains.get(conv.id) or ends.get(conv.id)
            checked = hashed.get(conv.id, 0)
            if result is None and checked != counts.get(conv.id, 0):
                result = _strays(conn, conv.id, counts.get(conv.id, 0) - checked)
            if result is None:
                verification = Verification(conv.id, True, checked, conv.head_hash.hex())
            else:
                verification = Verification(
                    conv.id,
                    False,
                    checked if result.checked is None else result.checked,
                    conv.head_hash.hex(),
                    result.problem,
                    result.event_seq,
                    result.event_id,
                )
            results.append(verification)
            if progress is not None:
                progress(verification)
    return results


def check_recompute(recompute: str) -> None:
    """Refuse a `recompute` that is not one of `Recompute`'s values."""
    if recompute not in ("auto", "database", "client"):
        raise InvalidInputError(
            f"recompute must be 'auto', 'database' or 'client', not {recompute!r}."
        )


def _strays(conn: Connection, conversation_id: str, count: int) -> _Problem:
    """Events of the conversation that lie on none of its branches (so no chain covers them)."""
    seq, event_id = _raw(
        conn,
        "SELECT e.seq, CAST(e.id AS TEXT) FROM chatledger_events e WHERE e.conversation_id {ids} "
        "AND NOT EXISTS (SELECT 1 FROM chatledger_branches b WHERE b.id = e.branch_id "
        "AND b.conversation_id = e.conversation_id) ORDER BY e.seq LIMIT 1",
        [conversation_id],
    )[0]
    return _Problem(
        f"{count} event(s) of the conversation lie on none of its branches, the first being "
        f"event {seq} (id '{event_id}'): they were added or moved after the log was written.",
        seq,
        event_id,
    )


def _chunks(
    conn: Connection, tenant: str | None, conversation_ids: list[str] | None
) -> Iterator[list[_Conversation]]:
    """The conversations to verify, `CHUNK` at a time, in id order."""
    c = conversations.c
    query = sa.select(c.id, c.head_branch_id, c.head_position, c.head_hash).order_by(c.id)
    if tenant is not None:
        query = query.where(c.tenant == tenant)
    if conversation_ids is not None:
        query = query.where(c.id.in_(conversation_ids))
    after: str | None = None
    while True:
        page = conn.execute(
            (query if after is None else query.where(c.id > after)).limit(CHUNK)
        ).all()
        if not page:
            return
        yield [
            _Conversation(
                str(r.id), Position(str(r.head_branch_id), r.head_position), bytes(r.head_hash)
            )
            for r in page
        ]
        after = str(page[-1].id)


@dataclass(frozen=True)
class _Problem:
    problem: str
    event_seq: int | None
    event_id: str | None
    checked: int | None = None


def _mismatch(row: Any, checked: int | None = None) -> _Problem:
    seq, event_id, branch_id, position, kind = row
    return _Problem(
        f"Event {seq} (id '{event_id}', position {position} of branch "
        f"'{branch_id}', {kind}) does not match its hash: its content or its "
        f"place in the chain was changed after it was recorded.",
        seq,
        event_id,
        checked,
    )


def _gap(expected: int, row: Any, checked: int | None = None) -> _Problem:
    seq, event_id, branch_id, position, _ = row
    return _Problem(
        f"Event at position {expected} of branch '{branch_id}' is missing: it was "
        f"deleted (the next one recorded is at position {position}).",
        seq,
        event_id,
        checked,
    )


def _raw(conn: Connection, sql: str, ids: list[str], binary: bool = False) -> list[Any]:
    """Rows straight from the driver for `sql`, whose `{ids}` stands for the id list.

    A verify reads every row of the log, and SQLAlchemy's per-row machinery
    would cost more than the hashing.
    """
    dbapi: Any = conn.connection.dbapi_connection
    params: Any
    if is_sqlite(conn):
        sql, params = sql.format(ids="IN (" + ", ".join("?" * len(ids)) + ")"), tuple(ids)
        cursor = dbapi.cursor()
    else:
        sql, params = sql.format(ids="= ANY(%s::uuid[])"), (ids,)
        # The binary protocol: bytea arrives as bytes, not as hex text.
        try:
            cursor = dbapi.cursor(binary=True) if binary else dbapi.cursor()
        except TypeError:  # SQLAlchemy's async psycopg adapter takes no options
            cursor = dbapi.cursor()
    try:
        cursor.execute(sql, params)
        rows: list[Any] = cursor.fetchall()
    finally:
        cursor.close()
    return rows


def _counts(conn: Connection, ids: list[str]) -> dict[str, int]:
    return {
        str(c): n
        for c, n in _raw(
            conn,
            "SELECT conversation_id, count(*) FROM chatledger_events "
            "WHERE conversation_id {ids} GROUP BY conversation_id",
            ids,
        )
    }


def _orphans(conn: Connection, ids: list[str]) -> dict[str, _Problem]:
    """Per conversation, the first branch whose parent event is gone."""
    found: dict[str, _Problem] = {}
    for conversation_id, branch_id, parent_branch_id, parent_position in _raw(
        conn,
        "SELECT b.conversation_id, b.id, b.parent_branch_id, b.parent_position "
        "FROM chatledger_branches b WHERE b.conversation_id {ids} "
        "AND b.parent_branch_id IS NOT NULL AND NOT EXISTS ("
        " SELECT 1 FROM chatledger_branches pb JOIN chatledger_events p"
        " ON p.conversation_id = pb.conversation_id AND p.branch_id = pb.id"
        " WHERE pb.id = b.parent_branch_id AND p.position = b.parent_position) "
        "ORDER BY b.conversation_id, b.id",
        ids,
    ):
        found.setdefault(
            str(conversation_id),
            _Problem(
                f"Branch '{branch_id}' continues event {parent_position} of branch "
                f"'{parent_branch_id}', which is missing: it was deleted.",
                None,
                None,
                0,
            ),
        )
    return found


_ROWS = (
    "SELECT CAST(id AS TEXT), CAST(conversation_id AS TEXT), CAST(branch_id AS TEXT), position, "
    "CAST(run_id AS TEXT), kind, origin, head, idempotency_key, {payload}, seq, hash "
    "FROM chatledger_events WHERE conversation_id {{ids}} "
    "ORDER BY conversation_id, branch_id, position"
)


def _verify_here(conn: Connection, ids: list[str]) -> tuple[dict[str, _Problem], dict[str, int]]:
    """The chains recomputed in this process, from the rows as stored.

    Returns the first problem of each broken conversation, and per
    conversation how many events were hashed.
    """
    # The payload comes as its UTF-8 bytes: what the hash covers, with no
    # decoding and re-encoding of every row's text.
    sql = _ROWS.format(
        payload="CAST(payload AS BLOB)" if is_sqlite(conn) else "convert_to(payload, 'UTF8')"
    )
    rows_by_branch: dict[str, list[Any]] = {}
    stored: dict[tuple[str, int], bytes] = {}
    for row in _raw(conn, sql, ids, binary=True):
        rows_by_branch.setdefault(row[2], []).append(row)
        stored[(row[2], row[3])] = row[11]
    tree = _raw(
        conn,
        "SELECT CAST(conversation_id AS TEXT), CAST(id AS TEXT), CAST(parent_branch_id AS TEXT), "
        "parent_position FROM chatledger_branches WHERE conversation_id {ids} "
        "ORDER BY conversation_id, id",
        ids,
    )

    def parent_hash(parent_id: str | None, position: int | None) -> bytes | None:
        if parent_id is None or position is None:
            return _chain.GENESIS
        if (parent_id, position) in stored:
            return stored[(parent_id, position)]
        found = conn.execute(  # a fork's root branch continues another conversation
            sa.select(events.c.hash)
            .select_from(events.join(branches, branches.c.id == events.c.branch_id))
            .where(
                events.c.conversation_id == branches.c.conversation_id,
                events.c.branch_id == parent_id,
                events.c.position == position,
            )
        ).scalar()
        return None if found is None else bytes(found)

    header, sha256 = _chain.header, hashlib.sha256
    problems: dict[str, _Problem] = {}
    checked: dict[str, int] = {}
    for conversation_id, branch_id, parent_id, parent_position in tree:
        if conversation_id in problems:
            continue
        previous = parent_hash(parent_id, parent_position)
        if previous is None:
            continue  # `_orphans` names it
        expected = (parent_position or 0) + 1
        done = checked.get(conversation_id, 0)
        for row in rows_by_branch.get(branch_id, ()):
            i, c, b, position, run_id, kind, origin, head, key, payload, seq, stored_hash = row
            if position != expected:
                problems[conversation_id] = _gap(expected, (seq, i, b, position, kind), done)
                break
            done += 1
            computed = sha256(
                previous + header(i, c, b, position, run_id, kind, origin, head, key) + payload
            ).digest()
            if computed != stored_hash:
                problems[conversation_id] = _mismatch((seq, i, b, position, kind), done)
                break
            previous = stored_hash
            expected += 1
        checked[conversation_id] = done
    return problems, checked


_GENESIS_SQL = "'\\x" + "00" * 32 + "'::bytea"

# Each branch's events in position order (the unique index gives that order,
# so no sort), each hashed against the one before it (`lag`), the first
# against the event its branch continues. Per conversation, only the count of
# hashed events and the first failing event (with the position it should
# have had) come back.
_IN_DATABASE = f"""
SELECT b.conversation_id::text, count(*),
  (array_agg(x.seq ORDER BY b.id, x.position) FILTER (WHERE x.bad))[1],
  (array_agg(x.expected ORDER BY b.id, x.position) FILTER (WHERE x.bad))[1]
FROM chatledger_branches b
LEFT JOIN chatledger_branches pb ON pb.id = b.parent_branch_id
LEFT JOIN chatledger_events p
  ON p.conversation_id = pb.conversation_id AND p.branch_id = pb.id
  AND p.position = b.parent_position
CROSS JOIN LATERAL (
  SELECT y.seq, y.position, y.expected, y.position <> y.expected OR NOT y.matches AS bad
  FROM (
    SELECT e.seq, e.position,
      coalesce(lag(e.position) OVER w, b.parent_position, 0) + 1 AS expected,
      e.hash = pg_catalog.sha256(
        coalesce(lag(e.hash) OVER w, p.hash, {_GENESIS_SQL}) || {{content}}
      ) AS matches
    FROM chatledger_events e
    WHERE e.conversation_id = b.conversation_id AND e.branch_id = b.id
    WINDOW w AS (ORDER BY e.position)
  ) y
) x
WHERE b.conversation_id {{{{ids}}}}
GROUP BY b.conversation_id
"""

_NAMED = (
    "SELECT seq, CAST(id AS TEXT), CAST(branch_id AS TEXT), position, kind "
    "FROM chatledger_events WHERE seq = ANY(%s)"
)


def _verify_in_database(
    conn: Connection, ids: list[str]
) -> tuple[dict[str, _Problem], dict[str, int]]:
    """The chains recomputed by Postgres in one pass; only counts and failures travel.

    Returns what `_verify_here` returns.
    """
    sql = _IN_DATABASE.format(content=_chain.content_sql(**{f: f"e.{f}" for f in _chain.FIELDS}))
    hashed: dict[str, int] = {}
    failed: dict[str, tuple[int, int]] = {}
    for conversation_id, count, seq, expected in _raw(conn, sql, ids):
        hashed[conversation_id] = count
        if seq is not None:
            failed[conversation_id] = (seq, expected)
    if not failed:
        return {}, hashed
    dbapi: Any = conn.connection.dbapi_connection
    cursor = dbapi.cursor()
    try:
        cursor.execute(_NAMED, ([seq for seq, _ in failed.values()],))
        named = {row[0]: row for row in cursor.fetchall()}
    finally:
        cursor.close()
    problems = {}
    for conversation_id, (seq, expected) in failed.items():
        row = named[seq]
        problems[conversation_id] = _gap(expected, row) if row[3] != expected else _mismatch(row)
    return problems, hashed


def _check_ends(conn: Connection, ids: list[str]) -> dict[str, _Problem]:
    """Deleted tails leave no gap: check what points at the ends of branches."""
    found: dict[str, _Problem] = {}
    for conversation_id, branch_id, position in _raw(
        conn,
        "SELECT c.id, c.head_branch_id, c.head_position FROM chatledger_conversations c "
        "LEFT JOIN chatledger_events e ON e.conversation_id = c.id "
        "AND e.branch_id = c.head_branch_id AND e.position = c.head_position "
        "WHERE c.id {ids} AND (e.hash IS NULL OR e.hash <> c.head_hash)",
        ids,
    ):
        found[str(conversation_id)] = _Problem(
            f"The head's event (position {position} of branch '{branch_id}') is missing: "
            "it was deleted.",
            None,
            None,
        )
    for conversation_id, run_id, position in _raw(
        conn,
        "SELECT r.conversation_id, r.id, r.position FROM chatledger_runs r "
        "WHERE r.conversation_id {ids} AND NOT EXISTS (SELECT 1 FROM chatledger_events e "
        "WHERE e.conversation_id = r.conversation_id AND e.branch_id = r.branch_id "
        "AND e.position = r.position) ORDER BY r.conversation_id, r.id",
        ids,
    ):
        found.setdefault(
            str(conversation_id),
            _Problem(
                f"The last event of run '{run_id}' (position {position}) is missing: "
                "it was deleted.",
                None,
                None,
            ),
        )
    return found
