"""The append: the general path, and the chat-loop fast paths pinned to it.

The common append continues the head's branch in place: lock the
conversation row, check the head is open (and where the caller expected it,
and the idempotency key unused), insert the events, add them to the head
view and move the head. The general path (`append_messages`) does this
and every other case with SQLAlchemy Core; the fast paths (`append_postgres`,
`append_sqlite`) do only the common case, in plain SQL prepared once:

- on Postgres, each statement is a network round trip, so the five steps are
  one statement of data-modifying CTEs, run in autocommit mode (a single
  statement is atomic by itself): one round trip per append. At the head the
  store's last append to the conversation left, a shorter statement that
  moves that head only if it is still there (ADR 0029); when it is not, that
  statement writes nothing and the full one follows;
- on SQLite, statements cost microseconds in-process but SQLAlchemy's
  connection and expression machinery costs more than executing them, so the
  steps are plain SQL on a DB-API cursor inside the caller's
  `BEGIN IMMEDIATE` transaction (`Store.execute` opens it on the pooled
  driver connection directly).

When the common case does not apply, nothing is written (on SQLite the
transaction is rolled back) and None is returned; the general path then
decides in a transaction of its own, reading everything afresh. The
conformance suite runs twice: as shipped, and with the fast paths off
(`Store.open(..., fast_paths=False)`), so both paths answer to the same tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from hashlib import sha256
from typing import Any, Protocol

import sqlalchemy as sa
from psycopg.errors import UniqueViolation
from sqlalchemy.engine import Connection

from chatledger.store import _checks
from chatledger.store._cache import HeadCache
from chatledger.store._checks import MAX_INT32, check_int, check_text
from chatledger.store._crypto import PLAIN, Seal, is_sealed, open_text, split_sealed
from chatledger.store._errors import ConflictError, InvalidInputError, NotFoundError
from chatledger.store._sql import chain as _chain
from chatledger.store._sql import entries as _entries
from chatledger.store._sql.dialect import sqlite_clock, sqlite_time
from chatledger.store._sql.log import (
    create_branch,
    create_conversation_event,
    event_from_row,
    get_conversation,
    insert_events,
    resolve_position,
    set_head,
    utc,
)
from chatledger.store._sql.projector import head_is_open
from chatledger.store._sql.translate import key_name
from chatledger.store._values import Appended, BranchReason, Conversation, Event, NewEvent, Position
from chatledger.store.ids import new_id
from chatledger.store.schema import events

__all__ = [
    "Append",
    "CreateAppend",
    "InPlace",
    "append_messages",
    "append_postgres",
    "append_sqlite",
    "appended_in_place",
    "check_append_options",
    "check_expected",
    "create_append_postgres",
    "create_append_sqlite",
    "create_conversation_postgres",
    "create_conversation_sqlite",
    "event_ids",
    "key_conflict",
    "keyed_event",
    "same_content",
]

_APPEND = """
WITH RECURSIVE c AS (
    SELECT id, head_branch_id, head_position, head_open, head_hash, state, subject, erased_at
    FROM chatledger_conversations
    WHERE id = %(cid)s AND tenant = %(tenant)s
    FOR UPDATE
), ok AS (
    SELECT id, head_branch_id, head_position, head_hash FROM c
    WHERE head_open
      -- Sealed content only into a sealed conversation, and nothing into an
      -- erased one: otherwise the general path says what is wrong.
      AND erased_at IS NULL AND (subject IS NOT NULL) = %(sealed)s
      AND (%(expected)s::int IS NULL OR head_position = %(expected)s::int)
      AND (%(expected_branch)s::uuid IS NULL OR head_branch_id = %(expected_branch)s::uuid)
      AND (%(key)s::text IS NULL OR NOT EXISTS (
          SELECT 1 FROM chatledger_events k
          WHERE k.conversation_id = %(cid)s AND k.idempotency_key = %(key)s::text))
      -- The state's compare-and-set: each expected field holds its value (null:
      -- absent). A state holding \\u0000, which jsonb refuses, declines: the
      -- general path decides.
      AND CASE WHEN %(expected_state)s::jsonb IS NULL THEN true
               WHEN strpos(c.state, '\\u0000') > 0 THEN false
               ELSE NOT EXISTS (
                   SELECT 1 FROM jsonb_each(%(expected_state)s::jsonb) e
                   WHERE coalesce(c.state::jsonb -> e.key, 'null'::jsonb) <> e.value) END
      AND (%(named)s::uuid[] IS NULL OR NOT EXISTS (
          SELECT 1 FROM chatledger_event_ids x WHERE x.id = ANY(%(named)s::uuid[])))
), new AS (
    -- The arrays in binary: in text, psycopg escapes each element with a regular expression.
    SELECT * FROM unnest(%(ids)b::text[]::uuid[], %(kinds)b::text[], %(origins)b::text[],
                         %(payloads)b::text[]) WITH ORDINALITY AS n(id, kind, origin, payload, ord)
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
    RETURNING id, seq, position, kind, recorded_at, hash
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq)
    SELECT %(cid)s, position, seq FROM ins WHERE kind = 'message.recorded'
), named AS (
    INSERT INTO chatledger_event_ids (id, conversation_id, event_seq)
    SELECT id, %(cid)s, seq FROM ins WHERE id = ANY(%(named)s::uuid[])
), moved AS (
    UPDATE chatledger_conversations AS t
    SET head_position = ok.head_position + %(count)s, head_open = true,
        head_hash = (SELECT hash FROM chain WHERE ord = %(count)s),
        state = coalesce(%(state)s::text, t.state)
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
    created: Event | None = None
    """The `conversation.created` event, when the append created the conversation."""


_RACED = frozenset({"pk_chatledger_event_ids", "ix_chatledger_events_idempotency"})
"""Unique keys a concurrent append can take between the fast statement's check and insert."""

# The append at a head known from this store's last append to the
# conversation (`HeadCache`): the client chains the events' hashes from that
# head's hash, and the statement moves the head only if it is still that one
# (branch, position and hash, open, not erased, of the tenant, sealed as the
# content is), which also locks the row; the events and their view entries
# are inserted only when it moved. No row: nothing written, and `_APPEND`
# decides. The server neither reads the head first nor hashes: a third less
# of its CPU than `_APPEND` for a chat turn (ADR 0029).
_AT_HEAD = """
WITH moved AS (
    UPDATE chatledger_conversations
    SET head_position = %(last)s, head_hash = %(hash)s
    WHERE id = %(cid)s::uuid AND tenant = %(tenant)s AND head_open AND erased_at IS NULL
      AND (subject IS NOT NULL) = %(sealed)s AND head_branch_id = %(branch)s::uuid
      AND head_position = %(position)s AND head_hash = %(previous)s
    RETURNING id
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload, hash)
    {rows}
    RETURNING seq, position, kind, recorded_at
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq)
    SELECT %(cid)s::uuid, position, seq FROM ins WHERE kind = 'message.recorded'
)
SELECT seq, position, recorded_at FROM ins ORDER BY position
"""
_APPEND_AT_HEAD = _AT_HEAD.format(
    rows="""SELECT n.id::uuid, moved.id, %(branch)s::uuid, %(position)s + n.ord::int,
           %(run_id)s::uuid, %(kind)s, %(origin)s, n.ord = %(count)s, clock_timestamp(), NULL,
           n.payload, n.hash
    FROM moved CROSS JOIN unnest(%(ids)b::text[], %(payloads)b::text[], %(hashes)b::bytea[])
         WITH ORDINALITY AS n(id, payload, hash, ord)
    ORDER BY n.ord"""
)
# One message, the chat turn: scalars, which psycopg sends without building arrays.
_APPEND_ONE_AT_HEAD = _AT_HEAD.format(
    rows="""SELECT %(id)s::uuid, moved.id, %(branch)s::uuid, %(last)s, %(run_id)s::uuid,
           %(kind)s, %(origin)s, true, clock_timestamp(), NULL, %(payload)s, %(hash)s
    FROM moved"""
)

_SQLITE_HEAD = (
    "SELECT head_branch_id, head_position, head_open, head_hash, state, "
    "subject IS NOT NULL, erased_at IS NULL "
    "FROM chatledger_conversations WHERE id = ? AND tenant = ?"
)
_SQLITE_NAMED = "INSERT INTO chatledger_event_ids (id, conversation_id, event_seq) VALUES {values}"
_SQLITE_NAMED_TAKEN = "SELECT 1 FROM chatledger_event_ids WHERE id IN ({ids}) LIMIT 1"
_SQLITE_MOVE_STATE = (
    "UPDATE chatledger_conversations SET head_position = ?, head_open = 1, head_hash = ?, "
    "state = ? WHERE id = ?"
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
    named: Sequence[str] | None = None,
    state: str | None = None,
    expected_state: Mapping[str, Any] | None = None,
    expected_branch: str | None = None,
    sealed: bool = False,
    heads: HeadCache | None = None,
) -> InPlace | None:
    """Append in place as one statement on an autocommit DB-API cursor, or
    return None having written nothing.

    Raises nothing for a missing conversation: the general path that follows
    reports it. `named`, `state` and `expected_state` are those of the general
    path (`ids`, `state`, `expected_state`); `expected_branch` is the branch of
    an expected `Position`. With `heads`, a plain append (no key, ids or state)
    first tries the head this store's last append left (`_APPEND_AT_HEAD`; a
    second statement follows when that head moved), and every append that
    writes leaves its head there.
    """
    plain = idempotency_key is None and named is None and state is None
    if heads is not None and plain and _uniform(encoded):
        known = heads.get(tenant, conversation_id)
        if (
            known is not None
            and expected_state is None
            and expected in (None, known[1])
            and expected_branch in (None, known[0])
        ):
            done = _append_at_head(cursor, tenant, conversation_id, encoded, known, run_id, sealed)
            if done is not None:
                return _kept(heads, tenant, conversation_id, done)
            heads.forget(tenant, conversation_id)
    expected_text = None if expected_state is None else json.dumps(dict(expected_state))
    if expected_text is not None and "\\u0000" in expected_text:
        return None  # jsonb refuses \u0000: the general path compares it
    ids = event_ids(named, len(encoded))
    try:
        cursor.execute(
            _APPEND,
            {
                "cid": conversation_id,
                "tenant": tenant,
                "expected": expected,
                "expected_branch": expected_branch,
                "key": idempotency_key,
                "expected_state": expected_text,
                "named": None if named is None else list(named),
                "state": state,
                "ids": ids,
                "kinds": [item.kind for item, _ in encoded],
                "origins": [item.origin for item, _ in encoded],
                "payloads": [text for _, text in encoded],
                "run_id": run_id,
                "count": len(encoded),
                "sealed": sealed,
            },
        )
    except UniqueViolation as error:
        # A concurrent append took one of the caller's ids or the idempotency
        # key after this statement's snapshot: it wrote nothing; the general
        # path reports the taken id, or replays the key's append.
        if key_name(error.diag.constraint_name) in _RACED:
            return None
        raise
    rows = cursor.fetchall()
    # Columns: head_branch_id, head_position, seq, position, recorded_at, kind, hash.
    if not rows or rows[0][2] is None:
        return None
    done = InPlace(
        branch_id=str(rows[0][0]),
        ids=ids,
        written=[(r[2], r[3], r[4], bytes(r[6])) for r in rows],
    )
    return _kept(heads, tenant, conversation_id, done)


def _append_at_head(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    head: tuple[str, int, bytes],
    run_id: str | None,
    sealed: bool,
) -> InPlace | None:
    """`encoded` appended after `head` (branch, position, hash) by `_APPEND_AT_HEAD`,
    the hashes chained here; None, having written nothing, when the head is elsewhere.

    The ids are hashed as given, so they must be canonical (as `Operations`
    checks them): the full statement hashes the database's spelling.
    """
    branch_id, position, head_hash = head
    ids = [new_id() for _ in encoded]
    hashes = _chained(head_hash, ids, conversation_id, branch_id, position, encoded, run_id, None)
    last = len(encoded)
    first = encoded[0][0]  # the kind and origin of every event (`_uniform`)
    params: dict[str, Any] = {
        "cid": conversation_id,
        "tenant": tenant,
        "branch": branch_id,
        "position": position,
        "previous": head_hash,
        "last": position + last,
        "hash": hashes[-1],
        "sealed": sealed,
        "run_id": run_id,
        "kind": first.kind,
        "origin": first.origin,
    }
    if last == 1:
        params.update(id=ids[0], payload=encoded[0][1])
        cursor.execute(_APPEND_ONE_AT_HEAD, params)
    else:
        params.update(count=last, ids=ids, payloads=[t for _, t in encoded], hashes=hashes)
        cursor.execute(_APPEND_AT_HEAD, params)
    rows = cursor.fetchall()  # (seq, position, recorded_at) per event
    if not rows:
        return None
    return InPlace(
        branch_id=branch_id,
        ids=ids,
        written=[(r[0], r[1], r[2], h) for r, h in zip(rows, hashes, strict=True)],
    )


def _chained(
    previous: bytes,
    ids: Sequence[str],
    conversation_id: str,
    branch_id: str,
    start: int,
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    key: str | None,
) -> list[bytes]:
    """The hashes of `encoded` appended after a head at `start` whose hash is
    `previous`: the last event is the head, and the first carries `key`."""
    hashes: list[bytes] = []
    last = len(encoded)
    header = _chain.header
    for i, (item, text) in enumerate(encoded, 1):
        fields = (ids[i - 1], conversation_id, branch_id, start + i, run_id, item.kind)
        content = header(*fields, item.origin, i == last, key if i == 1 else None)
        previous = sha256(previous + content + text.encode()).digest()
        hashes.append(previous)
    return hashes


def _uniform(encoded: Sequence[tuple[NewEvent, str]]) -> bool:
    """Whether the events share one kind and one origin (an append of messages does),
    as `_APPEND_AT_HEAD` writes them."""
    if not encoded:
        return False
    first = encoded[0][0]
    return all(item.kind == first.kind and item.origin == first.origin for item, _ in encoded)


def _kept(heads: HeadCache | None, tenant: str, conversation_id: str, done: InPlace) -> InPlace:
    """`done`, the head it left (branch, last position, last hash) kept in `heads`."""
    if heads is not None:
        _, position, _, last_hash = done.written[-1]
        heads.put(tenant, conversation_id, (done.branch_id, position, last_hash))
    return done


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
        named: Sequence[str] | None = None,
        state: str | None = None,
        expected_state: Mapping[str, Any] | None = None,
        expected_branch: str | None = None,
        sealed: bool = False,
    ) -> InPlace | None: ...


def event_ids(named: Sequence[str] | None, count: int) -> list[str]:
    """The ids of `count` new events: the caller's for the first ones, then minted."""
    given = list(named or ())
    return given + [new_id() for _ in range(count - len(given))]


class CreateAppend(Protocol):
    """`create_append_postgres` and `create_append_sqlite`."""

    def __call__(
        self,
        cursor: Any,
        tenant: str,
        conversation_id: str,
        root: tuple[str, str],
        encoded: Sequence[tuple[NewEvent, str]],
        *,
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
    named: Sequence[str] | None = None,
    state: str | None = None,
    expected_state: Mapping[str, Any] | None = None,
    expected_branch: str | None = None,
    sealed: bool = False,
) -> InPlace | None:
    """Append in place through a DB-API cursor inside the caller's `BEGIN IMMEDIATE`.

    The writer lock is held, so read-then-write is safe. Returns None having
    written nothing when the common case does not apply. `named`, `state` and
    `expected_state` are as for `append_postgres`.
    """
    cursor.execute(_SQLITE_HEAD, (conversation_id, tenant))
    head = cursor.fetchone()
    if head is None or not head[2] or bool(head[5]) != sealed or not head[6]:
        return None
    branch_id, start, head_hash = head[0], head[1], bytes(head[3])
    if expected is not None and start != expected:
        return None
    if expected_branch is not None and branch_id != expected_branch:
        return None
    if expected_state is not None and _entries.changed_fields(json.loads(head[4]), expected_state):
        return None
    key = idempotency_key
    if key is not None:
        cursor.execute(_SQLITE_KEY, (conversation_id, key))
        if cursor.fetchone() is not None:
            return None
    if named:
        cursor.execute(_SQLITE_NAMED_TAKEN.format(ids=", ".join("?" * len(named))), list(named))
        if cursor.fetchone() is not None:
            return None
    last = len(encoded)
    ids = event_ids(named, last)
    # The embedded database's clock is this host's: read once, the events of
    # one append share the moment they were recorded.
    now = sqlite_clock()
    recorded_at = sqlite_time(now)
    hashes = _chained(head_hash, ids, conversation_id, branch_id, start, encoded, run_id, key)
    params: list[object] = []
    for i, ((item, text), event_hash) in enumerate(zip(encoded, hashes, strict=True), 1):
        event_key = key if i == 1 else None
        fields = (ids[i - 1], conversation_id, branch_id, start + i, run_id, item.kind)
        params += (*fields, item.origin, i == last, recorded_at, event_key, text, event_hash)
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
    if named:
        rows = [v for i in range(len(named)) for v in (ids[i], conversation_id, written[i][0])]
        cursor.execute(_sqlite_values(_SQLITE_NAMED, "(?, ?, ?)", len(named)), rows)
    if state is None:
        cursor.execute(_SQLITE_MOVE, (start + last, hashes[-1], conversation_id))
    else:
        cursor.execute(_SQLITE_MOVE_STATE, (start + last, hashes[-1], state, conversation_id))
    return InPlace(branch_id=branch_id, ids=ids, written=written)


# -- a conversation created by its first append (ADR 0016) ---------------------------
#
# They write what `create_conversation` followed by `append_messages` write in
# one transaction (the general path below does exactly that): the
# conversation row, its `root` branch, `conversation.created` at position 1
# (not flagged `head`: this commit leaves the head at the last message), the
# messages from position 2 and their view rows. Everything is new, so every
# hash is computed here from the genesis hash, and one reading of the clock
# stamps every row. A taken id (this tenant's conversation exists, or another
# tenant's) writes nothing and returns None: the caller then appends in place,
# or the general path decides. tests/store/test_fast_paths.py compares the rows.

_CREATE_APPEND_POSTGRES = """
WITH conv AS (
    INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, head_open,
                                          head_hash, created_at, metadata)
    VALUES (%(cid)s::uuid, %(tenant)s, %(bid)s::uuid, %(last)s, true, %(hash)s,
            clock_timestamp(), %(meta)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING created_at
), branch AS (
    INSERT INTO chatledger_branches (id, conversation_id, reason, created_at)
    SELECT %(bid)s::uuid, %(cid)s::uuid, 'root', created_at FROM conv
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload, hash)
    SELECT n.id, %(cid)s::uuid, %(bid)s::uuid, n.ord::int,
           CASE WHEN n.ord > 1 THEN %(run_id)s::uuid END, n.kind, n.origin,
           n.ord = %(last)s, conv.created_at, CASE WHEN n.ord = 2 THEN %(key)s::text END,
           n.payload, n.hash
    FROM conv CROSS JOIN unnest(%(ids)b::text[]::uuid[], %(kinds)b::text[],
                                %(origins)b::text[], %(payloads)b::text[], %(hashes)b::bytea[])
         WITH ORDINALITY AS n(id, kind, origin, payload, hash, ord)
    ORDER BY n.ord
    RETURNING seq, position, kind
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq)
    SELECT %(cid)s::uuid, position, seq FROM ins WHERE kind = 'message.recorded'
)
SELECT conv.created_at, ins.seq FROM conv CROSS JOIN ins ORDER BY ins.position
"""


@dataclass(frozen=True)
class _Fresh:
    """A new conversation's rows as the create-append forms write them."""

    branch_id: str
    ids: list[str]
    """The `conversation.created` event's, then one per message."""
    kinds: list[str]
    origins: list[str]
    payloads: list[str]
    keys: list[str | None]
    hashes: list[bytes]


_SQLITE_NEW_CONVERSATION = (
    "INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, "
    "head_open, head_hash, created_at, metadata) VALUES (?, ?, ?, ?, 1, ?, ?, ?) "
    "ON CONFLICT (id) DO NOTHING"
)
_SQLITE_NEW_BRANCH = (
    "INSERT INTO chatledger_branches (id, conversation_id, reason, created_at) "
    "VALUES (?, ?, 'root', ?)"
)


def _fresh(
    conversation_id: str,
    created: str,
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    key: str | None,
) -> _Fresh:
    """The rows of a new conversation whose first append is `encoded`, hashed from genesis."""
    branch_id = new_id()
    ids = [new_id() for _ in range(len(encoded) + 1)]
    kinds: list[str] = ["conversation.created", *(item.kind for item, _ in encoded)]
    origins: list[str] = ["client", *(item.origin for item, _ in encoded)]
    payloads = [created, *(text for _, text in encoded)]
    keys = [None, *(key if i == 0 else None for i in range(len(encoded)))]
    hashes: list[bytes] = []
    previous = _chain.GENESIS
    last = len(ids)
    header = _chain.header
    for i in range(last):
        event_run = run_id if i else None
        fields = (ids[i], conversation_id, branch_id, i + 1, event_run, kinds[i], origins[i])
        content = header(*fields, i + 1 == last, keys[i]) + payloads[i].encode()
        previous = sha256(previous + content).digest()
        hashes.append(previous)
    return _Fresh(branch_id, ids, kinds, origins, payloads, keys, hashes)


def _created_event(conversation_id: str, fresh: _Fresh, seq: int, recorded_at: datetime) -> Event:
    return Event(
        seq=seq,
        id=fresh.ids[0],
        conversation_id=conversation_id,
        branch_id=fresh.branch_id,
        position=1,
        run_id=None,
        kind="conversation.created",
        origin="client",
        head=False,
        recorded_at=utc(recorded_at),
        idempotency_key=None,
        payload_json=fresh.payloads[0],
        hash=fresh.hashes[0],
    )


def create_append_postgres(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    root: tuple[str, str],
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    run_id: str | None,
    idempotency_key: str | None,
    heads: HeadCache | None = None,
) -> InPlace | None:
    """Create the conversation and append `encoded` as one statement on an
    autocommit DB-API cursor, or return None having written nothing (the id is
    taken). `root` is `encode_root`'s (metadata text, created payload). With
    `heads`, the head it leaves is kept there (see `append_postgres`)."""
    meta_text, created = root
    fresh = _fresh(conversation_id, created, encoded, run_id, idempotency_key)
    cursor.execute(
        _CREATE_APPEND_POSTGRES,
        {
            "cid": conversation_id,
            "tenant": tenant,
            "bid": fresh.branch_id,
            "last": len(fresh.ids),
            "hash": fresh.hashes[-1],
            "meta": meta_text,
            "run_id": run_id,
            "key": idempotency_key,
            "ids": fresh.ids,
            "kinds": fresh.kinds,
            "origins": fresh.origins,
            "payloads": fresh.payloads,
            "hashes": fresh.hashes,
        },
    )
    rows = cursor.fetchall()  # (created_at, seq) per event, in position order
    if not rows:
        return None
    at = rows[0][0]
    done = InPlace(
        branch_id=fresh.branch_id,
        ids=fresh.ids[1:],
        written=[
            (r[1], i, at, h)
            for i, (r, h) in enumerate(zip(rows, fresh.hashes, strict=True), 1)
            if i > 1
        ],
        created=_created_event(conversation_id, fresh, rows[0][1], at),
    )
    return _kept(heads, tenant, conversation_id, done)


def create_append_sqlite(
    cursor: Any,
    tenant: str,
    conversation_id: str,
    root: tuple[str, str],
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    run_id: str | None,
    idempotency_key: str | None,
) -> InPlace | None:
    """Create the conversation and append `encoded` through a DB-API cursor inside
    the caller's `BEGIN IMMEDIATE`, or return None having written nothing (the
    id is taken). `root` as for `create_append_postgres`."""
    meta_text, created = root
    fresh = _fresh(conversation_id, created, encoded, run_id, idempotency_key)
    last = len(fresh.ids)
    now = sqlite_clock()
    at = sqlite_time(now)
    cursor.execute(
        _SQLITE_NEW_CONVERSATION,
        (conversation_id, tenant, fresh.branch_id, last, fresh.hashes[-1], at, meta_text),
    )
    if cursor.rowcount != 1:
        return None  # the conversation row comes first: nothing was written
    cursor.execute(_SQLITE_NEW_BRANCH, (fresh.branch_id, conversation_id, at))
    params: list[object] = []
    for i in range(last):
        params += (
            fresh.ids[i],
            conversation_id,
            fresh.branch_id,
            i + 1,
            run_id if i else None,
            fresh.kinds[i],
            fresh.origins[i],
            i + 1 == last,
            at,
            fresh.keys[i],
            fresh.payloads[i],
            fresh.hashes[i],
        )
    cursor.execute(_sqlite_values(_SQLITE_INSERT, _SQLITE_ROW, last), params)
    first = cursor.lastrowid - last + 1  # the rowid rule of `append_sqlite`
    views = [
        v
        for i in range(1, last)
        if fresh.kinds[i] == "message.recorded"
        for v in (conversation_id, i + 1, first + i)
    ]
    if views:
        cursor.execute(_sqlite_values(_SQLITE_VIEW, "(?, ?, ?)", len(views) // 3), views)
    return InPlace(
        branch_id=fresh.branch_id,
        ids=fresh.ids[1:],
        written=[(first + i, i + 1, now, fresh.hashes[i]) for i in range(1, last)],
        created=_created_event(conversation_id, fresh, first, now),
    )


_CREATE_POSTGRES = """
WITH conv AS (
    INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, head_open,
                                          head_hash, created_at, metadata)
    VALUES (%(cid)s::uuid, %(tenant)s, %(bid)s::uuid, 1, true, %(hash)s, clock_timestamp(),
            %(meta)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING created_at
), branch AS (
    INSERT INTO chatledger_branches (id, conversation_id, reason, created_at)
    SELECT %(bid)s::uuid, %(cid)s::uuid, 'root', created_at FROM conv
), created AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, kind, origin, head,
                                   recorded_at, payload, hash)
    SELECT %(eid)s::uuid, %(cid)s::uuid, %(bid)s::uuid, 1, 'conversation.created', 'client',
           true, created_at, %(payload)s, %(hash)s
    FROM conv
)
SELECT created_at FROM conv
"""
"""`_CREATE_APPEND_POSTGRES`'s rows for no messages, with scalar parameters: the
arrays, `unnest` and the returned rows cost a creation a third more time
(0.41-0.46 against 0.58-0.60 ms a call on the bench machine)."""


def create_conversation_postgres(
    cursor: Any, tenant: str, conversation_id: str | None, meta_text: str, payload: str
) -> Conversation | None:
    """`create_conversation` of a root conversation: the rows of the create-append
    form with no messages (one statement), or None having written nothing (the id
    is taken). The inputs are checked already; `meta_text` and `payload` come
    from `encode_root`. tests/store/test_fast_paths.py compares the rows with the
    general path's."""
    cid = conversation_id or new_id()
    fresh = _fresh(cid, payload, [], None, None)
    cursor.execute(
        _CREATE_POSTGRES,
        {
            "cid": cid,
            "tenant": tenant,
            "bid": fresh.branch_id,
            "hash": fresh.hashes[0],
            "meta": meta_text,
            "eid": fresh.ids[0],
            "payload": payload,
        },
    )
    row = cursor.fetchone()
    if row is None:
        return None
    return _root(tenant, cid, fresh.branch_id, utc(row[0]), meta_text)


def create_conversation_sqlite(
    cursor: Any, tenant: str, conversation_id: str | None, meta_text: str, payload: str
) -> Conversation | None:
    """`create_conversation_postgres` through a SQLite DB-API cursor inside the
    caller's `BEGIN IMMEDIATE`."""
    cid = conversation_id or new_id()
    done = create_append_sqlite(
        cursor, tenant, cid, (meta_text, payload), [], run_id=None, idempotency_key=None
    )
    if done is None or done.created is None:
        return None
    return _root(tenant, cid, done.branch_id, done.created.recorded_at, meta_text)


def _root(
    tenant: str, conversation_id: str, branch_id: str, created_at: datetime, meta_text: str
) -> Conversation:
    """A new root conversation, as `get_conversation` reads it back."""
    return Conversation(
        id=conversation_id,
        tenant=tenant,
        head=Position(branch_id, 1),
        head_open=True,
        created_at=created_at,
        metadata=json.loads(meta_text),
        forked_from=None,
    )


# -- the general path: every case, with SQLAlchemy Core ------------------------------


def keyed_event(conn: Connection, conversation_id: str, key: str) -> Event | None:
    """The event that carries idempotency key `key` in the conversation (the first of its append)."""
    row = conn.execute(
        sa.select(events).where(
            events.c.conversation_id == conversation_id, events.c.idempotency_key == key
        )
    ).first()
    return None if row is None else event_from_row(row)


def key_conflict(conversation_id: str, key: str) -> InvalidInputError:
    """The error for an idempotency key replayed with other content: the caller's
    mistake, not a race (a `ConflictError` invites a retry, which would fail for ever)."""
    return InvalidInputError(
        f"Idempotency key {key!r} of conversation '{conversation_id}' was used for a "
        f"different append (other messages, more or fewer of them, or another run), so "
        f"nothing was written and a retry fails the same way: use a new key for new content, "
        f"and reuse a key only to retry the very same append."
    )


def same_content(
    written: Sequence[Event],
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    seal: Seal = PLAIN,
) -> bool:
    """Whether `written` are exactly the events `encoded` would write (a true retry).

    Sealed payloads differ on every sealing (a fresh nonce): they are compared
    opened, under the seal's key; content under another key is other content.
    """
    keys = {} if seal.key is None else {seal.key.key_id: seal.key}

    def plain(text: str) -> str | None:
        if not is_sealed(text):
            return text
        return open_text(text, keys) if split_sealed(text)[0] in keys else None

    return len(written) == len(encoded) and all(
        plain(e.payload_json) == plain(text)
        and e.kind == item.kind
        and e.origin == item.origin
        and e.run_id == run_id
        for e, (item, text) in zip(written, encoded, strict=True)
    )


def replayed(
    conn: Connection,
    conv: Conversation,
    key: str,
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    ids: Sequence[str] | None = None,
    seal: Seal = PLAIN,
) -> Appended | None:
    """The original append of an idempotency key, if the key was used.

    An append's events end at its first event flagged `head` (an append
    always moves the head past its last event), so the original is known
    exactly: a retry with fewer, more or other messages, or one that would
    reach into a later append, is an `InvalidInputError`, never a partial replay.
    """
    first = keyed_event(conn, conv.id, key)
    if first is None:
        return None
    rows = conn.execute(
        sa.select(events)
        .where(
            events.c.conversation_id == conv.id,
            events.c.branch_id == first.branch_id,
            events.c.position >= first.position,
        )
        .order_by(events.c.position)
        .limit(len(encoded) + 1)
    ).all()
    original: list[Event] = []
    for row in rows:
        original.append(event_from_row(row))
        if original[-1].head:
            break
    else:
        raise key_conflict(conv.id, key)  # no end within reach: the original was longer
    if not same_content(original, encoded, run_id, seal) or (
        ids is not None and [e.id for e in original[: len(ids)]] != list(ids)
    ):
        raise key_conflict(conv.id, key)
    return Appended(conv.id, original, conv.head)


def append_messages(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    expected: int | Position | None,
    run_id: str | None,
    idempotency_key: str | None,
    create: bool = False,
    metadata: dict[str, Any] | None = None,
    after: int | Position | None = None,
    ids: Sequence[str] | None = None,
    state: str | None = None,
    expected_state: Mapping[str, Any] | None = None,
    seal: Seal = PLAIN,
) -> Appended:
    """Append one turn at the head and move the head past it, atomically.

    The conversation row lock serializes appends to one conversation. When
    the head is not the tip of its branch (a run's leftovers lie beyond it),
    the turn opens a new branch at the head. With `create`, a conversation
    the tenant does not have is created first, in the same transaction, with
    `metadata`. With `after`, the turn goes after that position instead,
    replacing what followed it in the head's history (which stays in the log,
    on its branch). `ids` are the event ids of the first `len(ids)` events
    (the messages), minted by the caller. `state` (stored text) is the
    conversation's new state, whose `state.changed` event ends `encoded`;
    `expected_state` is checked first.
    """
    if not encoded:
        raise InvalidInputError("append_messages needs at least one message, or a state.")
    check_append_options(expected, run_id, idempotency_key)
    created = _create_first(conn, tenant, conversation_id, metadata, seal) if create else None
    conv = get_conversation(conn, tenant, conversation_id, lock=True)
    if idempotency_key is not None:
        again = replayed(conn, conv, idempotency_key, encoded, run_id, ids, seal)
        if again is not None:
            return again
    check_expected(conv, expected)
    _entries.check_state(conv, expected_state)
    base = conv.head if after is None else resolve_position(conn, conv, after)
    branch_id, position = base.branch_id, base.position
    written: list[Event] = [] if created is None else [created]
    opened = not conv.head_open if after is None else not head_is_open(conn, conv.id, base)
    if opened:
        reason: BranchReason = "run" if after is None else "edit"
        branch_id, branched = create_branch(
            conn, conv.id, base, reason, run_id=run_id if after is None else None, origin="client"
        )
        written.append(branched)
        position += 1
    inserted = insert_events(
        conn,
        conv.id,
        branch_id,
        position + 1,
        encoded,
        run_id=run_id,
        idempotency_key=idempotency_key,
        head=True,
        ids=None if ids is None else [*ids, *(new_id() for _ in encoded[len(ids) :])],
    )
    written += inserted
    if ids is not None:
        _entries.record_ids(conn, conv.id, inserted[: len(ids)])
    new_head = Position(branch_id, written[-1].position)
    messages = [e for e in written if e.kind == "message.recorded"]
    set_head(
        conn, conv, new_head, messages, written[-1].hash, extends=after is None or base == conv.head
    )
    if state is not None:
        _entries.store_state(conn, conv.id, state)
    return Appended(conv.id, written, new_head, created=created is not None)


def check_expected(conv: Conversation, expected: int | Position | None) -> None:
    """The optimistic check of an append: the head is where the caller last saw it
    (a position on the head's branch, or a `Position` naming the branch too)."""
    if expected is None:
        return
    if isinstance(expected, Position):
        if expected == conv.head:
            return
        seen = f"{expected.branch_id}:{expected.position}"
        found = f"{conv.head.branch_id}:{conv.head.position}"
        position = expected.position
    elif expected == conv.head.position:
        return
    else:
        seen, found, position = str(expected), str(conv.head.position), expected
    raise ConflictError(
        f"Conversation '{conv.id}' is at position {found}, but the append expected {seen}. "
        f"Another writer appended first; reload the history and retry.",
        conversation_id=conv.id,
        branch_id=conv.head.branch_id,
        expected=position,
        actual=conv.head.position,
    )


def _create_first(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    metadata: dict[str, Any] | None,
    seal: Seal = PLAIN,
) -> Event | None:
    """Create the conversation unless the tenant has it; its `conversation.created` event.

    In a savepoint: when a concurrent first append of the same tenant creates
    it first, this one appends to it; when another tenant has the id, the
    `ConflictError` of `create_conversation` stands.
    """
    if _exists(conn, tenant, conversation_id):
        return None
    try:
        with conn.begin_nested():
            _, created = create_conversation_event(
                conn, tenant, metadata, conversation_id=conversation_id, head=False, seal=seal
            )
    except ConflictError:
        if _exists(conn, tenant, conversation_id):
            return None
        raise
    return created


def _exists(conn: Connection, tenant: str, conversation_id: str) -> bool:
    try:
        get_conversation(conn, tenant, conversation_id)
    except NotFoundError:
        return False
    return True


def check_append_options(
    expected: int | Position | None, run_id: str | None, idempotency_key: str | None
) -> None:
    """The options of `append_messages`, checked before anything is written."""
    if isinstance(expected, Position):
        _checks.check_id(expected.branch_id, "branch")
        check_int(expected.position, "expected position", minimum=0, maximum=MAX_INT32)
    elif expected is not None:
        check_int(expected, "expected", minimum=0, maximum=MAX_INT32)
    if run_id is not None:
        _checks.check_id(run_id, "run")
    if idempotency_key is not None:
        check_text(idempotency_key, "idempotency key")


def appended_in_place(
    conversation_id: str,
    done: InPlace | None,
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    idempotency_key: str | None,
) -> Appended | None:
    """What a fast-path append wrote, as the general path reports it (None: nothing)."""
    if done is None:
        return None
    written = [] if done.created is None else [done.created]
    written += [
        Event(
            seq=seq,
            id=event_id,
            conversation_id=conversation_id,
            branch_id=done.branch_id,
            position=position,
            run_id=run_id,
            kind=item.kind,
            origin=item.origin,
            head=i == len(encoded) - 1,
            recorded_at=utc(recorded_at),
            idempotency_key=idempotency_key if i == 0 else None,
            payload_json=text,
            hash=event_hash,
        )
        for i, (event_id, (seq, position, recorded_at, event_hash), (item, text)) in enumerate(
            zip(done.ids, done.written, encoded, strict=True)
        )
    ]
    return Appended(
        conversation_id,
        written,
        Position(done.branch_id, written[-1].position),
        created=done.created is not None,
    )
