"""Where a ten-message SQLite append spends its time, against the raw driver.

    python bench/bench_sqlite_floor.py [--calls 3000] [--batch 1]

`bench_store.py` finds chatledger's batched append (ten ~1 KB messages per
call) on SQLite well under its 0.6x target. This script measures how low
that figure can go for chatledger's schema at all, on this machine, by
running side by side, one call each in turn, each on its own database file
in WAL mode with synchronous=FULL (`--batch 1`: the one-message chat-loop
append instead):

- raw: sqlite3 `executemany` into one table and one index (bench_store's raw
  side);
- statements only: chatledger's own fast-path statements (head read, event
  insert, view insert, head move) on chatledger's schema, issued straight
  through sqlite3 with the payloads serialized once and random bytes for hashes:
  what any implementation of this schema pays before doing anything else;
- the same without the audit index, and without the audit index and the head
  view: what dropping them would buy;
- least work: the statements plus what no implementation can skip (serialize
  the ten messages, mint ten ids, hash ten chain links), as plain code;
- chatledger: `Ledger.append_messages`.

It also counts the WAL frames (pages) each commit writes, by B-tree, for the
raw side and for chatledger: with synchronous=FULL a commit waits for those
pages to reach the disk. Results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, write_section
from bench.bench_store import MESSAGES, Cycle, Ours, RawSqlite
from chatledger.store._sql import append as _append
from chatledger.store._sql import chain as _chain
from chatledger.store._sql.dialect import sqlite_clock, sqlite_time
from chatledger.store.ids import new_id
from chatledger.store.messages import dump_message

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
BATCH = 10
"""Messages per append: 10, or 1 with `--batch 1`."""


def chatledger_file(path: str) -> tuple[sqlite3.Connection, str]:
    """A migrated chatledger database with one conversation, opened with plain sqlite3."""
    ours = Ours(f"sqlite:///{path}")
    conversation = ours.ledger.create_conversation().id
    ours.store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn, conversation


def by_hand(conn: sqlite3.Connection, conversation: str, least_work: bool) -> Callable[[], None]:
    """One ten-message append of chatledger's fast path, written directly on sqlite3.

    With `least_work`, the messages are serialized and the chain hashed on
    every call; without, payloads are serialized once and hashes are random.
    """
    cycle = Cycle()
    insert = _append._sqlite_values(_append._SQLITE_INSERT, _append._SQLITE_ROW, BATCH)
    view_insert = _append._sqlite_values(_append._SQLITE_VIEW, "(?, ?, ?)", BATCH)
    texts = [dump_message(m) for m in MESSAGES]
    view = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'chatledger_view_entries'"
    ).fetchone()[0]

    def append() -> None:
        picked = cycle.next(BATCH)
        payloads = [dump_message(MESSAGES[i]) if least_work else texts[i] for i in picked]
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        cur.execute(_append._SQLITE_HEAD, (conversation, "bench"))
        branch, start, _, previous = cur.fetchone()
        recorded_at = sqlite_time(sqlite_clock())
        params: list[object] = []
        for i, text in enumerate(payloads, 1):
            fields = (new_id(), conversation, branch, start + i, None)
            fields += ("message.recorded", "client", i == BATCH)
            if least_work:
                header = _chain.header(*fields, None)
                previous = sha256(previous + header + text.encode()).digest()
            else:
                previous = os.urandom(32)
            params += (*fields, recorded_at, None, text, previous)
        cur.execute(insert, params)
        first = cur.lastrowid - BATCH + 1  # type: ignore[operator]
        if view:
            rows = [v for i in range(BATCH) for v in (conversation, start + i + 1, first + i)]
            cur.execute(view_insert, rows)
        cur.execute(_append._SQLITE_MOVE, (start + BATCH, previous, conversation))
        cur.execute("COMMIT")
        cur.close()

    return append


def wal_frames(
    path: str, conn: sqlite3.Connection, append: Callable[[], None], commits: int
) -> dict[str, float]:
    """WAL frames per commit of `append`, by B-tree, with checkpoints held off."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for _ in range(commits):
        append()
    with open(path + "-wal", "rb") as wal:
        data = wal.read()
    conn.execute("PRAGMA wal_autocheckpoint=1000")
    page_size = struct.unpack(">I", data[8:12])[0]
    pages = [
        struct.unpack(">I", data[offset : offset + 4])[0]
        for offset in range(32, len(data) - 24 - page_size + 1, 24 + page_size)
    ]
    owner = dict(
        conn.execute(
            "SELECT pageno, name || CASE pagetype WHEN 'internal' THEN ' (interior)' "
            "WHEN 'overflow' THEN ' (overflow)' ELSE '' END FROM dbstat"
        )
    )
    counts = collections.Counter(
        "sqlite_schema (database header)" if p == 1 else owner.get(p, "free") for p in pages
    )
    return {name: n / commits for name, n in counts.most_common()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per contender")
    parser.add_argument("--batch", type=int, choices=(1, 10), default=10, help="messages per append")
    args = parser.parse_args()
    global BATCH
    BATCH = args.batch
    details = machine()
    with tempfile.TemporaryDirectory() as tmp:
        raw = RawSqlite(os.path.join(tmp, "raw.db"))
        raw_conversation = str(uuid.uuid4())
        raw_append = raw.append_batch if BATCH == 10 else raw.append
        contenders: dict[str, Callable[[], None]] = {
            "raw sqlite3 executemany": lambda: raw_append(raw_conversation)
        }
        files: dict[str, tuple[str, sqlite3.Connection]] = {}
        for label, name, drop, least in [
            ("statements only", "statements.db", (), False),
            ("statements only, no audit index", "no_audit.db", ("index",), False),
            (
                "statements only, no audit index, no head view",
                "no_view.db",
                ("index", "view"),
                False,
            ),
            ("least work (statements, serialize, ids, hashes)", "least.db", (), True),
        ]:
            path = os.path.join(tmp, name)
            conn, conversation = chatledger_file(path)
            if "index" in drop:
                conn.execute("DROP INDEX ix_chatledger_events_conversation")
            if "view" in drop:
                conn.execute("DROP TABLE chatledger_view_entries")
            contenders[label] = by_hand(conn, conversation, least)
            files[label] = (path, conn)
        ours_path = os.path.join(tmp, "chatledger.db")
        ours = Ours(f"sqlite:///{ours_path}")
        ours_conversation = ours.ledger.create_conversation().id
        ours_append = ours.append_batch if BATCH == 10 else ours.append
        contenders["chatledger append_messages"] = lambda: ours_append(ours_conversation)

        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(200):  # warm up: caches, WAL file at its working size
            for fn in contenders.values():
                fn()
        for _ in range(args.calls):
            for name, fn in contenders.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)

        frames = {
            "raw sqlite3 executemany": wal_frames(
                os.path.join(tmp, "raw.db"), raw.conn, contenders["raw sqlite3 executemany"], 200
            )
        }
        # chatledger's append issues exactly these statements (store/_sql/append.py).
        frames["chatledger's statements"] = wal_frames(
            *files["statements only"], contenders["statements only"], 200
        )
        ours.store.close()
        raw.conn.close()
        for _, conn in files.values():
            conn.close()

    raw_mean = statistics.mean(times["raw sqlite3 executemany"])
    lines = [
        "| contender | median µs/call | mean µs/call | calls/s | ratio to raw |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in times.items():
        mean = statistics.mean(values)
        lines.append(
            f"| {name} | {statistics.median(values) * 1e6:.0f} | {mean * 1e6:.0f} | "
            f"{1 / mean:.0f} | {raw_mean / mean:.2f}x |"
        )
    lines += ["", f"WAL frames (4 KiB pages) written per {BATCH}-message commit:", ""]
    lines += ["| B-tree | " + " | ".join(frames) + " |", "|---|" + "---:|" * len(frames)]
    names = sorted(
        {n for f in frames.values() for n in f},
        key=lambda n: -max(f.get(n, 0) for f in frames.values()),
    )
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{f.get(n, 0):.2f}" for f in frames.values()) + " |")
    lines.append(
        "| total | " + " | ".join(f"{sum(f.values()):.2f}" for f in frames.values()) + " |"
    )
    body = [
        f"`python bench/bench_sqlite_floor.py --calls {args.calls} --batch {BATCH}`: the "
        "contenders take turns, "
        "one call each, on separate files (WAL, synchronous=FULL); ratio is calls/s against raw.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
        "",
        *lines,
    ]
    text = "\n".join(body)
    print(text)
    title = "SQLite batched append" if BATCH == 10 else "SQLite one-message append"
    write_section(RESULTS, f"{title}: the floor", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
