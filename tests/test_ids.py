"""UUIDv7 ids: format, order and uniqueness."""

from __future__ import annotations

import uuid

from chatledger.store.ids import canonical_id, is_id, new_id


def test_new_id_is_a_uuid7_string() -> None:
    ident = new_id()
    parsed = uuid.UUID(ident)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert str(parsed) == ident


def test_ids_minted_in_a_tight_loop_sort_in_creation_order_and_are_unique() -> None:
    ids = [new_id() for _ in range(100_000)]
    assert sorted(ids) == ids
    assert len(set(ids)) == len(ids)


def test_is_id_accepts_only_canonical_lowercase_uuids() -> None:
    ident = new_id()
    assert is_id(ident)
    assert not is_id(ident.upper())
    assert not is_id(ident.replace("-", ""))
    assert not is_id("not-an-id")
    assert not is_id(None)


def test_canonical_id_lowers_a_uuid_in_capitals_and_leaves_anything_else() -> None:
    ident = new_id()
    assert canonical_id(ident.upper()) == ident
    assert canonical_id(ident) == ident
    for other in ("NOT-AN-ID", ident.upper().replace("-", ""), f"{ident.upper()} ", ""):
        assert canonical_id(other) == other
