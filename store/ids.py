"""UUIDv7 identifiers.

Ids are UUIDv7 strings (RFC 9562): the first 48 bits are a Unix timestamp in
milliseconds, so ids sort by creation time. Ids minted in one process sort in
creation order even within one millisecond (`uuid_utils` keeps a monotonic
counter in the random bits).
"""

from __future__ import annotations

import re

import uuid_utils

__all__ = ["canonical_id", "is_id", "new_id"]


def new_id() -> str:
    """Return a new UUIDv7 as a lowercase, hyphenated string."""
    return str(uuid_utils.uuid7())


_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_id(value: object) -> bool:
    """Return whether `value` is a UUID string in canonical lowercase form."""
    return isinstance(value, str) and _CANONICAL.fullmatch(value) is not None


def canonical_id(value: str) -> str:
    """`value` lower-cased when it is a UUID in capitals, else as given.

    For the faces people type ids into (the command line, the HTTP API): an
    id copied from elsewhere may be in capitals. Only the case changes, so it
    names the same row, of the same tenant, or none; anything else goes on as
    it is, and the store says what is wrong with it. The store itself accepts
    only the canonical form, so that both databases compare ids the same way.
    """
    lowered = value.lower()
    return lowered if _CANONICAL.fullmatch(lowered) else value
