"""How fast `verify` recomputes hash chains, on Postgres and SQLite.

    python bench/bench_verify.py [--conversations 10000] [--events-per 100] [--long 100000]

Builds, through the library, two logs on each backend from ~1 KB chat
messages: MANY conversations of EVENTS-PER events each (1 million events in
10 thousand conversations by default, the audit benchmark's shape), and one
LONG conversation (100 thousand events). Then times `verify` of the whole
store (`Store.verify`, every conversation) and of the long conversation,
median of 3, for each place hashes can be recomputed: `auto` (in SQL on
Postgres, in this process on SQLite) and, on Postgres, `client` (in this
process, independent of the server's functions). Target: at least 100
thousand events per second for the default (`auto`). Results go to the
"Verify" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median_seconds, postgres_database, write_section
from bench.bench_store import MESSAGES
from chatledger.store import Ledger, Recompute, Store

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
TARGET = 100_000


def conversation(ledger: Ledger, events: int) -> str:
    """One conversation of `events` events (its creation, then messages 100 at a time)."""
    conv = ledger.create_conversation().id
    written = 1
    while written < events:
        batch = min(100, events - written)
        ledger.append_messages(conv, [MESSAGES[i % 4] for i in range(batch)])
        written += batch
    return conv


def measure(
    url: str, conversations: int, events_per: int, long: int, modes: list[Recompute]
) -> list[tuple[str, str, int, float]]:
    rows = []
    with Store.open(url) as store:
        store.migrate()
        many = store.tenant("many")
        for _ in range(conversations):
            conversation(many, events_per)
        single = store.tenant("long")
        conv = conversation(single, long)
        for mode in modes:
            results = store.verify(recompute=mode)
            assert all(r.ok for r in results), [r.problem for r in results if not r.ok][:3]
            events = sum(r.checked for r in results)
            seconds = median_seconds(partial(store.verify, recompute=mode), 3)
            rows.append(
                (f"whole store, {conversations + 1:,} conversations", mode, events, seconds)
            )
            result = single.verify(conv, recompute=mode)
            assert result.ok, result.problem
            seconds = median_seconds(partial(single.verify, conv, recompute=mode), 3)
            rows.append(("one conversation", mode, result.checked, seconds))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--events-per", type=int, default=100)
    parser.add_argument("--long", type=int, default=100_000)
    args = parser.parse_args()
    shape = (args.conversations, args.events_per, args.long)
    measured = []
    with postgres_database("chatledger_verify") as url:
        measured += [("Postgres", *row) for row in measure(url, *shape, ["auto", "client"])]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{os.path.join(tmp, 'v.db')}"
        measured += [("SQLite", *row) for row in measure(url, *shape, ["auto"])]
    lines = [
        "`python bench/bench_verify.py` "
        f"(--conversations {args.conversations} --events-per {args.events_per} "
        f"--long {args.long}): median of 3.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in machine().items()),
        "",
        "| backend | verify of | recompute | events | seconds | events/s | target |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    ok = True
    for backend, scope, mode, events, seconds in measured:
        rate = events / seconds
        if mode == "auto":
            passed = rate >= TARGET
            ok &= passed
            verdict = f">= {TARGET:,} " + ("PASS" if passed else "FAIL")
        else:
            verdict = "(independent check; not a target)"
        lines.append(
            f"| {backend} | {scope} | {mode} | {events:,} | {seconds:.2f} | {rate:,.0f} | {verdict} |"
        )
    print("\n".join(lines))
    write_section(RESULTS, "Verify", "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
