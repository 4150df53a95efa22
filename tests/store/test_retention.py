"""Retention: a tenant's policy, the pass a scheduler runs, its dry run, and a kill -9.

Conversations cannot be made old (their events are append-only and stamped
by the database's clock), so a pass is run as of a later moment (`now=`),
which is what a scheduler's clock would say that many days on.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from chatledger.engine._cli import main
from chatledger.store import ErasedError, InvalidInputError, Ledger, Message, Store
from chatledger.store._crypto import ERASED_CONTENT
from chatledger.store._retention import export_path
from tests.conftest import kill_when_paused

KEK = bytes(range(96, 128))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sealed_store(database_url: str) -> Iterator[Store]:
    with Store.open(database_url, kek=KEK) as opened:
        yield opened


@pytest.fixture
def ledger(sealed_store: Store) -> Ledger:
    return sealed_store.tenant(f"tenant-{uuid.uuid4().hex[:8]}")


def _conversation(ledger: Ledger, subject: str | None = None, text: str = "hello") -> str:
    conv = ledger.create_conversation(subject=subject)
    ledger.append_messages(conv.id, [Message(role="user", content=text)])
    return conv.id


def _last(ledger: Ledger, conversation_id: str) -> datetime:
    return ledger.events(conversation_id=conversation_id)[-1].recorded_at


def test_a_policy_is_set_read_replaced_and_cleared(ledger: Ledger) -> None:
    assert ledger.retention.get() is None
    first = ledger.retention.set(30, "erase")
    assert (first.tenant, first.idle_days, first.action) == (ledger.tenant, 30, "erase")
    ledger.retention.set(90, "export-erase")
    found = ledger.retention.get()
    assert found is not None and (found.idle_days, found.action) == (90, "export-erase")
    assert ledger.retention.clear() and not ledger.retention.clear()
    assert ledger.retention.get() is None
    for days, action in ((0, "erase"), (-1, "erase"), (True, "erase"), (30, "delete")):
        with pytest.raises(InvalidInputError):
            ledger.retention.set(days, action)  # type: ignore[arg-type]


def test_the_pass_erases_idle_subjects_keeps_active_ones_and_reports_the_clear(
    database_url: str, sealed_store: Store, ledger: Ledger
) -> None:
    old = _conversation(ledger, text="old")
    mixed_old = _conversation(ledger, subject="mixed", text="old too")
    with Store.open(database_url, kek=None) as bare:
        clear = _conversation(bare.tenant(ledger.tenant), text="in the clear")
    between = _last(ledger, clear)
    new = _conversation(ledger, text="new")
    mixed_new = _conversation(ledger, subject="mixed", text="new too")
    assert _last(ledger, mixed_old) < between < _last(ledger, new)
    ledger.retention.set(1, "erase")
    now = between + timedelta(days=1, microseconds=1)

    dry = sealed_store.run_retention(tenant=ledger.tenant, dry_run=True, now=now)
    (plan,) = dry.plans
    assert plan.due == {old: [old]} and plan.active == ["mixed"] and plan.clear == [clear]
    assert [s.subject for s in dry.subjects] == [old] and not dry.subjects[0].erased
    assert ledger.history(old)[0].content == "old"  # a dry run writes nothing

    report = sealed_store.run_retention(tenant=ledger.tenant, now=now)
    assert [(s.subject, s.erased, s.error) for s in report.subjects] == [(old, True, None)]
    assert ledger.history(old)[0].content == ERASED_CONTENT
    event = ledger.events(conversation_id=old)[-1]
    assert event.kind == "conversation.erased" and "retention" in event.payload["reason"]
    for kept in (mixed_old, mixed_new, new):
        assert ledger.history(kept)[0].content != ERASED_CONTENT
    assert ledger.history(clear)[0].content == "in the clear"
    # Run again: what was erased is no longer due.
    assert sealed_store.run_retention(tenant=ledger.tenant, now=now).subjects == []


def test_export_erase_archives_each_conversation_before_erasing_it(
    sealed_store: Store, ledger: Ledger, tmp_path: Path
) -> None:
    first = _conversation(ledger, subject="person", text="first words")
    second = _conversation(ledger, subject="person", text="second words")
    ledger.retention.set(1, "export-erase")
    now = _last(ledger, second) + timedelta(days=2)
    with pytest.raises(InvalidInputError, match="export directory"):
        sealed_store.run_retention(tenant=ledger.tenant, now=now)

    exports = tmp_path / "exports"
    report = sealed_store.run_retention(tenant=ledger.tenant, export_dir=exports, now=now)
    (outcome,) = report.subjects
    assert outcome.erased and sorted(outcome.exported) == sorted(
        str(export_path(exports, ledger.tenant, c)) for c in (first, second)
    )
    assert ledger.history(first)[0].content == ERASED_CONTENT
    # The archive holds the content, sealed, with its key: a store with the same
    # key-encryption key reads it back.
    with Store.open(f"sqlite:///{tmp_path / 'archive.db'}", kek=KEK) as archive:
        archive.migrate()
        copy = archive.tenant(ledger.tenant)
        for conversation_id, text in ((first, "first words"), (second, "second words")):
            with export_path(exports, ledger.tenant, conversation_id).open() as source:
                copy.import_file(source)
            assert copy.history(conversation_id)[0].content == text
            assert copy.verify(conversation_id).ok


def test_a_pass_killed_halfway_leaves_a_verifiable_store_and_finishes_when_run_again(
    own_database: str, tmp_path: Path
) -> None:
    with Store.open(own_database, kek=KEK) as store:
        ledger = store.tenant("acme")
        ids = {f"person-{i}": _conversation(ledger, subject=f"person-{i}") for i in range(3)}
        ledger.retention.set(1, "export-erase")
        now = _last(ledger, ids["person-2"]) + timedelta(days=2)
    kill_when_paused(
        "tests._retention_child",
        own_database,
        "acme",
        str(tmp_path / "exports"),
        now.isoformat(),
        KEK.hex(),
    )
    with Store.open(own_database, kek=KEK) as store:
        ledger = store.tenant("acme")
        assert all(v.ok for v in ledger.verify_all())
        erased = [s for s, c in ids.items() if ledger.conversation(c).erased_at is not None]
        assert erased == ["person-0"]  # the first subject committed; the second rolled back
        again = store.run_retention(tenant="acme", export_dir=tmp_path / "exports", now=now)
        assert sorted(s.subject for s in again.subjects) == ["person-1", "person-2"]
        assert all(s.erased for s in again.subjects)
        assert all(v.ok for v in ledger.verify_all())
        for conversation_id in ids.values():
            assert export_path(tmp_path / "exports", "acme", conversation_id).stat().st_size > 0
            with pytest.raises(ErasedError):
                ledger.append_messages(conversation_id, [Message(role="user", content="no")])


def test_the_cli_sets_shows_and_runs_retention(
    own_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATLEDGER_KEK", KEK.hex())

    def run(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out):
            status = main([*argv, "--database-url", own_database])
        return status, out.getvalue()

    status, said = run("retention", "show")
    assert status == 0 and "no retention policy" in said
    status, said = run("retention", "set", "--idle-days", "7", "--action", "erase")
    assert status == 0 and "7 days" in said
    status, said = run("retention", "show", "--json")
    assert json.loads(said) == {"tenant": "default", "idleDays": 7, "action": "erase"}
    with Store.open(own_database) as store:
        conv = _conversation(store.tenant("default"))
    # Nothing is a week old yet.
    status, said = run("retention", "run", "--dry-run")
    assert status == 0 and "Nothing is due" in said
    status, said = run("retention", "run", "--json")
    assert status == 0 and json.loads(said)["subjects"] == []
    status, said = run("retention", "clear")
    assert status == 0 and "removed" in said
    with Store.open(own_database) as store:
        assert store.tenant("default").history(conv)[0].content == "hello"


def test_a_subject_written_to_after_the_plan_is_kept(sealed_store: Store, ledger: Ledger) -> None:
    from chatledger.store._sql.erasure import erase_if_idle
    from chatledger.store._sql.ops import Op

    old = _conversation(ledger, subject="person")
    cutoff = _last(ledger, old) + timedelta(microseconds=1)
    newer = _conversation(ledger, subject="person")  # after the plan's cutoff

    def erase(ids: list[str]) -> object:
        return sealed_store.execute(
            Op(
                "erasing",
                write=True,
                fn=lambda c: erase_if_idle(
                    c, ledger.tenant, "person", "r", conversation_ids=ids, idle_before=cutoff
                ),
            )
        )

    assert erase([old]) is None  # a conversation the plan did not see
    assert erase([old, newer]) is None  # an event since the cutoff
    assert ledger.conversation(old).erased_at is None


def test_export_paths_stay_inside_the_export_directory(tmp_path: Path) -> None:
    for tenant in ("..", ".", "a/b", "../../etc"):
        path = export_path(tmp_path, tenant, "c").resolve()
        assert path.parent.parent == tmp_path.resolve()
