"""A save through a framework adapter against `append_messages` of the same messages.

    python bench/bench_adapters.py [--turns 300]

pydantic-ai's `ConversationStore.save` through `LedgerConversationStore`
(adapters/pydantic_ai), each save adding one turn (a ~1 KB user prompt and a
~1 KB answer), against `AsyncLedger.append_messages` of the very chatledger
messages that turn becomes, on the same database, taking turns save by save.
Both run on `AsyncStore`, on SQLite (WAL, synchronous=FULL) and Postgres.
The figure is the ratio of median times (issue 18's target: at most 1.3x).
Results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from adapters.pydantic_ai import LedgerConversationStore, to_messages
from bench._common import machine, postgres_database, write_section
from store import AsyncStore

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
TEXT = "The quick brown fox jumps over the lazy dog. " * 22  # ~1 KB
TARGET = 1.3


def turn(i: int) -> list[ModelRequest | ModelResponse]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"{i}: {TEXT}")]),
        ModelResponse(parts=[TextPart(content=f"{i}: {TEXT}")]),
    ]


async def measure(url: str, turns: int) -> tuple[float, float]:
    """Median seconds of a save and of the same append, after a warm-up."""
    async with AsyncStore.open(url, message_cache=0) as store:
        await store.migrate()
        ledger = store.tenant("bench")
        conversations = LedgerConversationStore(ledger)
        conversation = Conversation(conversation_id="bench-conversation")
        await conversations.save(conversation)
        plain = (await ledger.create_conversation()).id
        saves, appends = [], []
        for i in range(turns):
            added = turn(i)
            conversation.messages.extend(added)
            start = time.perf_counter()
            await conversations.save(conversation)
            saves.append(time.perf_counter() - start)
            messages = [m for message in added for m in to_messages(message)]
            start = time.perf_counter()
            await ledger.append_messages(plain, messages)
            appends.append(time.perf_counter() - start)
        warm = turns // 10
        return statistics.median(saves[warm:]), statistics.median(appends[warm:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300, help="saves per backend")
    args = parser.parse_args()
    details = machine()
    lines = [
        "| backend | `save` median ms | `append_messages` median ms | ratio | target |",
        "|---|---:|---:|---:|---|",
    ]
    met = True
    with tempfile.TemporaryDirectory() as tmp, postgres_database("bench_adapters") as pg:
        for name, url in [
            ("SQLite", f"sqlite:///{os.path.join(tmp, 'adapters.db')}"),
            ("Postgres", pg),
        ]:
            save, append = asyncio.run(measure(url, args.turns))
            ratio = save / append
            met = met and ratio <= TARGET
            verdict = "PASS" if ratio <= TARGET else "FAIL"
            lines.append(
                f"| {name} | {save * 1e3:.2f} | {append * 1e3:.2f} | {ratio:.2f}x | "
                f"<= {TARGET}x {verdict} |"
            )
    body = "\n".join(
        [
            f"`python bench/bench_adapters.py --turns {args.turns}`: pydantic-ai's `save` "
            "through `LedgerConversationStore`, one turn per save, against "
            "`append_messages` of the same chatledger messages, taking turns.",
            "",
            "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
            "",
            *lines,
        ]
    )
    print(body)
    write_section(RESULTS, "Framework adapters: a save against the append", body)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
