"""Property: after any sequence of appends, forks, head moves and runs, every
materialized head view equals its rebuild from the events."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatledger.store import ChatledgerError, Message, NewEvent, RunCursor, Store
from chatledger.store._sql import projector
from chatledger.store.schema import conversations, view_entries

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["append", "fork", "move", "start", "record", "complete", "fail", "resume"]
        ),
        st.integers(min_value=0, max_value=50),
    ),
    min_size=1,
    max_size=25,
)


def view_rows(conn: sa.Connection, ids: list[str]) -> list[tuple[object, ...]]:
    """Every materialized row of the conversations' views: entries and head flags."""
    rows = conn.execute(
        sa.select(view_entries.c.conversation_id, view_entries.c.position, view_entries.c.event_seq)
        .where(view_entries.c.conversation_id.in_(ids))
        .order_by(view_entries.c.conversation_id, view_entries.c.position)
    ).all()
    flags = conn.execute(
        sa.select(conversations.c.id, conversations.c.head_open, conversations.c.head_hash)
        .where(conversations.c.id.in_(ids))
        .order_by(conversations.c.id)
    ).all()
    return [tuple(r) for r in rows] + [(i, bool(f), bytes(h)) for i, f, h in flags]


def apply(store: Store, ops: list[tuple[str, int]]) -> list[str]:
    ledger = store.tenant(f"prop-{uuid.uuid4().hex[:8]}")
    convs = [ledger.create_conversation().id]
    cursors: list[RunCursor] = []
    failed: list[str] = []
    for op, n in ops:
        conv_id = convs[n % len(convs)]
        head = ledger.conversation(conv_id).head.position
        try:
            if op == "append":
                ledger.append_messages(
                    conv_id, [Message(role="user", content=f"m{n}.{i}") for i in range(1 + n % 3)]
                )
            elif op == "fork":
                convs.append(ledger.fork(conv_id, at=1 + n % head).id)
            elif op == "move" and head > 1:
                ledger.move_head(conv_id, 1 + n % head)
            elif op == "start":
                cursors.append(ledger.runs.start(conv_id, owner="p"))
            elif op in ("record", "complete", "fail") and cursors:
                cursor = cursors.pop(n % len(cursors))
                if op == "record":
                    message = Message(role="assistant", content=f"r{n}")
                    _, cursor = ledger.runs.record(cursor, [NewEvent.of_message(message)])
                    cursors.append(cursor)
                elif op == "complete":
                    ledger.runs.complete(cursor)
                else:
                    ledger.runs.fail(cursor, stage="model", error="injected")
                    failed.append(cursor.run_id)
            elif op == "resume" and failed:
                run = ledger.runs.get(failed[n % len(failed)])
                cursors.append(ledger.runs.start(run.conversation_id, owner="p", resumes=run.id))
        except ChatledgerError:
            pass  # conflicts and refused resumes are part of the game
    return convs


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_incremental_views_equal_rebuild(store: Store, ops: list[tuple[str, int]]) -> None:
    convs = apply(store, ops)
    with store.engine.connect() as conn, conn.begin() as transaction:
        incremental = view_rows(conn, convs)
        projector.rebuild_views(conn, convs)
        rebuilt = view_rows(conn, convs)
        transaction.rollback()
    assert incremental == rebuilt


def test_store_rebuild_recomputes_identical_views(store: Store) -> None:
    convs = apply(
        store,
        [
            ("append", 1),
            ("start", 0),
            ("record", 0),
            ("fork", 3),
            ("append", 1),
            ("complete", 0),
            ("move", 2),
            ("start", 1),
            ("fail", 0),
            ("resume", 0),
            ("record", 0),
            ("complete", 0),
        ],
    )
    with store.engine.connect() as conn:
        before = view_rows(conn, convs)
    assert store.rebuild() >= len(convs)
    with store.engine.connect() as conn:
        assert view_rows(conn, convs) == before
