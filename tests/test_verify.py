"""Tamper evidence: the hash chain, recomputed by `verify`, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from store import (
    InvalidInputError,
    Ledger,
    Message,
    NewEvent,
    NotFoundError,
    Position,
    Recompute,
    Store,
    _chain,
)
from store.ids import new_id
from store.schema import events
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
    cursor = ledger.start_run(conv.id, owner="v")
    _, cursor = ledger.record(
        cursor, [NewEvent.of_message(Message(role="assistant", content="three"))]
    )
    ledger.complete_run(cursor)
    failing = ledger.start_run(conv.id, owner="v")
    ledger.fail_run(failing, stage="model", error="x")
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
    import subprocess
    import sys

    conv, _ = populate(ledger)
    victim = ledger.events(conversation_id=conv)[1]
    with triggers_off(store) as conn:
        conn.execute(events.update().where(events.c.seq == victim.seq).values(kind="run.started"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.cli",
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
    from store import AsyncStore

    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant("async-verify")
        conv = await ledger.create_conversation()
        await ledger.append_messages(conv.id, [Message(role="user", content="x")])
        assert (await ledger.verify(conv.id)).ok
