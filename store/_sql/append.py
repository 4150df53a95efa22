"""The append: every form of it, one plan choosing among them, and one writer.

An append continues the head's branch in place: check the head is open (and
where the caller expected it, the idempotency key unused, the caller's ids
free, the state as expected), insert the events, add their view entries and
caller ids, and move the head. `plan` decides, from the options alone and the
head this store's last append to the conversation left, which forms to try:

- `create`: a new conversation and its first events, hashed from genesis;
- `kept`: straight at the head kept (`HeadCache`): no read at all;
- `read`: at the head read now (`read_postgres`, `read_sqlite`), checked
  against every option in the client (`head_for`).

The last two go through one writer per dialect (`write_postgres`: one
statement of data-modifying CTEs, run alone in autocommit mode, so one round
trip; `write_sqlite`: plain SQL on the driver's cursor inside the caller's
`BEGIN IMMEDIATE`), which moves the head by compare-and-set and writes nothing
when another writer moved it. When every form declines, nothing is written
(on SQLite the transaction is rolled back) and the general path
(`append_messages`) decides every case in a transaction of its own, reading
everything afresh with SQLAlchemy: creating the conversation, replaying a key,
raising what an option refuses, opening a branch, moving the view after
another position. Then it writes through the same writer.

Every hash is chained in the client (`chain.chained`). The conformance suite
runs twice, as shipped and with the forms off (`Store.open(...,
fast_paths=False)`), and tests/store/test_append_differential.py drives random
mixes of the options through both and compares the rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store import _checks
from chatledger.store._cache import HeadCache
from chatledger.store._checks import MAX_INT32, check_int, check_text
from chatledger.store._crypto import PLAIN, Seal, is_sealed, open_text, split_sealed
from chatledger.store._errors import ConflictError, InvalidInputError, NotFoundError
from chatledger.store._sql import chain as _chain
from chatledger.store._sql import entries as _entries
from chatledger.store._sql import keys as _keys
from chatledger.store._sql import projector
from chatledger.store._sql import steps as _steps
from chatledger.store._sql.dialect import is_sqlite, on_cursor, sqlite_clock, sqlite_time
from chatledger.store._sql.log import (
    create_branch,
    create_conversation_event,
    event_from_row,
    get_conversation,
    previous_hash,
    resolve_position,
    utc,
)
from chatledger.store._sql.projector import head_is_open
from chatledger.store._sql.translate import unique_violation, violated_key
from chatledger.store._values import Appended, BranchReason, Conversation, Event, NewEvent, Position
from chatledger.store.ids import new_id
from chatledger.store.schema import conversations, events
from chatledger.store.schema import event_ids as minted_ids

__all__ = [
    "POSTGRES",
    "SQLITE",
    "At",
    "Dialect",
    "Head",
    "Turn",
    "Written",
    "append_messages",
    "appended",
    "check_append_options",
    "check_expected",
    "create_conversation_postgres",
    "create_conversation_sqlite",
    "in_place",
    "key_conflict",
    "keyed_event",
    "plan",
    "same_content",
]


@dataclass(slots=True)  # not frozen: see `store._sql.ops.Op`
class Written:
    """What a form wrote: ids and (seq, position, recorded_at, hash) per event."""

    branch_id: str
    ids: list[str]
    written: list[tuple[int, int, datetime, bytes]]
    created: Event | None = None
    """The `conversation.created` event, when the form created the conversation."""


Head = tuple[str, int, bytes, str]
"""A conversation's head as an append finds it: its branch, position and hash, and
the conversation's state there (stored text, sealed in a sealed conversation).
The state changes only with the
head (every change is a `state.changed` event, which becomes the head), so a
head that is still there still has that state."""


@dataclass(slots=True)  # not frozen: see `store._sql.ops.Op`
class Turn:
    """One append's checked inputs, as every form writes them."""

    tenant: str
    conversation_id: str
    encoded: Sequence[tuple[NewEvent, str]]
    run_id: str | None = None
    key: str | None = None
    named: Sequence[str] | None = None
    """The caller's ids of the first events (`ids`)."""
    state: str | None = None
    """The new state's stored text (its `state.changed` event ends `encoded`)."""
    expected: int | None = None
    expected_branch: str | None = None
    expected_state: Mapping[str, Any] | None = None
    sealed: bool | None = False
    """Whether the content is sealed, which the conversation must be as well (None:
    the general path has checked it)."""
    root: tuple[str, str] | None = None
    """`encode_root`'s (metadata text, created payload) of a conversation the append
    may create (`create`, in the clear)."""
    seal: Seal = PLAIN
    """What the content is sealed under, which opens a sealed state for
    `expected_state`."""

    def holds(self, stored: str) -> bool:
        """Whether the state stored as `stored` holds `expected_state` (False when this
        turn cannot open it: the general path then says why). A turn in the clear
        takes it as clear: its write to a sealed conversation is refused anyway."""
        if self.expected_state is None:
            return True
        state = self.seal.state_of(json.loads(stored), self.seal.sealed)
        return state is not None and not _entries.changed_fields(state, self.expected_state)


@dataclass(slots=True)  # not frozen: see `store._sql.ops.Op`
class At:
    """Where the writer puts a turn: the head it must find still there (branch,
    position, hash and whether it is open: a compare-and-set, which also takes the
    row's lock), and the branch, position and hash the turn continues (the head's,
    unless the general path opened a branch or appends after another position)."""

    seen: tuple[str, int, bytes, bool]
    branch_id: str
    start: int
    previous: bytes

    @classmethod
    def head(cls, head: Head) -> At:
        branch_id, position, head_hash, _ = head
        return cls((branch_id, position, head_hash, True), branch_id, position, head_hash)


Form = Literal["create", "kept", "read"]


def plan(
    turn: Turn, kept: Head | None, *, after: bool = False, minting: bool = False
) -> tuple[Form, ...]:
    """The forms `turn` tries, in order, before the general path (which decides
    every case the forms decline, reading everything afresh), given the head this
    store's last append to the conversation left (`kept`):

    - `create`: a new conversation and its first events (`create` with a root in
      the clear), for an append with no caller ids, state or expected state, in
      the clear, whose `expected` admits a new head (1, not on a branch named);
    - `kept`: at the head kept, where `expected` and `expected_state` must hold;
    - `read`: at the head read now, checked against every option (`head_for`).

    None at all when the turn writes nothing, goes after another position
    (`after`, which may open a branch), or mints its subject's key (`minting`):
    the general path's.
    """
    if not in_place_at_all(turn, after=after, minting=minting):
        return ()
    expected = turn.expected
    forms: list[Form] = []
    if (
        turn.root is not None
        and turn.named is None
        and turn.state is None
        and turn.expected_state is None
        and not turn.sealed
        and expected in (None, 1)
        and turn.expected_branch is None  # a new conversation's branch: no caller knows it
    ):
        forms.append("create")
    if (
        kept is not None
        and expected in (None, kept[1])
        and turn.expected_branch in (None, kept[0])
        and turn.holds(kept[3])
    ):
        forms.append("kept")
    forms.append("read")
    return tuple(forms)


def in_place_at_all(turn: Turn, *, after: bool = False, minting: bool = False) -> bool:
    """Whether `plan` gives `turn` any form (else the general path writes it)."""
    return bool(turn.encoded) and not after and not minting


def head_for(turn: Turn, found: Sequence[Any] | None) -> Head | None:
    """The head `turn` goes at, from the conversation's row as a read form finds it
    (branch, position, open, hash, state, sealed, live, key used, an id taken), or
    None when an option refuses it there: the general path then says why."""
    if found is None:
        return None
    branch_id, position, is_open, head_hash, state, sealed, live, key_used, taken = found
    branch_id = str(branch_id)
    if not is_open or not live or bool(sealed) != turn.sealed or key_used or taken:
        return None
    if turn.expected is not None and position != turn.expected:
        return None
    if turn.expected_branch is not None and branch_id != turn.expected_branch:
        return None
    if not turn.holds(state):
        return None
    return branch_id, position, bytes(head_hash), state


# -- the writer: every append's events, view entries, caller ids and head ----------
#
# One statement on Postgres (data-modifying CTEs: it runs alone in autocommit
# mode, or inside the general path's transaction), plain SQL on SQLite (inside
# the caller's `BEGIN IMMEDIATE`, or the general path's transaction). The head
# moves first, by compare-and-set on the head it must still find: nothing is
# written when another writer moved it (None). The hashes are chained here,
# in the client, from `At.previous` (`chain.chained`): the database never hashes.

_MOVE_POSTGRES = """
    UPDATE chatledger_conversations
    SET head_branch_id = %(branch)s::uuid, head_position = %(last)s, head_open = true,
        head_hash = %(hash)s, state = coalesce(%(state)s::text, state)
    WHERE id = %(cid)s::uuid AND tenant = %(tenant)s AND erased_at IS NULL
      AND (%(sealed)s::bool IS NULL OR (subject IS NOT NULL) = %(sealed)s::bool)
      AND head_branch_id = %(seen_branch)s::uuid AND head_position = %(seen_position)s
      AND head_hash = %(seen_hash)s AND head_open = %(seen_open)s
    RETURNING id"""
_WRITE_POSTGRES = (
    """
WITH moved AS ("""
    + _MOVE_POSTGRES.replace("{", "{{").replace("}", "}}")
    + """
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload, hash,
                                   tenant)
    {rows}
    RETURNING id, seq, position, kind, recorded_at
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq, tenant)
    SELECT %(cid)s::uuid, position, seq, %(tenant)s FROM ins WHERE kind = 'message.recorded'
){named}
SELECT seq, position, recorded_at FROM ins ORDER BY position
"""
)
_ARRAYS = """unnest(%(ids)b::text[], %(kinds)b::text[], %(origins)b::text[],
                                 %(payloads)b::text[], %(hashes)b::bytea[])
         WITH ORDINALITY"""
_ROWS = """SELECT n.id::uuid, moved.id, %(branch)s::uuid, %(start)s + n.ord::int, %(run_id)s::uuid,
           n.kind, n.origin, n.ord = %(count)s, statement_timestamp(),
           CASE WHEN n.ord = 1 THEN %(key)s::text END, n.payload, n.hash, %(tenant)s
    FROM moved CROSS JOIN {source} AS n(id, kind, origin, payload, hash, ord)
    ORDER BY n.ord"""
_NAMED = """, named AS (
    INSERT INTO chatledger_event_ids (id, conversation_id, event_seq, tenant)
    SELECT id, %(cid)s::uuid, seq, %(tenant)s FROM ins WHERE id = ANY(%(named)s::uuid[])
)"""
_SCALARS = 6
"""Events up to which a turn's rows are sent as scalars (a VALUES list), which
psycopg dumps for less CPU than the five arrays a longer turn is sent as; past
six, the parameters (16 and five an event) outnumber the 50 up to which psycopg
caches a query's conversion, and it would parse the statement on every run."""


@lru_cache(maxsize=2 * _SCALARS + 2)
def _postgres_statement(count: int, named: bool) -> str:
    """The writer's statement for `count` events (`count` > `_SCALARS`: any number)."""
    if count > _SCALARS:
        source = _ARRAYS
    else:
        rows = ", ".join(
            f"(%(id{i})s, %(kind{i})s, %(origin{i})s, %(payload{i})s, %(hash{i})s::bytea, {i + 1})"
            for i in range(count)
        )
        source = f"(VALUES {rows})"
    return _WRITE_POSTGRES.format(rows=_ROWS.format(source=source), named=_NAMED if named else "")


_RACED = frozenset({"pk_chatledger_event_ids", "ix_chatledger_events_idempotency"})
"""Unique keys a concurrent append can take between a read form's check and the write."""


def write_postgres(cursor: Any, turn: Turn, at: At) -> Written | None:
    """`turn` written at `at` by one statement on `cursor`, or None having written
    nothing (the head moved). A caller id or the idempotency key taken meanwhile
    by a concurrent append is None too on an autocommit cursor (the statement
    failed whole); in a transaction, the caller handles it."""
    encoded, cid = turn.encoded, turn.conversation_id
    ids = event_ids(turn.named, len(encoded))
    hashed = fields(at, ids, turn)
    hashes = _chain.chained(at.previous, hashed)
    last = at.start + len(encoded)
    branch, position, seen_hash, seen_open = at.seen
    citus = _steps.is_citus(cursor)
    params: dict[str, Any] = {
        "cid": cid,
        "tenant": turn.tenant,
        "sealed": turn.sealed,
        "seen_branch": branch,
        "seen_position": position,
        "seen_hash": seen_hash,
        "seen_open": seen_open,
        "branch": at.branch_id,
        "last": last,
        "hash": hashes[-1],
        "state": turn.state,
        "run_id": turn.run_id,
        "key": turn.key,
        "named": None if turn.named is None else list(turn.named),
    }
    count = len(encoded)
    if citus:
        return _write_steps(cursor, turn, at, params, ids, hashed, hashes)
    params.update(start=at.start, count=count)
    if count > _SCALARS:
        params.update(
            ids=ids,
            kinds=[item.kind for item, _ in encoded],
            origins=[item.origin for item, _ in encoded],
            payloads=[text for _, text in encoded],
            hashes=hashes,
        )
    else:
        for i, ((item, text), event_hash) in enumerate(zip(encoded, hashes, strict=True)):
            params[f"id{i}"] = ids[i]
            params[f"kind{i}"] = item.kind
            params[f"origin{i}"] = item.origin
            params[f"payload{i}"] = text
            params[f"hash{i}"] = event_hash
    try:
        cursor.execute(_postgres_statement(min(count, _SCALARS + 1), bool(turn.named)), params)
    except Exception as error:
        if _steps.autocommit(cursor) and violated_key(error) in _RACED:
            return None
        raise
    rows = cursor.fetchall()  # (seq, position, recorded_at) per event
    if not rows:
        return None
    return Written(
        at.branch_id, ids, [(r[0], r[1], r[2], h) for r, h in zip(rows, hashes, strict=True)]
    )


# The same rows as plain statements, for Citus (store/_sql/steps.py).
_STEP_EVENTS = (
    "INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind, "
    "origin, head, recorded_at, idempotency_key, payload, hash, tenant) VALUES {values} "
    "RETURNING seq, position, recorded_at"
)
_STEP_VIEWS = (
    "INSERT INTO chatledger_view_entries (conversation_id, position, event_seq, tenant) "
    "VALUES {values}"
)
_STEP_NAMED = (
    "INSERT INTO chatledger_event_ids (id, conversation_id, event_seq, tenant) VALUES {values}"
)


def _write_steps(
    cursor: Any,
    turn: Turn,
    at: At,
    params: dict[str, Any],
    ids: list[str],
    hashed: list[_chain.Fields],
    hashes: list[bytes],
) -> Written | None:
    """`write_postgres`'s rows (`hashed`, `fields`' values) as statements of one
    transaction (Citus)."""
    tenant, cid, encoded = turn.tenant, turn.conversation_id, turn.encoded
    rows: list[object] = []
    for (*row, key, text), event_hash in zip(hashed, hashes, strict=True):
        rows += (*row, key, text, event_hash, tenant)
    with _steps.in_transaction(cursor) as abandon:
        cursor.execute(_MOVE_POSTGRES, params)
        if cursor.fetchone() is None:
            abandon()
            return None
        try:
            written = _step_events(cursor, rows, len(encoded), "statement_timestamp()")
            views = [
                v
                for (seq, position, _), (item, _) in zip(written, encoded, strict=True)
                if item.kind == "message.recorded"
                for v in (cid, position, seq, tenant)
            ]
            _step_rows(cursor, _STEP_VIEWS, 4, views)
            if turn.named:
                named = [
                    v for i in range(len(turn.named)) for v in (ids[i], cid, written[i][0], tenant)
                ]
                _step_rows(cursor, _STEP_NAMED, 4, named)
        except Exception as error:
            if _steps.autocommit(cursor) and violated_key(error) in _RACED:
                abandon()
                return None
            raise
    return Written(
        at.branch_id, ids, [(r[0], r[1], r[2], h) for r, h in zip(written, hashes, strict=True)]
    )


def _step_events(cursor: Any, rows: list[object], count: int, recorded: str) -> list[Any]:
    """Insert `count` events from `rows`, each row's values in the columns' order but
    `recorded_at`, which is the SQL `recorded` (a clock, or `%s` for a value in the
    row): their (seq, position, recorded_at), in position order."""
    row = "(" + ", ".join(["%s"] * 8 + [recorded] + ["%s"] * 4) + ")"
    cursor.execute(_values(_STEP_EVENTS, row, count), rows)
    return sorted(cursor.fetchall(), key=lambda r: r[1])


def _step_rows(cursor: Any, statement: str, width: int, flat: list[object]) -> None:
    """`statement` for the rows of `width` values in `flat`, if any."""
    if flat:
        row = "(" + ", ".join(["%s"] * width) + ")"
        cursor.execute(_values(statement, row, len(flat) // width), flat)


_SQLITE_MOVE = (
    "UPDATE chatledger_conversations SET head_branch_id = ?, head_position = ?, head_open = 1, "
    "head_hash = ?, state = coalesce(?, state) WHERE id = ? AND tenant = ? AND erased_at IS NULL "
    "AND (? IS NULL OR (subject IS NOT NULL) = ?) AND head_branch_id = ? AND head_position = ? "
    "AND head_hash = ? AND head_open = ?"
)
_SQLITE_INSERT = (
    "INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind, "
    "origin, head, recorded_at, idempotency_key, payload, hash, tenant) VALUES {values}"
)
_SQLITE_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQLITE_VIEW = (
    "INSERT INTO chatledger_view_entries (conversation_id, position, event_seq, tenant) "
    "VALUES {values}"
)
_SQLITE_NAMED = (
    "INSERT INTO chatledger_event_ids (id, conversation_id, event_seq, tenant) VALUES {values}"
)


@lru_cache(maxsize=64)
def _values(statement: str, row: str, count: int) -> str:
    """`statement` with `count` copies of `row` for its `{values}`."""
    return statement.format(values=", ".join([row] * count))


def write_sqlite(cursor: Any, turn: Turn, at: At) -> Written | None:
    """`write_postgres` in plain SQL on a SQLite cursor, inside the caller's
    transaction (which holds the writer lock)."""
    encoded, cid = turn.encoded, turn.conversation_id
    ids = event_ids(turn.named, len(encoded))
    rows = fields(at, ids, turn)
    hashes = _chain.chained(at.previous, rows)
    count = len(encoded)
    start = at.start
    sealed = turn.sealed
    cursor.execute(
        _SQLITE_MOVE,
        (
            at.branch_id,
            start + count,
            hashes[-1],
            turn.state,
            cid,
            turn.tenant,
            sealed,
            sealed,
            *at.seen,
        ),
    )
    if cursor.rowcount != 1:
        return None
    # The embedded database's clock is this host's: read once, the events of
    # one append share the moment they were recorded.
    now = sqlite_clock()
    recorded_at = sqlite_time(now)
    branch_id = at.branch_id
    tenant = turn.tenant
    params: list[object] = []
    for (*row, key, text), event_hash in zip(rows, hashes, strict=True):
        params += (*row, recorded_at, key, text, event_hash, tenant)
    cursor.execute(_values(_SQLITE_INSERT, _SQLITE_ROW, count), params)
    # No RETURNING (it cost a third of a ten-row insert): `seq` is the rowid,
    # and under the writer lock each row of the VALUES list, inserted in order,
    # gets the largest rowid so far plus one (SQLite's documented rule while
    # rowids stay below 2**63 - 1), so this insert's rows end at `lastrowid`.
    first = cursor.lastrowid - count + 1
    written = [(first + i, start + i + 1, now, hashes[i]) for i in range(count)]
    views = [
        v
        for (seq, position, _, _), (item, _) in zip(written, encoded, strict=True)
        if item.kind == "message.recorded"
        for v in (cid, position, seq, tenant)
    ]
    if views:
        cursor.execute(_values(_SQLITE_VIEW, "(?, ?, ?, ?)", len(views) // 4), views)
    if turn.named:
        named = [v for i in range(len(turn.named)) for v in (ids[i], cid, written[i][0], tenant)]
        cursor.execute(_values(_SQLITE_NAMED, "(?, ?, ?, ?)", len(turn.named)), named)
    return Written(branch_id, ids, written)


def fields(at: At, ids: Sequence[str], turn: Turn) -> list[_chain.Fields]:
    """The hashed fields of `turn`'s events at `at` (`chain.FIELDS` order): the last
    is the head, and the first carries the idempotency key."""
    last = len(turn.encoded)
    cid, branch_id, start, run_id, key = (
        turn.conversation_id,
        at.branch_id,
        at.start,
        turn.run_id,
        turn.key,
    )
    return [
        (
            ids[i - 1],
            cid,
            branch_id,
            start + i,
            run_id,
            item.kind,
            item.origin,
            i == last,
            key if i == 1 else None,
            text,
        )
        for i, (item, text) in enumerate(turn.encoded, 1)
    ]


# -- the read forms: the head now, and what the options need to know of it ----------

_READ_POSTGRES = """
SELECT head_branch_id, head_position, head_open, head_hash, state, subject IS NOT NULL,
       erased_at IS NULL,
       %(key)s::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM chatledger_events k
           WHERE k.conversation_id = %(cid)s AND k.idempotency_key = %(key)s::text
             AND k.tenant = %(tenant)s),
       %(named)s::uuid[] IS NOT NULL AND EXISTS (
           SELECT 1 FROM chatledger_event_ids x
           WHERE x.id = ANY(%(named)s::uuid[]) AND x.tenant = %(tenant)s)
FROM chatledger_conversations WHERE id = %(cid)s AND tenant = %(tenant)s
"""
_READ_SQLITE = (
    "SELECT head_branch_id, head_position, head_open, head_hash, state, subject IS NOT NULL, "
    "erased_at IS NULL FROM chatledger_conversations WHERE id = ? AND tenant = ?"
)
_SQLITE_KEY_USED = (
    "SELECT 1 FROM chatledger_events WHERE conversation_id = ? AND idempotency_key = ? LIMIT 1"
)
_SQLITE_NAMED_TAKEN = "SELECT 1 FROM chatledger_event_ids WHERE id IN ({ids}) LIMIT 1"


def read_postgres(cursor: Any, turn: Turn) -> Head | None:
    """The head `turn` goes at, read in one statement (see `head_for`)."""
    cursor.execute(
        _READ_POSTGRES,
        {
            "cid": turn.conversation_id,
            "tenant": turn.tenant,
            "key": turn.key,
            "named": None if turn.named is None else list(turn.named),
        },
    )
    return head_for(turn, cursor.fetchone())


def read_sqlite(cursor: Any, turn: Turn) -> Head | None:
    """`read_postgres` on SQLite, inside the caller's `BEGIN IMMEDIATE`; the key and
    the caller's ids are checked once before any form (`Dialect.taken`)."""
    cursor.execute(_READ_SQLITE, (turn.conversation_id, turn.tenant))
    found = cursor.fetchone()
    return None if found is None else head_for(turn, (*found, False, False))


def _taken_sqlite(cursor: Any, turn: Turn) -> bool:
    """Whether `turn`'s idempotency key is used in its conversation, or one of the
    caller's ids is taken: either way no form writes it."""
    if turn.key is not None:
        cursor.execute(_SQLITE_KEY_USED, (turn.conversation_id, turn.key))
        if cursor.fetchone() is not None:
            return True
    if turn.named:
        named = list(turn.named)
        cursor.execute(_SQLITE_NAMED_TAKEN.format(ids=", ".join("?" * len(named))), named)
        return cursor.fetchone() is not None
    return False


@dataclass(frozen=True)
class Dialect:
    """One database's forms of the append."""

    read: Callable[[Any, Turn], Head | None]
    write: Callable[[Any, Turn, At], Written | None]
    create: Callable[[Any, Turn], Written | None]
    taken: Callable[[Any, Turn], bool] | None = None
    """Whether the turn's key or ids are taken, asked once before any form writes
    (SQLite, whose forms run in one transaction); None on Postgres, where a form's
    one statement fails whole on a taken key and writes nothing."""


def in_place(
    cursor: Any, dialect: Dialect, turn: Turn, *, heads: HeadCache | None
) -> Written | None:
    """`turn` by the forms `plan` picks, on a DB-API cursor (autocommit on Postgres,
    the caller's `BEGIN IMMEDIATE` on SQLite); None having written nothing when
    every form declines. The head each write leaves is kept in `heads`."""
    tenant, cid = turn.tenant, turn.conversation_id
    kept = None if heads is None else heads.get(tenant, cid)
    forms = plan(turn, kept)
    if forms and dialect.taken is not None and dialect.taken(cursor, turn):
        return None  # a replay or a taken id: the general path decides
    done: Written | None = None
    for form in forms:
        state = "{}"  # a new conversation's
        if form == "create":
            done = dialect.create(cursor, turn)
        else:
            head = kept if form == "kept" else dialect.read(cursor, turn)
            if head is not None:
                state = head[3]
                done = dialect.write(cursor, turn, At.head(head))
        if done is not None:
            if heads is not None:
                _, position, _, last_hash = done.written[-1]
                state = state if turn.state is None else turn.state
                heads.put(tenant, cid, (done.branch_id, position, last_hash, state))
            return done
        if form == "kept" and heads is not None:
            heads.forget(tenant, cid)
    return None


def event_ids(named: Sequence[str] | None, count: int) -> list[str]:
    """The ids of `count` new events: the caller's for the first ones, then minted."""
    given = list(named or ())
    return given + [new_id() for _ in range(count - len(given))]


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
            statement_timestamp(), %(meta)s)
    ON CONFLICT DO NOTHING
    RETURNING created_at
), branch AS (
    INSERT INTO chatledger_branches (id, conversation_id, reason, created_at, tenant)
    SELECT %(bid)s::uuid, %(cid)s::uuid, 'root', created_at, %(tenant)s FROM conv
), ins AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                   origin, head, recorded_at, idempotency_key, payload, hash,
                                   tenant)
    SELECT n.id, %(cid)s::uuid, %(bid)s::uuid, n.ord::int,
           CASE WHEN n.ord > 1 THEN %(run_id)s::uuid END, n.kind, n.origin,
           n.ord = %(last)s, conv.created_at, CASE WHEN n.ord = 2 THEN %(key)s::text END,
           n.payload, n.hash, %(tenant)s
    FROM conv CROSS JOIN unnest(%(ids)b::text[]::uuid[], %(kinds)b::text[],
                                %(origins)b::text[], %(payloads)b::text[], %(hashes)b::bytea[])
         WITH ORDINALITY AS n(id, kind, origin, payload, hash, ord)
    ORDER BY n.ord
    RETURNING seq, position, kind
), view AS (
    INSERT INTO chatledger_view_entries (conversation_id, position, event_seq, tenant)
    SELECT %(cid)s::uuid, position, seq, %(tenant)s FROM ins WHERE kind = 'message.recorded'
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

    def rows(self, cid: str, run_id: str | None, at: object, tenant: str) -> list[object]:
        """The events' values in the table's column order (`seq` and `txid` left to
        the database), all recorded `at`: one reading of the clock, as one
        statement's."""
        last = len(self.ids)
        values: list[object] = []
        for i in range(last):
            values += (
                self.ids[i],
                cid,
                self.branch_id,
                i + 1,
                run_id if i else None,
                self.kinds[i],
                self.origins[i],
                i + 1 == last,
                at,
                self.keys[i],
                self.payloads[i],
                self.hashes[i],
                tenant,
            )
        return values


_SQLITE_NEW_CONVERSATION = (
    "INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, "
    "head_open, head_hash, created_at, metadata, key) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_SQLITE_NEW_BRANCH = (
    "INSERT INTO chatledger_branches (id, conversation_id, reason, created_at, tenant) "
    "VALUES (?, ?, 'root', ?, ?)"
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
    last = len(ids)
    hashes = _chain.chained(
        _chain.GENESIS,
        (
            (
                ids[i],
                conversation_id,
                branch_id,
                i + 1,
                run_id if i else None,
                kinds[i],
                origins[i],
                i + 1 == last,
                keys[i],
                payloads[i],
            )
            for i in range(last)
        ),
    )
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


def create_append_postgres(cursor: Any, turn: Turn) -> Written | None:
    """Create the conversation and append `turn` as one statement on an autocommit
    DB-API cursor, or return None having written nothing (the id is taken)."""
    assert turn.root is not None
    meta_text, created = turn.root
    cid = turn.conversation_id
    fresh = _fresh(cid, created, turn.encoded, turn.run_id, turn.key)
    if _steps.is_citus(cursor):
        return _create_steps(cursor, turn.tenant, cid, fresh, meta_text, turn.run_id)
    cursor.execute(
        _CREATE_APPEND_POSTGRES,
        {
            "cid": cid,
            "tenant": turn.tenant,
            "bid": fresh.branch_id,
            "last": len(fresh.ids),
            "hash": fresh.hashes[-1],
            "meta": meta_text,
            "run_id": turn.run_id,
            "key": turn.key,
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
    return Written(
        branch_id=fresh.branch_id,
        ids=fresh.ids[1:],
        written=[
            (r[1], i, at, h)
            for i, (r, h) in enumerate(zip(rows, fresh.hashes, strict=True), 1)
            if i > 1
        ],
        created=_created_event(cid, fresh, rows[0][1], at),
    )


def create_append_sqlite(cursor: Any, turn: Turn, key: str | None = None) -> Written | None:
    """`create_append_postgres` through a DB-API cursor inside the caller's
    `BEGIN IMMEDIATE`; the conversation's row holds `key` (its key's row is the
    caller's)."""
    assert turn.root is not None
    meta_text, created = turn.root
    conversation_id, run_id = turn.conversation_id, turn.run_id
    fresh = _fresh(conversation_id, created, turn.encoded, run_id, turn.key)
    last = len(fresh.ids)
    now = sqlite_clock()
    at = sqlite_time(now)
    cursor.execute(
        _SQLITE_NEW_CONVERSATION,
        (conversation_id, turn.tenant, fresh.branch_id, last, fresh.hashes[-1], at, meta_text, key),
    )
    if cursor.rowcount != 1:
        return None  # the conversation row comes first: nothing was written
    tenant = turn.tenant
    cursor.execute(_SQLITE_NEW_BRANCH, (fresh.branch_id, conversation_id, at, tenant))
    params = fresh.rows(conversation_id, run_id, at, tenant)
    cursor.execute(_values(_SQLITE_INSERT, _SQLITE_ROW, last), params)
    first = cursor.lastrowid - last + 1  # the rowid rule of `write_sqlite`
    views = [
        v
        for i in range(1, last)
        if fresh.kinds[i] == "message.recorded"
        for v in (conversation_id, i + 1, first + i, tenant)
    ]
    if views:
        cursor.execute(_values(_SQLITE_VIEW, "(?, ?, ?, ?)", len(views) // 4), views)
    return Written(
        branch_id=fresh.branch_id,
        ids=fresh.ids[1:],
        written=[(first + i, i + 1, now, fresh.hashes[i]) for i in range(1, last)],
        created=_created_event(conversation_id, fresh, first, now),
    )


_CREATE_POSTGRES = """
WITH conv AS (
    INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, head_open,
                                          head_hash, created_at, metadata, key)
    VALUES (%(cid)s::uuid, %(tenant)s, %(bid)s::uuid, 1, true, %(hash)s, statement_timestamp(),
            %(meta)s, %(key)s)
    ON CONFLICT DO NOTHING
    RETURNING created_at
), keyed AS (
    INSERT INTO chatledger_conversation_keys (tenant, key, conversation_id)
    SELECT %(tenant)s, %(key)s, %(cid)s::uuid FROM conv WHERE %(key)s::text IS NOT NULL
), branch AS (
    INSERT INTO chatledger_branches (id, conversation_id, reason, created_at, tenant)
    SELECT %(bid)s::uuid, %(cid)s::uuid, 'root', created_at, %(tenant)s FROM conv
), created AS (
    INSERT INTO chatledger_events (id, conversation_id, branch_id, position, kind, origin, head,
                                   recorded_at, payload, hash, tenant)
    SELECT %(eid)s::uuid, %(cid)s::uuid, %(bid)s::uuid, 1, 'conversation.created', 'client',
           true, created_at, %(payload)s, %(hash)s, %(tenant)s
    FROM conv
)
SELECT created_at FROM conv
"""
"""`_CREATE_APPEND_POSTGRES`'s rows for no messages, with scalar parameters: the
arrays, `unnest` and the returned rows cost a creation a third more time
(0.41-0.46 against 0.58-0.60 ms a call on the bench machine)."""


def create_conversation_postgres(
    cursor: Any,
    tenant: str,
    conversation_id: str | None,
    meta_text: str,
    payload: str,
    key: str | None = None,
) -> Conversation | None:
    """`create_conversation` of a root conversation in the clear, with its `key`
    when given: the rows of the create-append form with no messages and the key's
    row (one statement), or None having written nothing (the id or the key is
    taken: the general path says which). The inputs are checked already;
    `meta_text` and `payload` come from `encode_root`.
    tests/store/test_fast_paths.py compares the rows with the general path's."""
    cid = conversation_id or new_id()
    fresh = _fresh(cid, payload, [], None, None)
    if _steps.is_citus(cursor):
        done = _create_steps(cursor, tenant, cid, fresh, meta_text, None, key)
        if done is None or done.created is None:
            return None
        return _root(tenant, cid, fresh.branch_id, done.created.recorded_at, meta_text, key)
    try:
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
                "key": key,
            },
        )
    except Exception as error:  # the statement failed whole: nothing was written
        if violated_key(error) == "pk_chatledger_conversation_keys":
            return None
        raise
    row = cursor.fetchone()
    if row is None:
        return None
    return _root(tenant, cid, fresh.branch_id, utc(row[0]), meta_text, key)


_STEP_NEW_CONVERSATION = (
    "INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, "
    "head_open, head_hash, created_at, metadata, key) "
    "VALUES (%s, %s, %s, %s, true, %s, statement_timestamp(), %s, %s) "
    "ON CONFLICT DO NOTHING RETURNING created_at"
)
_STEP_NEW_KEY = (
    "INSERT INTO chatledger_conversation_keys (tenant, key, conversation_id) VALUES (%s, %s, %s)"
)
_STEP_NEW_BRANCH = (
    "INSERT INTO chatledger_branches (id, conversation_id, reason, created_at, tenant) "
    "VALUES (%s, %s, 'root', %s, %s)"
)


def _create_steps(
    cursor: Any,
    tenant: str,
    cid: str,
    fresh: _Fresh,
    meta_text: str,
    run_id: str | None,
    key: str | None = None,
) -> Written | None:
    """The create-append form's rows (and `key`'s row) as statements of one
    transaction (Citus); None having written nothing when the id or the key is taken."""
    last = len(fresh.ids)
    with _steps.in_transaction(cursor) as abandon:
        cursor.execute(
            _STEP_NEW_CONVERSATION,
            (cid, tenant, fresh.branch_id, last, fresh.hashes[-1], meta_text, key),
        )
        found = cursor.fetchone()
        if found is None:
            abandon()
            return None
        at = found[0]
        if key is not None:
            try:
                cursor.execute(_STEP_NEW_KEY, (tenant, key, cid))
            except Exception as error:
                if _steps.autocommit(cursor) and (
                    violated_key(error) == "pk_chatledger_conversation_keys"
                ):
                    abandon()
                    return None
                raise
        cursor.execute(_STEP_NEW_BRANCH, (fresh.branch_id, cid, at, tenant))
        written = _step_events(cursor, fresh.rows(cid, run_id, at, tenant), last, "%s")
        views = [
            v
            for (seq, position, _), kind in zip(written, fresh.kinds, strict=True)
            if kind == "message.recorded"
            for v in (cid, position, seq, tenant)
        ]
        _step_rows(cursor, _STEP_VIEWS, 4, views)
    return Written(
        branch_id=fresh.branch_id,
        ids=fresh.ids[1:],
        written=[(r[0], r[1], at, h) for r, h in zip(written[1:], fresh.hashes[1:], strict=True)],
        created=_created_event(cid, fresh, written[0][0], at),
    )


_SQLITE_NEW_KEY = (
    "INSERT INTO chatledger_conversation_keys (tenant, key, conversation_id) VALUES (?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)


def create_conversation_sqlite(
    cursor: Any,
    tenant: str,
    conversation_id: str | None,
    meta_text: str,
    payload: str,
    key: str | None = None,
) -> Conversation | None:
    """`create_conversation_postgres` through a SQLite DB-API cursor inside the
    caller's `BEGIN IMMEDIATE` (None rolls it back)."""
    cid = conversation_id or new_id()
    if key is not None:
        cursor.execute(_SQLITE_NEW_KEY, (tenant, key, cid))
        if cursor.rowcount != 1:
            return None  # the key is taken: the general path says so
    done = create_append_sqlite(cursor, Turn(tenant, cid, [], root=(meta_text, payload)), key)
    if done is None or done.created is None:
        return None
    return _root(tenant, cid, done.branch_id, done.created.recorded_at, meta_text, key)


def _root(
    tenant: str,
    conversation_id: str,
    branch_id: str,
    created_at: datetime,
    meta_text: str,
    key: str | None,
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
        key=key,
    )


# -- the general path: every case, with SQLAlchemy Core ------------------------------


def keyed_event(conn: Connection, tenant: str, conversation_id: str, key: str) -> Event | None:
    """The event that carries idempotency key `key` in the conversation (the first of its append)."""
    row = conn.execute(
        sa.select(events).where(
            events.c.conversation_id == conversation_id,
            events.c.idempotency_key == key,
            events.c.tenant == tenant,
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
    first = keyed_event(conn, conv.tenant, conv.id, key)
    if first is None:
        return None
    rows = conn.execute(
        sa.select(events)
        .where(
            events.c.tenant == conv.tenant,
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
    turn: Turn,
    *,
    create: bool = False,
    metadata: dict[str, Any] | None = None,
    after: int | Position | None = None,
    seal: Seal = PLAIN,
) -> Appended:
    """Append `turn` at the head and move the head past it, atomically: every case.

    The conversation row lock serializes appends to one conversation. When
    the head is not the tip of its branch (a run's leftovers lie beyond it),
    the turn opens a new branch at the head. With `create`, a conversation
    the tenant does not have is created first, in the same transaction, with
    `metadata`. With `after`, the turn goes after that position instead,
    replacing what followed it in the head's history (which stays in the log,
    on its branch). These are the pre-steps; the writer of the in-place forms
    (`write_postgres`, `write_sqlite`) then writes the turn, in this transaction.
    """
    encoded, cid, tenant = turn.encoded, turn.conversation_id, turn.tenant
    if not encoded:
        raise InvalidInputError("append_messages needs at least one message, or a state.")
    created = _create_first(conn, tenant, cid, metadata, seal) if create else None
    conv = get_conversation(conn, tenant, cid, lock=True)
    if turn.key is not None:
        again = replayed(conn, conv, turn.key, encoded, turn.run_id, turn.named, seal)
        if again is not None:
            return again
    expected = turn.expected
    if turn.expected_branch is not None and expected is not None:
        check_expected(conv, Position(turn.expected_branch, expected))
    else:
        check_expected(conv, expected)
    _keys.check_writable(conn, turn.tenant, cid, encoded)
    _entries.check_state(conv, turn.expected_state, seal)
    if turn.named:
        _entries.check_ids_free(conn, turn.tenant, cid, turn.named)
    base = conv.head if after is None else resolve_position(conn, conv, after)
    branch_id, position = base.branch_id, base.position
    written: list[Event] = [] if created is None else [created]
    opened = not conv.head_open if after is None else not head_is_open(conn, turn.tenant, cid, base)
    head_hash = bytes(
        conn.execute(
            sa.select(conversations.c.head_hash).where(
                conversations.c.id == cid, conversations.c.tenant == turn.tenant
            )
        ).scalar_one()
    )
    if opened:
        reason: BranchReason = "run" if after is None else "edit"
        run_id = turn.run_id if after is None else None
        branch_id, branched = create_branch(
            conn, turn.tenant, cid, base, reason, run_id=run_id, origin="client"
        )
        written.append(branched)
        position += 1
        previous = branched.hash
    elif base == conv.head:
        previous = head_hash
    else:
        previous = previous_hash(conn, turn.tenant, cid, branch_id, position + 1)
    if base != conv.head:  # the turn replaces what followed `base` in the head's view
        projector.move_view(conn, turn.tenant, cid, conv.head, base)
    seen = (conv.head.branch_id, conv.head.position, head_hash, conv.head_open)
    at = At(seen, branch_id, position, previous)
    checked = replace(turn, sealed=None)  # `check_writable` has checked the sealing
    try:
        done = on_cursor(conn, lambda cursor: _WRITERS[is_sqlite(conn)](cursor, checked, at))
    except Exception as error:
        # A caller id taken by a concurrent append since `check_ids_free`, or by
        # another tenant (one server's key is the id alone).
        if unique_violation(error, minted_ids, ["id"]):
            raise _entries.ids_taken(cid) from error
        raise
    assert done is not None, "the head moved under the row lock"
    return appended(turn, done, before=written)


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
        if not isinstance(expected, int) or isinstance(expected, bool):
            raise InvalidInputError(
                f"expected is the head position the caller last saw (an int or a Position), "
                f"or an Expected(head=..., state=...), not {expected!r}."
            )
        check_int(expected, "expected", minimum=0, maximum=MAX_INT32)
    if run_id is not None:
        _checks.check_id(run_id, "run")
    if idempotency_key is not None:
        check_text(idempotency_key, "idempotency key")


def appended(
    turn: Turn,
    done: Written,
    *,
    texts: Sequence[tuple[NewEvent, str]] | None = None,
    before: Sequence[Event] = (),
) -> Appended:
    """What a form wrote for `turn`, as an append reports it: after the events the
    general path wrote `before` it (a creation, a new branch), if any, with the
    payloads `texts` (default: as written; the in-place forms report the caller's
    clear ones, which need no opening)."""
    encoded = turn.encoded if texts is None else texts
    cid, key, run_id = turn.conversation_id, turn.key, turn.run_id
    written = [*before] if done.created is None else [done.created]
    written += [
        Event(
            seq=seq,
            id=event_id,
            conversation_id=cid,
            branch_id=done.branch_id,
            position=position,
            run_id=run_id,
            kind=item.kind,
            origin=item.origin,
            head=i == len(encoded) - 1,
            recorded_at=utc(recorded_at),
            idempotency_key=key if i == 0 else None,
            payload_json=text,
            hash=event_hash,
        )
        for i, (event_id, (seq, position, recorded_at, event_hash), (item, text)) in enumerate(
            zip(done.ids, done.written, encoded, strict=True)
        )
    ]
    created = any(e.kind == "conversation.created" for e in written)
    return Appended(cid, written, Position(done.branch_id, written[-1].position), created=created)


POSTGRES = Dialect(read=read_postgres, write=write_postgres, create=create_append_postgres)
SQLITE = Dialect(
    read=read_sqlite, write=write_sqlite, create=create_append_sqlite, taken=_taken_sqlite
)
_WRITERS = {False: write_postgres, True: write_sqlite}
"""The writer of a connection's dialect, by `is_sqlite`."""
