"""UUIDv7 identifiers.

Ids are UUIDv7 strings (RFC 9562): the first 48 bits are a Unix timestamp in
milliseconds, so ids sort by creation time. Ids minted in one process sort in
creation order even within one millisecond (`uuid_utils` keeps a monotonic
counter in the random bits).
"""

from __future__ import annotations

import uuid

import uuid_utils

__all__ = ["is_id", "new_id"]


def new_id() -> str:
    """Return a new UUIDv7 as a lowercase, hyphenated string."""
    return str(uuid_utils.uuid7())


def is_id(value: object) -> bool:
    """Return whether `value` is a UUID string in canonical lowercase form."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False
