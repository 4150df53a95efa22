"""`plan`: which forms an append tries before the general path, from its options
and the head kept, table-tested (the differential, test_append_differential.py,
shows that what they then write is what the general path writes)."""

from __future__ import annotations

from typing import Any

import pytest

from chatledger.store._sql.append import Head, Turn, plan
from chatledger.store._values import NewEvent

MESSAGE = (NewEvent("message.recorded", {}, origin="client"), "{}")
KEPT: Head = ("b1", 4, bytes(32), '{"a": 1}')
ROOT = ("{}", "{}")


def turn(**options: Any) -> Turn:
    options.setdefault("encoded", [MESSAGE])
    return Turn("t", "c", **options)


CASES = [
    # (what, turn, kept, after, minting, forms)
    ("a plain append, nothing kept", turn(), None, False, False, ("read",)),
    ("a plain append at the head kept", turn(), KEPT, False, False, ("kept", "read")),
    ("nothing to write", turn(encoded=[]), KEPT, False, False, ()),
    ("after a position", turn(), KEPT, True, False, ()),
    ("a subject's key to mint", turn(root=ROOT), None, False, True, ()),
    ("a creation", turn(root=ROOT), None, False, False, ("create", "read")),
    ("a creation, kept", turn(root=ROOT), KEPT, False, False, ("create", "kept", "read")),
    (
        "a creation expecting a new head",
        turn(root=ROOT, expected=1),
        None,
        False,
        False,
        ("create", "read"),
    ),
    (
        "a creation expecting an old head",
        turn(root=ROOT, expected=3),
        None,
        False,
        False,
        ("read",),
    ),
    (
        "a creation expecting a branch",
        turn(root=ROOT, expected=1, expected_branch="b1"),
        None,
        False,
        False,
        ("read",),
    ),
    ("a creation with caller ids", turn(root=ROOT, named=["e"]), None, False, False, ("read",)),
    ("a creation with a state", turn(root=ROOT, state="{}"), None, False, False, ("read",)),
    (
        "a creation expecting a state",
        turn(root=ROOT, expected_state={}),
        None,
        False,
        False,
        ("read",),
    ),
    ("a sealed creation", turn(root=ROOT, sealed=True), None, False, False, ("read",)),
    ("expected where the head kept is", turn(expected=4), KEPT, False, False, ("kept", "read")),
    ("expected elsewhere", turn(expected=5), KEPT, False, False, ("read",)),
    (
        "expected on the branch kept",
        turn(expected=4, expected_branch="b1"),
        KEPT,
        False,
        False,
        ("kept", "read"),
    ),
    (
        "expected on another branch",
        turn(expected=4, expected_branch="b2"),
        KEPT,
        False,
        False,
        ("read",),
    ),
    (
        "the state kept expected",
        turn(expected_state={"a": 1}),
        KEPT,
        False,
        False,
        ("kept", "read"),
    ),
    ("another state expected", turn(expected_state={"a": 2}), KEPT, False, False, ("read",)),
    (
        "a field expected absent",
        turn(expected_state={"b": None}),
        KEPT,
        False,
        False,
        ("kept", "read"),
    ),
    (
        "a key, ids and a state at the head kept",
        turn(key="k", named=["e"], state="{}"),
        KEPT,
        False,
        False,
        ("kept", "read"),
    ),
]


@pytest.mark.parametrize(
    ("turn_", "kept", "after", "minting", "forms"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_plan(
    turn_: Turn, kept: Head | None, after: bool, minting: bool, forms: tuple[str, ...]
) -> None:
    assert plan(turn_, kept, after=after, minting=minting) == forms
