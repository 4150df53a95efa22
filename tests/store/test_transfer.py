"""Export and import (docs/export.md): a copy that verifies, on either backend, and files refused whole.

Each test writes a conversation with the public API, exports it, and imports
the file into a database of its own (a fresh one per test, made from a
migrated template): the copy must verify, keep every event's id, payload,
hash and time, and read back the same history; a bad file must be refused
with the line at fault, leaving every table of the target as it was.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import (
    AsyncStore,
    EncryptionError,
    ImportFileError,
    InvalidInputError,
    Ledger,
    Message,
    NewEvent,
    NotFoundError,
    Position,
    Store,
    ToolCall,
)
from chatledger.store.schema import metadata as tables
from tests.conftest import fresh_database


@pytest.fixture
def target(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store on the test's backend, to import into."""
    with Store.open(fresh_database(backend, request, tmp_path)) as store:
        yield store


@pytest.fixture
def source(database_url: str) -> Iterator[Store]:
    with Store.open(database_url) as store:
        yield store


def tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:8]}"


# -- what a conversation is made of ---------------------------------------------------


def build(ledger: Ledger) -> tuple[str, str]:
    """A conversation with every kind of row, and a fork of it: (conversation id, fork id).

    Branches: the root, a failed run's side branch, an edit; a completed run
    with a tool call; caller-minted ids; a key; a state.
    """
    conv = ledger.create_conversation(metadata={"user": "u1"}, key=f"key-{uuid.uuid4().hex}")
    ledger.append_messages(
        conv.id, [Message(role="user", content="hello"), Message(role="assistant", content="hi")]
    )
    failed = ledger.runs.start(
        conv.id,
        owner="worker",
        model="m",
        events=[NewEvent.of_message(Message(role="user", content="a run that fails"))],
    )
    _, failed = ledger.runs.record(
        failed, [NewEvent.of_message(Message(role="assistant", content="half an answer"))]
    )
    ledger.runs.fail(failed, stage="model", error="the model went away")
    ledger.append_messages(conv.id, [Message(role="user", content="an edit")], after=2)
    done = ledger.runs.start(
        conv.id,
        owner="worker",
        events=[NewEvent.of_message(Message(role="user", content="look it up"))],
    )
    call = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="lookup", arguments="{}")])
    result = Message(role="tool", tool_call_id="c1", tool_name="lookup", content="found")
    _, done = ledger.runs.record(
        done,
        [
            NewEvent.of_message(call),
            NewEvent("tool.started", {"callId": "c1", "name": "lookup"}),
            NewEvent("tool.finished", {"callId": "c1", "failed": False}),
            NewEvent.of_message(result),
        ],
    )
    ledger.runs.complete(done, request_count=1, tool_count=1)
    ledger.append_messages(conv.id, [], state={"step": 2})
    minted = [str(uuid.uuid4()) for _ in range(2)]
    ledger.append_messages(
        conv.id,
        [Message(role="user", content="named one"), Message(role="assistant", content="named two")],
        ids=minted,
        idempotency_key="turn-7",
    )
    fork = ledger.fork(conv.id, at=3, metadata={"fork": True})
    ledger.append_messages(fork.id, [Message(role="user", content="only in the fork")])
    return conv.id, fork.id


def export_text(ledger: Ledger, conversation_id: str | None = None) -> str:
    out = io.StringIO()
    ledger.export(out, conversation_id=conversation_id)
    return out.getvalue()


def event_rows(ledger: Ledger, conversation_id: str) -> list[dict[str, Any]]:
    """Every event as the log holds it, without the database's own `seq`."""
    return [
        {**asdict(e), "seq": None}
        for e in sorted(
            ledger.events(conversation_id=conversation_id),
            key=lambda e: (e.branch_id, e.position),
        )
    ]


def entry_rows(ledger: Ledger, conversation_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.event_id, e.conversation_id, e.position, e.recorded_at, e.message)
        for e in ledger.entries(conversation_id)
    ]


def assert_same(source: Ledger, copy: Ledger, ids: list[str]) -> None:
    """The copy verifies, and holds what the source holds."""
    checked = {v.conversation_id: v for v in copy.verify_all()}
    assert all(v.ok for v in checked.values()), [v.problem for v in checked.values()]
    for cid in ids:
        assert checked[cid].head_digest == source.verify(cid).head_digest
        assert copy.conversation(cid) == source.conversation(cid)
        assert copy.history(cid) == source.history(cid)
        assert copy.history(cid, repaired=False) == source.history(cid, repaired=False)
        assert entry_rows(copy, cid) == entry_rows(source, cid)
        assert event_rows(copy, cid) == event_rows(source, cid)
        assert copy.runs.recent(conversation_id=cid) == source.runs.recent(conversation_id=cid)


def row_counts(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            name: conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for name, table in tables.tables.items()
        }


# -- round trips ----------------------------------------------------------------------


def test_a_copy_verifies_and_holds_every_event_branch_run_and_row(
    ledger: Ledger, target: Store
) -> None:
    conv_id, fork_id = build(ledger)
    copy = target.tenant(ledger.tenant)
    report = copy.import_file(io.StringIO(export_text(ledger)))
    assert sorted(report.conversations) == sorted([conv_id, fork_id])
    assert report.already_present == []
    assert report.events == len(ledger.events())
    assert_same(ledger, copy, [conv_id, fork_id])
    conv = copy.conversation(conv_id)
    assert conv.state == {"step": 2} and conv.key is not None
    assert copy.conversation_by_key(conv.key).id == conv_id
    named = [e for e in ledger.events(conversation_id=conv_id) if e.idempotency_key == "turn-7"]
    assert copy.entry(named[0].id).message.content == "named one"
    # The copy takes writes as the source would, at its head.
    copy.append_messages(conv_id, [Message(role="user", content="after the import")])
    assert copy.verify(conv_id).ok


def test_exporting_a_fork_brings_its_source_first(source: Store, target: Store) -> None:
    ledger = source.tenant(tenant())
    conv_id, fork_id = build(ledger)
    fork_of_fork = ledger.fork(fork_id).id
    ledger.create_conversation()  # not an ancestor: left out
    text = export_text(ledger, fork_of_fork)
    order = [json.loads(x)["id"] for x in text.splitlines() if '"type":"conversation"' in x]
    assert order == [conv_id, fork_id, fork_of_fork]
    copy = target.tenant(ledger.tenant)
    assert copy.import_file(io.StringIO(text)).conversations == order
    assert_same(ledger, copy, order)


def test_a_tenant_export_puts_every_source_before_its_forks(source: Store) -> None:
    ledger = source.tenant(tenant())
    # A source whose id sorts after its fork's: the order follows lineage, not ids.
    late = "ffffffff" + str(uuid.uuid4())[8:]
    ledger.create_conversation(conversation_id=late)
    ledger.append_messages(late, [Message(role="user", content="hi")])
    fork = ledger.fork(late)
    text = export_text(ledger)
    order = [json.loads(x)["id"] for x in text.splitlines() if '"type":"conversation"' in x]
    assert order == [late, fork.id]


def test_the_file_keeps_the_stored_form_and_ends_with_its_digest(source: Store) -> None:
    ledger = source.tenant(tenant())
    conv_id, _ = build(ledger)
    progress: list[int] = []
    out = io.StringIO()
    report = ledger.export(out, conversation_id=conv_id, progress=progress.append)
    lines = out.getvalue().splitlines(keepends=True)
    header, end = json.loads(lines[0]), json.loads(lines[-1])
    assert header["format"] == "chatledger-export" and header["version"] == 1
    assert header["tenant"] == ledger.tenant
    import hashlib

    digest = hashlib.sha256("".join(lines[:-1]).encode()).hexdigest()
    assert end == {"type": "end", "lines": len(lines) - 1, "sha256": digest}
    assert (report.lines, report.sha256, report.conversations) == (len(lines), digest, 1)
    stored = {e.id: e for e in ledger.events(conversation_id=conv_id)}
    records = [json.loads(x) for x in lines[1:-1]]
    exported = [r for r in records if r["type"] == "event"]
    assert len(exported) == report.events == len(stored)
    assert progress == list(range(1, len(stored) + 1))
    for record in exported:
        event = stored[record["id"]]
        assert record["payload"] == event.payload_json
        assert record["hash"] == event.hash.hex()
        assert record["recordedAt"] == event.recorded_at.isoformat(timespec="microseconds")
    assert sum(r["callerMinted"] for r in exported) == 2
    assert all(x.isascii() for x in lines)


def test_an_empty_tenant_exports_and_imports_as_nothing(source: Store, target: Store) -> None:
    ledger = source.tenant(tenant())
    text = export_text(ledger)
    assert len(text.splitlines()) == 2
    report = target.tenant(ledger.tenant).import_file(io.StringIO(text))
    assert (report.conversations, report.already_present, report.events) == ([], [], 0)


def test_a_missing_conversation_is_not_found(source: Store) -> None:
    with pytest.raises(NotFoundError):
        export_text(source.tenant(tenant()), str(uuid.uuid4()))
    with pytest.raises(InvalidInputError):
        export_text(source.tenant(tenant()), "not-an-id")


@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_a_copy_on_the_other_backend_verifies_and_matches(
    direction: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    first, second = direction.split("-to-")
    if first == "sqlite":
        source_url = fresh_database("sqlite", request, tmp_path)
    else:
        source_url = str(request.getfixturevalue("postgres_url"))
    with (
        Store.open(source_url) as source,
        Store.open(fresh_database(second, request, tmp_path)) as target,
    ):
        ledger = source.tenant(tenant())
        conv_id, fork_id = build(ledger)
        copy = target.tenant(ledger.tenant)
        progress: list[int] = []
        report = copy.import_file(io.StringIO(export_text(ledger)), progress=progress.append)
        assert progress[-1] == report.events == len(ledger.events())
        assert_same(ledger, copy, [conv_id, fork_id])
        # And back again: the file the copy writes is the source's, but for its time.
        again = export_text(copy).splitlines()[1:-1]
        assert again == export_text(ledger).splitlines()[1:-1]


def test_the_async_face_exports_and_imports_the_same(
    source: Store, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ledger = source.tenant(tenant())
    conv_id, fork_id = build(ledger)
    url = fresh_database(backend, request, tmp_path)

    async def run() -> tuple[str, list[str]]:
        async with AsyncStore.open(str(request.getfixturevalue("database_url"))) as a:
            out = io.StringIO()
            await a.tenant(ledger.tenant).export(out)
        async with AsyncStore.open(url) as b:
            report = await b.tenant(ledger.tenant).import_file(io.StringIO(out.getvalue()))
        return out.getvalue(), report.conversations

    text, imported = asyncio.run(run())
    assert text.splitlines()[1:-1] == export_text(ledger).splitlines()[1:-1]
    assert sorted(imported) == sorted([conv_id, fork_id])
    with Store.open(url) as target:
        assert_same(ledger, target.tenant(ledger.tenant), [conv_id, fork_id])


# -- idempotence and conflicts ---------------------------------------------------------


def test_importing_again_writes_nothing_and_names_what_was_there(
    source: Store, target: Store
) -> None:
    ledger = source.tenant(tenant())
    conv_id, fork_id = build(ledger)
    text = export_text(ledger)
    copy = target.tenant(ledger.tenant)
    copy.import_file(io.StringIO(text))
    before = row_counts(target)
    again = copy.import_file(io.StringIO(text))
    assert (again.conversations, again.events) == ([], 0)
    assert sorted(again.already_present) == sorted([conv_id, fork_id])
    assert row_counts(target) == before
    # A file holding one new conversation beside those imports only that one.
    new = ledger.create_conversation().id
    third = copy.import_file(io.StringIO(export_text(ledger)))
    assert third.conversations == [new] and len(third.already_present) == 2


def test_a_conversation_the_target_holds_otherwise_is_refused_at_its_line(
    source: Store, target: Store
) -> None:
    ledger = source.tenant(tenant())
    conv_id, _ = build(ledger)
    copy = target.tenant(ledger.tenant)
    copy.import_file(io.StringIO(export_text(ledger, conv_id)))
    ledger.append_messages(conv_id, [Message(role="user", content="later")])
    text = export_text(ledger)
    line = next(
        i
        for i, x in enumerate(text.splitlines(), 1)
        if '"type":"conversation"' in x and f'"id":"{conv_id}"' in x
    )
    before = row_counts(target)
    with pytest.raises(ImportFileError) as refused:
        copy.import_file(io.StringIO(text))
    assert refused.value.line == line
    assert f"Line {line} " in str(refused.value) and conv_id in str(refused.value)
    assert row_counts(target) == before


def test_a_file_of_another_tenant_is_refused_at_line_1(source: Store, target: Store) -> None:
    ledger = source.tenant(tenant())
    build(ledger)
    before = row_counts(target)
    with pytest.raises(ImportFileError) as refused:
        target.tenant("someone-else").import_file(io.StringIO(export_text(ledger)))
    assert refused.value.line == 1 and ledger.tenant in str(refused.value)
    assert row_counts(target) == before


def test_a_conversation_id_another_tenant_holds_is_refused(source: Store, target: Store) -> None:
    ledger = source.tenant(tenant())
    conv = ledger.create_conversation()
    target.tenant("other").create_conversation(conversation_id=conv.id)
    with pytest.raises(ImportFileError) as refused:
        target.tenant(ledger.tenant).import_file(io.StringIO(export_text(ledger)))
    assert refused.value.line == 2


# -- sealed content -------------------------------------------------------------------


def test_sealed_content_travels_sealed_and_reads_back_with_the_same_key(
    database_url: str, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kek = os.urandom(32)
    with (
        Store.open(database_url, kek=kek) as source,
        Store.open(fresh_database(backend, request, tmp_path), kek=kek) as target,
    ):
        ledger = source.tenant(tenant())
        kept = ledger.create_conversation(metadata={"secret": "meta"})
        ledger.append_messages(kept.id, [Message(role="user", content="a secret kept")])
        gone = ledger.create_conversation(subject="alice")
        ledger.append_messages(gone.id, [Message(role="user", content="a secret erased")])
        fork = ledger.fork(kept.id)
        ledger.erase("alice", reason="asked to be forgotten")
        text = export_text(ledger)
        assert "secret" not in text  # ciphertext only, metadata too
        assert '{\\"sealed\\":{' in text
        copy = target.tenant(ledger.tenant)
        copy.import_file(io.StringIO(text))
        assert all(v.ok for v in copy.verify_all())
        assert_same(ledger, copy, [kept.id, gone.id, fork.id])
        assert [m.content for m in copy.history(kept.id)] == ["a secret kept"]
        assert copy.conversation(kept.id).metadata == {"secret": "meta"}
        assert [m.content for m in copy.history(gone.id)] == ["[erased]"]
        assert copy.conversation(gone.id).erased_at is not None
    # Without the key-encryption key, the copy holds only what it was sent: ciphertext.
    with (
        Store.open(target.engine.url.render_as_string(False)) as keyless,
        pytest.raises(EncryptionError, match="key-encryption key"),
    ):
        keyless.tenant(ledger.tenant).history(kept.id)


# -- bad files ------------------------------------------------------------------------


@pytest.fixture
def good(source: Store) -> tuple[Ledger, list[str]]:
    """A tenant with a conversation and a fork, and its export as lines (newlines kept)."""
    ledger = source.tenant(tenant())
    build(ledger)
    return ledger, export_text(ledger).splitlines(keepends=True)


def event_lines(lines: list[str]) -> list[int]:
    """The indexes of the event records whose payload is a message."""
    return [i for i, x in enumerate(lines) if '"kind":"message.recorded"' in x]


def refused_at(target: Store, ledger: Ledger, lines: list[str]) -> ImportFileError:
    """Import `lines`; assert it is refused and the target unchanged; return the error."""
    before = row_counts(target)
    with pytest.raises(ImportFileError) as refused:
        target.tenant(ledger.tenant).import_file(io.StringIO("".join(lines)))
    assert row_counts(target) == before
    assert str(refused.value).startswith(f"Line {refused.value.line} of the import file: ")
    assert str(refused.value).endswith("Nothing was imported.")
    return refused.value


def test_a_truncated_file_is_refused_after_its_last_line(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    kept = lines[:-3]
    error = refused_at(target, ledger, kept)
    assert error.line == len(kept) + 1 and "cut short" in str(error)
    # Cut mid-line: that line is no JSON.
    error = refused_at(target, ledger, [*lines[:5], lines[5][:40]])
    assert error.line == 6


def test_an_edited_payload_is_refused_at_its_line(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    i = event_lines(lines)[2]
    record = json.loads(lines[i])
    message = json.loads(record["payload"])
    message["content"] = message["content"] + "!"
    record["payload"] = json.dumps(message, separators=(",", ":"))
    edited = [*lines[:i], json.dumps(record, separators=(",", ":")) + "\n", *lines[i + 1 :]]
    error = refused_at(target, ledger, edited)
    assert error.line == i + 1 and "does not match its hash" in str(error)


def test_swapped_event_lines_are_refused_at_the_first(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    i = event_lines(lines)[1]
    swapped = [*lines[:i], lines[i + 1], lines[i], *lines[i + 2 :]]
    error = refused_at(target, ledger, swapped)
    assert error.line == i + 1 and "out of order" in str(error)


def test_another_version_is_refused_at_line_1(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    header = json.loads(lines[0])
    error = refused_at(target, ledger, [json.dumps({**header, "version": 2}) + "\n", *lines[1:]])
    assert error.line == 1 and "version 2" in str(error)
    error = refused_at(target, ledger, ['{"hello":"world"}\n', *lines[1:]])
    assert error.line == 1
    assert refused_at(target, ledger, []).line == 1


def test_a_wrong_end_record_is_refused_at_its_line(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    end = json.loads(lines[-1])
    for wrong in ({**end, "sha256": "0" * 64}, {**end, "lines": end["lines"] + 1}):
        error = refused_at(target, ledger, [*lines[:-1], json.dumps(wrong) + "\n"])
        assert error.line == len(lines)
    # A line after it.
    error = refused_at(target, ledger, [*lines, lines[1]])
    assert error.line == len(lines) + 1


def test_invalid_json_is_refused_at_its_line(good: tuple[Ledger, list[str]], target: Store) -> None:
    ledger, lines = good
    i = event_lines(lines)[0]
    error = refused_at(target, ledger, [*lines[:i], lines[i][:-5] + "\n", *lines[i + 1 :]])
    assert error.line == i + 1 and "not valid JSON" in str(error)


def test_records_out_of_place_or_malformed_are_refused_at_their_line(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    branch = next(i for i, x in enumerate(lines) if '"type":"branch"' in x)
    # A branch before any conversation record.
    assert refused_at(target, ledger, [lines[0], lines[branch], *lines[1:]]).line == 2
    # A field of the wrong type.
    record = json.loads(lines[branch])
    bad = json.dumps({**record, "parentPosition": "one"}) + "\n"
    error = refused_at(target, ledger, [*lines[:branch], bad, *lines[branch + 1 :]])
    assert error.line == branch + 1 and "parentPosition" in str(error)
    # An event of a conversation in another's section.
    i = event_lines(lines)[0]
    record = json.loads(lines[i])
    bad = json.dumps({**record, "conversationId": str(uuid.uuid4())}) + "\n"
    assert refused_at(target, ledger, [*lines[:i], bad, *lines[i + 1 :]]).line == i + 1
    # A value no column holds.
    bad = json.dumps({**record, "origin": "elsewhere"}) + "\n"
    error = refused_at(target, ledger, [*lines[:i], bad, *lines[i + 1 :]])
    assert error.line == i + 1 and "'origin'" in str(error)
    # An event dropped from the middle of a branch.
    assert refused_at(target, ledger, [*lines[:i], *lines[i + 1 :]]).line == i + 1


def test_a_fork_without_its_source_is_refused(
    good: tuple[Ledger, list[str]], target: Store
) -> None:
    ledger, lines = good
    starts = [i for i, x in enumerate(lines) if '"type":"conversation"' in x]
    fork_only = [lines[0], *lines[starts[1] :]]
    assert refused_at(target, ledger, fork_only).line == 2


def test_a_position_type_stays_what_the_api_takes(source: Store, target: Store) -> None:
    """Histories at an explicit position read the same on the copy (views are rebuilt)."""
    ledger = source.tenant(tenant())
    conv_id, fork_id = build(ledger)
    copy = target.tenant(ledger.tenant)
    copy.import_file(io.StringIO(export_text(ledger)))
    for cid in (conv_id, fork_id):
        head = ledger.conversation(cid).head
        for at in (1, 2, Position(head.branch_id, head.position)):
            assert copy.history(cid, at=at) == ledger.history(cid, at=at)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ["payload", "metadata"])
def test_a_nan_token_is_refused_at_its_line(
    source: Store, target: Store, token: str, where: str
) -> None:
    """An append never writes one (nor `null` in its place): only an edited file holds it,
    and a reader would take it for a number or fail on it."""
    from tests.store.test_erasure import _forged_export

    ledger = source.tenant(tenant())
    conv = ledger.create_conversation({"ok": 1})
    ledger.append_messages(conv.id, [Message(role="user", content="NaN and Infinity")])
    text = export_text(ledger, conv.id)
    if where == "payload":
        forged = _forged_export(text, payload=f'{{"role":"user","content":"x","score":{token}}}')
    else:
        forged = _forged_export(text, metadata=f'{{"ok":{token}}}')
    lines = forged.splitlines(keepends=True)
    error = refused_at(target, ledger, lines)
    record = json.loads(lines[error.line - 1])
    assert record["type"] == ("event" if where == "payload" else "conversation")
    assert "NaN or Infinity" in str(error)
    # The same file with the words in a text, not as tokens, imports.
    target.tenant(ledger.tenant).import_file(io.StringIO(text))
