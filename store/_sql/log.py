"""The event log's operations, as functions over one open transaction.

Each function takes a `Connection` inside a transaction that the caller (the
`Store`) began, so the sync and async stores share this code unchanged; the
fast forms of `create_conversation` are the append's create-append forms
(`store._sql.append`), and the one-query `conversation_by_key` forms here take
a DB-API cursor.
Business rules that need no database (repair, identity) live in
`store.history`; this module translates between rows and values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from chatledger.store import _checks
from chatledger.store._checks import (
    MAX_INT32,
    MAX_INT64,
    check_choice,
    check_int,
    check_limit,
    json_text,
)
from chatledger.store._crypto import PLAIN, Seal
from chatledger.store._errors import (
    ConflictError,
    EncryptionError,
    InvalidInputError,
    NotFoundError,
)
from chatledger.store._sql import chain as _chain
from chatledger.store._sql import keys as _keys
from chatledger.store._sql import projector
from chatledger.store._sql.dialect import db_now, for_update, is_sqlite
from chatledger.store._sql.translate import unique_violation
from chatledger.store._values import (
    Branch,
    BranchReason,
    Conversation,
    Event,
    EventKind,
    ForkPoint,
    NewEvent,
    Origin,
    Position,
)
from chatledger.store.ids import new_id
from chatledger.store.messages import Message, dump_message
from chatledger.store.schema import branches, conversation_keys, conversations, events, runs

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_PAYLOAD_CHARS",
    "branch_tip",
    "check_key",
    "conversation_by_key_postgres",
    "conversation_by_key_sqlite",
    "conversation_of",
    "conversation_postgres",
    "conversation_sqlite",
    "create_branch",
    "create_conversation",
    "create_conversation_event",
    "encode_events",
    "encode_root",
    "fork",
    "get_branch",
    "get_conversation",
    "get_conversation_by_key",
    "insert_events",
    "key_taken",
    "list_conversations",
    "list_events",
    "move_head",
    "previous_hash",
    "resolve_position",
]

MAX_PAYLOAD_CHARS = 64 * 1024 * 1024

_KINDS: frozenset[str] = frozenset(get_args(EventKind))
_ORIGINS: frozenset[str] = frozenset(get_args(Origin))


def utc(value: datetime | str) -> datetime:
    """`value` as an aware UTC datetime (SQLite hands back naive UTC, or its text form
    from an expression such as `max()` or the clock)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def canonical_json(value: Any, what: str = "payload") -> str:
    """Compact, key-sorted JSON text: the stored form of non-message payloads.

    `InvalidInputError` when `value` is not plain JSON (see `_checks.json_text`).
    """
    return json_text(value, what)


check_text = _checks.check_text
_check_encodable = _checks.check_encodable


def encode_events(new_events: Sequence[NewEvent]) -> list[tuple[NewEvent, str]]:
    """Validate and serialize events before any transaction begins."""
    encoded = []
    for item in new_events:
        if not isinstance(item, NewEvent):
            raise InvalidInputError(
                f"Events to record are NewEvent values, not {type(item).__name__}. Build them "
                f"with NewEvent(kind, payload) or NewEvent.of_message(message)."
            )
        check_choice(item.kind, "An event's kind", _KINDS)
        check_choice(item.origin, "An event's origin", _ORIGINS)
        if item.kind == "message.recorded":
            if item.message is None:
                raise InvalidInputError(
                    "A message.recorded event needs its message; build it with NewEvent.of_message()."
                )
            if not isinstance(item.message, Message):
                raise InvalidInputError(
                    f"A message.recorded event needs a Message, not {type(item.message).__name__}."
                )
            if item.message.model_extra and "sealed" in item.message.model_extra:
                raise InvalidInputError(
                    "A message carries the field 'sealed', which chatledger reserves for the "
                    "messages it stores encrypted (docs/erasure.md). Rename the field."
                )
            text = dump_message(item.message)
        else:
            if not isinstance(item.payload, dict):
                raise InvalidInputError(
                    f"A {item.kind} payload must be a dict, not {type(item.payload).__name__}."
                )
            if "sealed" in item.payload:
                raise InvalidInputError(
                    f"A {item.kind} payload carries the field 'sealed', which chatledger "
                    f"reserves for the content it stores encrypted (docs/erasure.md). Rename "
                    f"the field."
                )
            text = canonical_json(item.payload, f"the {item.kind} payload")
        if len(text) > MAX_PAYLOAD_CHARS:
            raise InvalidInputError(
                f"A {item.kind} payload is {len(text):,} characters, over the limit of "
                f"{MAX_PAYLOAD_CHARS:,}. Store large content elsewhere and record a URL part."
            )
        encoded.append((item, text))
    return encoded


# -- rows to values -----------------------------------------------------------


def _conversation(row: Row[Any]) -> Conversation:
    return conversation_of(row._mapping)


def conversation_of(m: Mapping[Any, Any]) -> Conversation:
    """A conversation row's values (by column name) as a `Conversation`."""
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
        key=m["key"],
        state=json.loads(m["state"]),
        subject=m["subject"],
        erased_at=None if m["erased_at"] is None else utc(m["erased_at"]),
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
    check_limit(limit)
    query = sa.select(conversations).where(conversations.c.tenant == tenant)
    if before is not None:
        # The keyset cursor is a conversation id: one of this tenant's, like any other id.
        get_conversation(conn, tenant, before)
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
    key: str | None = None,
    seal: Seal = PLAIN,
) -> Conversation:
    """A new conversation whose root branch starts with `conversation.created`.

    A caller-chosen id that is taken, by this tenant or any other, is a
    `ConflictError` that reads the same either way; so is a `key` the tenant
    already uses.
    """
    conv, _ = create_conversation_event(
        conn,
        tenant,
        metadata,
        conversation_id=conversation_id,
        fork_point=fork_point,
        key=key,
        seal=seal,
    )
    return conv


def create_conversation_event(
    conn: Connection,
    tenant: str,
    metadata: dict[str, Any] | None,
    *,
    conversation_id: str | None = None,
    fork_point: ForkPoint | None = None,
    head: bool = True,
    key: str | None = None,
    seal: Seal = PLAIN,
) -> tuple[Conversation, Event]:
    """`create_conversation`, also returning its `conversation.created` event.

    `head=False` when the same transaction goes on to append (a conversation
    created by its first append): the head this commit leaves is not there.
    With a `seal` that has a key, the metadata and the `conversation.created`
    payload are sealed and the conversation belongs to the seal's subject
    (whose new key, if minted for it, is written here).
    """
    conversation_id = _checks.check_new_id(conversation_id, "conversation") or new_id()
    meta_text = check_metadata(metadata)
    if key is not None:
        check_key(key)
    if _taken(conn, tenant, conversation_id):
        raise ConflictError(
            f"Conversation id '{conversation_id}' is taken. Pass another id, or none to have "
            f"chatledger mint one.",
            conversation_id=conversation_id,
        )
    if key is not None and _key_taken(conn, tenant, key):
        raise key_taken(key, conversation_id)
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
            tenant=tenant,
        )
    )
    payload = _created_payload(tenant, metadata, fork_point)
    position = parent_position + 1
    if seal.key is not None and seal.new_key is None:
        # The subject's key, read before this transaction: it must still exist,
        # and an erasure of the subject waits for this creation (and then erases it).
        _keys.hold_key(conn, tenant, seal.key.key_id, conversation_id)
    if seal.new_key is not None:
        new = seal.new_key
        _keys.insert_key(
            conn,
            key_id=new.key_id,
            tenant=new.tenant,
            subject=new.subject,
            kek_id=new.kek_id,
            wrapped=new.wrapped,
            conversation_id=conversation_id,
        )
    (created,) = insert_events(
        conn,
        tenant,
        conversation_id,
        branch_id,
        position,
        seal.events(
            [(NewEvent("conversation.created", payload, origin="client"), canonical_json(payload))]
        ),
        head=head,
    )
    try:
        _insert_conversation(
            conn,
            conversation_id,
            tenant,
            branch_id,
            position,
            created.hash,
            seal.metadata(meta_text),
            fork_point,
            key,
            seal.subject if seal.sealed else None,
        )
    except sa.exc.IntegrityError as error:
        # Another transaction took the id (or the key) between the checks above
        # and here; the transaction rolls back as this propagates, so nothing
        # is written.
        if key is not None and unique_violation(error, conversation_keys, ["tenant", "key"]):
            raise key_taken(key, conversation_id) from error
        if unique_violation(error, conversations, ["id"]):
            raise ConflictError(
                f"Conversation id '{conversation_id}' is taken. Pass another id, or none to "
                f"have chatledger mint one.",
                conversation_id=conversation_id,
            ) from error
        raise
    if fork_point:
        projector.fill_view(conn, tenant, conversation_id, Position(branch_id, position))
    return get_conversation(conn, tenant, conversation_id), created


def _insert_conversation(
    conn: Connection,
    conversation_id: str,
    tenant: str,
    branch_id: str,
    position: int,
    head_hash: bytes,
    meta_text: str,
    fork_point: ForkPoint | None,
    key: str | None,
    subject: str | None = None,
) -> None:
    conn.execute(
        conversations.insert().values(
            key=key,
            subject=subject,
            id=conversation_id,
            tenant=tenant,
            head_branch_id=branch_id,
            head_position=position,
            head_open=True,
            head_hash=head_hash,
            created_at=db_now(conn),
            metadata=meta_text,
            forked_from_conversation_id=fork_point.conversation_id if fork_point else None,
            forked_from_branch_id=fork_point.branch_id if fork_point else None,
            forked_from_position=fork_point.position if fork_point else None,
        )
    )
    if key is not None:
        conn.execute(
            conversation_keys.insert().values(
                tenant=tenant, key=key, conversation_id=conversation_id
            )
        )


def _created_payload(
    tenant: str, metadata: dict[str, Any] | None, fork_point: ForkPoint | None
) -> dict[str, Any]:
    """The payload of a conversation's `conversation.created` event."""
    payload: dict[str, Any] = {"metadata": metadata or {}, "tenant": tenant}
    if fork_point:
        payload["forkedFrom"] = {
            "conversationId": fork_point.conversation_id,
            "branchId": fork_point.branch_id,
            "position": fork_point.position,
        }
    return payload


def encode_root(tenant: str, metadata: Any) -> tuple[str, str]:
    """A new root conversation's metadata and `conversation.created` payload as stored
    text, checked (`InvalidInputError`) before any transaction begins. The fast
    forms of creating one are `store._sql.append`'s create-append forms."""
    meta_text = check_metadata(metadata)
    return meta_text, canonical_json(_created_payload(tenant, metadata, None))


MAX_KEY_CHARS = 512


def check_key(key: object) -> str:
    """A conversation key: a caller's own name for a conversation."""
    return _checks.check_text(key, "conversation key", max_chars=MAX_KEY_CHARS)


def key_taken(key: str, conversation_id: str) -> ConflictError:
    """The error for a key the tenant already uses (`conversation_id`: the one refused)."""
    return ConflictError(
        f"Conversation key {key!r} is taken by another conversation of this tenant. Look it "
        f"up with conversation_by_key, or pass another key.",
        conversation_id=conversation_id,
    )


def _key_taken(conn: Connection, tenant: str, key: str) -> bool:
    found = conn.execute(
        sa.select(conversation_keys.c.conversation_id).where(
            conversation_keys.c.tenant == tenant, conversation_keys.c.key == key
        )
    ).first()
    return found is not None


# Through the lookup table, then the conversation by its id (one partition or
# shard); the conversation's tenant is checked again on its own row.
_BY_KEY = (
    "SELECT {columns} FROM chatledger_conversation_keys k "
    "JOIN chatledger_conversations c ON c.id = k.conversation_id AND c.tenant = k.tenant "
    "WHERE k.tenant = {tenant} AND k.key = {key}"
)
_BY_ID = (
    "SELECT {columns} FROM chatledger_conversations c WHERE c.id = {id} AND c.tenant = {tenant}"
)
_UUIDS = {"id", "head_branch_id", "forked_from_conversation_id", "forked_from_branch_id"}
# The ids as text, as SQLAlchemy's `Id` type hands them back.
_PG_COLUMNS = ", ".join(
    f"c.{c.name}::text AS {c.name}" if c.name in _UUIDS else f"c.{c.name}"
    for c in conversations.columns
)
_SQLITE_COLUMNS = ", ".join(f"c.{c.name} AS {c.name}" for c in conversations.columns)
_PG_BY_KEY = _BY_KEY.format(columns=_PG_COLUMNS, tenant="%(tenant)s", key="%(key)s")
_SQLITE_BY_KEY = _BY_KEY.format(columns=_SQLITE_COLUMNS, tenant="?", key="?")
_PG_BY_ID = _BY_ID.format(columns=_PG_COLUMNS, id="%(id)s::uuid", tenant="%(tenant)s")
_SQLITE_BY_ID = _BY_ID.format(columns=_SQLITE_COLUMNS, id="?", tenant="?")


def conversation_postgres(cursor: Any, tenant: str, conversation_id: str) -> Conversation:
    """`get_conversation` as one query on an autocommit DB-API cursor (the id checked
    already); a missing or foreign one is the same `NotFoundError`."""
    cursor.execute(_PG_BY_ID, {"id": conversation_id, "tenant": tenant})
    return _fetched(cursor, ("conversation", conversation_id, tenant), parse_time=False)


def conversation_sqlite(cursor: Any, tenant: str, conversation_id: str) -> Conversation:
    """`conversation_postgres` through a SQLite DB-API cursor."""
    cursor.execute(_SQLITE_BY_ID, (conversation_id, tenant))
    return _fetched(cursor, ("conversation", conversation_id, tenant), parse_time=True)


def conversation_by_key_postgres(cursor: Any, tenant: str, key: str) -> Conversation:
    """`get_conversation_by_key` as one query on an autocommit DB-API cursor: the same
    query, so its miss is the same `NotFoundError` (a framework's first write to a
    thread looks its key up and misses)."""
    cursor.execute(_PG_BY_KEY, {"tenant": tenant, "key": key})
    return _fetched(cursor, ("conversation key", key, tenant), parse_time=False)


def conversation_by_key_sqlite(cursor: Any, tenant: str, key: str) -> Conversation:
    """`conversation_by_key_postgres` through a SQLite DB-API cursor."""
    cursor.execute(_SQLITE_BY_KEY, (tenant, key))
    return _fetched(cursor, ("conversation key", key, tenant), parse_time=True)


def _fetched(cursor: Any, missing: tuple[str, str, str], *, parse_time: bool) -> Conversation:
    """The conversation row the cursor's query found, else `NotFoundError(*missing)`."""
    row = cursor.fetchone()
    if row is None:
        raise NotFoundError(*missing)
    m = dict(zip([d[0] for d in cursor.description], row, strict=True))
    m["head_hash"] = bytes(m["head_hash"])
    if parse_time:  # SQLite holds the text `sqlite_time` writes
        m["created_at"] = datetime.fromisoformat(m["created_at"])
    return conversation_of(m)


def get_conversation_by_key(conn: Connection, tenant: str, key: str) -> Conversation:
    """The tenant's conversation with this key; `NotFoundError` when it has none."""
    check_key(key)
    row = conn.execute(
        sa.select(conversations)
        .join(
            conversation_keys,
            sa.and_(
                conversations.c.id == conversation_keys.c.conversation_id,
                conversations.c.tenant == conversation_keys.c.tenant,
            ),
        )
        .where(conversation_keys.c.tenant == tenant, conversation_keys.c.key == key)
    ).first()
    if row is None:
        raise NotFoundError("conversation key", key, tenant)
    return _conversation(row)


def check_metadata(metadata: Any) -> str:
    """Conversation metadata (a dict of plain JSON, or None) as its stored text."""
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInputError(
            f"metadata must be a dict (or None), not {type(metadata).__name__}."
        )
    return canonical_json(metadata or {}, "metadata")


def _taken(conn: Connection, tenant: str, conversation_id: str) -> bool:
    """Whether the tenant has a conversation with this id. Another tenant's is refused
    by the key (the id alone) on one server; on Citus ids are a tenant's (ADR 0054)."""
    found = conn.execute(
        sa.select(conversations.c.id).where(
            conversations.c.id == conversation_id, conversations.c.tenant == tenant
        )
    ).first()
    return found is not None


def fork(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    at: int | Position | None,
    metadata: dict[str, Any] | None,
    *,
    key: str | None = None,
    fork_id: str | None = None,
    seal: Seal = PLAIN,
) -> Conversation:
    """A new conversation continuing `conversation_id` at `at`; nothing is copied."""
    source = get_conversation(conn, tenant, conversation_id)
    if source.subject is not None and not seal.sealed and source.erased_at is None:
        raise EncryptionError(
            f"Conversation '{source.id}' is sealed: a fork of it continues its subject's "
            f"content, so only a store with the key-encryption key (Store.open(kek=...) or "
            f"CHATLEDGER_KEK) may fork it. Nothing was written."
        )
    point = resolve_position(conn, source, at)
    return create_conversation(
        conn,
        tenant,
        metadata,
        conversation_id=fork_id,
        fork_point=ForkPoint(source.id, point.branch_id, point.position),
        key=key,
        seal=seal,
    )


def resolve_position(conn: Connection, conv: Conversation, at: int | Position | None) -> Position:
    """`at` as a position of `conv`: None is the head; an int is on the head's lineage."""
    if at is None:
        return conv.head
    if isinstance(at, int) and not isinstance(at, bool):
        if not 1 <= at <= conv.head.position:
            raise InvalidInputError(
                f"Position {at} is not on the head lineage of conversation '{conv.id}', which "
                f"runs from 1 to {conv.head.position}. Pass a position in that range (a "
                f"position of another branch is read with that branch's id)."
            )
        for _, branch_id, first, last in projector.lineage(conn, conv.tenant, conv.head):
            if first <= at <= last:
                return Position(branch_id, at)
        raise AssertionError("a lineage covers every position up to its end")
    if isinstance(at, Position):
        check_int(at.position, "A position", minimum=0, maximum=MAX_INT32)
        if conv.forked_from is not None and _before_the_fork(conn, conv, at):
            return at  # the history a fork continues: its source's, up to the fork point
        branch = get_branch(conn, conv.tenant, conv.id, at.branch_id)
        first = (branch.parent.position if branch.parent else 0) + 1
        tip = branch_tip(conn, conv.tenant, conv.id, branch.id)
        if not first <= at.position <= tip:
            raise InvalidInputError(
                f"Branch '{branch.id}' of conversation '{conv.id}' holds positions {first} to "
                f"{tip}, not {at.position}. Pass a position in that range."
            )
        return at
    raise InvalidInputError(f"A position must be an int or a Position, not {type(at).__name__}.")


def _before_the_fork(conn: Connection, conv: Conversation, at: Position) -> bool:
    """Whether `at` lies on the lineage a fork continues, up to its fork point: a
    position of its source (or the source's source), shared, not copied."""
    assert conv.forked_from is not None
    point = Position(conv.forked_from.branch_id, conv.forked_from.position)
    return any(
        branch_id == at.branch_id and first <= at.position <= last
        for _, branch_id, first, last in projector.lineage(conn, conv.tenant, point)
    )


# -- branches -----------------------------------------------------------------


def get_branch(conn: Connection, tenant: str, conversation_id: str, branch_id: str) -> Branch:
    """A branch of the tenant's conversation."""
    _check_id(branch_id, "branch")
    row = conn.execute(
        sa.select(branches).where(
            branches.c.id == branch_id,
            branches.c.conversation_id == conversation_id,
            branches.c.tenant == tenant,
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


def branch_tip(conn: Connection, tenant: str, conversation_id: str, branch_id: str) -> int:
    """The position of a branch's last event."""
    tip = conn.execute(
        sa.select(sa.func.max(events.c.position)).where(
            events.c.conversation_id == conversation_id,
            events.c.branch_id == branch_id,
            events.c.tenant == tenant,
        )
    ).scalar_one()
    return int(tip or 0)


def create_branch(
    conn: Connection,
    tenant: str,
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
            tenant=tenant,
        )
    )
    payload = {
        "parent": {"branchId": parent.branch_id, "position": parent.position},
        "reason": reason,
        "resumes": resumes_run_id,
    }
    (created,) = insert_events(
        conn,
        tenant,
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
    tenant: str,
    conversation_id: str,
    branch_id: str,
    first_position: int,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    run_id: str | None = None,
    idempotency_key: str | None = None,
    head: bool = False,
    ids: Sequence[str] | None = None,
) -> list[Event]:
    """Insert events at consecutive positions from `first_position`.

    The unique key (conversation, branch, position) refuses a position that
    another writer took; `head` flags the last event as setting the head.
    `ids` are the events' ids when the caller minted them.
    """
    if not encoded:
        return []
    _keys.check_writable(conn, tenant, conversation_id, encoded)
    rows: list[dict[str, Any]] = [
        {
            "id": ids[i] if ids is not None else new_id(),
            "conversation_id": conversation_id,
            "branch_id": branch_id,
            "position": first_position + i,
            "run_id": run_id,
            "kind": item.kind,
            "origin": item.origin,
            "head": head and i == len(encoded) - 1,
            "idempotency_key": idempotency_key if i == 0 else None,
            "payload": text,
            "tenant": tenant,
        }
        for i, (item, text) in enumerate(encoded)
    ]
    previous = previous_hash(conn, tenant, conversation_id, branch_id, first_position)
    hashes = _chain.chained(previous, (tuple(row[f] for f in _chain.FIELDS) for row in rows))
    for row, event_hash in zip(rows, hashes, strict=True):
        row["hash"] = event_hash
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


def previous_hash(
    conn: Connection, tenant: str, conversation_id: str, branch_id: str, position: int
) -> bytes:
    """The hash an event at `position` of `branch_id` chains to (see `store._sql.chain`)."""
    found = conn.execute(
        sa.select(events.c.hash).where(
            events.c.conversation_id == conversation_id,
            events.c.branch_id == branch_id,
            events.c.position == position - 1,
            events.c.tenant == tenant,
        )
    ).scalar()
    if found is not None:
        return bytes(found)
    # The branch's first event chains into the point its branch continues.
    parent = branches.alias("parent")
    row = conn.execute(
        sa.select(parent.c.conversation_id, branches.c.parent_branch_id, branches.c.parent_position)
        .select_from(
            branches.join(
                parent,
                sa.and_(
                    parent.c.id == branches.c.parent_branch_id,
                    parent.c.tenant == branches.c.tenant,
                ),
            )
        )
        .where(branches.c.id == branch_id, branches.c.tenant == tenant)
    ).first()
    if row is None:
        return _chain.GENESIS
    found = conn.execute(
        sa.select(events.c.hash).where(
            events.c.conversation_id == row[0],
            events.c.branch_id == row[1],
            events.c.position == row[2],
            events.c.tenant == tenant,
        )
    ).scalar()
    return _chain.GENESIS if found is None else bytes(found)


def set_head(
    conn: Connection,
    conv: Conversation,
    new_head: Position,
    appended: Sequence[Event],
    head_hash: bytes,
    *,
    extends: bool = True,
) -> None:
    """Move the head row and its view.

    `appended` are message events just added at the head; `head_hash` is the
    hash of the new head's event (the conversation's chain head). `extends`
    says that they continue the head where it was; when False (a head moved
    elsewhere, possibly past other messages of its own branch) the view is
    recomputed from the common prefix of the two lineages.
    """
    if (
        extends
        and new_head.branch_id == conv.head.branch_id
        and all(e.position > conv.head.position for e in appended)
    ):
        projector.advance_view(conn, conv.tenant, conv.id, [(e.position, e.seq) for e in appended])
    else:
        projector.move_view(conn, conv.tenant, conv.id, conv.head, new_head)
    # Every new head is the tip of a branch no run is writing (the run that
    # wrote it has just ended), so the next append may continue it in place.
    conn.execute(
        conversations.update()
        .where(conversations.c.id == conv.id, conversations.c.tenant == conv.tenant)
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
    head: bool = True,
) -> Conversation:
    """Move the head to `to` by compare-and-set, recording `head.moved`.

    A target that is not the tip of its branch opens an `edit` branch there,
    so the `head.moved` event lands on a line of its own. `head=False` when
    the same transaction moves the head on past that event.
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
    if not projector.head_is_open(conn, tenant, conv.id, target):
        branch_id, _ = create_branch(conn, tenant, conv.id, target, "edit", origin="client")
        position += 1
    payload = {
        "from": {"branchId": conv.head.branch_id, "position": conv.head.position},
        "to": {"branchId": target.branch_id, "position": target.position},
    }
    (moved,) = insert_events(
        conn,
        tenant,
        conv.id,
        branch_id,
        position + 1,
        [(NewEvent("head.moved", payload, origin="client"), canonical_json(payload))],
        head=head,
    )
    set_head(conn, conv, Position(branch_id, moved.position), [], moved.hash, extends=False)
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
        .join(
            conversations,
            sa.and_(
                conversations.c.id == events.c.conversation_id,
                conversations.c.tenant == events.c.tenant,
            ),
        )
        .where(conversations.c.tenant == tenant)
    )
    if conversation_id is not None:
        get_conversation(conn, tenant, conversation_id)
        query = query.where(events.c.conversation_id == conversation_id)
    if run_id is not None:
        # A run of another tenant (or none) is not found, as a conversation is.
        _check_id(run_id, "run")
        found = conn.execute(
            sa.select(runs.c.id).where(runs.c.id == run_id, runs.c.tenant == tenant)
        ).first()
        if found is None:
            raise NotFoundError("run", run_id, tenant)
        query = query.where(events.c.run_id == run_id)
    if after_seq is not None:
        check_int(after_seq, "after_seq", minimum=0, maximum=MAX_INT64)
        query = query.where(events.c.seq > after_seq)
    if conversation_id is not None and is_sqlite(conn):
        # SQLite's `txid` is always 0: the same order, read off the conversation's
        # index (conversation_id, txid, seq) instead of sorted afresh.
        query = query.order_by(events.c.txid, events.c.seq)
    else:
        query = query.order_by(events.c.seq)
    if limit is not None:
        query = query.limit(check_limit(limit))
    return [event_from_row(r) for r in conn.execute(query).all()]


def _check_id(value: str, kind: str) -> None:
    _checks.check_id(value, kind)
