"""`verify`: recompute the hash chains and name the first event that does not match.

Besides the chains, every event position that the log or its rows name must
hold an event: that is how a deleted tail, which leaves no gap, is found.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._errors import InvalidInputError
from chatledger.store._sql import chain as _chain
from chatledger.store._sql.dialect import is_sqlite
from chatledger.store._values import VALUE_CONFIG, Position
from chatledger.store.ids import is_id
from chatledger.store.schema import branches, conversations, events

__all__ = ["CHUNK", "Recompute", "Verification", "verify_many"]


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one conversation's chain.

    What it proves: every event of the conversation's branches matches its
    hash, positions run without a gap, no event lies outside the branches, and
    every event position that the log or its rows name still holds an event.
    The names are, in the events (hashed, so a name cannot be removed without
    breaking a chain in turn): `head.moved` `from` and `to`, `run.started`
    `base` and `headAtStart`, `branch.created` `parent` and a fork's
    `conversation.created` `forkedFrom`; in the rows: the conversation's head
    (and `head_hash`) and `forked_from`, each branch's parent, each run's last
    event, base and head at start. So a deleted event is found when a later
    event of its branch survives, or when anything that survives names it:
    the line a `move_head` or a completed run left behind, a failed run's
    tail, a resume's or a fork's starting point.

    What it cannot prove: that nothing was cut off where nothing names it.
    A run that did not complete and was never resumed is named only by its
    run row, which is not append-only: delete its last events and rewind the
    row, and the log is consistent again. Likewise the head's own line, cut
    back together with the head row, still verifies; only `head_digest`,
    anchored outside the database, shows that.

    Attributes:
        ok: every event matches its chain and nothing is missing.
        checked: how many events were hashed (when the client finds a
            mismatch, those up to it; the database hashes them all).
        problem: what is wrong, as a sentence, when not ok.
        event_seq: the `seq` of the first event that does not match, of the
            event after a gap, or of the event that names a missing one,
            when there is one (a missing event named only by a row has none).
        event_id: that event's id.
        head_digest: the conversation's chain head (hex sha256): anchor it
            externally to detect a rewrite of the whole chain.
    """

    __pydantic_config__ = VALUE_CONFIG  # camelCase JSON, like every value's

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
    forked_from: Position | None


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
    for owner, chunk in _chunks(conn, tenant, conversation_ids):
        ids = _Ids(owner, [c.id for c in chunk])
        counts = _counts(conn, ids)
        broken = _orphans(conn, ids)
        chains, hashed, naming = (_verify_here if here else _verify_in_database)(conn, ids)
        ends = _check_names(conn, ids, chunk, naming)
        for conv in chunk:
            result = broken.get(conv.id) or chains.get(conv.id) or ends.get(conv.id)
            checked = hashed.get(conv.id, 0)
            if result is None and checked != counts.get(conv.id, 0):
                strays = _Ids(owner, [conv.id])
                result = _strays(conn, strays, counts.get(conv.id, 0) - checked)
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


def _strays(conn: Connection, conversation: _Ids, count: int) -> _Problem:
    """Events of the conversation that lie on none of its branches (so no chain covers them)."""
    seq, event_id = _raw(
        conn,
        "SELECT e.seq, CAST(e.id AS TEXT) FROM chatledger_events e WHERE e.conversation_id {ids} "
        "AND e.tenant = {tenant} AND NOT EXISTS (SELECT 1 FROM chatledger_branches b "
        "WHERE b.id = e.branch_id AND b.conversation_id = e.conversation_id "
        "AND b.tenant = e.tenant) ORDER BY e.seq LIMIT 1",
        conversation,
    )[0]
    return _Problem(
        f"{count} event(s) of the conversation lie on none of its branches, the first being "
        f"event {seq} (id '{event_id}'): they were added or moved after the log was written.",
        seq,
        event_id,
    )


def _chunks(
    conn: Connection, tenant: str | None, conversation_ids: list[str] | None
) -> Iterator[tuple[str, list[_Conversation]]]:
    """The conversations to verify, at most `CHUNK` at a time, each chunk one tenant's
    (every query of a chunk names it: on Citus, one shard), in (tenant, id) order."""
    c = conversations.c
    query = sa.select(
        c.tenant,
        c.id,
        c.head_branch_id,
        c.head_position,
        c.head_hash,
        c.forked_from_branch_id,
        c.forked_from_position,
    ).order_by(c.tenant, c.id)
    if tenant is not None:
        query = query.where(c.tenant == tenant)
    if conversation_ids is not None:
        query = query.where(c.id.in_(conversation_ids))
    after: tuple[str, str] | None = None
    while True:
        page = conn.execute(
            (query if after is None else query.where(sa.tuple_(c.tenant, c.id) > after)).limit(
                CHUNK
            )
        ).all()
        if not page:
            return
        for owner in dict.fromkeys(r.tenant for r in page):
            yield (
                owner,
                [
                    _Conversation(
                        str(r.id),
                        Position(str(r.head_branch_id), r.head_position),
                        bytes(r.head_hash),
                        None
                        if r.forked_from_branch_id is None
                        else Position(str(r.forked_from_branch_id), r.forked_from_position),
                    )
                    for r in page
                    if r.tenant == owner
                ],
            )
        after = (page[-1].tenant, str(page[-1].id))


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


@dataclass(frozen=True)
class _Ids:
    """Conversations of one tenant, as a verify's queries name them."""

    tenant: str
    ids: list[str]


def _raw(conn: Connection, sql: str, ids: _Ids, binary: bool = False) -> list[Any]:
    """Rows straight from the driver for `sql`, whose every `{ids}` stands for the id
    list and every `{tenant}` for their tenant.

    A verify reads every row of the log, and SQLAlchemy's per-row machinery
    would cost more than the hashing.
    """
    if is_sqlite(conn):
        names = {f"i{n}": i for n, i in enumerate(ids.ids)}
        listed = "IN (" + ", ".join(f":{name}" for name in names) + ")"
        return _fetch(
            conn, sql.format(ids=listed, tenant=":tenant"), {"tenant": ids.tenant, **names}
        )
    return _fetch(
        conn,
        sql.format(ids="= ANY(%(ids)s::uuid[])", tenant="%(tenant)s"),
        {"ids": ids.ids, "tenant": ids.tenant},
        binary,
    )


def _fetch(conn: Connection, sql: str, params: Any, binary: bool = False) -> list[Any]:
    """Rows straight from the driver (see `_raw`); `binary` asks psycopg for bytea as bytes."""
    dbapi: Any = conn.connection.dbapi_connection
    if binary and not is_sqlite(conn):
        try:
            cursor = dbapi.cursor(binary=True)
        except TypeError:  # SQLAlchemy's async psycopg adapter takes no options
            cursor = dbapi.cursor()
    else:
        cursor = dbapi.cursor()
    try:
        cursor.execute(sql, params)
        rows: list[Any] = cursor.fetchall()
    finally:
        cursor.close()
    return rows


def _counts(conn: Connection, ids: _Ids) -> dict[str, int]:
    return {
        str(c): n
        for c, n in _raw(
            conn,
            "SELECT conversation_id, count(*) FROM chatledger_events "
            "WHERE conversation_id {ids} AND tenant = {tenant} GROUP BY conversation_id",
            ids,
        )
    }


def _orphans(conn: Connection, ids: _Ids) -> dict[str, _Problem]:
    """Per conversation, the first branch whose parent event is gone.

    The branch's first event (its `branch.created`, or a fork's
    `conversation.created`) chains into the parent and names it: it is the
    event reported. Its chain cannot be checked, so nothing counts as hashed.
    """
    found: dict[str, _Problem] = {}
    for conversation_id, branch_id, parent_branch_id, parent_position, seq, event_id, kind in _raw(
        conn,
        "SELECT CAST(b.conversation_id AS TEXT), CAST(b.id AS TEXT), "
        "CAST(b.parent_branch_id AS TEXT), b.parent_position, f.seq, CAST(f.id AS TEXT), f.kind "
        "FROM chatledger_branches b LEFT JOIN chatledger_events f "
        "ON f.conversation_id = b.conversation_id AND f.branch_id = b.id "
        "AND f.position = b.parent_position + 1 AND f.tenant = b.tenant "
        "WHERE b.conversation_id {ids} AND b.tenant = {tenant} "
        "AND b.parent_branch_id IS NOT NULL AND NOT EXISTS ("
        + _EXISTS_AT.format(
            branch_id="b.parent_branch_id", position="b.parent_position", tenant="b.tenant"
        )
        + ") ORDER BY b.conversation_id, b.id",
        ids,
    ):
        who = f"branch '{branch_id}'"
        if seq is not None:
            who += f" (its first event, {kind} {seq} with id '{event_id}')"
        parent = _Name(
            conversation_id,
            parent_branch_id,
            parent_position,
            who,
            "the point the branch continues",
            seq,
            event_id,
        )
        found.setdefault(conversation_id, parent.missing(checked=0))
    return found


_ROWS = (
    "SELECT CAST(id AS TEXT), CAST(conversation_id AS TEXT), CAST(branch_id AS TEXT), position, "
    "CAST(run_id AS TEXT), kind, origin, head, idempotency_key, {payload}, seq, hash "
    "FROM chatledger_events WHERE conversation_id {{ids}} AND tenant = {{tenant}} "
    "ORDER BY conversation_id, branch_id, position"
)


def _verify_here(conn: Connection, ids: _Ids) -> _Chains:
    """The chains recomputed in this process, from the rows as stored.

    Returns the first problem of each broken conversation, per conversation
    how many events were hashed, and the events whose payload names a
    position (`_Naming`), found on the way.
    """
    # The payload comes as its UTF-8 bytes: what the hash covers, with no
    # decoding and re-encoding of every row's text.
    sql = _ROWS.format(
        payload="CAST(payload AS BLOB)" if is_sqlite(conn) else "convert_to(payload, 'UTF8')"
    )
    rows_by_branch: dict[str, list[Any]] = {}
    stored: dict[tuple[str, int], bytes] = {}
    naming: list[_Naming] = []
    for row in _raw(conn, sql, ids, binary=True):
        rows_by_branch.setdefault(row[2], []).append(row)
        stored[(row[2], row[3])] = row[11]
        if row[5] in _NAMES:
            naming.append((row[1], row[10], row[0], row[5], row[9]))
    tree = _raw(
        conn,
        "SELECT CAST(conversation_id AS TEXT), CAST(id AS TEXT), CAST(parent_branch_id AS TEXT), "
        "parent_position FROM chatledger_branches WHERE conversation_id {ids} "
        "AND tenant = {tenant} ORDER BY conversation_id, id",
        ids,
    )

    def parent_hash(parent_id: str | None, position: int | None) -> bytes | None:
        if parent_id is None or position is None:
            return _chain.GENESIS
        if (parent_id, position) in stored:
            return stored[(parent_id, position)]
        found = conn.execute(  # a fork's root branch continues another conversation
            sa.select(events.c.hash)
            .select_from(
                events.join(
                    branches,
                    sa.and_(
                        branches.c.id == events.c.branch_id,
                        branches.c.tenant == events.c.tenant,
                    ),
                )
            )
            .where(
                events.c.conversation_id == branches.c.conversation_id,
                events.c.branch_id == parent_id,
                events.c.position == position,
                events.c.tenant == ids.tenant,
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
    return problems, checked, naming


_GENESIS_SQL = "'\\x" + "00" * 32 + "'::bytea"

# Each branch's events in position order (the unique index gives that order,
# so no sort), each hashed against the one before it (`lag`), the first
# against the event its branch continues. Per conversation, only the count of
# hashed events, the first failing event (with the position it should have
# had) and the `seq`s of the events whose payload names a position come back.
_IN_DATABASE = f"""
SELECT b.conversation_id::text, count(*),
  (array_agg(x.seq ORDER BY b.id, x.position) FILTER (WHERE x.bad))[1],
  (array_agg(x.expected ORDER BY b.id, x.position) FILTER (WHERE x.bad))[1],
  array_agg(x.seq) FILTER (WHERE x.names)
FROM chatledger_branches b
LEFT JOIN chatledger_branches pb
  ON pb.id = b.parent_branch_id AND pb.tenant = b.tenant AND pb.tenant = {{{{tenant}}}}
LEFT JOIN chatledger_events p
  ON p.conversation_id = pb.conversation_id AND p.branch_id = pb.id
  AND p.position = b.parent_position AND p.tenant = pb.tenant AND p.tenant = {{{{tenant}}}}
CROSS JOIN LATERAL (
  SELECT y.seq, y.position, y.expected, y.position <> y.expected OR NOT y.matches AS bad,
    y.names
  FROM (
    SELECT e.seq, e.position, e.kind IN ({{names}}) AS names,
      coalesce(lag(e.position) OVER w, b.parent_position, 0) + 1 AS expected,
      e.hash = pg_catalog.sha256(
        coalesce(lag(e.hash) OVER w, p.hash, {_GENESIS_SQL}) || {{content}}
      ) AS matches
    FROM chatledger_events e
    WHERE e.conversation_id = b.conversation_id AND e.branch_id = b.id AND e.tenant = b.tenant
      AND e.tenant = {{{{tenant}}}}
    WINDOW w AS (ORDER BY e.position)
  ) y
) x
WHERE b.conversation_id {{{{ids}}}} AND b.tenant = {{{{tenant}}}}
GROUP BY b.conversation_id
"""

_NAMED = (
    "SELECT seq, CAST(id AS TEXT), CAST(branch_id AS TEXT), position, kind "
    "FROM chatledger_events WHERE conversation_id = ANY(CAST(%s AS uuid[])) AND tenant = %s "
    "AND seq = ANY(%s)"
)


def _verify_in_database(conn: Connection, ids: _Ids) -> _Chains:
    """The chains recomputed by Postgres in one pass; only counts and failures travel.

    Returns what `_verify_here` returns; the naming events' payloads are
    fetched by `seq` afterwards.
    """
    sql = _IN_DATABASE.format(
        content=_chain.content_sql(**{f: f"e.{f}" for f in _chain.FIELDS}),
        names=", ".join(f"'{kind}'" for kind in _NAMES),
    )
    hashed: dict[str, int] = {}
    failed: dict[str, tuple[int, int]] = {}
    naming_seqs: list[int] = []
    for conversation_id, count, seq, expected, names in _raw(conn, sql, ids):
        hashed[conversation_id] = count
        if seq is not None:
            failed[conversation_id] = (seq, expected)
        naming_seqs += names or ()
    naming: list[_Naming] = []
    if naming_seqs:
        naming = _fetch(conn, _NAMING, (ids.ids, ids.tenant, naming_seqs))
    problems = {}
    if failed:
        seqs = [seq for seq, _ in failed.values()]
        named = {row[0]: row for row in _fetch(conn, _NAMED, (ids.ids, ids.tenant, seqs))}
        for conversation_id, (seq, expected) in failed.items():
            row = named[seq]
            problems[conversation_id] = (
                _gap(expected, row) if row[3] != expected else _mismatch(row)
            )
    return problems, hashed, naming


_NAMING = (
    "SELECT CAST(conversation_id AS TEXT), seq, CAST(id AS TEXT), kind, payload "
    "FROM chatledger_events WHERE conversation_id = ANY(CAST(%s AS uuid[])) AND tenant = %s "
    "AND seq = ANY(%s)"
)


@dataclass(frozen=True)
class _Name:
    """Something that names an event position: `who` names it as `role`."""

    conversation_id: str
    branch_id: str
    position: int
    who: str
    role: str
    event_seq: int | None = None
    event_id: str | None = None

    def missing(self, checked: int | None = None) -> _Problem:
        """The problem when no event is there."""
        return _Problem(
            f"Conversation '{self.conversation_id}': the event at {self.branch_id}:"
            f"{self.position} is missing, but {self.who} names it as {self.role}. It was "
            f"deleted after it was recorded; restore the log from a backup to recover it.",
            self.event_seq,
            self.event_id,
            checked,
        )


def _check_names(
    conn: Connection, ids: _Ids, chunk: list[_Conversation], naming: list[_Naming]
) -> dict[str, _Problem]:
    """Deleted tails leave no gap: check that every event something names is there.

    Per conversation, the first problem of: the head row; the events that
    name a position (in `seq` order); the run rows and the fork point.
    (Each branch's parent is `_orphans`'.) One query looks them all up.
    """
    found = _check_head(conn, ids)
    names = [*_names_in_events(naming), *_names_in_rows(conn, ids, chunk)]
    absent = _absent(conn, ids.tenant, {(n.branch_id, n.position) for n in names})
    for name in names:
        if (name.branch_id, name.position) in absent:
            found.setdefault(name.conversation_id, name.missing())
    return found


def _check_head(conn: Connection, ids: _Ids) -> dict[str, _Problem]:
    """The head row's event must be there, with the hash the row keeps."""
    found: dict[str, _Problem] = {}
    for conversation_id, branch_id, position, seq, event_id in _raw(
        conn,
        "SELECT CAST(c.id AS TEXT), CAST(c.head_branch_id AS TEXT), c.head_position, e.seq, "
        "CAST(e.id AS TEXT) FROM chatledger_conversations c "
        "LEFT JOIN chatledger_events e ON e.conversation_id = c.id "
        "AND e.branch_id = c.head_branch_id AND e.position = c.head_position "
        "AND e.tenant = c.tenant "
        "WHERE c.id {ids} AND c.tenant = {tenant} AND (e.hash IS NULL OR e.hash <> c.head_hash)",
        ids,
    ):
        if seq is None:
            head = _Name(conversation_id, branch_id, position, "the conversation's row", "its head")
            found[conversation_id] = head.missing()
        else:
            found[conversation_id] = _Problem(
                f"Conversation '{conversation_id}': the hash of its head's event {seq} (id "
                f"'{event_id}', at {branch_id}:{position}) is not the head hash its row keeps: "
                f"the event or the row was changed after it was written; compare both with a "
                f"backup of the log.",
                seq,
                event_id,
            )
    return found


_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "conversation.created": (("forkedFrom", "the point its conversation was forked from"),),
    "branch.created": (("parent", "the point its branch continues"),),
    "run.started": (("base", "its run's base"), ("headAtStart", "the head when its run started")),
    "head.moved": (
        ("from", "the head it moved away from"),
        ("to", "the point it moved the head to"),
    ),
}
"""The payload fields that name an event position ({branchId, position}), per kind."""

_Naming = tuple[str, int, str, str, str | bytes]
"""An event whose kind is in `_NAMES`: conversation id, seq, id, kind, payload."""

_Chains = tuple[dict[str, _Problem], dict[str, int], list[_Naming]]
"""What a chain recomputation returns: problems, hashed counts, naming events."""


def _names_in_events(naming: list[_Naming]) -> Iterator[_Name]:
    """The positions the events' payloads name, in `seq` order.

    The payloads are parsed here, not in SQL: a forged payload that is not
    JSON, or names nothing, must not stop the verify (its hash reports it).
    """
    for conversation_id, seq, event_id, kind, payload in sorted(naming, key=lambda n: n[1]):
        who = f"{kind} event {seq} (id '{event_id}')"
        for role, branch_id, position in _positions_named(kind, payload):
            yield _Name(conversation_id, branch_id, position, who, role, seq, event_id)


def _positions_named(kind: str, payload: str | bytes) -> Iterator[tuple[str, str, int]]:
    """(role, branch id, position) for each position the payload names."""
    try:
        body = json.loads(payload)
    except ValueError:  # also UnicodeDecodeError
        return
    if not isinstance(body, dict):
        return
    for field, role in _NAMES[kind]:
        point = body.get(field)
        if not isinstance(point, dict):
            continue
        branch_id, position = point.get("branchId"), point.get("position")
        # Positions are 32-bit in the tables; anything else names nothing storable.
        if (
            isinstance(branch_id, str)
            and is_id(branch_id)
            and type(position) is int
            and 0 <= position < 2**31
        ):
            yield role, branch_id, position


_RUN_ROLES = (
    ("its last event", 2, 3),
    ("its base", 4, 5),
    ("the head when it started", 6, 7),
)
"""Run rows' names: role, and the columns of branch id and position in `_names_in_rows`."""


def _names_in_rows(conn: Connection, ids: _Ids, chunk: list[_Conversation]) -> Iterator[_Name]:
    """The positions the run rows and the conversations' fork points name."""
    for row in _raw(
        conn,
        "SELECT CAST(conversation_id AS TEXT), CAST(id AS TEXT), CAST(branch_id AS TEXT), "
        "position, CAST(base_branch_id AS TEXT), base_position, "
        "CAST(head_branch_id AS TEXT), head_position FROM chatledger_runs "
        "WHERE conversation_id {ids} AND tenant = {tenant} ORDER BY conversation_id, id",
        ids,
    ):
        for role, branch, position in _RUN_ROLES:
            yield _Name(row[0], row[branch], row[position], f"run '{row[1]}'", role)
    for conv in chunk:
        if conv.forked_from is not None:
            yield _Name(
                conv.id,
                conv.forked_from.branch_id,
                conv.forked_from.position,
                "the conversation's row",
                "the point it was forked from",
            )


_EXISTS_AT = (
    "SELECT 1 FROM chatledger_branches pb JOIN chatledger_events pe "
    "ON pe.conversation_id = pb.conversation_id AND pe.branch_id = pb.id "
    "AND pe.tenant = pb.tenant "
    "WHERE pb.id = {branch_id} AND pe.position = {position} AND pb.tenant = {tenant}"
)
"""Whether an event is at (branch, position): found through the branch's row,
because a name may point into another conversation (a fork's source)."""


def _absent(conn: Connection, tenant: str, points: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Those of `points` (branch id, position, of `tenant`'s branches) that hold no
    event: one query for all."""
    if not points:
        return set()
    if is_sqlite(conn):
        exists = _EXISTS_AT.format(branch_id="t.b", position="t.p", tenant="?")
        sql = (
            "SELECT t.b, t.p FROM (SELECT json_extract(value, '$[0]') AS b, "
            f"json_extract(value, '$[1]') AS p FROM json_each(?)) t WHERE NOT EXISTS ({exists})"
        )
        params: Any = (json.dumps(sorted(points)), tenant)
    else:
        exists = _EXISTS_AT.format(branch_id="t.b", position="t.p", tenant="%s")
        sql = (
            "SELECT t.b::text, t.p FROM unnest(%s::uuid[], %s::int[]) AS t(b, p) "
            f"WHERE NOT EXISTS ({exists})"
        )
        params = ([b for b, _ in points], [p for _, p in points], tenant)
    return {(str(b), int(p)) for b, p in _fetch(conn, sql, params)}
