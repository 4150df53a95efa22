"""Tenancy: another tenant's ids and cursors look exactly like missing ones, and write nothing.

Every public operation that takes an id, a position or a run cursor is driven
with another tenant's values and with values that name nothing at all: both
must raise `NotFoundError` with the same sentence (up to the id), and no row
of any table may change.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatledger.store import (
    ConflictError,
    Ledger,
    NewEvent,
    NotFoundError,
    Position,
    RunCursor,
    Store,
)
from chatledger.store.ids import new_id
from chatledger.store.schema import branches, conversations, event_ids, events, runs, view_entries
from tests.helpers import user


@dataclass(frozen=True)
class Ids:
    """The ids one operation is handed: a conversation, a branch, a run and a run cursor."""

    conversation: str
    branch: str
    run: str
    cursor: RunCursor


@dataclass(frozen=True)
class World:
    mine: Ledger
    own: Ids
    theirs: Ids
    tenants: tuple[str, str]


def _populate(ledger: Ledger) -> Ids:
    """A conversation with history, a failed run on a side branch, and a running run."""
    conv = ledger.create_conversation({"secret": ledger.tenant})
    ledger.append_messages(conv.id, [user(f"secret of {ledger.tenant}")])
    failed = ledger.runs.start(conv.id, owner="w", events=[NewEvent.of_message(user("q"))])
    ledger.runs.fail(failed, stage="model", error="down")
    running = ledger.runs.start(conv.id, owner="w", events=[NewEvent.of_message(user("q2"))])
    return Ids(conv.id, running.branch_id, failed.run_id, running)


def _missing() -> Ids:
    return Ids(new_id(), new_id(), new_id(), RunCursor(new_id(), new_id(), new_id(), 3, "w", 1))


@pytest.fixture
def world(store: Store) -> World:
    suffix = uuid.uuid4().hex[:8]
    mine, other = store.tenant(f"mine-{suffix}"), store.tenant(f"theirs-{suffix}")
    return World(mine, _populate(mine), _populate(other), (mine.tenant, other.tenant))


def snapshot(store: Store, tenants: tuple[str, str]) -> tuple[Any, ...]:
    """Every row count, and the two tenants' conversation and run rows in full."""
    with store.engine.connect() as conn:
        counts = tuple(
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (conversations, branches, events, runs, view_entries, event_ids)
        )
        convs = conn.execute(
            sa.select(conversations)
            .where(conversations.c.tenant.in_(tenants))
            .order_by(conversations.c.id)
        ).all()
        run_rows = conn.execute(
            sa.select(runs).where(runs.c.tenant.in_(tenants)).order_by(runs.c.id)
        ).all()
    return counts, [tuple(r) for r in convs], [tuple(r) for r in run_rows]


Operation = Callable[[World, Ids], object]

# Each operation takes the ids it acts on from `ids` (another tenant's, or
# ones that name nothing) and everything else from the caller's own tenant.
OPERATIONS: dict[str, Operation] = {
    "conversation": lambda w, i: w.mine.conversation(i.conversation),
    "conversations before": lambda w, i: w.mine.conversations(before=i.conversation),
    "history": lambda w, i: w.mine.history(i.conversation),
    "history at position": lambda w, i: w.mine.history(i.conversation, at=1),
    "history at their branch": lambda w, i: w.mine.history(
        w.own.conversation, at=Position(i.branch, 1)
    ),
    "append": lambda w, i: w.mine.append_messages(i.conversation, [user("x")]),
    "append with key": lambda w, i: w.mine.append_messages(
        i.conversation, [user("x")], idempotency_key="k", expected=2
    ),
    "append after their branch": lambda w, i: w.mine.append_messages(
        w.own.conversation, [user("x")], after=Position(i.branch, 1)
    ),
    "append with state": lambda w, i: w.mine.append_messages(
        i.conversation, [user("x")], state={"s": 1}, ids=[new_id()]
    ),
    "entries": lambda w, i: w.mine.entries(i.conversation),
    "last entries": lambda w, i: w.mine.entries(i.conversation, last=1),
    "entries at their branch": lambda w, i: w.mine.entries(
        w.own.conversation, at=Position(i.branch, 1)
    ),
    "set state": lambda w, i: w.mine.append_messages(i.conversation, [], state={"s": 1}),
    "move head with state": lambda w, i: w.mine.move_head(i.conversation, 1, state={"s": 1}),
    "fork": lambda w, i: w.mine.fork(i.conversation),
    "fork with key": lambda w, i: w.mine.fork(i.conversation, key="k"),
    "fork at their branch": lambda w, i: w.mine.fork(w.own.conversation, at=Position(i.branch, 1)),
    "move head": lambda w, i: w.mine.move_head(i.conversation, 1),
    "move head to their branch": lambda w, i: w.mine.move_head(
        w.own.conversation, Position(i.branch, 1)
    ),
    "events of conversation": lambda w, i: w.mine.events(conversation_id=i.conversation),
    "events of run": lambda w, i: w.mine.events(run_id=i.run),
    "start run": lambda w, i: w.mine.runs.start(i.conversation, owner="w"),
    "start run at their branch": lambda w, i: w.mine.runs.start(
        w.own.conversation, owner="w", base=Position(i.branch, 1)
    ),
    "resume their run": lambda w, i: w.mine.runs.start(
        w.own.conversation, owner="w", resumes=i.run
    ),
    "record": lambda w, i: w.mine.runs.record(i.cursor, [NewEvent.of_message(user("inject"))]),
    "record with key": lambda w, i: w.mine.runs.record(
        i.cursor, [NewEvent.of_message(user("inject"))], idempotency_key="k"
    ),
    "complete run": lambda w, i: w.mine.runs.complete(i.cursor),
    "fail run": lambda w, i: w.mine.runs.fail(i.cursor, stage="model", error="x"),
    "renew lease": lambda w, i: w.mine.runs.renew_lease(i.cursor),
    "run": lambda w, i: w.mine.runs.get(i.run),
    "runs of conversation": lambda w, i: w.mine.runs.recent(conversation_id=i.conversation),
    "verify": lambda w, i: w.mine.verify(i.conversation),
    "audit events of conversation": lambda w, i: w.mine.audit.events(
        conversation_id=i.conversation
    ),
    "audit events of run": lambda w, i: w.mine.audit.events(run_id=i.run),
    "audit timeline": lambda w, i: w.mine.audit.run_timeline(i.run),
    "audit model request": lambda w, i: w.mine.audit.model_request(i.run, 1, instructions=""),
    "audit tools of conversation": lambda w, i: w.mine.audit.tool_executions(
        conversation_id=i.conversation
    ),
    "audit tools of run": lambda w, i: w.mine.audit.tool_executions(run_id=i.run),
    "audit supplied": lambda w, i: w.mine.audit.supplied_and_repaired(
        conversation_id=i.conversation
    ),
    "audit lineage": lambda w, i: w.mine.audit.lineage(i.conversation),
}


def _refusal(call: Callable[[], object]) -> NotFoundError:
    with pytest.raises(NotFoundError) as caught:
        call()
    return caught.value


def _shape(error: NotFoundError, ids: Ids) -> str:
    """The error's sentence with the ids it was handed blanked out."""
    text = str(error)
    for value in (ids.conversation, ids.branch, ids.run, ids.cursor.run_id):
        text = text.replace(value, "<id>")
    return text


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_another_tenants_ids_read_exactly_as_missing_ones_and_write_nothing(
    store: Store, world: World, name: str
) -> None:
    operation = OPERATIONS[name]
    missing = _missing()
    before = snapshot(store, world.tenants)
    foreign = _refusal(lambda: operation(world, world.theirs))
    absent = _refusal(lambda: operation(world, missing))
    assert snapshot(store, world.tenants) == before
    assert (foreign.kind, _shape(foreign, world.theirs)) == (absent.kind, _shape(absent, missing))
    assert world.mine.tenant in str(foreign)


_SOURCES = st.sampled_from(["own", "theirs", "missing"])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    run=_SOURCES,
    conversation=_SOURCES,
    branch=_SOURCES,
    operation=st.sampled_from(["record", "complete run", "fail run", "renew lease"]),
)
def test_a_cursor_with_any_field_not_its_own_runs_names_no_run(
    store: Store, world: World, run: str, conversation: str, branch: str, operation: str
) -> None:
    if run == conversation == branch == "own":
        return  # the run's own cursor: not a forgery
    missing = _missing()
    source = {"own": world.own, "theirs": world.theirs, "missing": missing}
    forged = replace(
        world.own.cursor,
        run_id=source[run].cursor.run_id,
        conversation_id=source[conversation].cursor.conversation_id,
        branch_id=source[branch].cursor.branch_id,
    )
    before = snapshot(store, world.tenants)
    error = _refusal(lambda: OPERATIONS[operation](world, replace(world.own, cursor=forged)))
    assert error.kind == "run"
    assert snapshot(store, world.tenants) == before


def test_a_forged_cursor_cannot_write_into_another_tenants_log(world: World, store: Store) -> None:
    # The attack: start a run of one's own, then point its cursor at another
    # tenant's conversation and branch.
    forged = replace(
        world.own.cursor,
        conversation_id=world.theirs.conversation,
        branch_id=world.theirs.cursor.branch_id,
    )
    other = store.tenant(world.tenants[1])
    logged = other.events(conversation_id=world.theirs.conversation)
    with pytest.raises(NotFoundError):
        world.mine.runs.record(forged, [NewEvent.of_message(user("inject"))])
    with pytest.raises(NotFoundError):
        world.mine.runs.complete(forged)
    assert other.events(conversation_id=world.theirs.conversation) == logged
    # The run itself still works through its true cursor.
    world.mine.runs.record(world.own.cursor, [NewEvent.of_message(user("fine"))])


def test_a_taken_conversation_id_is_the_same_conflict_for_every_tenant(
    store: Store, world: World, ids_per_tenant: bool
) -> None:
    if ids_per_tenant:  # another tenant's id is free, as a missing one is
        with pytest.raises(ConflictError, match="is taken"):
            world.mine.create_conversation(conversation_id=world.own.conversation)
        theirs = store.tenant(world.tenants[1])
        before = (
            theirs.conversation(world.theirs.conversation),
            theirs.history(world.theirs.conversation),
        )
        mine = world.mine.create_conversation(conversation_id=world.theirs.conversation)
        assert (mine.tenant, world.mine.history(mine.id)) == (world.mine.tenant, [])
        after = (
            theirs.conversation(world.theirs.conversation),
            theirs.history(world.theirs.conversation),
        )
        assert after == before
        return
    errors = []
    for taken in (world.own.conversation, world.theirs.conversation):
        with pytest.raises(ConflictError) as caught:
            world.mine.create_conversation(conversation_id=taken)
        errors.append(str(caught.value).replace(taken, "<id>"))
    assert errors[0] == errors[1]
    assert "is taken" in errors[0]


def test_a_taken_run_id_is_the_same_conflict_for_every_tenant(world: World) -> None:
    errors = []
    for taken in (world.own.run, world.theirs.run):
        with pytest.raises(ConflictError) as caught:
            world.mine.runs.start(world.own.conversation, owner="w", run_id=taken)
        errors.append(str(caught.value).replace(taken, "<id>"))
    assert errors[0] == errors[1]
    assert "is taken" in errors[0]
