"""Runs and branches: the head rule, partial runs, resumes, leases and fencing."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from chatledger.store import (
    ConflictError,
    InvalidInputError,
    LeaseError,
    Ledger,
    Message,
    NewEvent,
    Position,
    ResumeConflictError,
    RunStateError,
    StorageError,
    Store,
    new_id,
)
from chatledger.store.schema import events, view_entries
from tests.helpers import user


def said(text: str) -> NewEvent:
    return NewEvent.of_message(Message(role="assistant", content=text))


def contents(ledger: Ledger, conversation_id: str) -> list[str]:
    return [m.content for m in ledger.history(conversation_id)]


def test_fork_inherits_history_without_copying_rows(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one"), user("two")])
    with store.engine.connect() as conn:
        before = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
    fork = ledger.fork(conv.id, at=2, metadata={"why": "test"})
    with store.engine.connect() as conn:
        after = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
    assert after == before + 1  # only the fork's conversation.created
    assert fork.id != conv.id
    assert fork.forked_from is not None and fork.forked_from.conversation_id == conv.id
    assert contents(ledger, fork.id) == ["one"]
    ledger.append_messages(fork.id, [user("fork only")])
    assert contents(ledger, fork.id) == ["one", "fork only"]
    assert contents(ledger, conv.id) == ["one", "two"]


def test_fork_new_messages_carry_the_new_conversation(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("one")])
    fork = ledger.fork(conv.id)
    appended = ledger.append_messages(fork.id, [user("two")])
    assert {e.conversation_id for e in appended.events} == {fork.id}
    inherited = ledger.events(conversation_id=conv.id)
    assert {e.conversation_id for e in inherited} == {conv.id}


def test_run_completion_moves_the_head(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("q")])
    cursor = ledger.runs.start(conv.id, owner="w1", model="scripted")
    _, cursor = ledger.runs.record(cursor, [said("answer")])
    done = ledger.runs.complete(cursor)
    assert done.head.position == cursor.position + 1
    assert contents(ledger, conv.id) == ["q", "answer"]
    assert ledger.runs.get(cursor.run_id).status == "completed"


def test_failed_run_partial_stays_beyond_the_head(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("q")])
    head = ledger.conversation(conv.id).head
    cursor = ledger.runs.start(conv.id, owner="w1")
    _, cursor = ledger.runs.record(cursor, [said("partial answer")])
    ledger.runs.fail(cursor, stage="model", error="boom")
    assert ledger.conversation(conv.id).head == head
    assert contents(ledger, conv.id) == ["q"]
    run = ledger.runs.get(cursor.run_id)
    assert (run.status, run.stage) == ("failed", "model")
    following = ledger.runs.start(conv.id, owner="w1")
    assert following.branch_id != cursor.branch_id
    _, following = ledger.runs.record(following, [said("fresh")])
    ledger.runs.complete(following)
    assert contents(ledger, conv.id) == ["q", "fresh"]


def test_completed_run_moves_the_head_only_by_compare_and_set(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    first = ledger.runs.start(conv.id, owner="w1")
    second = ledger.runs.start(conv.id, owner="w2")
    assert first.branch_id != second.branch_id
    _, first = ledger.runs.record(first, [said("first")])
    _, second = ledger.runs.record(second, [said("second")])
    ledger.runs.complete(first)
    with pytest.raises(ConflictError, match="moved"):
        ledger.runs.complete(second)
    assert contents(ledger, conv.id) == ["first"]
    lost = ledger.runs.get(second.run_id)
    assert (lost.status, lost.stage) == ("failed", "conflict")
    kinds = [e.kind for e in ledger.events(run_id=second.run_id)]
    assert kinds == ["branch.created", "run.started", "message.recorded", "run.failed"]


def test_an_exclusive_start_is_refused_while_another_run_is_live_and_writes_nothing(
    ledger: Ledger,
) -> None:
    conv = ledger.create_conversation()
    live = ledger.runs.start(conv.id, owner="w1")
    before = ledger.events(conversation_id=conv.id)
    with pytest.raises(ConflictError, match=live.run_id) as caught:
        ledger.runs.start(conv.id, owner="w2", exclusive=True, events=[said("second")])
    assert "Retry once it has ended" in str(caught.value)
    assert ledger.events(conversation_id=conv.id) == before
    ledger.runs.complete(live)
    after = ledger.runs.start(conv.id, owner="w2", exclusive=True)  # the retry the error advises
    ledger.runs.complete(after)


def test_a_run_whose_lease_expired_does_not_hold_the_conversation(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.runs.start(conv.id, owner="crashed", lease_seconds=0)
    cursor = ledger.runs.start(conv.id, owner="w2", exclusive=True)
    ledger.runs.complete(cursor)


def test_a_run_that_creates_its_conversation_writes_it_in_its_own_transaction(
    ledger: Ledger,
) -> None:
    conversation_id = new_id()
    prompt = NewEvent.of_message(user("hi"), origin="client")
    cursor = ledger.runs.start(conversation_id, owner="w", create=True, events=[prompt])
    ledger.runs.complete(cursor)
    assert contents(ledger, conversation_id) == ["hi"]
    kinds = [e.kind for e in ledger.events(conversation_id=conversation_id)]
    assert kinds == ["conversation.created", "run.started", "message.recorded", "run.completed"]
    refused = NewEvent.of_message(user("lone \udfff"), origin="client")
    with pytest.raises(InvalidInputError):
        ledger.runs.start(new_id(), owner="w", create=True, events=[refused])
    assert [c.id for c in ledger.conversations()] == [conversation_id]


def test_append_while_a_run_is_open_branches_off_the_head(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1")
    appended = ledger.append_messages(conv.id, [user("meanwhile")])
    assert appended.head.branch_id != cursor.branch_id
    assert contents(ledger, conv.id) == ["meanwhile"]
    with pytest.raises(ConflictError):
        ledger.runs.complete(cursor)


def test_resume_continues_from_the_partial(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("q")])
    cursor = ledger.runs.start(conv.id, owner="w1")
    _, cursor = ledger.runs.record(cursor, [said("partial")])
    ledger.runs.fail(cursor, stage="tool", error="crash")
    resume = ledger.runs.start(conv.id, owner="w2", resumes=cursor.run_id)
    assert resume.branch_id != cursor.branch_id
    _, resume = ledger.runs.record(resume, [said("finished")])
    ledger.runs.complete(resume)
    assert contents(ledger, conv.id) == ["q", "partial", "finished"]
    assert ledger.runs.get(resume.run_id).resumes == cursor.run_id


def test_at_most_one_resume_branch_under_racing_creators(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1")
    ledger.runs.fail(cursor, stage="model", error="crash")
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def create() -> None:
        barrier.wait()
        try:
            ledger.runs.start(conv.id, owner=threading.current_thread().name, resumes=cursor.run_id)
            outcome = "resumed"
        except ResumeConflictError:
            outcome = "conflict"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict"] * 7 + ["resumed"]
    assert len(ledger.runs.recent(conversation_id=conv.id)) == 2


def test_running_run_cannot_be_resumed(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1")
    with pytest.raises(RunStateError, match="running"):
        ledger.runs.start(conv.id, owner="w2", resumes=cursor.run_id)


def test_stale_attempt_append_writes_nothing(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    zombie = ledger.runs.start(conv.id, owner="zombie", lease_seconds=0)
    claimed = ledger.runs.claim_stale(owner="rescuer", lease_seconds=60)
    assert [(run.id, c.attempt) for run, c in claimed] == [(zombie.run_id, 2)]
    before = ledger.events(run_id=zombie.run_id)
    with pytest.raises(LeaseError, match="attempt 1") as caught:
        ledger.runs.record(zombie, [said("from the grave")])
    assert "rescuer" in str(caught.value)
    assert ledger.events(run_id=zombie.run_id) == before
    _, rescuer = claimed[0]
    written, _ = ledger.runs.record(rescuer, [said("rescued")])
    assert written[0].position == zombie.position + 1


def test_expired_lease_refuses_appends_until_renewed_elsewhere(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1", lease_seconds=0)
    with pytest.raises(LeaseError, match="expired"):
        ledger.runs.record(cursor, [said("late")])
    with pytest.raises(LeaseError):
        ledger.runs.renew_lease(cursor, 30)


def test_renewed_lease_is_not_claimable(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1", lease_seconds=60)
    ledger.runs.renew_lease(cursor, 60)
    assert ledger.runs.claim_stale(owner="w2") == []


def test_run_crashing_every_attempt_is_given_up(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1", lease_seconds=0)
    for _ in range(2):
        assert len(ledger.runs.claim_stale(owner="w", lease_seconds=0, max_attempts=3)) == 1
    assert ledger.runs.claim_stale(owner="w", lease_seconds=0, max_attempts=3) == []
    run = ledger.runs.get(cursor.run_id)
    assert (run.status, run.stage, run.error) == ("failed", "gave_up", None)
    assert run.attention is not None and "3 attempts" in run.attention
    assert [r.id for r in ledger.runs.recent(attention=True)] == [cursor.run_id]


def test_append_messages_is_atomic(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("kept")])
    # A stray view row where the batch's second message would go makes the
    # database fail the append midway, after its first rows were written.
    with store.engine.begin() as conn:
        conn.execute(
            view_entries.insert().values(
                conversation_id=conv.id, position=4, event_seq=0, tenant=ledger.tenant
            )
        )
    with pytest.raises(StorageError):
        ledger.append_messages(conv.id, [user("lost 1"), user("lost 2")])
    with store.engine.begin() as conn:
        conn.execute(view_entries.delete().where(view_entries.c.event_seq == 0))
    assert contents(ledger, conv.id) == ["kept"]
    assert len(ledger.events(conversation_id=conv.id)) == 2
    assert ledger.conversation(conv.id).head.position == 2


def test_moving_the_head_onto_a_running_runs_tip_never_writes_into_the_run(
    ledger: Ledger,
) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1")
    moved = ledger.move_head(conv.id, Position(cursor.branch_id, cursor.position))
    assert moved.head.branch_id != cursor.branch_id
    appended = ledger.append_messages(conv.id, [user("meanwhile")])
    assert appended.head.branch_id != cursor.branch_id
    written, _ = ledger.runs.record(cursor, [said("still mine")])
    assert written[0].position == cursor.position + 1


def test_canceled_run_records_its_stage_and_error_in_the_log(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w1")
    ledger.runs.fail(cursor, stage="canceled", error="user pressed stop", canceled=True)
    last = ledger.events(run_id=cursor.run_id)[-1]
    assert last.kind == "run.canceled"
    assert (last.payload["stage"], last.payload["error"]) == ("canceled", "user pressed stop")
