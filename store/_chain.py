"""The hash chain that makes tampering with the log evident.

Every event row carries `hash = sha256(previous hash || content)`, where the
previous hash is that of the event before it in its lineage: the previous
event of its branch, or for a branch's first event the event its branch
continues (a fork's first event chains into the source conversation), or 32
zero bytes for a root branch. `content` covers the identifying columns and
the exact payload text, each field length-prefixed so no two rows encode
alike. `recorded_at` is not covered: it is the database's clock, known only
inside the insert.

Postgres computes the same bytes in SQL on the fast path (`content_sql`);
`tests/test_verify.py` proves the two agree (Postgres appends take that path).
"""

from __future__ import annotations

import hashlib

__all__ = ["FIELDS", "GENESIS", "content", "content_sql", "encode", "link"]

GENESIS = bytes(32)

FIELDS = (
    "id",
    "conversation_id",
    "branch_id",
    "position",
    "run_id",
    "kind",
    "origin",
    "head",
    "idempotency_key",
    "payload",
)


def content(
    *,
    id: str,
    conversation_id: str,
    branch_id: str,
    position: int,
    run_id: str | None,
    kind: str,
    origin: str,
    head: bool,
    idempotency_key: str | None,
    payload: str,
) -> bytes:
    """The bytes of one event that its hash covers."""
    return encode(
        id,
        conversation_id,
        branch_id,
        position,
        run_id,
        kind,
        origin,
        head,
        idempotency_key,
        payload,
    )


def encode(
    i: str,
    c: str,
    b: str,
    position: int,
    run_id: str | None,
    kind: str,
    origin: str,
    head: bool | int,
    key: str | None,
    payload: str,
) -> bytes:
    """`content` for positional fields in `FIELDS` order (the verify loop's fast form)."""
    p, r, h, k = str(position), run_id or "", "1" if head else "0", key or ""
    return (
        f"{len(i)}:{i}{len(c)}:{c}{len(b)}:{b}{len(p)}:{p}{len(r)}:{r}{len(kind)}:{kind}"
        f"{len(origin)}:{origin}1:{h}{len(k)}:{k}{len(payload)}:{payload}"
    ).encode()


def link(previous: bytes, event_content: bytes) -> bytes:
    """The hash of an event given the hash before it."""
    return hashlib.sha256(previous + event_content).digest()


def content_sql(**columns: str) -> str:
    """The same bytes as `content`, as a Postgres expression over `columns`.

    Each keyword names the SQL expression of one field (all of `FIELDS`).
    """
    parts = []
    for name in FIELDS:
        expression = columns[name]
        if name in ("id", "conversation_id", "branch_id", "run_id", "position"):
            expression = f"coalesce(({expression})::text, '')"
        elif name == "head":
            expression = f"(CASE WHEN {expression} THEN '1' ELSE '0' END)"
        else:
            expression = f"coalesce({expression}, '')"
        parts.append(f"length({expression})::text || ':' || {expression}")
    return "convert_to(" + " || ".join(parts) + ", 'UTF8')"
