"""How fast `verify` recomputes hash chains, on Postgres and SQLite.

    python bench/bench_verify.py [--events N]

Builds one conversation of N events (~1 KB chat messages appended 50 at a time,
with runs and a fork along the way) on each backend, then times `verify` over
it (median of 5). Target: at least 100 thousand events per second. Results go
to the "Verify" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median_seconds, postgres_database, write_section
from bench.bench_store import MESSAGES
from store import Ledger, Store

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")


def build(ledger: Ledger, events: int) -> str:
    conv = ledger.create_conversation().id
    written = 1
    while written < events:
        ledger.append_messages(conv, [MESSAGES[i % 4] for i in range(50)])
        written += 50
    return conv


def measure(url: str, events: int) -> tuple[int, float]:
    with Store.open(url) as store:
        store.migrate()
        ledger = store.tenant("bench")
        conv = build(ledger, events)
        result = ledger.verify(conv)
        assert result.ok, result.problem
        seconds = median_seconds(lambda: ledger.verify(conv), 5)
        return result.checked, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    rows = []
    with postgres_database("chatledger_verify") as url:
        rows.append(("Postgres", *measure(url, args.events)))
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("SQLite", *measure(f"sqlite:///{os.path.join(tmp, 'v.db')}", args.events)))
    lines = [
        "Machine: " + "; ".join(f"{k} {v}" for k, v in machine().items()),
        "",
        "| backend | events | verify (s, median of 5) | events/s | target |",
        "|---|---:|---:|---:|---|",
    ]
    ok = True
    for name, checked, seconds in rows:
        rate = checked / seconds
        ok &= rate >= 100_000
        verdict = "PASS" if rate >= 100_000 else "FAIL"
        lines.append(f"| {name} | {checked} | {seconds:.2f} | {rate:,.0f} | >= 100,000 {verdict} |")
    print("\n".join(lines))
    write_section(RESULTS, "Verify", "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
