"""Erasure, proven from outside the store: the raw database files, a kill -9, the CLI,
and an upgrade.

- After an erasure, `VACUUM` and a checkpoint, no byte of the subject's
  content, and not its wrapped data key, is anywhere in the database's files
  (SQLite: the file and its WAL; Postgres: every file of the database and
  the WAL, read with `pg_read_binary_file`). A conversation in the clear,
  written beside it, is found by the same scan: the scan can see.
- The same holds after an `ANALYZE` (which autovacuum runs by itself) and
  docs/erasure.md's clean-up: no statistics keep a sample of the wrapped keys.
- A process killed with SIGKILL inside the erasure's transaction leaves the
  store as it was: it verifies, reads, and the erasure runs again to the end.
"""

from __future__ import annotations

import io
import json
import sqlite3
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.engine._cli import main
from chatledger.store import EncryptionError, ErasedError, Message, Store
from chatledger.store._crypto import ERASED_CONTENT
from chatledger.store._sql import migrate as _migrate
from tests.conftest import (
    _libpq,
    create_postgres_database,
    drop_postgres_database,
    kill_when_paused,
)
from tests.store.test_upgrade import written_at_0002  # noqa: F401 (a fixture)

KEK = bytes(range(32, 64))
ROOT = Path(__file__).resolve().parents[2]


def _write(ledger_store: Store, tenant: str, marker: str, subject: str) -> str:
    ledger = ledger_store.tenant(tenant)
    conv = ledger.create_conversation({"note": f"meta {marker}"}, subject=subject)
    for i in range(3):
        ledger.append_messages(
            conv.id,
            [
                Message(role="user", content=f"question {i} {marker}"),
                Message(role="assistant", content=f"answer {i} {marker}"),
            ],
        )
    return conv.id


def _wrapped_key(store: Store, tenant: str, subject: str) -> bytes:
    with store.engine.connect() as conn:
        return bytes(
            conn.execute(
                sa.text(
                    "SELECT wrapped FROM chatledger_subject_keys WHERE tenant = :t AND subject = :s"
                ),
                {"t": tenant, "s": subject},
            ).scalar_one()
        )


def _sqlite_files(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def _postgres_files(url: str) -> tuple[bytes, bytes]:
    """The bytes of every file of the database, and of the WAL."""
    name = sa.make_url(url).database
    chunks = []
    wal = []
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert oid is not None
        base = f"base/{oid[0]}"
        for (entry,) in conn.execute("SELECT pg_ls_dir(%s)", (base,)).fetchall():
            path = f"{base}/{entry}"
            if conn.execute("SELECT (pg_stat_file(%s)).isdir", (path,)).fetchone()[0]:
                continue
            chunks.append(conn.execute("SELECT pg_read_binary_file(%s)", (path,)).fetchone()[0])
        # The server's other databases keep writing while this reads: a checkpoint
        # may recycle a segment between the listing and its read, renaming it to a
        # future segment with its old bytes still in it. A vanished name reads as
        # NULL (`missing_ok`), and the directory is listed again until it shows no
        # name not yet read, so a recycled segment is read under its new name.
        (segment,) = conn.execute(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'"
        ).fetchone()
        read: set[str] = set()
        while True:
            names = {
                name
                for (name,) in conn.execute(
                    "SELECT name FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'"
                ).fetchall()
            } - read
            if not names:
                break
            for name in sorted(names):
                (content,) = conn.execute(
                    "SELECT pg_read_binary_file(%s, 0, %s, true)", (f"pg_wal/{name}", segment)
                ).fetchone()
                if content is not None:
                    wal.append(content)
            read |= names
    return b"".join(bytes(c) for c in chunks), b"".join(bytes(c) for c in wal)


def test_no_plaintext_and_no_wrapped_key_remain_in_the_files_after_erasure(
    backend: str, own_database: str
) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    control = f"CONTROL-{uuid.uuid4().hex}"
    with Store.open(own_database, kek=None) as bare:
        plain = bare.tenant("acme").create_conversation()
        bare.tenant("acme").append_messages(plain.id, [Message(role="user", content=control)])
    with Store.open(own_database, kek=KEK) as store:
        erased = _write(store, "acme", secret, subject="person-7")
        kept = _write(store, "acme", f"kept-{uuid.uuid4().hex}", subject="person-8")
        wrapped = _wrapped_key(store, "acme", "person-7")
        store.tenant("acme").erase("person-7", reason="test")
        assert [m.content for m in store.tenant("acme").history(erased)] == [ERASED_CONTENT] * 6
        assert len(store.tenant("acme").history(kept)) == 6
    if backend == "sqlite":
        path = Path(sa.make_url(own_database).database or "")
        with sqlite3.connect(path) as conn:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        files = log = _sqlite_files(path)
    else:
        with psycopg.connect(_libpq(own_database), autocommit=True) as conn:
            conn.execute("VACUUM")
            # The keys table is tiny: VACUUM FULL rewrites it, leaving no dead row behind.
            _vacuum_full(conn, "chatledger_subject_keys")
        files, log = _postgres_files(own_database)
    assert control.encode() in files  # the scan sees what is stored in the clear
    assert secret.encode() not in files and secret.encode() not in log
    # The wrapped key is gone from the tables. Postgres's WAL keeps the record of
    # its insert until the segment is recycled (docs/erasure.md): wrapped, it is
    # of no use without the key-encryption key.
    assert wrapped not in files
    with Store.open(own_database, kek=KEK) as store:
        assert store.tenant("acme").verify(erased).ok


def _analyze(backend: str, url: str) -> None:
    if backend == "sqlite":
        with sqlite3.connect(sa.make_url(url).database or "") as conn:
            conn.execute("ANALYZE")
    else:
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            conn.execute("ANALYZE")


# True while a transaction that began before `mark` (an xid taken after a delete
# committed) still runs anywhere in the cluster, or a session of this database
# holds a snapshot from before it: a rewrite then keeps the deleted rows.
_OLDER_STILL_OPEN = """
SELECT pg_snapshot_xmin(pg_current_snapshot()) <= %(mark)s
    OR EXISTS (SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND age(backend_xmin) >= age(xid(%(mark)s::xid8)))
"""


def _vacuum_full(conn: psycopg.Connection[Any], table: str) -> None:
    """`VACUUM FULL table` once every transaction older than this call has ended.

    A rewrite keeps a deleted row that a snapshot taken before the delete may
    still see: its own snapshot's too, which another database's long
    transaction holds back (docs/erasure.md says to wait for them)."""
    mark = conn.execute("SELECT pg_current_xact_id()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + 120
    while conn.execute(_OLDER_STILL_OPEN, {"mark": mark}).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, "a transaction older than the delete kept running"
        time.sleep(0.02)
    conn.execute(f"VACUUM FULL {table}")
    conn.execute("CHECKPOINT")


def _clean_up(backend: str, url: str) -> bytes:
    """docs/erasure.md's clean-up after an erasure; the bytes of the database's files."""
    if backend == "sqlite":
        path = Path(sa.make_url(url).database or "")
        with sqlite3.connect(path) as conn:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return _sqlite_files(path)
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        _vacuum_full(conn, "chatledger_subject_keys")
    return _postgres_files(url)[0]


def test_no_wrapped_key_remains_in_the_files_after_analyze_erasure_and_the_clean_up(
    backend: str, own_database: str
) -> None:
    # Enough subjects for the statistics to hold a histogram of a column's values.
    subjects = [f"person-{i}" for i in range(12)]
    with Store.open(own_database, kek=KEK) as store:
        for subject in subjects:
            _write(store, "acme", subject, subject=subject)
        wrapped = {s: _wrapped_key(store, "acme", s) for s in subjects}
        _analyze(backend, own_database)
        for subject in subjects[1:]:
            store.tenant("acme").erase(subject, reason="test")
    files = _clean_up(backend, own_database)
    assert wrapped[subjects[0]] in files  # the scan sees a key that still exists
    assert [s for s in subjects[1:] if wrapped[s] in files] == []


def test_an_upgrade_drops_the_keys_statistics_taken_before_it() -> None:
    # A database analyzed at 0007 holds a sample of the wrapped keys: 0008 deletes
    # it, and docs/erasure.md's one-off `VACUUM FULL pg_statistic` its bytes.
    url = create_postgres_database("chatledger_own")
    sampled = (
        "SELECT count(*) FROM pg_stats "
        "WHERE tablename = 'chatledger_subject_keys' AND attname = 'wrapped'"
    )
    statistics = (
        "SELECT pg_relation_filepath(oid), pg_relation_filepath(reltoastrelid) "
        "FROM pg_class WHERE relname = 'pg_statistic'"
    )
    try:
        with Store.open(url, kek=KEK) as store:
            store.migrate()
            subjects = [f"person-{i}" for i in range(12)]
            for subject in subjects:
                _write(store, "acme", subject, subject=subject)
            wrapped = [_wrapped_key(store, "acme", s) for s in subjects]
            with store.engine.begin() as conn:  # keys written as they were at 0007
                _migrate.downgrade(conn, "0007")
            _analyze("postgres", url)
            with psycopg.connect(_libpq(url), autocommit=True) as conn:
                assert conn.execute(sampled).fetchone() == (1,)
            store.migrate()
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            assert conn.execute(sampled).fetchone() == (0,)
            _vacuum_full(conn, "pg_statistic")
            paths = conn.execute(statistics).fetchone()
            assert paths is not None
            files = b"".join(
                bytes(conn.execute("SELECT pg_read_binary_file(%s)", (p,)).fetchone()[0])
                for p in paths
            )
        assert [w for w in wrapped if w in files] == []
    finally:
        drop_postgres_database(url)


def test_a_kill_inside_the_erasure_leaves_the_store_verifiable_and_the_erasure_resumable(
    backend: str, own_database: str
) -> None:
    with Store.open(own_database, kek=KEK) as store:
        ids = [_write(store, "acme", f"m{i}", subject="person-9") for i in range(3)]
        before = {cid: store.tenant("acme").history(cid) for cid in ids}
    # Killed inside the erasure's transaction, before the key is deleted.
    kill_when_paused("tests._erasure_child", own_database, "acme", "person-9", KEK.hex())
    with Store.open(own_database, kek=KEK) as store:
        ledger = store.tenant("acme")
        assert all(v.ok for v in ledger.verify_all())
        assert {cid: ledger.history(cid) for cid in ids} == before  # nothing of it landed
        assert all(ledger.conversation(cid).erased_at is None for cid in ids)
        erasure = ledger.erase("person-9", reason="again, to the end")
        assert sorted(erasure.conversation_ids) == sorted(ids) and not erasure.already
        assert all(v.ok for v in ledger.verify_all())
        for cid in ids:
            assert {m.content for m in ledger.history(cid)} == {ERASED_CONTENT}
            with pytest.raises(ErasedError):
                ledger.append_messages(cid, [Message(role="user", content="no")])


def test_the_cli_erases_and_then_shows_markers(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATLEDGER_KEK", KEK.hex())
    with Store.open(own_database) as store:
        conv = _write(store, "default", "visible", subject="person-3")

    def run(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out):
            status = main([*argv, "--database-url", own_database])
        return status, out.getvalue()

    status, shown = run("history", conv)
    assert status == 0 and "visible" in shown
    status, said = run("erase", "person-3", "--reason", "asked by the person", "--json")
    assert status == 0
    report = json.loads(said)
    assert report["conversationIds"] == [conv] and report["already"] is False
    status, shown = run("history", conv)
    assert status == 0 and "visible" not in shown and ERASED_CONTENT in shown
    status, said = run("erase", "person-3", "--reason", "again")
    assert status == 0 and "erased before" in said
    status, said = run("verify", "--conversation", conv)
    assert status == 0 and "intact" in said
    monkeypatch.delenv("CHATLEDGER_KEK")
    status, _ = run("history", conv)
    assert status != 0  # sealed content needs the key, erased or not


def test_an_old_database_upgrades_keeps_its_conversations_in_the_clear_and_seals_new_ones(
    written_at_0002: str,  # noqa: F811
) -> None:
    with Store.open(written_at_0002, kek=KEK) as store:
        store.migrate()
        store.check_schema()
        with store.engine.connect() as conn:
            old = conn.execute(
                sa.text("SELECT id, tenant FROM chatledger_conversations ORDER BY id LIMIT 1")
            ).one()
        ledger = store.tenant(old.tenant)
        before = ledger.history(str(old.id), repaired=False)
        ledger.append_messages(str(old.id), [Message(role="user", content="after the upgrade")])
        assert ledger.history(str(old.id), repaired=False)[:-1] == before
        assert ledger.conversation(str(old.id)).subject is None
        new = _write(store, old.tenant, "x", subject="s")
        assert ledger.conversation(new).subject == "s"
        assert all(v.ok for v in store.verify())
        # The refusal rolls the downgrade back whole: the revisions above 0007
        # it passed on the way are undone too.
        with pytest.raises(RuntimeError, match="sealed"), store.engine.begin() as conn:
            _migrate.downgrade(conn, "0006")
        ledger.erase("s", reason="so that the downgrade can go")
    with (
        Store.open(written_at_0002, kek=KEK) as store,
        pytest.raises(RuntimeError, match="sealed"),
        store.engine.begin() as conn,
    ):
        _migrate.downgrade(conn, "0006")  # erased, its events are still sealed


def test_rotating_the_key_encryption_key_rewraps_every_data_key(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = bytes(range(200, 232))
    with Store.open(own_database, kek=KEK) as store:
        kept = _write(store, "acme", "kept", subject="p1")
        gone = _write(store, "acme", "gone", subject="p2")
        store.tenant("acme").erase("p2", reason="before the rotation")
        old_wrapped = _wrapped_key(store, "acme", "p1")
    with Store.open(own_database, kek=None) as bare, pytest.raises(EncryptionError):
        bare.rotate_kek(new)  # the current key is needed
    monkeypatch.setenv("CHATLEDGER_KEK", KEK.hex())
    monkeypatch.setenv("CHATLEDGER_NEW_KEK", new.hex())
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["rotate-kek", "--database-url", own_database]) == 0
    assert "Re-wrapped 1 data key under" in out.getvalue()
    with Store.open(own_database, kek=new) as store:
        ledger = store.tenant("acme")
        assert ledger.history(kept)[0].content == "question 0 kept"
        assert ledger.history(gone)[0].content == ERASED_CONTENT
        assert _wrapped_key(store, "acme", "p1") != old_wrapped
        assert store.rotate_kek(new) == 0  # already under the new key
    with Store.open(own_database, kek=KEK) as old, pytest.raises(EncryptionError):
        old.tenant("acme").history(kept)


def test_a_store_that_rotated_seals_under_the_new_key_from_then_on(own_database: str) -> None:
    new = bytes(range(232, 256)) + bytes(8)
    with Store.open(own_database, kek=KEK) as store:
        before = _write(store, "acme", "before", subject="p1")
        ledger = store.tenant("acme")  # a handle made before the rotation
        assert store.rotate_kek(new) == 1
        after = _write(store, "acme", "after", subject="p2")
        assert ledger.history(before)[0].content == "question 0 before"
    with Store.open(own_database, kek=new) as store:
        for conversation_id, word in ((before, "before"), (after, "after")):
            assert store.tenant("acme").history(conversation_id)[0].content == f"question 0 {word}"
