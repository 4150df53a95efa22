"""The fast paths and the general path of the append answer alike.

The whole conformance suite also runs with the fast paths off (the
`*-general` ids, see `conftest.py`); these tests pin the switch itself, and
compare what the two paths write for the same turns, row by row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from store import AsyncStore, ConflictError, Event, Ledger, Message, Store
from store.ids import is_id, new_id


@contextmanager
def statements(engine: sa.Engine) -> Iterator[list[str]]:
    """The statements SQLAlchemy executes on `engine` meanwhile (a fast path runs none)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def turn(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
def test_the_switch_decides_which_path_an_append_and_a_head_read_take(
    database_url: str, fast: bool
) -> None:
    with Store.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"switch-{uuid.uuid4().hex[:8]}")
        conv = ledger.create_conversation()
        with statements(store.engine) as seen:
            ledger.append_messages(conv.id, turn("hi"), expected=1)
            assert [m.content for m in ledger.history(conv.id)] == ["hi"]
    assert bool(seen) is not fast


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "general"])
async def test_the_switch_decides_the_same_on_the_async_store(
    database_url: str, fast: bool
) -> None:
    async with AsyncStore.open(database_url, fast_paths=fast) as store:
        ledger = store.tenant(f"switch-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        with statements(store.engine.sync_engine) as seen:
            await ledger.append_messages(conv.id, turn("hi"), expected=1)
            assert [m.content for m in await ledger.history(conv.id)] == ["hi"]
    assert bool(seen) is not fast


def written(ledger: Ledger) -> list[Any]:
    """The same turns, every case of the append; what each step returned and read back."""
    steps: list[Any] = []
    conv = ledger.create_conversation({"k": "v"})

    def append(messages: list[Message], **options: Any) -> None:
        appended = ledger.append_messages(conv.id, messages, **options)
        first = appended.events[0].seq
        # What the append returned is what the log holds.
        assert appended.events == ledger.events(conversation_id=conv.id, after_seq=first - 1)
        steps.append(("appended", appended.positions, appended.head.position))

    append(turn("one"), expected=1)
    append(
        [Message(role="assistant", content="two"), Message(role="user", content="three")],
        idempotency_key="k",
    )
    # A retry with the same key and content writes nothing and returns the original.
    retried = ledger.append_messages(
        conv.id,
        [Message(role="assistant", content="two"), Message(role="user", content="three")],
        idempotency_key="k",
    )
    steps.append(("retried", retried.positions))
    with pytest.raises(ConflictError) as conflict:
        ledger.append_messages(conv.id, turn("late"), expected=1)
    steps.append(("conflict", conflict.value.expected, conflict.value.actual))
    append(turn("repaired"), origin="repair")
    append(turn("stamped"), run_id=new_id())
    ledger.move_head(conv.id, 2)
    append(turn("on a branch"))  # the head is no longer its branch's end
    append(turn("after the branch"))
    steps.append(("history", [m.content for m in ledger.history(conv.id)]))
    names: dict[str, str] = {}
    steps.append(("log", [shape(e, names) for e in ledger.events(conversation_id=conv.id)]))
    assert ledger.verify(conv.id).ok
    return steps


def shape(event: Event, names: dict[str, str]) -> Any:
    """An event without what two conversations differ in by design: ids, times, hashes."""
    return anonymized(
        (
            event.kind,
            event.branch_id,
            event.position,
            event.origin,
            event.run_id,
            event.head,
            event.idempotency_key,
            event.payload,
        ),
        names,
    )


def anonymized(value: Any, names: dict[str, str]) -> Any:
    """`value` with every id replaced by its order of first appearance."""
    if is_id(value):
        return names.setdefault(value, f"id{len(names)}")
    if isinstance(value, dict):
        return {k: anonymized(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [anonymized(v, names) for v in value]
    return value


def test_the_fast_and_general_paths_write_the_same_log(database_url: str) -> None:
    with (
        Store.open(database_url) as fast,
        Store.open(database_url, fast_paths=False) as general,
    ):
        tenant = f"differential-{uuid.uuid4().hex[:8]}"
        assert written(fast.tenant(tenant)) == written(general.tenant(tenant))
