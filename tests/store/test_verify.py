"""Tamper evidence: the hash chain, recomputed by `verify`, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from chatledger.store import (
    Event,
    InvalidInputError,
    Ledger,
    Message,
    NewEvent,
    NotFoundError,
    Position,
    Recompute,
    Store,
)
from chatledger.store._sql import chain as _chain
from chatledger.store.ids import new_id
from chatledger.store.schema import events, runs
from tests.conftest import create_postgres_database, drop_postgres_database


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """This module tampers with rows: its own database, which no other test reads."""
    url = create_postgres_database("chatledger_tamper")
    with Store.open(url) as store:
        store.migrate()
    yield url
    drop_postgres_database(url)


def populate(ledger: Ledger) -> tuple[str, str]:
    conv = ledger.create_conversation({"who": "auditor"})
    ledger.append_messages(
        conv.id, [Message(role="user", content="one"), Message(role="assistant", content="two")]
    )
    cursor = ledger.runs.start(conv.id, owner="v")
    _, cursor = ledger.runs.record(
        cursor, [NewEvent.of_message(Message(role="assistant", content="three"))]
    )
    ledger.runs.complete(cursor)
    failing = ledger.runs.start(conv.id, owner="v")
    ledger.runs.fail(failing, stage="model", error="x")
    ledger.append_messages(conv.id, [Message(role="user", content="after a failed run")])
    ledger.move_head(conv.id, 3)
    fork = ledger.fork(conv.id)
    ledger.append_messages(fork.id, [Message(role="user", content="in the fork")])
    return conv.id, fork.id


@contextmanager
def triggers_off(store: Store) -> Iterator[sa.Connection]:
    """What a superuser can do: bypass the append-only triggers."""
    with store.engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("DROP TRIGGER chatledger_events_no_update")
            conn.exec_driver_sql("DROP TRIGGER chatledger_events_no_delete")
            yield conn
            conn.exec_driver_sql(
                "CREATE TRIGGER chatledger_events_no_update BEFORE UPDATE ON chatledger_events "
                "BEGIN SELECT RAISE(ABORT, 'append-only'); END"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER chatledger_events_no_delete BEFORE DELETE ON chatledger_events "
                "BEGIN SELECT RAISE(ABORT, 'append-only'); END"
            )
        else:
            conn.exec_driver_sql(
                "ALTER TABLE chatledger_events DISABLE TRIGGER chatledger_events_no_change"
            )
            yield conn
            conn.exec_driver_sql(
                "ALTER TABLE chatledger_events ENABLE TRIGGER chatledger_events_no_change"
            )


@pytest.fixture(params=["auto", "client"])
def recompute(request: pytest.FixtureRequest) -> Recompute:
    """Where hashes are recomputed: in SQL on Postgres (`auto`), or in this process."""
    mode: Recompute = request.param
    return mode


def test_an_untouched_log_verifies_clean(ledger: Ledger, recompute: Recompute) -> None:
    conv, fork = populate(ledger)
    results = {r.conversation_id: r for r in ledger.verify_all(recompute=recompute)}
    assert results[conv].ok and results[fork].ok
    assert results[conv].checked == len(ledger.events(conversation_id=conv))
    assert results[conv].head_digest != results[fork].head_digest


def test_a_changed_payload_is_found_and_named(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv, fork = populate(ledger)
    victim = next(
        e for e in ledger.events(conversation_id=conv) if e.message and e.message.content == "two"
    )
    with triggers_off(store) as conn:
        conn.execute(
            events.update()
            .where(events.c.seq == victim.seq)
            .values(payload='{"role":"user","content":"forged"}')
        )
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and result.event_seq == victim.seq and result.event_id == victim.id
    assert f"Event {victim.seq}" in (result.problem or "")
    assert ledger.verify(fork, recompute=recompute).ok  # the fork's own events are intact


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv, _ = populate(ledger)
    log = ledger.events(conversation_id=conv)
    victim, after = log[1], log[2]
    assert (after.branch_id, after.position) == (victim.branch_id, victim.position + 1)
    forged = '{"role":"user","content":"forged"}'
    fields = {
        name: getattr(victim, name if name != "payload" else "payload_json")
        for name in _chain.FIELDS
    }
    fields["payload"] = forged
    with triggers_off(store) as conn:
        conn.execute(
            events.update()
            .where(events.c.seq == victim.seq)
            .values(payload=forged, hash=_chain.link(log[0].hash, _chain.content(**fields)))
        )
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and result.event_seq == after.seq, result.problem


def test_an_event_added_outside_every_branch_is_found(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv, _ = populate(ledger)
    model = ledger.events(conversation_id=conv)[1]
    with store.engine.begin() as conn:  # inserts pass the append-only triggers
        conn.execute(
            events.insert().values(
                id=new_id(),
                conversation_id=conv,
                branch_id=new_id(),
                position=1,
                kind=model.kind,
                origin=model.origin,
                head=False,
                recorded_at=model.recorded_at,
                payload=model.payload_json,
                hash=model.hash,
                tenant=ledger.tenant,
            )
        )
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and "none of its branches" in (result.problem or "")


def test_an_event_moved_to_another_conversation_is_blamed_on_both(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    first, _ = populate(ledger)
    second, _ = populate(ledger)
    head = ledger.conversation(first).head
    moved = next(
        e
        for e in ledger.events(conversation_id=first)
        if (e.branch_id, e.position) == (head.branch_id, head.position)
    )
    with triggers_off(store) as conn:
        conn.execute(
            events.update().where(events.c.seq == moved.seq).values(conversation_id=second)
        )
    results = {
        r.conversation_id: r
        for r in ledger.verify_all(recompute=recompute)
        if r.conversation_id in (first, second)
    }
    assert not results[first].ok
    assert not results[second].ok and results[second].event_seq == moved.seq


def test_malformed_ids_and_modes_are_invalid_input(ledger: Ledger) -> None:
    with pytest.raises(InvalidInputError, match="canonical"):
        ledger.verify("not-a-uuid")
    conv = ledger.create_conversation()
    with pytest.raises(InvalidInputError, match="recompute must be"):
        ledger.verify(conv.id, recompute="everywhere")  # type: ignore[arg-type]


def test_sqlite_cannot_recompute_in_the_database(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'v.db'}") as store:
        store.migrate()
        ledger = store.tenant("t")
        conv = ledger.create_conversation()
        with pytest.raises(InvalidInputError, match="recompute='client'"):
            ledger.verify(conv.id, recompute="database")


@pytest.mark.parametrize("which", ["middle", "tail"])
def test_a_deleted_event_is_found(
    store: Store, ledger: Ledger, which: str, recompute: Recompute
) -> None:
    conv, _ = populate(ledger)
    log = ledger.events(conversation_id=conv)
    head = ledger.conversation(conv).head
    victim = (
        log[2]
        if which == "middle"
        else next(e for e in log if (e.branch_id, e.position) == (head.branch_id, head.position))
    )
    with triggers_off(store) as conn:
        conn.execute(events.delete().where(events.c.seq == victim.seq))
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and "missing" in (result.problem or "")


def test_chains_cross_into_a_forks_source(ledger: Ledger) -> None:
    conv, fork = populate(ledger)
    first_of_fork = ledger.events(conversation_id=fork)[0]
    point = ledger.conversation(fork).forked_from
    assert point is not None
    source = next(
        e
        for e in ledger.events(conversation_id=conv)
        if (e.branch_id, e.position) == (point.branch_id, point.position)
    )
    fields = {
        name: getattr(first_of_fork, name if name != "payload" else "payload_json")
        for name in _chain.FIELDS
    }
    assert first_of_fork.hash == _chain.link(source.hash, _chain.content(**fields))


def test_verify_of_another_tenants_conversation_is_not_found(store: Store, ledger: Ledger) -> None:
    conv, _ = populate(ledger)
    with pytest.raises(NotFoundError):
        store.tenant("intruder").verify(conv)
    assert store.tenant("intruder").verify_all() == []


def test_head_digest_is_the_head_events_hash(ledger: Ledger) -> None:
    conv, _ = populate(ledger)
    head = ledger.conversation(conv).head
    event = next(
        e for e in ledger.events(conversation_id=conv) if Position(e.branch_id, e.position) == head
    )
    assert ledger.verify(conv).head_digest == event.hash.hex()


def test_the_verify_command_names_the_tampered_event(
    store: Store, ledger: Ledger, database_url: str, recompute: Recompute
) -> None:
    import sys

    from tests import warm

    conv, _ = populate(ledger)
    victim = ledger.events(conversation_id=conv)[1]
    with triggers_off(store) as conn:
        conn.execute(events.update().where(events.c.seq == victim.seq).values(kind="run.started"))
    result = warm.run(
        [
            sys.executable,
            "-m",
            "chatledger",
            "verify",
            "--tenant",
            ledger.tenant,
            "--database-url",
            database_url,
            "--recompute",
            recompute,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"Event {victim.seq} (id '{victim.id}'" in result.stdout


async def test_async_verify(database_url: str) -> None:
    from chatledger.store import AsyncStore

    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant("async-verify")
        conv = await ledger.create_conversation()
        await ledger.append_messages(conv.id, [Message(role="user", content="x")])
        assert (await ledger.verify(conv.id)).ok


# -- Deleted events that something names ---------------------------------------
#
# A deleted event leaves no gap when it was the last of its branch. It is
# found through whatever names its position: an event's payload (hashed, so
# the name itself cannot be removed without breaking a chain) or a row.


def delete_event(store: Store, ledger: Ledger, conversation_id: str, at: Position) -> None:
    victim = next(
        e
        for e in ledger.events(conversation_id=conversation_id)
        if Position(e.branch_id, e.position) == at
    )
    with triggers_off(store) as conn:
        conn.execute(events.delete().where(events.c.seq == victim.seq))


def only_event(ledger: Ledger, conversation_id: str, kind: str) -> Event:
    (found,) = [e for e in ledger.events(conversation_id=conversation_id) if e.kind == kind]
    return found


def test_a_deleted_line_that_move_head_left_is_named_by_head_moved(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(
        conv, [Message(role="user", content="keep"), Message(role="user", content="drop")]
    )
    old_head = ledger.conversation(conv).head
    ledger.move_head(conv, 2)
    moved = only_event(ledger, conv, "head.moved")
    delete_event(store, ledger, conv, old_head)
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok
    assert (result.event_seq, result.event_id) == (moved.seq, moved.id)
    assert f"{old_head.branch_id}:{old_head.position} is missing" in (result.problem or "")
    assert conv in (result.problem or "")


def test_a_deleted_head_that_a_run_left_is_named_by_run_started(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(
        conv, [Message(role="user", content="q"), Message(role="assistant", content="a")]
    )
    old_head = ledger.conversation(conv).head
    cursor = ledger.runs.start(conv, owner="v", base=2)  # regenerate the answer
    _, cursor = ledger.runs.record(
        cursor, [NewEvent.of_message(Message(role="assistant", content="b"))]
    )
    ledger.runs.complete(cursor)
    started = only_event(ledger, conv, "run.started")
    delete_event(store, ledger, conv, old_head)
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and result.event_seq == started.seq
    assert f"{old_head.branch_id}:{old_head.position}" in (result.problem or "")
    assert "the head when its run started" in (result.problem or "")


def test_a_deleted_tail_of_a_failed_run_is_named_by_its_run_row(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(
        conv, [Message(role="user", content="q"), Message(role="assistant", content="a")]
    )
    cursor = ledger.runs.start(conv, owner="v", base=2)  # a side branch at position 2
    ledger.runs.fail(cursor, stage="model", error="x")
    run = ledger.runs.get(cursor.run_id)
    delete_event(store, ledger, conv, Position(run.branch_id, run.position))
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and result.event_seq is None
    assert f"the event at {run.branch_id}:{run.position} is missing" in (result.problem or "")
    assert f"run '{run.id}'" in (result.problem or "")


def test_a_deleted_point_that_a_resume_continues_is_named_even_with_the_run_row_rewound(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(conv, [Message(role="user", content="q")])
    failed = ledger.runs.start(conv, owner="v")
    ledger.runs.fail(failed, stage="model", error="x")
    ledger.runs.start(conv, owner="v", resumes=failed.run_id)
    tail = ledger.runs.get(failed.run_id)
    resumed_from = Position(tail.branch_id, tail.position)
    created = only_event(ledger, conv, "branch.created")
    delete_event(store, ledger, conv, resumed_from)
    with store.engine.begin() as conn:  # covering tracks: the row no longer names it
        conn.execute(runs.update().where(runs.c.id == tail.id).values(position=tail.position - 1))
    result = ledger.verify(conv, recompute=recompute)
    assert not result.ok and (result.event_seq, result.event_id) == (created.seq, created.id)
    assert f"{resumed_from.branch_id}:{resumed_from.position} is missing" in (result.problem or "")


def test_a_deleted_fork_point_is_named_in_the_source_and_in_the_fork(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    source = ledger.create_conversation().id
    ledger.append_messages(
        source, [Message(role="user", content="a"), Message(role="user", content="b")]
    )
    point = ledger.conversation(source).head
    fork = ledger.fork(source).id
    ledger.move_head(source, 2)  # the source leaves the fork point behind
    delete_event(store, ledger, source, point)
    named = f"{point.branch_id}:{point.position} is missing"
    in_source = ledger.verify(source, recompute=recompute)
    assert not in_source.ok and named in (in_source.problem or "")
    assert in_source.event_seq == only_event(ledger, source, "head.moved").seq
    in_fork = ledger.verify(fork, recompute=recompute)
    assert not in_fork.ok and named in (in_fork.problem or "")
    assert in_fork.event_seq == only_event(ledger, fork, "conversation.created").seq


def test_a_fork_answers_only_for_its_own_lineage(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    source = ledger.create_conversation().id
    ledger.append_messages(source, [Message(role="user", content="a")])
    fork = ledger.fork(source).id
    ledger.append_messages(source, [Message(role="user", content="beyond the fork point")])
    delete_event(store, ledger, source, ledger.conversation(source).head)
    assert not ledger.verify(source, recompute=recompute).ok  # the source's head names it
    assert ledger.verify(fork, recompute=recompute).ok  # the fork never saw it


def test_every_position_an_untouched_log_names_is_found(
    ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(
        conv, [Message(role="user", content="q"), Message(role="assistant", content="a")]
    )
    regenerate = ledger.runs.start(conv, owner="v", base=2)
    ledger.runs.complete(regenerate)
    failed = ledger.runs.start(conv, owner="v")
    ledger.runs.fail(failed, stage="model", error="x")
    resume = ledger.runs.start(conv, owner="v", resumes=failed.run_id)
    ledger.runs.complete(resume)
    ledger.move_head(conv, 2)
    fork = ledger.fork(conv, at=3).id
    ledger.move_head(fork, 2)  # into the source's lineage
    ledger.runs.complete(ledger.runs.start(fork, owner="v", base=1))  # based in the source
    assert [r.problem for r in ledger.verify_all(recompute=recompute)] == [None, None]


def test_a_forged_payload_that_names_no_position_is_a_mismatch(
    store: Store, ledger: Ledger, recompute: Recompute
) -> None:
    conv = ledger.create_conversation().id
    ledger.append_messages(conv, [Message(role="user", content="a")])
    ledger.move_head(conv, 1)
    moved = only_event(ledger, conv, "head.moved")
    for forged in ("not json", '{"from":{"branchId":"x","position":"y"}}', "[]"):
        with triggers_off(store) as conn:
            conn.execute(events.update().where(events.c.seq == moved.seq).values(payload=forged))
        result = ledger.verify(conv, recompute=recompute)
        assert not result.ok and result.event_seq == moved.seq, result.problem
