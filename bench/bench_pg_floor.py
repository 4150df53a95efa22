"""Where a Postgres append spends its time, against the raw driver.

    python bench/bench_pg_floor.py [--calls 3000] [--batch 1]

`bench_store.py` finds chatledger's Postgres chat loop (one ~1 KB message per
append) under its 0.8x target. This script measures how high that figure can
go for chatledger's schema at all, on this machine, by running side by side,
one call each in turn, each on a connection of its own to the same database:

- raw: psycopg INSERT + COMMIT of the message into one table with one index
  (bench_store's raw side; `--batch 10`: ten rows by `executemany`);
- full statement: chatledger's append when the store does not know the head
  (store/_sql/append.py, the `read` form: the head read and checked, then the
  writer's one statement, which moves the head only if it is still there and
  inserts the events, hashed in the client, and their view rows), issued
  straight through psycopg in autocommit mode with the payloads serialized
  once: what an append pays for the first append to a conversation, or one
  after another writer's;
- statement at the known head: the same writer at the head the store's last
  append left (the `kept` form, ADR 0029: no read), the payloads serialized
  once: what the chat loop pays before doing anything else;
- least work: that statement plus what no implementation can skip on the
  client (build each message's event and serialize it), as plain code;
- chatledger: `Ledger.append_messages`.

Per contender: wall time per call, and CPU per call of this process (the
thread's CPU time around each call) and of the Postgres backend serving it
(/proc/<backend pid>/stat, over the timed calls), and the WAL bytes a call
writes (each contender alone for 200 calls). With
`synchronous_commit=on` every contender waits for its commit's WAL flush;
what is left between them is CPU. Results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    cpu_spent,
    libpq,
    machine,
    postgres_database,
    server_cpu,
    with_application_name,
    write_section,
)
from bench.bench_store import MESSAGES, RAW_APP, Cycle, RawPostgres
from chatledger.store import Store
from chatledger.store._cache import HeadCache
from chatledger.store._sql import append as _append
from chatledger.store._sql import log as _log
from chatledger.store._values import NewEvent

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
TENANT = "bench"


def statement(
    url: str, conversation: str, batch: int, *, at_head: bool, least_work: bool, app: str
) -> Callable[[], None]:
    """One append of chatledger's fast path, written directly on psycopg.

    With `at_head`, at the head the last call left (ADR 0029), else with the
    full statement. With `least_work`, each message's event is built and
    serialized on every call; without, the payloads are serialized once.
    """
    cycle = Cycle()
    ready = [_log.encode_events([NewEvent.of_message(m, origin="client")])[0] for m in MESSAGES]
    conn = psycopg.connect(libpq(url), autocommit=True, application_name=app)
    heads = HeadCache() if at_head else None

    def append() -> None:
        picked = cycle.next(batch)
        if least_work:
            encoded = _log.encode_events(
                [NewEvent.of_message(MESSAGES[i], origin="client") for i in picked]
            )
        else:
            encoded = [ready[i] for i in picked]
        with conn.cursor() as cur:
            turn = _append.Turn(TENANT, conversation, encoded)
            done = _append.in_place(cur, _append.POSTGRES, turn, heads=heads)
        assert done is not None, "the append statement wrote nothing"

    return append


def wal_bytes(admin: psycopg.Connection[Any], fn: Callable[[], Any], calls: int) -> float:
    """WAL bytes per call of `fn`, run alone `calls` times (what its commits flush)."""
    lsn = "SELECT pg_current_wal_insert_lsn()"
    start = admin.execute(lsn).fetchone()[0]  # type: ignore[index]
    admin.commit()
    for _ in range(calls):
        fn()
    row = admin.execute(f"SELECT pg_wal_lsn_diff(({lsn}), %s)", (start,)).fetchone()
    admin.commit()
    return float(row[0]) / calls  # type: ignore[index]


FULL = "full statement"
AT_HEAD = "statement at the known head"
LEAST = "least work (statement at the head, events, serialize)"
OURS = "chatledger append_messages"
APPS = {
    "raw psycopg INSERT + COMMIT": RAW_APP,
    FULL: "chatledger_floor_full",
    AT_HEAD: "chatledger_floor_at_head",
    LEAST: "chatledger_floor_least",
    OURS: "chatledger_floor_ours",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per contender")
    parser.add_argument("--batch", type=int, choices=(1, 10), default=1, help="messages per append")
    parser.add_argument(
        "--partitions", type=int, default=0, help="hash-partition chatledger's log (ADR 0022)"
    )
    args = parser.parse_args()
    batch = args.batch
    details = machine()
    names = list(APPS)
    with postgres_database("bench_pg_floor") as url:
        raw = RawPostgres(url)
        raw_conversation = str(uuid.uuid4())
        store = Store.open(with_application_name(url, APPS[OURS]), message_cache=0)
        store.migrate(partitions=args.partitions or None)
        ledger = store.tenant(TENANT)
        conversations = [ledger.create_conversation().id for _ in range(4)]
        raw_append = raw.append if batch == 1 else raw.append_batch
        ours_cycle = Cycle()
        contenders: dict[str, Callable[[], Any]] = {names[0]: lambda: raw_append(raw_conversation)}
        for name, conversation, at_head, least in [
            (FULL, conversations[0], False, False),
            (AT_HEAD, conversations[1], True, False),
            (LEAST, conversations[2], True, True),
        ]:
            contenders[name] = statement(
                url, conversation, batch, at_head=at_head, least_work=least, app=APPS[name]
            )
        contenders[OURS] = lambda: ledger.append_messages(
            conversations[3], [MESSAGES[i] for i in ours_cycle.next(batch)]
        )
        for _ in range(200):  # warm up: plans prepared, caches filled
            for fn in contenders.values():
                fn()
        admin = psycopg.connect(libpq(url))
        before = {name: server_cpu(admin, app) for name, app in APPS.items()}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        client: dict[str, float] = dict.fromkeys(contenders, 0.0)
        for _ in range(args.calls):
            for name, fn in contenders.items():
                cpu = time.thread_time()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                client[name] += time.thread_time() - cpu
        server = {
            name: cpu_spent(before[name], server_cpu(admin, app)) for name, app in APPS.items()
        }
        wal = {name: wal_bytes(admin, fn, 200) for name, fn in contenders.items()}
        admin.close()
        store.close()
        raw.conn.close()

    raw_mean = statistics.mean(times[names[0]])
    lines = [
        "| contender | median µs/call | mean µs/call | calls/s | ratio to raw "
        "| client CPU µs/call | server CPU µs/call | WAL bytes/call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, values in times.items():
        mean = statistics.mean(values)
        lines.append(
            f"| {name} | {statistics.median(values) * 1e6:.0f} | {mean * 1e6:.0f} | "
            f"{1 / mean:.0f} | {raw_mean / mean:.2f}x | {client[name] / args.calls * 1e6:.0f} | "
            f"{server[name] / args.calls * 1e6:.0f} | {wal[name]:,.0f} |"
        )
    body = [
        f"`python bench/bench_pg_floor.py --calls {args.calls} --batch {batch}"
        + (f" --partitions {args.partitions}" if args.partitions else "")
        + "`: the "
        "contenders take turns, one call each, each on its own connection to one database; "
        "ratio is calls/s against raw.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
        "",
        *lines,
    ]
    text = "\n".join(body)
    print(text)
    title = "Postgres one-message append" if batch == 1 else "Postgres batched append"
    if args.partitions:
        title += f", {args.partitions} partitions"
    write_section(RESULTS, f"{title}: the floor", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
