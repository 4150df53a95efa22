"""The hash chain that makes tampering with the log evident.

Every event row carries `hash = sha256(previous hash || content)`, where the
previous hash is that of the event before it in its lineage: the previous
event of its branch, or for a branch's first event the event its branch
continues (a fork's first event chains into the source conversation), or 32
zero bytes for a root branch. `recorded_at` is not covered: it is the
database's clock, known only inside the insert.

`content` is UTF-8, in this order: the event id, conversation id and branch
id (36 characters each), then `position:run_id:kind:origin:head:` (run id
empty when null, head `1` or `0`), then the idempotency key as
`byte-length:key:` (empty when null), then the payload text. Ids are
canonical UUIDs and the other fields hold no `:`, so no two rows encode
alike; the payload comes last, so it needs no length.

Every writer chains in the client (`chained`, ADR 0044); Postgres computes
the same bytes in SQL only to verify (`content_sql`). `tests/store/test_verify.py`
and the fast/general differential of `tests/store/test_append_differential.py`
prove they agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from hashlib import sha256

__all__ = ["FIELDS", "GENESIS", "Fields", "chained", "content", "content_sql", "header", "link"]

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
    return header(
        id, conversation_id, branch_id, position, run_id, kind, origin, head, idempotency_key
    ) + payload.encode("utf-8")


def header(
    i: str,
    c: str,
    b: str,
    position: int,
    run_id: str | None,
    kind: str,
    origin: str,
    head: bool | int,
    key: str | None,
) -> bytes:
    """`content` without the payload, for positional fields in `FIELDS` order."""
    k = (key or "").encode("utf-8")
    h = "1" if head else "0"
    return f"{i}{c}{b}{position}:{run_id or ''}:{kind}:{origin}:{h}:{len(k)}:".encode() + k + b":"


Fields = tuple[str, str, str, int, str | None, str, str, bool, str | None, str]
"""One event's hashed fields, in `FIELDS` order (the payload as text)."""


def chained(previous: bytes, rows: Iterable[Fields]) -> list[bytes]:
    """The hashes of consecutive events after the one whose hash is `previous`:
    every writer's chain (the checks, `verify` and `import`, hash one row at a
    time with `link`)."""
    hashes: list[bytes] = []
    for i, c, b, position, run_id, kind, origin, head, key, payload in rows:
        fields = header(i, c, b, position, run_id, kind, origin, head, key)
        previous = sha256(previous + fields + payload.encode()).digest()
        hashes.append(previous)
    return hashes


def link(previous: bytes, event_content: bytes) -> bytes:
    """The hash of an event given the hash before it."""
    return hashlib.sha256(previous + event_content).digest()


def content_sql(**columns: str) -> str:
    """The same bytes as `content`, as a Postgres expression over `columns`.

    Each keyword names the SQL expression of one field (all of `FIELDS`).
    """
    c = columns
    key = f"coalesce({c['idempotency_key']}, '')"
    return (
        f"convert_to(({c['id']})::text || ({c['conversation_id']})::text || "
        f"({c['branch_id']})::text || ({c['position']})::text || ':' || "
        f"coalesce(({c['run_id']})::text, '') || ':' || {c['kind']} || ':' || "
        f"{c['origin']} || ':' || (CASE WHEN {c['head']} THEN '1' ELSE '0' END) || ':' || "
        f"octet_length({key})::text || ':' || {key} || ':' || {c['payload']}, 'UTF8')"
    )
