"""A write through a framework adapter against `append_messages` of the same messages.

    python bench/bench_adapters.py [--turns 300]

Two tables, each against `AsyncLedger.append_messages` of the very chatledger
messages the adapter writes, on the same database, taking turns write by
write, on `AsyncStore`, SQLite (WAL, synchronous=FULL) and Postgres:

- pydantic-ai's `ConversationStore.save` through `LedgerConversationStore`
  (adapters/pydantic_ai), each save adding one turn (a ~1 KB user prompt and
  a ~1 KB answer);
- the OpenAI Agents SDK's `Session.add_items` through `ChatledgerSession`
  (adapters/openai_agents) of one turn's items: a ~1 KB user message, then a
  model response of a ~1 KB reasoning item and a ~1 KB assistant message.

The save table also times the append as a save writes it (the entry ids,
the record's state and its compare-and-set, with no translation and no
pydantic-ai): the store's share of a save. The figure is the ratio of median times (issue 18's target: at most 1.3x);
the exit code is 1 when any backend of either table misses it. Results go to
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationRecord
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from bench._common import machine, postgres_database, write_section
from chatledger.adapters.openai_agents import ChatledgerSession
from chatledger.adapters.openai_agents import to_messages as items_to_messages
from chatledger.adapters.pydantic_ai import LedgerConversationStore, to_messages
from chatledger.adapters.pydantic_ai._store import _RECORD as RECORD_JSON
from chatledger.adapters.pydantic_ai._store import RECORD, REVISION
from chatledger.store import AsyncStore, Expected, new_id

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
TEXT = "The quick brown fox jumps over the lazy dog. " * 22  # ~1 KB
TARGET = 1.3


def turn(i: int) -> list[ModelRequest | ModelResponse]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"{i}: {TEXT}")]),
        ModelResponse(parts=[TextPart(content=f"{i}: {TEXT}")]),
    ]


async def measure(url: str, turns: int) -> tuple[float, float, float]:
    """Median seconds of a save, of the same append, and of that append as a save
    writes it (the entry ids, the record's state and its compare-and-set), after
    a warm-up."""
    async with AsyncStore.open(url, message_cache=0) as store:
        await store.migrate()
        ledger = store.tenant("bench")
        conversations = LedgerConversationStore(ledger)
        conversation = Conversation(conversation_id="bench-conversation")
        await conversations.save(conversation)
        plain = (await ledger.create_conversation()).id
        stated = (await ledger.create_conversation()).id
        revision = None
        saves, appends, states = [], [], []
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
            record = ConversationRecord(
                conversation_id="bench-stated", head_id=new_id(), usage=conversation.usage
            )
            state = {
                REVISION: record.revision,
                RECORD: RECORD_JSON.dump_python(record, mode="json", exclude_defaults=True),
            }
            start = time.perf_counter()
            await ledger.append_messages(
                stated,
                messages,
                ids=[new_id() for _ in messages],
                state=state,
                expected=Expected(state={REVISION: revision}),
            )
            states.append(time.perf_counter() - start)
            revision = record.revision
        warm = turns // 10
        return tuple(statistics.median(t[warm:]) for t in (saves, appends, states))  # type: ignore[return-value]


def items(i: int) -> list[dict[str, Any]]:
    """One turn's session items, as the runner adds them: the prompt, then the response."""
    return [
        {"role": "user", "content": f"{i}: {TEXT}"},
        {
            "type": "reasoning",
            "id": f"rs_{i}",
            "summary": [{"type": "summary_text", "text": f"{i}: {TEXT}"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{i}",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"{i}: {TEXT}", "annotations": []}],
        },
    ]


async def measure_session(url: str, turns: int) -> tuple[float, float]:
    """Median seconds of a session's `add_items` of one turn and of the same append."""
    async with AsyncStore.open(url, message_cache=0) as store:
        await store.migrate()
        ledger = store.tenant("bench-session")
        session = ChatledgerSession("bench-session", ledger)
        plain = (await ledger.create_conversation()).id
        adds, appends = [], []
        for i in range(turns):
            added = items(i)
            start = time.perf_counter()
            await session.add_items(added)
            adds.append(time.perf_counter() - start)
            messages = items_to_messages(added)
            start = time.perf_counter()
            await ledger.append_messages(plain, messages)
            appends.append(time.perf_counter() - start)
        warm = turns // 10
        return statistics.median(adds[warm:]), statistics.median(appends[warm:])


def table(
    urls: list[tuple[str, str]],
    measure_one: Callable[[str, int], Coroutine[Any, Any, tuple[float, ...]]],
    turns: int,
    what: str,
    floor: str | None = None,
) -> tuple[list[str], bool]:
    """A results table of `measure_one` on each backend, and whether every ratio met the target.

    With `floor`, `measure_one` times a third contender: the store's share of
    the adapter's write, shown as its own ratio to the append.
    """
    extra = f" {floor} median ms | its ratio |" if floor else ""
    lines = [
        f"| backend | {what} median ms | `append_messages` median ms |{extra} ratio | target |",
        "|---|---:|---:|" + ("---:|---:|" if floor else "") + "---:|---|",
    ]
    met = True
    for name, url in urls:
        adapter, append, *rest = asyncio.run(measure_one(url, turns))
        ratio = adapter / append
        met = met and ratio <= TARGET
        verdict = "PASS" if ratio <= TARGET else "FAIL"
        shown = "".join(f" {t * 1e3:.2f} | {t / append:.2f}x |" for t in rest)
        lines.append(
            f"| {name} | {adapter * 1e3:.2f} | {append * 1e3:.2f} |{shown} {ratio:.2f}x | "
            f"<= {TARGET}x {verdict} |"
        )
    return lines, met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300, help="saves per backend")
    args = parser.parse_args()
    details = machine()
    machine_line = "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items())
    with tempfile.TemporaryDirectory() as tmp, postgres_database("bench_adapters") as pg:
        sqlite = f"sqlite:///{os.path.join(tmp, 'adapters.db')}"
        urls = [("SQLite", sqlite), ("Postgres", pg)]
        saves, saves_met = table(
            urls, measure, args.turns, "`save`", floor="the append as a save writes it"
        )
        adds, adds_met = table(urls, measure_session, args.turns, "`add_items`")
    pydantic_ai = "\n".join(
        [
            f"`python bench/bench_adapters.py --turns {args.turns}`: pydantic-ai's `save` "
            "through `LedgerConversationStore`, one turn per save, against "
            "`append_messages` of the same chatledger messages, taking turns; and that "
            "append as a save writes it (the entry ids, the record's state and its "
            "compare-and-set): the store's share of a save.",
            "",
            machine_line,
            "",
            *saves,
        ]
    )
    openai_agents = "\n".join(
        [
            f"`python bench/bench_adapters.py --turns {args.turns}`: the OpenAI Agents SDK's "
            "`add_items` through `ChatledgerSession` of one turn's items (a user message, a "
            "reasoning item and an assistant message, ~1 KB each), against `append_messages` "
            "of the same chatledger messages (`to_messages(items)`), taking turns.",
            "",
            machine_line,
            "",
            *adds,
        ]
    )
    print(pydantic_ai, openai_agents, sep="\n\n")
    write_section(RESULTS, "Framework adapters: a save against the append", pydantic_ai)
    write_section(
        RESULTS, "Framework adapters: a session's add_items against the append", openai_agents
    )
    return 0 if saves_met and adds_met else 1


if __name__ == "__main__":
    sys.exit(main())
