"""Eight writers race to append to one branch with expected positions.

SQLite writers are threads (one writer at a time is SQLite's model); Postgres
writers are processes. Each makes CHATLEDGER_CONCURRENCY_ATTEMPTS appends (150
by default), all starting together from a barrier, whatever the machine's speed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from chatledger.store import Ledger, Store
from tests._writers import process_writer, ready, write

WRITERS = 8
ATTEMPTS = int(os.environ.get("CHATLEDGER_CONCURRENCY_ATTEMPTS", "150"))


def test_racing_writers_keep_positions_dense_and_lose_nothing(
    backend: str, database_url: str, store: Store, ledger: Ledger
) -> None:
    conv = ledger.create_conversation()
    results: list[dict[str, Any]]
    if backend == "sqlite":
        start = threading.Barrier(WRITERS)
        with ThreadPoolExecutor(WRITERS) as pool:
            futures = [
                pool.submit(write, ledger, conv.id, w, ATTEMPTS, start) for w in range(WRITERS)
            ]
            results = [f.result() for f in futures]
    else:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(WRITERS)
        with ProcessPoolExecutor(
            WRITERS, mp_context=context, initializer=ready, initargs=(barrier,)
        ) as pool:
            futures = [
                pool.submit(
                    process_writer,
                    database_url,
                    ledger.tenant,
                    conv.id,
                    w,
                    ATTEMPTS,
                    store.fast_paths,
                )
                for w in range(WRITERS)
            ]
            results = [f.result() for f in futures]

    assert [e for r in results for e in r["errors"]] == []
    acked = sorted(a for r in results for a in r["acked"])
    events = ledger.events(conversation_id=conv.id)
    positions = [e.position for e in events]
    assert positions == list(range(1, len(events) + 1)), "positions are dense, no duplicates"
    recorded = {e.position: e.message.content for e in events if e.message is not None}
    assert recorded == dict(acked), "every acknowledged append is present, nothing else"
    attempts = sum(r["attempts"] for r in results)
    conflicts = sum(r["conflicts"] for r in results)
    assert attempts == len(acked) + conflicts, "every loser got the conflict error"
    assert sum(r["retries_ok"] for r in results) == len(acked)
    assert len(acked) > WRITERS
    assert conflicts > 0, "the writers raced"
    assert [m.content for m in ledger.history(conv.id)] == [text for _, text in acked]
