"""The event log's operations, as functions over one open transaction.

Each function takes a `Connection` inside a transaction that the caller (the
`Store`) began, so the sync and async stores share this code unchanged.
Business rules that need no database (repair, identity) live in
`store.history`; this module translates between rows and values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from store import _chain, _fastpath, projector
from store._dialect import db_now, for_update
from store._errors import ConflictError, InvalidInputError, NotFoundError
from store._values import (
    Appended,
    Branch,
    BranchReason,
    Conversation,
    Event,
    ForkPoint,
    NewEvent,
    Origin,
    Position,
)
from store.ids import is_id, new_id
from store.messages import dump_message
from store.schema import branches, conversations, events

__all__ = [
    "MAX_PAYLOAD_CHARS",
    "append_messages",
    "appended_in_place",
    "branch_tip",
    "create_branch",
    "create_conversation",
    "encode_events",
    "fork",
    "get_branch",
    "get_conversation",
    "insert_events",
    "list_conversations",
    "list_events",
    "move_head",
    "previous_hash",
    "resolve_position",
]

MAX_PAYLOAD_CHARS = 64 * 1024 * 1024


def utc(value: datetime) -> datetime:
    """`value` as an aware UTC datetime (SQLite hands back naive UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON text: the stored form of non-message payloads."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def check_text(value: str, what: str) -> str:
    """Refuse text that cannot be stored: empty, too long, NUL or lone surrogates."""
    if not value or len(value) > 200 or "\x00" in value:
        raise InvalidInputError(
            f"The {what} {value!r} is not usable: it must be 1 to 200 characters with no NUL "
            f"character. Pass a short, printable {what}."
        )
    _check_encodable(value, what)
    return value


def _check_encodable(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"The {what} contains text that is not valid Unicode ({exc.reason}); nothing was "
            f"written. Decode it with errors='replace' before passing it."
        ) from exc


def encode_events(new_events: Sequence[NewEvent]) -> list[tuple[NewEvent, str]]:
    """Validate and serialize events before any transaction begins."""
    encoded = []
    for item in new_events:
        if item.kind == "message.recorded":
            if item.message is None:
                raise InvalidInputError(
                    "A message.recorded event needs its message; build it with NewEvent.of_message()."
                )
            text = dump_message(item.message)
        else:
            text = canonical_json(item.payload)
            _check_encodable(text, f"{item.kind} payload")
        if len(text) > MAX_PAYLOAD_CHARS:
            raise InvalidInputError(
                f"A {item.kind} payload is {len(text):,} characters, over the limit of "
                f"{MAX_PAYLOAD_CHARS:,}. Store large content elsewhere and record a URL part."
            )
        encoded.append((item, text))
    return encoded


# -- rows to values -----------------------------------------------------------


def _conversation(row: Row[Any]) -> Conversation:
    m = row._mapping
    forked = None
    if m["forked_from_conversation_id"] is not None:
        forked = ForkPoint(
            m["forked_from_conversation_id"], m["forked_from_branch_id"], m["forked_from_position"]
        )
    return Conversation(
        id=m["id"],
        tenant=m["tenant"],
        head=Position(m["head_branch_id"], m["head_position"]),
        head_open=bool(m["head_open"]),
        created_at=utc(m["created_at"]),
        metadata=json.loads(m["metadata"]),
        forked_from=forked,
    )


def event_from_row(row: Row[Any]) -> Event:
    """An `Event` from a full events row."""
    m = row._mapping
    return Event(
        seq=m["seq"],
        id=m["id"],
        conversation_id=m["conversation_id"],
        branch_id=m["branch_id"],
        position=m["position"],
        run_id=m["run_id"],
        kind=m["kind"],
        origin=m["origin"],
        head=bool(m["head"]),
        recorded_at=utc(m["recorded_at"]),
        idempotency_key=m["idempotency_key"],
        payload_json=m["payload"],
        hash=bytes(m["hash"]),
    )


# -- conversations --------------------------------------------------------------


def get_conversation(
    conn: Connection, tenant: str, conversation_id: str, *, lock: bool = False
) -> Conversation:
    """The tenant's conversation; `NotFoundError` for a missing or foreign one."""
    _check_id(conversation_id, "conversation")
    query = sa.select(conversations).where(
        conversations.c.id == conversation_id, conversations.c.tenant == tenant
    )
    row = conn.execute(for_update(conn, query) if lock else query).first()
    if row is None:
        raise NotFoundError("conversation", conversation_id, tenant)
    return _conversation(row)


def list_conversations(
    conn: Connection, tenant: str, *, limit: int, before: str | None
) -> list[Conversation]:
    """The tenant's conversations, newest first, keyset-paginated by id."""
    if limit < 1:
        raise InvalidInputError(f"limit must be at least 1, not {limit}.")
    query = sa.select(conversations).where(conversations.c.tenant == tenant)
    if before is not None:
        _check_id(before, "conversation")
        query = query.where(conversations.c.id < before)
    rows = conn.execute(query.order_by(conversations.c.id.desc()).limit(limit)).all()
    return [_conversation(r) for r in rows]


def create_conversation(
    conn: Connection,
    tenant: str,
    metadata: dict[str, Any] | None,
    *,
    conversation_id: str | None = None,
    fork_point: ForkPoint | None = None,
) -> Conversation:
    """A new conversation whose root branch starts with `conversation.created`."""
    conversation_id = conversation_id or new_id()
    _check_id(conversation_id, "conversation")
    meta_text = canonical_json(metadata or {})
    _check_encodable(meta_text, "metadata")
    branch_id = new_id()
    parent_position = fork_point.position if fork_point else 0
    conn.execute(
        branches.insert().values(
            id=branch_id,
            conversation_id=conversation_id,
            parent_branch_id=fork_point.branch_id if fork_point else None,
            parent_position=fork_point.position if fork_point else None,
            reason="fork" if fork_point else "root",
            created_at=db_now(conn),
        )
    )
    payload: dict[str, Any] = {"metadata": metadata or {}, "tenant": tenant}
    if fork_point:
        payload["forkedFrom"] = {
            "conversationId": fork_point.conversation_id,
            "branchId": fork_point.branch_id,
            "position": fork_point.position,
        }
    position = parent_position + 1
    (created,) = insert_events(
        conn,
        conversation_id,
        branch_id,
        position,
        [(NewEvent("conversation.created", payload, origin="client"), canonical_json(payload))],
        head=True,
    )
    conn.execute(
        conversations.insert().values(
            id=conversation_id,
            tenant=tenant,
            head_branch_id=branch_id,
            head_position=position,
            head_open=True,
            head_hash=created.hash,
            created_at=db_now(conn),
            metadata=meta_text,
            forked_from_conversation_id=fork_point.conversation_id if fork_point else None,
            forked_from_branch_id=fork_point.branch_id if fork_point else None,
            forked_from_position=fork_point.position if fork_point else None,
        )
    )
    if fork_point:
        projector.fill_view(conn, conversation_id, Position(branch_id, position))
    return get_conversation(conn, tenant, conversation_id)


def fork(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    at: int | Position | None,
    metadata: dict[str, Any] | None,
) -> Conversation:
    """A new conversation continuing `conversation_id` at `at`; nothing is copied."""
    source = get_conversation(conn, tenant, conversation_id)
    point = resolve_position(conn, source, at)
    return create_conversation(
        conn,
        tenant,
        metadata,
        fork_point=ForkPoint(source.id, point.branch_id, point.position),
    )


def resolve_position(conn: Connection, conv: Conversation, at: int | Position | None) -> Position:
    """`at` as a position of `conv`: None is the head; an int is on the head's lineage."""
    if at is None:
        return conv.head
    if isinstance(at, int) and not isinstance(at, bool):
        if not 1 <= at <= conv.head.position:
            raise InvalidInputError(
                f"Position {at} is not on the head lineage of conversation '{conv.id}', which "
                f"runs from 1 to {conv.head.position}. Pass a position in that range, or a "
                f"Position(branch_id, position) for another branch."
            )
        for _, branch_id, first, last in projector.lineage(conn, conv.head):
            if first <= at <= last:
                return Position(branch_id, at)
        raise AssertionError("a lineage covers every position up to its end")
    if isinstance(at, Position):
        branch = get_branch(conn, conv.tenant, conv.id, at.branch_id)
        first = (branch.parent.position if branch.parent else 0) + 1
        tip = branch_tip(conn, conv.id, branch.id)
        if not first <= at.position <= tip:
            raise InvalidInputError(
                f"Branch '{branch.id}' of conversation '{conv.id}' holds positions {first} to "
                f"{tip}, not {at.position}. Pass a position in that range."
            )
        return at
    raise InvalidInputError(f"A position must be an int or a Position, not {type(at).__name__}.")


# -- branches -----------------------------------------------------------------


def get_branch(conn: Connection, tenant: str, conversation_id: str, branch_id: str) -> Branch:
    """A branch of the tenant's conversation."""
    _check_id(branch_id, "branch")
    row = conn.execute(
        sa.select(branches)
        .join(conversations, conversations.c.id == branches.c.conversation_id)
        .where(
            branches.c.id == branch_id,
            branches.c.conversation_id == conversation_id,
            conversations.c.tenant == tenant,
        )
    ).first()
    if row is None:
        raise NotFoundError("branch", branch_id, tenant)
    m = row._mapping
    parent = None
    if m["parent_branch_id"] is not None:
        parent = Position(m["parent_branch_id"], m["parent_position"])
    return Branch(
        id=m["id"],
        conversation_id=m["conversation_id"],
        parent=parent,
        reason=m["reason"],
        run_id=m["run_id"],
        resumes_run_id=m["resumes_run_id"],
        created_at=utc(m["created_at"]),
    )


def branch_tip(conn: Connection, conversation_id: str, branch_id: str) -> int:
    """The position of a branch's last event."""
    tip = conn.execute(
        sa.select(sa.func.max(events.c.position)).where(
            events.c.conversation_id == conversation_id, events.c.branch_id == branch_id
        )
    ).scalar_one()
    return int(tip or 0)


def create_branch(
    conn: Connection,
    conversation_id: str,
    parent: Position,
    reason: BranchReason,
    *,
    run_id: str | None = None,
    resumes_run_id: str | None = None,
    origin: Origin = "run",
) -> tuple[str, Event]:
    """A new branch at `parent`, opened by its `branch.created` event."""
    branch_id = new_id()
    conn.execute(
        branches.insert().values(
            id=branch_id,
            conversation_id=conversation_id,
            parent_branch_id=parent.branch_id,
            parent_position=parent.position,
            reason=reason,
            run_id=run_id,
            resumes_run_id=resumes_run_id,
            created_at=db_now(conn),
        )
    )
    payload = {
        "parent": {"branchId": parent.branch_id, "position": parent.position},
        "reason": reason,
        "resumes": resumes_run_id,
    }
    (created,) = insert_events(
        conn,
        conversation_id,
        branch_id,
        parent.position + 1,
        [(NewEvent("branch.created", payload, origin=origin), canonical_json(payload))],
        run_id=run_id,
    )
    return branch_id, created


# -- events -----------------------------------------------------------------------


def insert_events(
    conn: Connection,
    conversation_id: str,
    branch_id: str,
    first_position: int,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    run_id: str | None = None,
    idempotency_key: str | None = None,
    head: bool = False,
) -> list[Event]:
    """Insert events at consecutive positions from `first_position`.

    The unique key (conversation, branch, position) refuses a position that
    another writer took; `head` flags the last event as setting the head.
    """
    if not encoded:
        return []
    rows: list[dict[str, Any]] = [
        {
            "id": new_id(),
            "conversation_id": conversation_id,
            "branch_id": branch_id,
            "position": first_position + i,
            "run_id": run_id,
            "kind": item.kind,
            "origin": item.origin,
            "head": head and i == len(encoded) - 1,
            "idempotency_key": idempotency_key if i == 0 else None,
            "payload": text,
        }
        for i, (item, text) in enumerate(encoded)
    ]
    previous = previous_hash(conn, conversation_id, branch_id, first_position)
    for row in rows:
        row["hash"] = previous = _chain.link(previous, _chain.content(**_chained(row)))
    stmt = (
        events.insert()
        .values(recorded_at=db_now(conn))
        .returning(events.c.seq, events.c.recorded_at, sort_by_parameter_order=True)
    )
    result = conn.execute(stmt, rows).all()
    return [
        Event(
            seq=seq,
            id=r["id"],
            conversation_id=conversation_id,
            branch_id=branch_id,
            position=r["position"],
            run_id=run_id,
            kind=r["kind"],
            origin=r["origin"],
            head=r["head"],
            recorded_at=utc(recorded_at),
            idempotency_key=r["idempotency_key"],
            payload_json=r["payload"],
            hash=r["hash"],
        )
        for r, (seq, recorded_at) in zip(rows, result, strict=True)
    ]


def _chained(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in _chain.FIELDS}


def previous_hash(conn: Connection, conversation_id: str, branch_id: str, position: int) -> bytes:
    """The hash an event at `position` of `branch_id` chains to (see `store._chain`)."""
    found = conn.execute(
        sa.select(events.c.hash).where(
            events.c.conversation_id == conversation_id,
            events.c.branch_id == branch_id,
            events.c.position == position - 1,
        )
    ).scalar()
    if found is not None:
        return bytes(found)
    # The branch's first event chains into the point its branch continues.
    parent = branches.alias("parent")
    row = conn.execute(
        sa.select(parent.c.conversation_id, branches.c.parent_branch_id, branches.c.parent_position)
        .select_from(branches.join(parent, parent.c.id == branches.c.parent_branch_id))
        .where(branches.c.id == branch_id)
    ).first()
    if row is None:
        return _chain.GENESIS
    found = conn.execute(
        sa.select(events.c.hash).where(
            events.c.conversation_id == row[0],
            events.c.branch_id == row[1],
            events.c.position == row[2],
        )
    ).scalar()
    return _chain.GENESIS if found is None else bytes(found)


def _replayed(
    conn: Connection, conv: Conversation, key: str, encoded: Sequence[tuple[NewEvent, str]]
) -> Appended | None:
    """The original append of an idempotency key, if the key was used."""
    first = conn.execute(
        sa.select(events.c.branch_id, events.c.position).where(
            events.c.conversation_id == conv.id, events.c.idempotency_key == key
        )
    ).first()
    if first is None:
        return None
    rows = conn.execute(
        sa.select(events)
        .where(
            events.c.conversation_id == conv.id,
            events.c.branch_id == first.branch_id,
            events.c.position >= first.position,
            events.c.position < first.position + len(encoded),
        )
        .order_by(events.c.position)
    ).all()
    original = [event_from_row(r) for r in rows]
    if [e.payload_json for e in original] != [text for _, text in encoded]:
        raise InvalidInputError(
            f"Idempotency key {key!r} of conversation '{conv.id}' was used for a different "
            f"append. Use a new key for new content; reuse a key only to retry the same append."
        )
    return Appended(conv.id, original, conv.head)


def append_messages(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    expected: int | None,
    run_id: str | None,
    idempotency_key: str | None,
) -> Appended:
    """Append one turn at the head and move the head past it, atomically.

    The conversation row lock serializes appends to one conversation. When
    the head is not the tip of its branch (a run's leftovers lie beyond it),
    the turn opens a new branch at the head.
    """
    if not encoded:
        raise InvalidInputError("append_messages needs at least one message.")
    if idempotency_key is not None:
        check_text(idempotency_key, "idempotency key")
    conv = get_conversation(conn, tenant, conversation_id, lock=True)
    if idempotency_key is not None:
        replayed = _replayed(conn, conv, idempotency_key, encoded)
        if replayed is not None:
            return replayed
    if expected is not None and expected != conv.head.position:
        raise ConflictError(
            f"Conversation '{conv.id}' is at position {conv.head.position}, but the append "
            f"expected {expected}. Another writer appended first; reload the history and retry.",
            conversation_id=conv.id,
            branch_id=conv.head.branch_id,
            expected=expected,
            actual=conv.head.position,
        )
    branch_id, position = conv.head.branch_id, conv.head.position
    written: list[Event] = []
    if not conv.head_open:
        branch_id, created = create_branch(
            conn, conv.id, conv.head, "run", run_id=run_id, origin="client"
        )
        written.append(created)
        position += 1
    written += insert_events(
        conn,
        conv.id,
        branch_id,
        position + 1,
        encoded,
        run_id=run_id,
        idempotency_key=idempotency_key,
        head=True,
    )
    new_head = Position(branch_id, written[-1].position)
    messages = [e for e in written if e.kind == "message.recorded"]
    set_head(conn, conv, new_head, messages, written[-1].hash)
    return Appended(conv.id, written, new_head)


def appended_in_place(
    conversation_id: str,
    done: _fastpath.InPlace | None,
    encoded: Sequence[tuple[NewEvent, str]],
    run_id: str | None,
    idempotency_key: str | None,
) -> Appended | None:
    """What a fast-path append wrote, as the general path reports it (None: nothing)."""
    if done is None:
        return None
    written = [
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
    return Appended(conversation_id, written, Position(done.branch_id, written[-1].position))


def set_head(
    conn: Connection,
    conv: Conversation,
    new_head: Position,
    appended: Sequence[Event],
    head_hash: bytes,
) -> None:
    """Move the head row and its view.

    `appended` are message events just added at the head; `head_hash` is the
    hash of the new head's event (the conversation's chain head).
    """
    if new_head.branch_id == conv.head.branch_id and all(
        e.position > conv.head.position for e in appended
    ):
        projector.advance_view(conn, conv.id, [(e.position, e.seq) for e in appended])
    else:
        projector.move_view(conn, conv.id, conv.head, new_head)
    # Every new head is the tip of a branch no run is writing (the run that
    # wrote it has just ended), so the next append may continue it in place.
    conn.execute(
        conversations.update()
        .where(conversations.c.id == conv.id)
        .values(
            head_branch_id=new_head.branch_id,
            head_position=new_head.position,
            head_open=True,
            head_hash=head_hash,
        )
    )


def move_head(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    to: int | Position,
    *,
    expected: Position | None,
) -> Conversation:
    """Move the head to `to` by compare-and-set, recording `head.moved`.

    A target that is not the tip of its branch opens an `edit` branch there,
    so the `head.moved` event lands on a line of its own.
    """
    conv = get_conversation(conn, tenant, conversation_id, lock=True)
    if expected is not None and expected != conv.head:
        raise ConflictError(
            f"The head of conversation '{conv.id}' is at {conv.head.branch_id}:"
            f"{conv.head.position}, not at the expected {expected.branch_id}:{expected.position}. "
            f"Another writer moved it; reload the conversation and retry.",
            conversation_id=conv.id,
            branch_id=conv.head.branch_id,
            expected=expected.position,
            actual=conv.head.position,
        )
    target = resolve_position(conn, conv, to)
    branch_id, position = target.branch_id, target.position
    if not projector.head_is_open(conn, conv.id, target):
        branch_id, _ = create_branch(conn, conv.id, target, "edit", origin="client")
        position += 1
    payload = {
        "from": {"branchId": conv.head.branch_id, "position": conv.head.position},
        "to": {"branchId": target.branch_id, "position": target.position},
    }
    (moved,) = insert_events(
        conn,
        conv.id,
        branch_id,
        position + 1,
        [(NewEvent("head.moved", payload, origin="client"), canonical_json(payload))],
        head=True,
    )
    set_head(conn, conv, Position(branch_id, moved.position), [], moved.hash)
    return get_conversation(conn, tenant, conversation_id)


def list_events(
    conn: Connection,
    tenant: str,
    *,
    conversation_id: str | None,
    run_id: str | None,
    after_seq: int | None,
    limit: int | None,
) -> list[Event]:
    """The tenant's raw log, in `seq` order, filtered by conversation or run."""
    query = (
        sa.select(events)
        .join(conversations, conversations.c.id == events.c.conversation_id)
        .where(conversations.c.tenant == tenant)
    )
    if conversation_id is not None:
        get_conversation(conn, tenant, conversation_id)
        query = query.where(events.c.conversation_id == conversation_id)
    if run_id is not None:
        _check_id(run_id, "run")
        query = query.where(events.c.run_id == run_id)
    if after_seq is not None:
        query = query.where(events.c.seq > after_seq)
    query = query.order_by(events.c.seq)
    if limit is not None:
        query = query.limit(limit)
    return [event_from_row(r) for r in conn.execute(query).all()]


def _check_id(value: str, kind: str) -> None:
    # A malformed id would make Postgres' uuid cast fail with a driver error,
    # and a differently spelled one would match on Postgres but not on SQLite:
    # only the canonical form is accepted, the same way on both.
    if not is_id(value):
        raise InvalidInputError(
            f"{kind.capitalize()} id {value!r} is not a UUID in canonical form (lowercase, "
            f"hyphenated). Pass the id exactly as chatledger returned it."
        )
