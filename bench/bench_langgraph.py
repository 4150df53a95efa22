"""LangGraph's checkpointers on one long thread: storage and `put` latency of chatledger's
`Saver` against LangGraph's own `PostgresSaver` and `SqliteSaver`.

    python bench/bench_langgraph.py [--turns 200] [--at 50] [--text 1000]

One graph, one thread, the same messages for every saver: each turn a user
question (`--text` characters), a model's tool call, the tool's result and the
answer (`--text` characters each but the call), through a `StateGraph` of an
agent node and a tool node (plain functions standing in for a model and a
tool), with `durability="sync"` so every `put` is timed where the graph waits
for it. Four savers in one run, on one machine: chatledger on Postgres and on
SQLite (`Saver(store.tenant(...))`), `PostgresSaver` and `SqliteSaver`.

Storage: what the saver's tables grew by, from the empty schema, after `--at`
turns and at the end (Postgres: `pg_total_relation_size` of each table, indexes
and TOAST included; SQLite: the pages the file uses, free pages left out, after
a WAL checkpoint). `put`: the
median over the first ten turns and over the last ten, and the growth per 100
messages of history (a least-squares line through every put); `get_tuple`
(LangGraph loads the thread as each turn starts): the median over the first ten
turns and over the last ten. Targets (issue 37): at the end, chatledger stores at
most a tenth of `PostgresSaver`'s bytes, and its `put` stays flat (grows by less
than 0.5 ms per 100 messages) and costs no more than `PostgresSaver`'s, over the
first ten turns and over the last ten. The exit code is 1 when a target is
missed. Results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from bench._common import libpq, machine, postgres_database, write_section
from chatledger.adapters.langgraph import Saver
from chatledger.store import Store

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
# Words drawn at random (seeded): text that compresses about as much as prose
# does, where a repeated sentence would let TOAST's compression hide every copy.
VOCABULARY = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "an",
    "be",
    "this",
    "from",
    "or",
    "have",
    "not",
    "are",
    "but",
    "had",
    "they",
    "his",
    "her",
    "she",
    "he",
    "we",
    "you",
    "which",
    "their",
    "one",
    "all",
    "would",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "can",
    "who",
    "so",
    "no",
    "out",
    "up",
    "into",
    "do",
    "time",
    "only",
    "its",
    "about",
    "other",
    "than",
    "then",
    "now",
    "could",
    "also",
    "after",
    "first",
    "two",
    "new",
    "over",
    "some",
    "any",
    "these",
    "may",
    "people",
    "like",
    "just",
    "our",
    "most",
    "what",
    "how",
    "made",
    "city",
    "river",
    "weather",
    "answer",
    "question",
    "number",
    "table",
    "order",
    "account",
    "report",
    "model",
    "tool",
    "value",
    "result",
    "search",
    "price",
    "market",
    "travel",
    "hotel",
    "flight",
    "morning",
    "evening",
    "tomorrow",
    "yesterday",
    "because",
    "through",
    "between",
    "during",
    "without",
    "within",
    "against",
    "among",
    "across",
    "around",
    "toward",
]
STORAGE_TARGET = 0.1  # chatledger's bytes at most this share of PostgresSaver's
FLAT = 0.5  # ms of put latency per 100 messages of history: "flat"


def text(turn: int, what: str, size: int) -> str:
    pick = random.Random(f"{what} {turn}")
    words = [pick.choice(VOCABULARY) for _ in range(size // 4)]
    return (f"{what} {turn}: " + " ".join(words))[:size]


def graph(saver: BaseCheckpointSaver[Any], size: int) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        turn = len(state["messages"]) // 4
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=text(turn, "answer", size))]}
        call = {"name": "look_up", "args": {"turn": turn}, "id": f"call-{turn}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def tools(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[attr-defined]
        result = text(call["args"]["turn"], "result", size)
        return {"messages": [ToolMessage(content=result, tool_call_id=call["id"], name="look_up")]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[attr-defined]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


@dataclass
class Run:
    name: str
    puts: list[tuple[int, float]] = field(default_factory=list)  # (history length, seconds)
    stored: dict[int, int] = field(default_factory=dict)  # turns -> bytes
    loads: list[tuple[int, float]] = field(default_factory=list)  # (turn, seconds of get_tuple)
    turn: int = 0

    def load_ms(self, turns: range) -> float:
        return 1e3 * statistics.median(s for t, s in self.loads if t in turns)

    def median_ms(self, turns: range, per_turn: int) -> float:
        return 1e3 * statistics.median(
            s for n, s in self.puts if turns.start * per_turn <= n < turns.stop * per_turn
        )

    def growth_ms_per_100(self) -> float:
        """The slope of put latency against history length, per 100 messages."""
        xs = [float(n) for n, _ in self.puts]
        ys = [s * 1e3 for _, s in self.puts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mx) ** 2 for x in xs
        )
        return slope * 100


def timed(saver: BaseCheckpointSaver[Any], run: Run) -> BaseCheckpointSaver[Any]:
    """`saver` with every `put` timed, against the history it saves."""
    put = saver.put

    def timed_put(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        start = time.perf_counter()
        done = put(config, checkpoint, metadata, new_versions)
        run.puts.append(
            (len(checkpoint["channel_values"].get("messages", [])), time.perf_counter() - start)
        )
        return done

    get_tuple = saver.get_tuple

    def timed_get_tuple(config: Any) -> Any:
        start = time.perf_counter()
        found = get_tuple(config)
        run.loads.append((run.turn, time.perf_counter() - start))
        return found

    saver.put = timed_put  # type: ignore[method-assign]
    saver.get_tuple = timed_get_tuple  # type: ignore[method-assign]
    return saver


def drive(contenders: list[tuple[Run, Any, Callable[[], int]]], turns: int, at: int, size: int) -> None:  # fmt: skip
    """The same thread on every saver, turn by turn in lockstep: a machine whose
    load changes during the run slows them all alike."""
    config = {"configurable": {"thread_id": "bench-thread"}}
    empty = {run.name: storage() for run, _, storage in contenders}  # the schema alone
    for turn in range(turns):
        question = HumanMessage(content=text(turn, "question", size))
        for run, app, storage in contenders:
            run.turn = turn
            app.invoke({"messages": [question]}, config, durability="sync")
            if turn + 1 in (at, turns):
                run.stored[turn + 1] = storage() - empty[run.name]


def postgres_bytes(url: str, tables: str) -> int:
    with psycopg.connect(libpq(url)) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public' AND c.relname LIKE %s",
            (tables,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def sqlite_bytes(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return int((pages - free) * size)


@contextmanager
def savers(tmp: str) -> Iterator[list[tuple[str, Callable[[], BaseCheckpointSaver[Any]], Callable[[], int]]]]:  # fmt: skip
    """Each saver, how to build it, and how to size what it stored."""
    with (
        postgres_database("bench_lg_chatledger") as chatledger_pg,
        postgres_database("bench_lg_postgres") as langgraph_pg,
    ):
        sqlite_path = os.path.join(tmp, "chatledger.db")
        langgraph_sqlite = os.path.join(tmp, "langgraph.db")
        stores = [Store.open(chatledger_pg), Store.open(f"sqlite:///{sqlite_path}")]
        for store in stores:
            store.migrate()
        pg_conn = psycopg.connect(libpq(langgraph_pg), autocommit=True, prepare_threshold=0)
        sqlite_conn = sqlite3.connect(langgraph_sqlite, check_same_thread=False)
        sqlite_conn.execute("PRAGMA journal_mode=WAL")

        def postgres_saver() -> BaseCheckpointSaver[Any]:
            saver = PostgresSaver(pg_conn)  # type: ignore[arg-type]
            saver.setup()
            return saver

        try:
            yield [
                (
                    "chatledger `Saver`, Postgres",
                    lambda: Saver(stores[0].tenant("bench")),
                    lambda: postgres_bytes(chatledger_pg, "chatledger%"),
                ),
                ("`PostgresSaver`", postgres_saver, lambda: postgres_bytes(langgraph_pg, "checkpoint%")),
                (
                    "chatledger `Saver`, SQLite",
                    lambda: Saver(stores[1].tenant("bench")),
                    lambda: sqlite_bytes(sqlite_path),
                ),
                ("`SqliteSaver`", lambda: SqliteSaver(sqlite_conn), lambda: sqlite_bytes(langgraph_sqlite)),
            ]  # fmt: skip
        finally:
            pg_conn.close()
            sqlite_conn.close()
            for store in stores:
                store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns of the thread")
    parser.add_argument("--at", type=int, default=50, help="turns at which storage is also sized")
    parser.add_argument("--text", type=int, default=1000, help="characters of each message's text")
    args = parser.parse_args()
    details = machine()
    with tempfile.TemporaryDirectory() as tmp, savers(tmp) as contenders:
        runs = [Run(name) for name, _, _ in contenders]
        apps = [graph(timed(build(), run), args.text) for run, (_, build, _) in zip(runs, contenders, strict=True)]  # fmt: skip
        drive(
            [(run, app, c[2]) for run, app, c in zip(runs, apps, contenders, strict=True)],
            args.turns,
            args.at,
            args.text,
        )
    per_turn = 4
    messages_at = {t: t * per_turn for t in (args.at, args.turns)}
    first, last = range(0, 10), range(args.turns - 10, args.turns)
    by_name = {r.name: r for r in runs}
    postgres = by_name["`PostgresSaver`"]
    lines = [
        f"| saver | bytes at {args.at} turns | per message | bytes at {args.turns} turns | "
        f"per message | `put` median ms, turns 1-10 | turns {args.turns - 9}-{args.turns} | "
        "growth, ms per 100 messages | `get_tuple` median ms, turns 1-10 | "
        f"turns {args.turns - 9}-{args.turns} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run.name} | {run.stored[args.at]:,} | {run.stored[args.at] // messages_at[args.at]:,} | "
            f"{run.stored[args.turns]:,} | {run.stored[args.turns] // messages_at[args.turns]:,} | "
            f"{run.median_ms(first, per_turn):.2f} | {run.median_ms(last, per_turn):.2f} | "
            f"{run.growth_ms_per_100():+.2f} | {run.load_ms(first):.2f} | {run.load_ms(last):.2f} |"
        )
    verdicts = []
    met = True
    for run in runs:
        if not run.name.startswith("chatledger"):
            continue
        share = run.stored[args.turns] / postgres.stored[args.turns]
        flat = run.growth_ms_per_100() < FLAT
        cheaper = run.median_ms(last, per_turn) <= postgres.median_ms(last, per_turn)
        cheaper_first = run.median_ms(first, per_turn) <= postgres.median_ms(first, per_turn)
        met = met and share <= STORAGE_TARGET and flat and cheaper and cheaper_first
        verdicts.append(
            f"- {run.name}: {share:.3f} of `PostgresSaver`'s bytes at {args.turns} turns "
            f"(target <= {STORAGE_TARGET}: {'PASS' if share <= STORAGE_TARGET else 'FAIL'}); "
            f"`put` growth {run.growth_ms_per_100():+.2f} ms per 100 messages (target < {FLAT}: "
            f"{'PASS' if flat else 'FAIL'}); last ten turns' `put` "
            f"{run.median_ms(last, per_turn):.2f} ms against `PostgresSaver`'s "
            f"{postgres.median_ms(last, per_turn):.2f} ({'PASS' if cheaper else 'FAIL'}); first "
            f"ten turns' `put` {run.median_ms(first, per_turn):.2f} ms against "
            f"{postgres.median_ms(first, per_turn):.2f} ({'PASS' if cheaper_first else 'FAIL'})."
        )
    body = "\n".join(
        [
            f"`python bench/bench_langgraph.py --turns {args.turns} --at {args.at} --text "
            f"{args.text}`: one thread of a `StateGraph` (agent, tool, agent: 4 messages a turn, "
            f"{args.text} characters of text each but the tool call), every `put` timed with "
            '`durability="sync"`, and every `get_tuple` (one as each turn starts), on four savers '
            "in one run, turn by turn in lockstep; bytes are what the tables grew by from the "
            "empty schema.",
            "",
            "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
            "",
            *lines,
            "",
            *verdicts,
        ]
    )
    print(body)
    write_section(RESULTS, "LangGraph checkpointers: storage and put latency", body)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
