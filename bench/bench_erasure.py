"""Sealed against clear: what encryption costs an append and a load.

    python bench/bench_erasure.py [--rounds 7] [--appends 400]

Two stores on the same database, one opened with a key-encryption key
(`Store.open(kek=...)`: every new conversation sealed, docs/erasure.md) and
one without, take turns round by round, on SQLite (WAL, synchronous=FULL)
and Postgres, each on:

- the chat-loop append: one ~1 KB message per `append_messages`, to a
  conversation of its own side;
- the batch: ten such messages per append;
- the cold load of a 1,000-message head history as `Message` objects
  (message cache off, as a freshly started process reads);
- the warm load of the same history through a store whose message cache
  holds it (the chat loop's read: each turn replays the head it read
  before); a sealed store serves opened messages from its cache after
  checking, in the read, that their keys still exist.

Each figure is the median over the rounds of each round's median time; the
ratio is sealed over clear (the target: at most 1.15x the time); the exit
status is 1 when any ratio misses it. Results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, postgres_database, write_section
from chatledger.store import Ledger, Message, Store

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
TEXT = "The quick brown fox jumps over the lazy dog. " * 22  # ~1 KB
TARGET = 1.15
KEK = os.urandom(32)


def _messages(n: int, start: int = 0) -> list[Message]:
    return [
        Message(role="user" if (start + i) % 2 == 0 else "assistant", content=f"{start + i} {TEXT}")
        for i in range(n)
    ]


def _timed(fn: Callable[[], object], count: int) -> float:
    """The median seconds of `count` calls of `fn`."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _round(ledger: Ledger, warm: Ledger, appends: int, loaded: str) -> dict[str, float]:
    conv = ledger.create_conversation().id
    one = _messages(1)
    ten = _messages(10)
    batch_conv = ledger.create_conversation().id
    return {
        "append": _timed(lambda: ledger.append_messages(conv, one), appends),
        "batch": _timed(lambda: ledger.append_messages(batch_conv, ten), appends // 4),
        "load": _timed(lambda: ledger.history(loaded), 20),
        "warm": _timed(lambda: warm.history(loaded), 20),
    }


def measure(url: str, rounds: int, appends: int) -> dict[str, tuple[float, float]]:
    """Per measure: the (sealed, clear) medians over the rounds."""
    with Store.open(url, kek=None) as admin:
        admin.migrate()
    sealed_store = Store.open(url, kek=KEK, message_cache=0)
    clear_store = Store.open(url, kek=None, message_cache=0)
    warm_stores = [Store.open(url, kek=KEK), Store.open(url, kek=None)]  # message cache on
    try:
        sides = {"sealed": sealed_store.tenant("bench"), "clear": clear_store.tenant("bench")}
        warm = {"sealed": warm_stores[0].tenant("bench"), "clear": warm_stores[1].tenant("bench")}
        loaded = {}
        for name, ledger in sides.items():
            conv = ledger.create_conversation().id
            for i in range(0, 1000, 100):
                ledger.append_messages(conv, _messages(100, i))
            loaded[name] = conv
            _round(ledger, warm[name], 20, conv)  # warm-up (and the warm side's cache)
        results: dict[str, dict[str, list[float]]] = {"sealed": {}, "clear": {}}
        for r in range(rounds):
            order = ["sealed", "clear"] if r % 2 == 0 else ["clear", "sealed"]
            for name in order:
                for key, value in _round(sides[name], warm[name], appends, loaded[name]).items():
                    results[name].setdefault(key, []).append(value)
        return {
            key: (
                statistics.median(results["sealed"][key]),
                statistics.median(results["clear"][key]),
            )
            for key in results["sealed"]
        }
    finally:
        for opened in (sealed_store, clear_store, *warm_stores):
            opened.close()


LABELS = {
    "append": "chat-loop append, 1 message",
    "batch": "batch append, 10 messages",
    "load": "cold load of 1,000 messages",
    "warm": "warm load of the same 1,000 (message cache on)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--appends", type=int, default=400, help="appends per round and side")
    args = parser.parse_args()
    details = machine()
    lines = [
        f"`python bench/bench_erasure.py --rounds {args.rounds} --appends {args.appends}`: "
        "a store with a key-encryption key (sealed) against one without (clear), taking turns "
        "round by round; medians of the rounds' medians.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
        "",
        "| backend | measure | sealed ms | clear ms | ratio | target |",
        "|---|---|---:|---:|---:|---|",
    ]
    met = True
    with tempfile.TemporaryDirectory() as tmp, postgres_database("bench_erasure") as pg:
        for name, url in (("SQLite", f"sqlite:///{os.path.join(tmp, 'e.db')}"), ("Postgres", pg)):
            for key, (sealed, clear) in measure(url, args.rounds, args.appends).items():
                ratio = sealed / clear
                met = met and ratio <= TARGET
                verdict = "PASS" if ratio <= TARGET else "FAIL"
                lines.append(
                    f"| {name} | {LABELS[key]} | {sealed * 1e3:.3f} | {clear * 1e3:.3f} | "
                    f"{ratio:.3f}x | <= {TARGET}x {verdict} |"
                )
    body = "\n".join(lines)
    print(body)
    write_section(RESULTS, "Encryption: sealed against clear", body)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
