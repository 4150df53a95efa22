"""Entries, caller-minted event ids and conversation state (ADR 0018).

What agent frameworks need beside the chat-loop append:

- `entries`: the messages of a lineage with where each one is (its event id
  and position), or only the last N of them, in one query;
- `entry`: one message by the id its caller minted for it
  (`append_messages(ids=...)`), found through `chatledger_event_ids`
  without indexing every event's id;
- `check_ids_free`: that no other event holds those ids (the append's writer
  records them);
- state: a JSON object per conversation that changes after creation, each
  change a `state.changed` event at the head, its current value kept on the
  conversation row; `check_state` is the compare-and-set on its fields;
  `state_changes`, those events read back (ADR 0036).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store import _checks
from chatledger.store._crypto import PLAIN, Seal
from chatledger.store._errors import (
    ConflictError,
    EncryptionError,
    InvalidInputError,
    NotFoundError,
)
from chatledger.store._sql import keys as _keys
from chatledger.store._sql import log as _log
from chatledger.store._sql import projector
from chatledger.store._sql.log import (
    canonical_json,
    event_from_row,
    get_conversation,
    insert_events,
    set_head,
    utc,
)
from chatledger.store._values import Conversation, Entry, Event, NewEvent, Position
from chatledger.store.messages import load_messages
from chatledger.store.schema import conversations, event_ids, events

__all__ = [
    "MINTED",
    "changed_fields",
    "check_ids",
    "check_ids_free",
    "check_state",
    "encode_state",
    "entries",
    "entry",
    "ids_taken",
    "json_equal",
    "move_head",
    "record_state",
    "state_changed",
    "state_changes",
    "store_state",
]

MESSAGE = "message.recorded"
Opening = Callable[[list[str]], list[str]]
"""What a read does to stored payloads before it parses them: opens the sealed ones
(or refuses them, on a store without a key)."""


MINTED = sa.and_(
    event_ids.c.conversation_id == events.c.conversation_id,
    event_ids.c.event_seq == events.c.seq,
    event_ids.c.tenant == events.c.tenant,
)
"""The join of an event and the id its caller minted for it (`chatledger_event_ids`)."""


def _unopened(texts: list[str]) -> list[str]:
    return texts


MAX_STATE_CHARS = 1024 * 1024
"""The largest state, as JSON text: it is written on every change, with the row."""
_COLUMNS = (
    events.c.seq,
    events.c.id,
    events.c.conversation_id,
    events.c.branch_id,
    events.c.position,
    events.c.recorded_at,
    events.c.payload,
)


def entries(
    conn: Connection,
    conv: Conversation,
    at: Position | None,
    last: int | None,
    opening: Opening = _unopened,
) -> list[Entry]:
    """The messages of the lineage ending at `at` (None: the head), oldest first;
    only the last `last` of them when given. `opening` turns the stored payloads
    into the texts to parse (opening sealed ones)."""
    position: sa.ColumnElement[Any]
    if at is None:
        head = projector.view_rows(conv.tenant, conv.id, _COLUMNS, conv.forked_from is not None)
        query = sa.select(*(head.c[c.name] for c in _COLUMNS))
        position = head.c.view_position
    else:
        segments = projector.lineage(conn, conv.tenant, at)
        query = sa.select(*_COLUMNS).where(
            projector.in_segments(segments),
            events.c.kind == MESSAGE,
            events.c.tenant == conv.tenant,
        )
        position = events.c.position
    if last is None:
        return _entries(conn.execute(query.order_by(position)).all(), opening)
    newest_first = conn.execute(query.order_by(position.desc()).limit(last)).all()
    return _entries(newest_first[::-1], opening)


def entry(conn: Connection, tenant: str, event_id: str, opening: Opening = _unopened) -> Entry:
    """The message whose event id its caller minted; `NotFoundError` otherwise,
    and for another tenant's. `opening` as for `entries`."""
    _checks.check_id(event_id, "event")
    row = conn.execute(
        sa.select(*_COLUMNS)
        .select_from(event_ids.join(events, MINTED))
        .where(event_ids.c.id == event_id, event_ids.c.tenant == tenant)
    ).first()
    if row is None:
        raise NotFoundError("entry", event_id, tenant)
    (found,) = _entries([row], opening)
    return found


def _entries(rows: Sequence[Any], opening: Opening) -> list[Entry]:
    """Entries of rows of `_COLUMNS` (read by index: a row's attributes cost more)."""
    messages = load_messages(opening([r[6] for r in rows]))
    return [
        Entry(
            event_id=str(event_id),
            conversation_id=str(conversation_id),
            position=Position(str(branch_id), position),
            seq=seq,
            recorded_at=utc(recorded_at),
            message=message,
        )
        for (seq, event_id, conversation_id, branch_id, position, recorded_at, _), message in zip(
            rows, messages, strict=True
        )
    ]


# -- caller-minted ids --------------------------------------------------------------


def check_ids(ids: object, count: int) -> list[str] | None:
    """`append_messages(ids=...)`: one canonical UUID per message, none twice."""
    if ids is None:
        return None
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise InvalidInputError(
            f"ids must be a list of event ids, one per message, not {type(ids).__name__}."
        )
    checked = [_checks.check_id(i, "event") for i in ids]
    if len(checked) != count:
        raise InvalidInputError(
            f"ids has {len(checked)} ids for {count} messages: give one id per message."
        )
    if len(set(checked)) != len(checked):
        raise InvalidInputError("ids holds the same id twice: give each message an id of its own.")
    return checked


def check_ids_free(conn: Connection, tenant: str, conversation_id: str, ids: Sequence[str]) -> None:
    """Refuse caller-minted event ids that another event of the tenant holds. Another
    tenant's is refused by the key on one server, with the same error (`ids_taken`);
    on Citus ids are a tenant's (docs/adr/0054-citus-distributed-by-tenant.md)."""
    taken = conn.execute(
        sa.select(event_ids.c.id).where(event_ids.c.id.in_(ids), event_ids.c.tenant == tenant)
    ).first()
    if taken is not None:
        raise ids_taken(conversation_id)


def ids_taken(conversation_id: str) -> ConflictError:
    """An event id of the append is taken (found by `check_ids_free`, or by the key when
    a concurrent append, or another tenant, took it)."""
    return ConflictError(
        "An event id of this append is taken by another event, so nothing was written. "
        "Mint a new id for each message (a UUIDv7, say); to retry an append that may "
        "have landed, pass the same idempotency key.",
        conversation_id=conversation_id,
    )


# -- state ------------------------------------------------------------------------


def encode_state(state: object, what: str = "state") -> str:
    """A conversation's state (a dict of plain JSON) as its stored text."""
    if not isinstance(state, dict):
        raise InvalidInputError(f"{what} must be a dict, not {type(state).__name__}.")
    if "sealed" in state:
        raise InvalidInputError(
            f"The {what} carries the field 'sealed', which chatledger reserves for the "
            f"content it stores encrypted (docs/erasure.md). Rename the field."
        )
    text = canonical_json(state, what)
    if len(text) > MAX_STATE_CHARS:
        raise InvalidInputError(
            f"The {what} is {len(text):,} characters of JSON; a conversation's state holds at "
            f"most {MAX_STATE_CHARS:,}. Keep large values in messages or your own storage."
        )
    return text


def changed_fields(state: Mapping[str, Any], expected: Mapping[str, Any] | None) -> list[str]:
    """The fields of `expected` that do not hold their value in `state` (null: absent)."""
    if expected is None:
        return []
    return [k for k, v in expected.items() if not json_equal(state.get(k), v)]


def json_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: numbers by value (1 == 1.0), but a
    boolean only equals a boolean (Postgres's `jsonb` equality, which the fast
    form of the compare-and-set uses)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return bool(a == b)


def check_state(conv: Conversation, expected: Mapping[str, Any] | None, seal: Seal = PLAIN) -> None:
    """The compare-and-set on state: each field of `expected` must hold its value now
    (a field given as None must be absent or null); a sealed state opens under `seal`."""
    if expected is None:
        return
    state = seal.state_of(conv.state, conv.subject is not None)
    if state is None:
        raise EncryptionError(
            f"The state of conversation '{conv.id}' is sealed, and this write does not hold "
            f"its key: open the store with its key-encryption key (Store.open(kek=...) or "
            f"CHATLEDGER_KEK). Nothing was written."
        )
    differs = changed_fields(state, expected)
    if differs:
        fields = ", ".join(map(repr, differs))
        raise ConflictError(
            f"The state of conversation '{conv.id}' changed: {fields} no longer "
            f"{'holds its' if len(differs) == 1 else 'hold their'} expected "
            f"value{'' if len(differs) == 1 else 's'}. Another writer saved first; reload the "
            f"conversation and retry.",
            conversation_id=conv.id,
        )


def record_state(
    conn: Connection, conv: Conversation, at: Position, state_text: str, seal: Seal = PLAIN
) -> Event:
    """A `state.changed` event right after `at` (the head, a tip of its branch, its
    view current), which becomes the head; and the conversation row's state: both
    sealed under `seal`, which must be the conversation's."""
    encoded = seal.events([state_changed(json.loads(state_text), state_text)])
    _keys.check_writable(conn, conv.tenant, conv.id, encoded)
    (changed,) = insert_events(
        conn, conv.tenant, conv.id, at.branch_id, at.position + 1, encoded, head=True
    )
    set_head(
        conn, replace(conv, head=at), Position(at.branch_id, changed.position), [], changed.hash
    )
    store_state(conn, conv.tenant, conv.id, seal.state(state_text))
    return changed


def state_changed(state: Mapping[str, Any], state_text: str) -> tuple[NewEvent, str]:
    """The `state.changed` event of a new state, encoded: `state_text` is the
    state's canonical JSON (`encode_state`), so the payload's is its own."""
    payload = {"state": dict(state)}
    return NewEvent("state.changed", payload, origin="client"), '{"state":' + state_text + "}"


def state_changes(
    conn: Connection,
    tenant: str,
    conversation_id: str | None,
    run_id: str | None,
    opening: Opening = _unopened,
) -> list[Event]:
    """The `state.changed` events of a conversation (every branch of its own log, and
    the lineage it continues from its source when it is a fork), or of the tenant's
    conversations stamped with `run_id`, or both filters at once; oldest first, their
    payloads opened by `opening`."""
    query = sa.select(events).where(events.c.kind == "state.changed", events.c.tenant == tenant)
    if conversation_id is not None:
        conv = get_conversation(conn, tenant, conversation_id)
        reach = events.c.conversation_id == conv.id
        if conv.forked_from is not None:
            point = conv.forked_from
            inherited = projector.lineage(conn, tenant, Position(point.branch_id, point.position))
            reach = sa.or_(reach, projector.in_segments(inherited))
        query = query.where(reach)
    if run_id is not None:
        query = query.where(
            events.c.run_id == run_id,
            events.c.conversation_id.in_(
                sa.select(conversations.c.id).where(conversations.c.tenant == tenant)
            ),
        )
    rows = conn.execute(query.order_by(events.c.seq)).all()
    texts = opening([r._mapping["payload"] for r in rows])
    return [
        replace(event_from_row(row), payload_json=text)
        for row, text in zip(rows, texts, strict=True)
    ]


def store_state(conn: Connection, tenant: str, conversation_id: str, state_text: str) -> None:
    """The conversation row's current state (its `state.changed` event written)."""
    conn.execute(
        conversations.update()
        .where(conversations.c.id == conversation_id, conversations.c.tenant == tenant)
        .values(state=state_text)
    )


def move_head(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    to: int | Position,
    *,
    expected: Position | None,
    state: str | None,
    expected_state: Mapping[str, Any] | None,
    seal: Seal = PLAIN,
) -> Conversation:
    """`log.move_head`, and with `state` a `state.changed` right after its
    `head.moved`, both by compare-and-set, in one transaction; a sealed state under
    `seal`, the conversation's."""
    if expected_state is not None:
        conv = get_conversation(conn, tenant, conversation_id, lock=True)
        check_state(conv, expected_state, seal)
    moved = _log.move_head(conn, tenant, conversation_id, to, expected=expected, head=state is None)
    if state is None:
        return moved
    record_state(conn, moved, moved.head, state, seal)
    return get_conversation(conn, tenant, conversation_id)
