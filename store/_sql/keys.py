"""Data keys in the database: finding the one a write seals under, reading the
ones a result was sealed under, writing a new one, and refusing writes that do
not fit the conversation's (erasing a subject is `store._sql.erasure`).

The keys themselves are sealed and opened in `store._crypto`; this module
only reads and writes `chatledger_subject_keys` and the conversations'
`subject` and `erased_at` (docs/erasure.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._checks import check_text
from chatledger.store._crypto import SEALED_PREFIX, key_id_of
from chatledger.store._errors import ConflictError, EncryptionError, ErasedError
from chatledger.store._sql.dialect import db_now, for_update
from chatledger.store._sql.translate import unique_violation
from chatledger.store._values import NewEvent
from chatledger.store.schema import conversations, subject_keys

__all__ = [
    "WriteKey",
    "check_subject",
    "check_writable",
    "hold_key",
    "insert_key",
    "keys_by_id",
    "keys_on_postgres",
    "keys_on_sqlite",
    "rewrap",
    "write_key",
]


@dataclass(frozen=True)
class WriteKey:
    """What a write to a conversation seals under, as the database says.

    `exists`: the tenant has the conversation. Then `subject` is its subject
    (None: stored in the clear) and `erased` whether it was erased. When it
    does not exist, `subject` is the one a new conversation would get and
    `key_id`/`wrapped` that subject's key, if it has one.
    """

    exists: bool
    subject: str | None
    erased: bool
    key_id: str | None
    wrapped: bytes | None


_WITH_KEY = conversations.outerjoin(
    subject_keys,
    sa.and_(
        subject_keys.c.tenant == conversations.c.tenant,
        subject_keys.c.subject == conversations.c.subject,
    ),
)
"""Conversations with their subject's key (none: in the clear, or erased)."""


def check_subject(subject: str) -> str:
    """An erasure subject: non-empty text of at most 200 characters."""
    return check_text(subject, "subject")


def write_key(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    *,
    source: str | None = None,
    subject: str | None = None,
) -> WriteKey:
    """The key a write to `conversation_id` seals under; for a new conversation the
    key of `subject`, else of the `source` conversation's subject (a fork), else
    of the conversation's own id."""
    found = conn.execute(
        sa.select(
            conversations.c.subject,
            conversations.c.erased_at,
            subject_keys.c.key_id,
            subject_keys.c.wrapped,
        )
        .select_from(_WITH_KEY)
        .where(conversations.c.id == conversation_id, conversations.c.tenant == tenant)
    ).first()
    if found is not None:
        return WriteKey(
            True,
            found.subject,
            found.erased_at is not None,
            found.key_id,
            None if found.wrapped is None else bytes(found.wrapped),
        )
    if subject is None and source is not None:
        parent = conn.execute(
            sa.select(conversations.c.subject, conversations.c.erased_at).where(
                conversations.c.id == source, conversations.c.tenant == tenant
            )
        ).first()
        if parent is not None and parent.erased_at is None:
            subject = parent.subject
    subject = subject or conversation_id
    key = conn.execute(
        sa.select(subject_keys.c.key_id, subject_keys.c.wrapped).where(
            subject_keys.c.tenant == tenant, subject_keys.c.subject == subject
        )
    ).first()
    if key is None:
        return WriteKey(False, subject, False, None, None)
    return WriteKey(False, subject, False, key.key_id, bytes(key.wrapped))


def keys_by_id(
    conn: Connection, key_ids: Iterable[str], tenant: str | None = None
) -> dict[str, bytes]:
    """The wrapped keys that still exist among `key_ids` (an erased one is absent), of
    `tenant` when given: a tenant's reads open only its own subjects' content."""
    wanted = sorted(set(key_ids))
    query = sa.select(subject_keys.c.key_id, subject_keys.c.wrapped).where(
        subject_keys.c.key_id.in_(wanted)
    )
    if tenant is not None:
        query = query.where(subject_keys.c.tenant == tenant)
    rows = conn.execute(query).all()
    return {str(r.key_id): bytes(r.wrapped) for r in rows}


def keys_on_postgres(cursor: Any, key_ids: Iterable[str], tenant: str) -> dict[str, bytes]:
    """`keys_by_id` on a psycopg DB-API cursor (a fast path's)."""
    cursor.execute(
        "SELECT key_id::text, wrapped FROM chatledger_subject_keys "
        "WHERE key_id = ANY(%s::uuid[]) AND tenant = %s",
        (sorted(set(key_ids)), tenant),
    )
    return {str(k): bytes(w) for k, w in cursor.fetchall()}


def keys_on_sqlite(cursor: Any, key_ids: Iterable[str], tenant: str) -> dict[str, bytes]:
    """`keys_by_id` on a sqlite3 cursor (a fast path's)."""
    wanted = sorted(set(key_ids))
    cursor.execute(
        "SELECT key_id, wrapped FROM chatledger_subject_keys "
        f"WHERE key_id IN ({', '.join('?' * len(wanted))}) AND tenant = ?",
        [*wanted, tenant],
    )
    return {str(k): bytes(w) for k, w in cursor.fetchall()}


def hold_key(conn: Connection, tenant: str, key_id: str, conversation_id: str) -> None:
    """Share-lock a subject's key for this transaction; a `ConflictError` when it is gone
    (the subject was erased since the caller read it: a retry mints a new key)."""
    query = sa.select(subject_keys.c.key_id).where(
        subject_keys.c.key_id == key_id, subject_keys.c.tenant == tenant
    )
    if conn.dialect.name != "sqlite":
        query = query.with_for_update(read=True)
    if conn.execute(query).first() is None:
        raise ConflictError(
            "The subject's data key was destroyed (an erasure) while this write was being "
            "prepared; nothing was written. Retry: the retry seals under a new key.",
            conversation_id=conversation_id,
        )


def rewrap(conn: Connection, unwrap: Any, new: Any) -> int:
    """Re-wrap every data key under the key-encryption key `new` (`KeyEncryptionKey`),
    each unwrapped by `unwrap(kek_id, wrapped)`; keys already under `new` are left
    as they are. Returns how many were re-wrapped. One transaction: all or none.

    The keys are locked a tenant at a time (on Citus, a row lock is taken within
    one shard)."""
    tenants = conn.execute(
        sa.select(subject_keys.c.tenant).distinct().order_by(subject_keys.c.tenant)
    ).scalars()
    done = 0
    for tenant in list(tenants):
        rows = conn.execute(
            for_update(
                conn,
                sa.select(subject_keys.c.key_id, subject_keys.c.kek_id, subject_keys.c.wrapped)
                .where(subject_keys.c.tenant == tenant)
                .order_by(subject_keys.c.key_id),
            )
        ).all()
        for row in rows:
            if row.kek_id == new.id:
                continue
            secret = unwrap(row.kek_id, bytes(row.wrapped))
            conn.execute(
                subject_keys.update()
                .where(subject_keys.c.key_id == row.key_id, subject_keys.c.tenant == tenant)
                .values(kek_id=new.id, wrapped=new.wrap(secret))
            )
            done += 1
    return done


class KeyRaced(ConflictError):
    """A subject's new data key, refused: another writer created the subject's key
    at the same moment (`insert_key`). Nothing was written."""


def insert_key(
    conn: Connection,
    *,
    key_id: str,
    tenant: str,
    subject: str,
    kek_id: str,
    wrapped: bytes,
    conversation_id: str,
) -> None:
    """Write a subject's new data key, in the transaction of its first conversation."""
    try:
        with conn.begin_nested():
            conn.execute(
                subject_keys.insert().values(
                    key_id=key_id,
                    tenant=tenant,
                    subject=subject,
                    kek_id=kek_id,
                    wrapped=wrapped,
                    created_at=db_now(conn),
                )
            )
    except sa.exc.IntegrityError as error:
        if unique_violation(error, subject_keys, ["tenant", "subject"]):
            raise KeyRaced(
                f"Another writer created the data key of subject '{subject}' at the same "
                f"moment; nothing was written. Retry: the retry uses that key.",
                conversation_id=conversation_id,
            ) from error
        raise


def check_writable(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    encoded: list[tuple[NewEvent, str]] | Any,
) -> None:
    """Refuse a write to an erased conversation, and content sealed otherwise than the
    conversation is: in the clear into a sealed one (a store without its
    key-encryption key), sealed into a clear one, or under another key than its
    subject's (two writers that created it at once, each with a key of its own).
    A conversation not written yet (being created) passes."""
    kinds = {item.kind for item, _ in encoded}
    if not kinds & _REFUSED_WHEN_ERASED:
        return  # a run's own events (its end, its failure): no content, no check
    row = conn.execute(
        sa.select(conversations.c.subject, conversations.c.erased_at, subject_keys.c.key_id)
        .select_from(_WITH_KEY)
        .where(conversations.c.id == conversation_id, conversations.c.tenant == tenant)
    ).first()
    if row is None:
        return
    if row.erased_at is not None and any(
        item.kind in ("message.recorded", "state.changed", "run.started") for item, _ in encoded
    ):
        # Content, state and new runs are refused; the events of a run under
        # way (its end, its failure) are not, so a run caught by an erasure ends.
        raise ErasedError(conversation_id=conversation_id, subject=row.subject)
    sealed = row.subject is not None
    for item, text in encoded:
        if item.kind not in ("message.recorded", "state.changed"):
            continue
        if text.startswith(SEALED_PREFIX) != sealed:
            raise EncryptionError(
                f"Conversation '{conversation_id}' is "
                + (
                    "sealed: open the store with its key-encryption key (Store.open(kek=...) "
                    "or CHATLEDGER_KEK) to write to it. Nothing was written."
                    if sealed
                    else "stored in the clear, but this write was sealed; nothing was written. "
                    "Retry: the store has re-read the conversation."
                )
            )
        if sealed and key_id_of(text) != str(row.key_id):
            raise ConflictError(
                f"Conversation '{conversation_id}' was created at the same moment by another "
                f"writer, under a data key of its own; nothing was written. Retry: the retry "
                f"seals under the conversation's key.",
                conversation_id=conversation_id,
            )


_REFUSED_WHEN_ERASED = frozenset({"message.recorded", "state.changed", "run.started"})
