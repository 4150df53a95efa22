"""Retention policies and the conversations they reach (docs/erasure.md, "Retention").

A tenant's policy says: conversations idle for `idle_days` are erased
(`erase`), or exported and then erased (`export-erase`). Idle means no event
of the conversation's own recorded since the cutoff. Erasure is by subject,
so a subject is due only when every one of its conversations not yet erased
is idle; a conversation stored in the clear cannot be erased and is
reported, never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from chatledger.store._checks import check_choice, check_int
from chatledger.store._sql.dialect import db_now, time_value
from chatledger.store._sql.log import utc
from chatledger.store.schema import conversations, events, retention_policies

__all__ = [
    "RetentionAction",
    "RetentionPlan",
    "RetentionPolicy",
    "clear_policy",
    "get_policy",
    "list_policies",
    "plan",
    "set_policy",
]

RetentionAction = Literal["erase", "export-erase"]
_ACTIONS: frozenset[str] = frozenset(get_args(RetentionAction))
MAX_IDLE_DAYS = 365_000


@dataclass(frozen=True)
class RetentionPolicy:
    """A tenant's retention policy."""

    tenant: str
    idle_days: int
    action: RetentionAction
    updated_at: datetime


@dataclass(frozen=True)
class RetentionPlan:
    """What a retention pass would do for one tenant, as of `cutoff`.

    Attributes:
        due: per subject due for erasure, its conversations (every one idle).
        active: subjects with an idle conversation and an active one: kept.
        clear: idle conversations stored in the clear, which cannot be erased.
    """

    tenant: str
    policy: RetentionPolicy
    cutoff: datetime
    due: dict[str, list[str]] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    clear: list[str] = field(default_factory=list)


def check_policy(idle_days: object, action: object) -> tuple[int, RetentionAction]:
    days = check_int(idle_days, "idle_days", minimum=1, maximum=MAX_IDLE_DAYS)
    chosen: Any = check_choice(action, "action", _ACTIONS)
    return days, chosen


def set_policy(
    conn: Connection, tenant: str, idle_days: int, action: RetentionAction
) -> RetentionPolicy:
    """Set (or replace) the tenant's policy."""
    conn.execute(retention_policies.delete().where(retention_policies.c.tenant == tenant))
    conn.execute(
        retention_policies.insert().values(
            tenant=tenant, idle_days=idle_days, action=action, updated_at=db_now(conn)
        )
    )
    found = get_policy(conn, tenant)
    assert found is not None
    return found


def get_policy(conn: Connection, tenant: str) -> RetentionPolicy | None:
    row = conn.execute(
        sa.select(retention_policies).where(retention_policies.c.tenant == tenant)
    ).first()
    return None if row is None else _policy(row._mapping)


def clear_policy(conn: Connection, tenant: str) -> bool:
    """Remove the tenant's policy; whether it had one."""
    done = conn.execute(retention_policies.delete().where(retention_policies.c.tenant == tenant))
    return bool(done.rowcount)


def list_policies(conn: Connection) -> list[RetentionPolicy]:
    rows = conn.execute(sa.select(retention_policies).order_by(retention_policies.c.tenant))
    return [_policy(r._mapping) for r in rows]


def _policy(m: Any) -> RetentionPolicy:
    return RetentionPolicy(m["tenant"], m["idle_days"], m["action"], utc(m["updated_at"]))


def plan(conn: Connection, policy: RetentionPolicy, now: datetime | None) -> RetentionPlan:
    """The subjects due under `policy` as of `now` (default: the database's clock)."""
    if now is None:
        now = conn.execute(sa.select(db_now(conn))).scalar_one()
    cutoff = utc(now) - timedelta(days=policy.idle_days)
    # Each conversation's last event, read through its own index range.
    last = (
        sa.select(sa.func.max(events.c.recorded_at))
        .where(
            events.c.conversation_id == conversations.c.id,
            events.c.tenant == conversations.c.tenant,
        )
        .scalar_subquery()
    )
    rows = conn.execute(
        sa.select(conversations.c.id, conversations.c.subject, last < time_value(conn, cutoff))
        .where(conversations.c.tenant == policy.tenant, conversations.c.erased_at.is_(None))
        .order_by(conversations.c.id)
    ).all()
    result = RetentionPlan(policy.tenant, policy, cutoff)
    by_subject: dict[str, list[tuple[str, bool]]] = {}
    for cid, subject, idle in rows:
        if subject is None:
            if idle:
                result.clear.append(str(cid))
            continue
        by_subject.setdefault(subject, []).append((str(cid), bool(idle)))
    for subject, members in sorted(by_subject.items()):
        if all(idle for _, idle in members):
            result.due[subject] = [cid for cid, _ in members]
        elif any(idle for _, idle in members):
            result.active.append(subject)
    return result
