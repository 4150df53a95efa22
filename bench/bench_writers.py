"""Concurrent writer processes on Postgres: chatledger against raw psycopg.

Used by bench/bench_store.py (the "concurrent writers" rows); runs on its own too:

    python bench/bench_writers.py [--quick]

Each writer is a process (multiprocessing, spawn) that appends one-message
turns to conversations of its own, creating a new conversation every 20
messages. The raw writers do the same rows with psycopg: a conversation row
folded into the transaction of its first message, then one INSERT+COMMIT per
message. All writers start at one barrier and stop after a fixed duration;
the figure is messages per second over all writers, with the CPU time per
message of the clients (getrusage in each writer) and of the Postgres
backends serving them (/proc/<pid>/stat).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client_cpu,
    cpu_spent,
    libpq,
    postgres_database,
    server_cpu,
    with_application_name,
)

PER_CONVERSATION = 20


def _writer(
    kind: str,
    url: str,
    app: str,
    index: int,
    seconds: float,
    start: Any,
    done: Any,
    leave: Any,
    results: Any,
) -> None:
    # Imported here: bench_store imports this module.
    from bench.bench_store import MESSAGES, PAYLOADS

    if kind == "raw":
        conn = psycopg.connect(libpq(url), application_name=app)
        conv = ""

        def turn(k: int) -> None:
            nonlocal conv
            if k % PER_CONVERSATION == 0:
                conv = str(uuid.uuid4())
                conn.execute(
                    "INSERT INTO raw_conversations (id, tenant) VALUES (%s, %s)",
                    (conv, f"w{index}"),
                )
            conn.execute(
                "INSERT INTO raw_messages (conversation_id, payload) VALUES (%s, %s)",
                (conv, Jsonb(PAYLOADS[k % 4])),
            )
            conn.commit()

        close = conn.close
    else:
        from chatledger.store import Store, new_id

        store = Store.open(with_application_name(url, app), message_cache=0)
        ledger = store.tenant(f"writer-{index}")
        our_conv = ""

        def turn(k: int) -> None:
            nonlocal our_conv
            if k % PER_CONVERSATION == 0:  # a new conversation with its first message
                our_conv = new_id()
                ledger.append_messages(our_conv, [MESSAGES[k % 4]], create=True)
            else:
                ledger.append_messages(our_conv, [MESSAGES[k % 4]])

        close = store.close

    turn(0)  # connections open, statements prepared, before the clock starts
    start.wait()
    cpu = client_cpu()
    began = time.perf_counter()
    deadline = began + seconds
    n = 1
    while time.perf_counter() < deadline:
        turn(n)
        n += 1
    elapsed = time.perf_counter() - began
    results.put((n - 1, elapsed, client_cpu() - cpu))
    done.wait()  # the server's CPU is read while every backend is still there
    leave.wait()
    close()


def writers(url: str, kind: str, count: int, seconds: float) -> dict[str, float]:
    """`count` writers of `kind` ("raw" or "ours") for `seconds`: msg/s and CPU per message."""
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Barrier(count + 1), ctx.Barrier(count + 1)
    leave = ctx.Event()
    results = ctx.Queue()
    app = f"bench_writers_{kind}_{uuid.uuid4().hex[:6]}"
    procs = [
        ctx.Process(target=_writer, args=(kind, url, app, i, seconds, start, done, leave, results))
        for i in range(count)
    ]
    for p in procs:
        p.start()
    with psycopg.connect(libpq(url)) as admin:
        start.wait(timeout=300)
        before = server_cpu(admin, app)
        got = [results.get(timeout=seconds + 120) for _ in procs]
        done.wait(timeout=60)
        server = cpu_spent(before, server_cpu(admin, app))
    leave.set()
    for p in procs:
        p.join(timeout=60)
    messages = sum(n for n, _, _ in got)
    return {
        "rate": sum(n / elapsed for n, elapsed, _ in got),
        "client_us": sum(c for _, _, c in got) / messages * 1e6,
        "server_us": server / messages * 1e6,
    }


def compare(url: str, counts: list[int], seconds: float, rounds: int) -> dict[int, dict[str, Any]]:
    """Raw and chatledger writers, alternating who goes first; the middle round of each
    (of two, the better)."""
    out: dict[int, dict[str, Any]] = {}
    for count in counts:
        runs: dict[str, list[dict[str, float]]] = {"raw": [], "ours": []}
        for r in range(rounds):
            for kind in ("raw", "ours") if r % 2 == 0 else ("ours", "raw"):
                runs[kind].append(writers(url, kind, count, seconds))
        out[count] = {
            kind: sorted(values, key=lambda v: v["rate"])[len(values) // 2]
            for kind, values in runs.items()
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, for a smoke run")
    args = parser.parse_args()
    from bench.bench_store import Ours, RawPostgres

    with postgres_database("chatledger_writers") as url:
        RawPostgres(url).conn.close()
        Ours(url).store.close()
        seconds, rounds = (1.5, 1) if args.quick else (4.0, 2)
        for count, res in compare(url, [4, 16], seconds, rounds).items():
            raw, ours = res["raw"], res["ours"]
            print(
                f"{count} writers: raw {raw['rate']:.0f} msg/s, chatledger {ours['rate']:.0f} "
                f"msg/s, {ours['rate'] / raw['rate']:.2f}x; CPU us/msg client+server raw "
                f"{raw['client_us']:.0f}+{raw['server_us']:.0f}, chatledger "
                f"{ours['client_us']:.0f}+{ours['server_us']:.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
