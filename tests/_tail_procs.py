"""The processes of the tail stress test (tests/store/test_tail_stress.py).

Run as `python -m tests._tail_procs ROLE ARGS_JSON`, ROLE one of:

* `write`: one writer, until the test says stop. Each of its transactions
  appends 1-3 messages (their contents name writer, transaction and
  message: "w3 t17 m0") to one of the test's conversations. Most run in a transaction of the writer's own,
  held open for a random 0-30 ms after the append before it commits, and
  about one in eight of those raises instead, so it rolls back; the rest are
  plain `ledger.append_messages` calls (the store's own transaction, its
  fast path, and its notification). For every transaction it writes one JSON
  line: its label, `time.monotonic()` before it began and after its commit
  returned (or it rolled back), whether it committed, and the events the
  append returned (id, seq, content).

* `consume`: the tailing consumer. It reads its cursor from the sink (a
  SQLite file of its own, not the store), follows `ledger.tail(after=cursor,
  follow=True)`, and handles each page in ONE sink transaction: a row per
  event, and the page's `next_after` as the new cursor. That is the
  exactly-once pattern: a kill anywhere loses either both or neither. The
  arrivals table has no unique key on the event, so a duplicate would show.
  Before each page's transaction it appends a line to a log of pages
  (outside the transaction), so the test can tell a kill that landed while
  a page was being handled, and a "ready" line once it handles SIGTERM,
  which sets the tail's `stop`: it ends cleanly after the page at hand.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chatledger.store import Message, Store
from chatledger.store._sql.dialect import (
    WRITE,  # private: marks a transaction BEGIN IMMEDIATE on SQLite
)

# A page holds at most this many events, so a backlog takes several pages.
PAGE_LIMIT = 16
# The consumer's idle re-read: with it short, an event whose wake-up went
# astray (a coalesced or lost notification) is late by half a second at most.
IDLE_SECONDS = 0.5

SINK_SCHEMA = """
CREATE TABLE arrivals (
    n INTEGER PRIMARY KEY,  -- arrival order
    incarnation INTEGER NOT NULL,
    page INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    content TEXT
);  -- deliberately no unique key on the event: duplicates must be visible
CREATE TABLE cursor (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    after TEXT,
    incarnation INTEGER,
    page INTEGER
);
INSERT INTO cursor (id, after) VALUES (1, NULL);
"""


def create_sink(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")  # the test reads while the consumer writes
        db.executescript(SINK_SCHEMA)
    finally:
        db.close()


class _RollBack(Exception):
    """Raised inside a writer's transaction to roll it back."""


def write(
    url: str,
    tenant: str,
    conversation_ids: list[str],
    writer: int,
    least: int,
    most: int,
    seed: int,
    out: str,
    stop: str,
) -> None:
    """At least `least` transactions, then more until the file `stop` exists (`most` at most)."""
    rng = random.Random(seed)
    with Store.open(url) as store, open(out, "a", encoding="utf-8") as log:
        ledger = store.tenant(tenant)
        ledger.conversation(conversation_ids[0])  # connected before the first timing
        # BEGIN IMMEDIATE on SQLite, as the store's own writes: a deferred
        # transaction that reads first could not take the write lock later.
        writing = store.engine.execution_options(**{WRITE: True})
        for t in range(most):
            if t >= least and os.path.exists(stop):
                break
            label = f"w{writer} t{t}"
            conversation_id = rng.choice(conversation_ids)
            messages = [
                Message(role="user", content=f"{label} m{m}") for m in range(rng.randint(1, 3))
            ]
            plain = rng.random() < 0.25
            roll_back = not plain and rng.random() < 1 / 8
            hold = rng.uniform(0, 0.03)
            began = time.monotonic()
            if plain:
                appended = ledger.append_messages(conversation_id, messages)
            else:
                try:
                    with writing.begin() as conn:
                        # `Ledger._ops` is private: the test uses it to run an
                        # append inside a transaction of its own
                        # (`Store.execute(op, connection)`), so it can hold
                        # the commit back, or roll back, after the rows exist.
                        op = next(ledger._ops.append_messages(conversation_id, messages))
                        appended = store.execute(op, conn)
                        time.sleep(hold)  # a random delay between the insert and the commit
                        if roll_back:
                            raise _RollBack
                except _RollBack:
                    pass
            ended = time.monotonic()
            record = {
                "label": label,
                "conversation_id": conversation_id,
                "path": "plain" if plain else "own",
                "committed": not roll_back,
                "began": began,
                "ended": ended,
                "events": [
                    [e.id, e.seq, None if e.message is None else e.message.content]
                    for e in appended.events
                ],
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            time.sleep(rng.uniform(0, 0.4))  # the writer's think time, not synchronisation


def consume(url: str, tenant: str, sink: str, incarnation: int, pages_log: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(incarnation)
    db = sqlite3.connect(sink, isolation_level=None)
    log = os.open(pages_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    (after,) = db.execute("SELECT after FROM cursor").fetchone()
    os.write(log, f"{incarnation} ready - {time.monotonic()}\n".encode())  # SIGTERM is handled
    with Store.open(url) as store:
        ledger = store.tenant(tenant)
        pages = ledger.tail(
            after, follow=True, limit=PAGE_LIMIT, idle_seconds=IDLE_SECONDS, stop=stop
        )
        for number, page in enumerate(pages):
            os.write(log, f"{incarnation} {number} {len(page.items)} {time.monotonic()}\n".encode())
            rows = [
                (
                    incarnation,
                    number,
                    e.seq,
                    e.id,
                    e.conversation_id,
                    e.kind,
                    None if e.message is None else e.message.content,
                )
                for e in page.items
            ]
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT INTO arrivals (incarnation, page, seq, event_id, conversation_id, kind,"
                " content) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            # Handling a page takes a moment: a kill can land inside it.
            time.sleep(rng.uniform(0.005, 0.03))
            db.execute(
                "UPDATE cursor SET after = ?, incarnation = ?, page = ?",
                (page.next_after, incarnation, number),
            )
            db.execute("COMMIT")
    os.close(log)
    db.close()


def main(argv: list[str]) -> None:
    role, args = argv[1], json.loads(argv[2])
    roles: dict[str, Any] = {"write": write, "consume": consume}
    roles[role](**args)


if __name__ == "__main__":
    main(sys.argv)
