"""`erase`: destroy an erasure subject's data key, in one transaction (docs/erasure.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._errors import NotFoundError
from chatledger.store._sql import append as _append
from chatledger.store._sql.dialect import db_now, for_update
from chatledger.store._sql.log import canonical_json, utc
from chatledger.store._values import NewEvent
from chatledger.store.schema import conversations, events, subject_keys

__all__ = ["Erasure", "erase", "erase_if_idle"]


@dataclass(frozen=True)
class Erasure:
    """What `ledger.erase` did: the subject, its key, and the conversations erased."""

    subject: str
    key_id: str | None
    conversation_ids: list[str]
    reason: str
    already: bool = False
    """True when the subject had been erased before: nothing was done now."""


def erase(conn: Connection, tenant: str, subject: str, reason: str) -> Erasure:
    """Destroy `subject`'s data key and mark its conversations erased, recording a
    `conversation.erased` event in each, all in this one transaction."""
    key, ids = _locked(conn, tenant, subject)
    if key is None:
        return _already(conn, tenant, subject, reason)
    return _destroy(conn, tenant, subject, reason, key, ids)


def erase_if_idle(
    conn: Connection,
    tenant: str,
    subject: str,
    reason: str,
    *,
    conversation_ids: list[str],
    idle_before: datetime,
) -> Erasure | None:
    """`erase`, only if the subject's conversations are still exactly
    `conversation_ids` and none has an event since `idle_before` (a retention
    pass's plan, checked again under the erasure's locks); None: it is not due."""
    key, ids = _locked(conn, tenant, subject)
    if key is None:
        return _already(conn, tenant, subject, reason)
    if sorted(ids) != sorted(conversation_ids):
        return None
    latest = conn.execute(
        sa.select(sa.func.max(events.c.recorded_at)).where(
            events.c.conversation_id.in_(ids), events.c.tenant == tenant
        )
    ).scalar_one()
    if latest is not None and utc(latest) >= idle_before:
        return None
    return _destroy(conn, tenant, subject, reason, key, ids)


def _locked(conn: Connection, tenant: str, subject: str) -> tuple[str | None, list[str]]:
    """The subject's key and its conversations not erased yet, locked in that order
    (the order a creation under the key takes its share lock in)."""
    key = conn.execute(
        for_update(
            conn,
            sa.select(subject_keys.c.key_id).where(
                subject_keys.c.tenant == tenant, subject_keys.c.subject == subject
            ),
        )
    ).first()
    ids = [
        str(r.id)
        for r in conn.execute(
            for_update(
                conn,
                sa.select(conversations.c.id, conversations.c.erased_at)
                .where(conversations.c.tenant == tenant, conversations.c.subject == subject)
                .order_by(conversations.c.id),
            )
        ).all()
        if r.erased_at is None
    ]
    return (None if key is None else str(key.key_id)), ids


def _already(conn: Connection, tenant: str, subject: str, reason: str) -> Erasure:
    erased = conn.execute(
        sa.select(conversations.c.id)
        .where(conversations.c.tenant == tenant, conversations.c.subject == subject)
        .order_by(conversations.c.id)
    ).all()
    if not erased:
        raise NotFoundError("erasure subject", subject, tenant)
    return Erasure(subject, None, [str(r.id) for r in erased], reason, already=True)


def _destroy(
    conn: Connection, tenant: str, subject: str, reason: str, key_id: str, ids: list[str]
) -> Erasure:
    payload = {"subject": subject, "keyId": key_id, "reason": reason}
    for conversation_id in ids:
        erased = NewEvent("conversation.erased", payload, origin="client")
        turn = _append.Turn(tenant, conversation_id, [(erased, canonical_json(payload))])
        _append.append_messages(conn, turn)
    conn.execute(
        conversations.update()
        .where(conversations.c.tenant == tenant, conversations.c.subject == subject)
        .where(conversations.c.erased_at.is_(None))
        .values(erased_at=db_now(conn))
    )
    conn.execute(
        subject_keys.delete().where(
            subject_keys.c.key_id == key_id, subject_keys.c.tenant == tenant
        )
    )
    return Erasure(subject, key_id, ids, reason)
