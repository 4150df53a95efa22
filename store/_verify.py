"""`verify`: recompute the hash chains and name the first event that does not match."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store import _chain
from store._log import get_conversation
from store.schema import branches, conversations, events, runs

__all__ = ["Verification", "verify_conversation", "verify_many"]


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one conversation's chain.

    Attributes:
        ok: every event matches its chain and nothing is missing.
        checked: how many events were recomputed.
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


_COLUMNS = [events.c[name] for name in _chain.FIELDS] + [events.c.seq, events.c.hash]


def verify_conversation(conn: Connection, tenant: str, conversation_id: str) -> Verification:
    """Recompute every event hash of one conversation and check nothing is missing."""
    conv = get_conversation(conn, tenant, conversation_id)
    head_hash = conn.execute(
        sa.select(conversations.c.head_hash).where(conversations.c.id == conv.id)
    ).scalar_one()
    digest = bytes(head_hash).hex()
    tree = conn.execute(
        sa.select(branches.c.id, branches.c.parent_branch_id, branches.c.parent_position).where(
            branches.c.conversation_id == conv.id
        )
    ).all()
    stored: dict[tuple[str, int], bytes] = {}
    rows_by_branch: dict[str, list[Any]] = {b.id: [] for b in tree}
    for row in conn.execute(
        sa.select(*_COLUMNS)
        .where(events.c.conversation_id == conv.id)
        .order_by(events.c.branch_id, events.c.position)
    ):
        rows_by_branch.setdefault(row.branch_id, []).append(row)
        stored[(row.branch_id, row.position)] = bytes(row.hash)
    checked = 0

    def parent_hash(parent_id: str | None, position: int | None) -> bytes | None:
        if parent_id is None or position is None:
            return _chain.GENESIS
        if (parent_id, position) in stored:
            return stored[(parent_id, position)]
        found = conn.execute(  # a fork's root branch continues another conversation
            sa.select(events.c.hash).where(
                events.c.branch_id == parent_id, events.c.position == position
            )
        ).scalar()
        return None if found is None else bytes(found)

    def bad(problem: str, row: Any = None) -> Verification:
        return Verification(
            conv.id,
            False,
            checked,
            digest,
            problem,
            None if row is None else row.seq,
            None if row is None else row.id,
        )

    for branch in tree:
        previous = parent_hash(branch.parent_branch_id, branch.parent_position)
        expected = (branch.parent_position or 0) + 1
        if previous is None:
            return bad(
                f"Branch '{branch.id}' continues event {branch.parent_position} of branch "
                f"'{branch.parent_branch_id}', which is missing: it was deleted."
            )
        for row in rows_by_branch.get(branch.id, []):
            if row.position != expected:
                return bad(
                    f"Event at position {expected} of branch '{branch.id}' is missing: it was "
                    f"deleted (the next one recorded is at position {row.position}).",
                    row,
                )
            encoded = _chain.encode(
                (
                    row.id,
                    row.conversation_id,
                    row.branch_id,
                    str(row.position),
                    row.run_id or "",
                    row.kind,
                    row.origin,
                    "1" if row.head else "0",
                    row.idempotency_key or "",
                    row.payload,
                )
            )
            computed = _chain.link(previous, encoded)
            checked += 1
            if computed != bytes(row.hash):
                return bad(
                    f"Event {row.seq} (id '{row.id}', position {row.position} of branch "
                    f"'{branch.id}', {row.kind}) does not match its hash: its content or its "
                    f"place in the chain was changed after it was recorded.",
                    row,
                )
            previous = bytes(row.hash)
            expected += 1
    return _check_ends(
        conn, conv.id, conv.head.branch_id, conv.head.position, stored, bytes(head_hash)
    ) or Verification(conv.id, True, checked, digest)


def _check_ends(
    conn: Connection,
    conversation_id: str,
    head_branch: str,
    head_position: int,
    stored: dict[tuple[str, int], bytes],
    head_hash: bytes,
) -> Verification | None:
    """Deleted tails leave no gap: check what points at the ends of branches."""

    def missing(what: str) -> Verification:
        return Verification(
            conversation_id,
            False,
            len(stored),
            head_hash.hex(),
            f"{what} is missing: it was deleted.",
        )

    if stored.get((head_branch, head_position)) != head_hash:
        return missing(f"The head's event (position {head_position} of branch '{head_branch}')")
    for run_id, branch_id, position in conn.execute(
        sa.select(runs.c.id, runs.c.branch_id, runs.c.position).where(
            runs.c.conversation_id == conversation_id
        )
    ):
        if (branch_id, position) not in stored:
            return missing(f"The last event of run '{run_id}' (position {position})")
    return None


def verify_many(
    conn: Connection,
    tenant: str | None,
    conversation_ids: list[str] | None,
    progress: Callable[[Verification], None] | None = None,
) -> list[Verification]:
    """Verify the given conversations, or every one (of `tenant`, or of all tenants)."""
    query = sa.select(conversations.c.id, conversations.c.tenant).order_by(conversations.c.id)
    if tenant is not None:
        query = query.where(conversations.c.tenant == tenant)
    if conversation_ids is not None:
        query = query.where(conversations.c.id.in_(conversation_ids))
    results = []
    for conversation_id, owner in conn.execute(query).all():
        result = verify_conversation(conn, owner, str(conversation_id))
        results.append(result)
        if progress is not None:
            progress(result)
    return results
