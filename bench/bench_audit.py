"""Benchmark of the audit queries on Postgres: 1 million events, 10 thousand conversations.

Run it as a plain script from the repository root (it needs a Postgres server;
it creates a throwaway database there and drops it at the end):

    python bench/bench_audit.py [--admin-url postgresql://postgres@127.0.0.1:5432/test]

The log is generated in SQL (INSERT ... SELECT over generate_series), shaped
like the engine writes it: 20 tenants, 10,000 conversations over 30 days,
each a day long with 100 events: `conversation.created`, four runs of 24
events (prompt, three model requests, two rounds of two tool calls each with
`tool.started`, `tool.finished` and the result, `run.completed`) and three
client appends. Tool calls are named from a set of 8 tools; 2% of results
fail. Rows are inserted in time order, so the conversations' events
interleave in `seq` as they do live, and `txid` advances every two rows, as
the engine's one-step transactions do.

Columns added by revisions this script does not know, such as the hash
chain's digests, are filled with placeholder sha256 values (NOT NULL `bytea`
columns only; anything else stops the script): the audit queries do not read
them.

Then, through the library (`store.tenant(...).audit`), each query is timed
on many different inputs after a warm-up, and the median and 95th percentile
are printed and written to bench/RESULTS.md under the "Audit" heading (other
sections of that file are kept). The target is a median under 50 ms for a
run timeline and for a tool-name query over one day.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from chatledger.store import Store

CONVERSATIONS = 10_000
EVENTS_PER_CONVERSATION = 100
TENANTS = 20
RUNS_PER_CONVERSATION = 4
TOOLS = ["search", "fetch", "calc", "lookup", "send_email", "refund", "translate", "summarize"]
START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 30
SAMPLES = 200
TARGET_MS = 50.0
SEED = 20261129
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
DEFAULT_ADMIN = os.environ.get(
    "CHATLEDGER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

STAMPS = '"runId":"{run}","conversationId":"{conv}"'
USAGE = '{"cacheReadTokens":null,"cacheWriteTokens":null,"inputTokens":812,"outputTokens":64}'
PROMPT = "Please look into order 4711: the customer says it arrived damaged and wants a refund."
RESULT = "Order 4711: shipped 2026-01-03, delivered 2026-01-05, 2 items, total 84.90 EUR. " * 3
ANSWER = "I checked the order and the delivery record; a refund has been prepared. " * 5


def _round(request: int, first: int, second: int) -> list[tuple[str, str, str]]:
    """The nine events of a model request whose answer calls two tools."""
    n = str(request)

    def call(k: int) -> str:
        return (
            '{"id":"c' + str(k) + '","name":"{n' + str(k) + '}","arguments":"{\\"order\\":4711}"}'
        )

    def started(k: int) -> tuple[str, str, str]:
        return ("tool.started", "run", '{"callId":"c' + str(k) + '","name":"{n' + str(k) + '}"}')

    def finished(k: int) -> tuple[str, str, str]:
        return (
            "tool.finished",
            "run",
            '{"callId":"c' + str(k) + '","failed":{failed' + str(k) + "}}",
        )

    def result(k: int) -> tuple[str, str, str]:
        return (
            "message.recorded",
            "run",
            '{"role":"tool","content":"' + RESULT + '","toolCallId":"c' + str(k) + '",'
            '"toolName":"{n' + str(k) + '}",{failedflag' + str(k) + "}" + STAMPS + "}",
        )

    return [
        ("model.requested", "run", '{"digest":"{digest}","request":' + n + "}"),
        (
            "model.responded",
            "run",
            '{"finishReason":"tool_calls","request":' + n + ',"usage":' + USAGE + "}",
        ),
        (
            "message.recorded",
            "run",
            '{"role":"assistant","toolCalls":['
            + call(first)
            + ","
            + call(second)
            + "],"
            + STAMPS
            + "}",
        ),
        started(first),
        started(second),
        finished(first),
        result(first),
        finished(second),
        result(second),
    ]


# The 24 events of one run, by offset: (kind, origin, payload template).
RUN = [
    (
        "run.started",
        "run",
        '{"base":{"branchId":"{branch}","position":{base}},"headAtStart":{"branchId":"{branch}",'
        '"position":{base}},"instructionsDigest":"{digest}","model":"openai:gpt-4o","resumes":null}',
    ),
    ("message.recorded", "client", '{"role":"user","content":"' + PROMPT + '",' + STAMPS + "}"),
    *_round(1, 1, 2),
    *_round(2, 3, 4),
    ("model.requested", "run", '{"digest":"{digest}","request":3}'),
    ("model.responded", "run", '{"finishReason":"stop","request":3,"usage":' + USAGE + "}"),
    ("message.recorded", "run", '{"role":"assistant","content":"' + ANSWER + '",' + STAMPS + "}"),
    ("run.completed", "run", '{"requestCount":3,"toolCount":4,"usage":' + USAGE + "}"),
]
assert len(RUN) == 24 and 1 + RUNS_PER_CONVERSATION * len(RUN) + 3 == EVENTS_PER_CONVERSATION


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def generate(conn: psycopg.Connection[Any]) -> None:
    """Fill a migrated database with the benchmark's log, in SQL."""
    templates = ", ".join(
        f"({o}, {_sql_text(kind)}, {_sql_text(origin)}, {_sql_text(payload)})"
        for o, (kind, origin, payload) in enumerate(RUN)
    )
    # Settled rows: every generated txid must lie below any later snapshot's xmin.
    xmin = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
    span = max(int(xmin[0]) - 10, 10) if xmin else 10
    total = CONVERSATIONS * EVENTS_PER_CONVERSATION
    conn.execute(f"""
        CREATE TEMP TABLE conv AS
        SELECT i,
               md5('conv-' || i)::uuid AS id,
               md5('branch-' || i)::uuid AS branch,
               'tenant-' || lpad((i % {TENANTS})::text, 2, '0') AS tenant,
               timestamptz '{START.isoformat()}'
                   + (i * interval '{DAYS - 1} days') / {CONVERSATIONS} AS created_at
        FROM generate_series(0, {CONVERSATIONS - 1}) AS i
    """)
    names, values = _extra(conn, "chatledger_conversations", "id::text")
    conn.execute(f"""
        INSERT INTO chatledger_conversations (id, tenant, head_branch_id, head_position, head_open,
                                              created_at, metadata{names})
        SELECT id, tenant, branch, 100, true, created_at, '{{}}'{values} FROM conv
    """)
    names, values = _extra(conn, "chatledger_branches", "branch::text")
    conn.execute(f"""
        INSERT INTO chatledger_branches (id, conversation_id, reason, created_at{names})
        SELECT branch, id, 'root', created_at{values} FROM conv
    """)
    # Position p of conversation i happens at created_at + (p - 1) * 864 s: a day per conversation.
    conn.execute(f"""
        CREATE TEMP TABLE ev AS
        WITH t (o, kind, origin, payload) AS (VALUES {templates}),
        slot AS (
            SELECT c.*, p,
                   c.created_at + (p - 1) * interval '864 seconds' AS at,
                   CASE WHEN p BETWEEN 2 AND 97 THEN (p - 2) / 24 END AS r,
                   CASE WHEN p BETWEEN 2 AND 97 THEN (p - 2) % 24 END AS o
            FROM conv AS c CROSS JOIN generate_series(1, 100) AS p
        )
        SELECT s.id AS conversation_id, s.branch, s.p, s.at, s.tenant,
               CASE WHEN s.r IS NOT NULL THEN md5('run-' || s.i || '-' || s.r)::uuid END AS run_id,
               CASE WHEN s.p = 1 THEN 'conversation.created'
                    WHEN s.r IS NULL THEN 'message.recorded' ELSE t.kind END AS kind,
               CASE WHEN s.r IS NULL THEN 'client' ELSE t.origin END AS origin,
               s.p = 1 OR s.p = 100 OR coalesce(s.o = 23, false) AS head,
               CASE
                 WHEN s.p = 1 THEN '{{"metadata":{{}},"tenant":"' || s.tenant || '"}}'
                 WHEN s.r IS NULL THEN '{{"role":"user","content":"Thanks, one more question ('
                                       || s.p || ')."}}'
                 ELSE {_fill("t.payload")}
               END AS payload
        FROM slot AS s LEFT JOIN t ON t.o = s.o
    """)
    names, values = _extra(conn, "chatledger_events", "payload")
    conn.execute(f"""
        INSERT INTO chatledger_events (id, conversation_id, branch_id, position, run_id, kind,
                                       origin, head, recorded_at, payload{names}, txid)
        SELECT md5('event-' || conversation_id || '-' || p)::uuid, conversation_id, branch, p,
               run_id, kind, origin, head, at, payload{values},
               3 + ((row_number() OVER (ORDER BY at, conversation_id) - 1) / 2) * {span} / {total}
        FROM ev
        ORDER BY at, conversation_id
    """)
    conn.execute("""
        INSERT INTO chatledger_runs (id, conversation_id, tenant, branch_id, position,
                                     base_branch_id, base_position, head_branch_id, head_position,
                                     status, request_count, tool_count, usage, model, attempt,
                                     started_at, ended_at)
        SELECT run_id, conversation_id, min(tenant), min(branch::text)::uuid, max(p),
               min(branch::text)::uuid, min(p) - 1, min(branch::text)::uuid, min(p) - 1,
               'completed', 3, 4,
               '{"inputTokens":2436,"outputTokens":192,"cacheReadTokens":null,"cacheWriteTokens":null}',
               'openai:gpt-4o', 1, min(at), max(at)
        FROM ev WHERE run_id IS NOT NULL
        GROUP BY conversation_id, run_id
    """)
    conn.execute("DROP TABLE ev")
    conn.execute("DROP TABLE conv")
    conn.execute("ANALYZE")


_KNOWN = {
    "chatledger_conversations": {
        "id",
        "tenant",
        "head_branch_id",
        "head_position",
        "head_open",
        "created_at",
        "metadata",
    },
    "chatledger_branches": {"id", "conversation_id", "reason", "created_at"},
    "chatledger_events": {
        "id",
        "conversation_id",
        "branch_id",
        "position",
        "kind",
        "origin",
        "head",
        "recorded_at",
        "payload",
    },
}


def _extra(conn: psycopg.Connection[Any], table: str, source: str) -> tuple[str, str]:
    """Columns a later revision added (NOT NULL, no default) and placeholder values for them."""
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = %s AND is_nullable = 'NO' AND column_default IS NULL "
        "ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    names, values = "", ""
    for name, data_type in rows:
        if name in _KNOWN[table]:
            continue
        if name == "tenant":  # revision 0009: the conversation's, which the source rows carry
            names += ", tenant"
            values += ", tenant"
            continue
        if data_type != "bytea":
            raise SystemExit(f"{table}.{name} ({data_type}) is new: teach generate() to fill it.")
        names += f", {name}"
        values += f", sha256(convert_to({source}, 'UTF8'))"
    return names, values


def _fill(template: str) -> str:
    """SQL that fills a payload template's placeholders for the row's run and call names."""
    tools = "ARRAY[" + ", ".join(_sql_text(t) for t in TOOLS) + "]"
    expr = template
    for name, value in [
        ("{run}", "md5('run-' || s.i || '-' || s.r)::uuid::text"),
        ("{conv}", "s.id::text"),
        ("{branch}", "s.branch::text"),
        ("{base}", "(s.p - 1)::text"),
        ("{digest}", "md5('d' || s.i || '-' || s.p) || md5('e' || s.i || '-' || s.p)"),
    ]:
        expr = f"replace({expr}, '{name}', {value})"
    for k in range(1, 5):
        pick = f"({tools})[1 + (hashtext(s.i || '-' || s.r || '-{k}') & 2147483647) % {len(TOOLS)}]"
        failed = f"(hashtext('f' || s.i || '-' || s.r || '-{k}') & 2147483647) % 50 = 0"
        expr = f"replace({expr}, '{{n{k}}}', {pick})"
        expr = f"replace({expr}, '{{failed{k}}}', CASE WHEN {failed} THEN 'true' ELSE 'false' END)"
        expr = (
            f"replace({expr}, '{{failedflag{k}}}', "
            f"CASE WHEN {failed} THEN '\"failed\":true,' ELSE '' END)"
        )
    return expr


# -- timing ---------------------------------------------------------------------------


def timed(samples: list[Any], query: Callable[[Any], object]) -> list[float]:
    """Milliseconds per call, one call per sample, after a warm-up pass over a few."""
    for sample in samples[:20]:
        query(sample)
    times = []
    for sample in samples:
        started = time.perf_counter()
        query(sample)
        times.append((time.perf_counter() - started) * 1000)
    return times


@contextmanager
def captured(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """The SQL statements the store sends, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def grab(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", grab)
    try:
        yield statements
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", grab)


def plan(store: Store, read: Callable[[], object], marker: str) -> str:
    """The index lines of the plan of the statement `read` sends that contains `marker`."""
    with captured(store) as statements:
        read()
    statement, parameters = next((s, p) for s, p in statements if marker in s)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, parameters).scalars().all()
    used = sorted(
        {
            w
            for line in rows
            for w in line.replace("(", " ").split()
            if w.startswith(("ix_", "pk_", "uq_"))
        }
    )
    return ", ".join(used) or "no index"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args(argv)

    admin = sa.make_url(args.admin_url).set(drivername="postgresql")
    name = f"chatledger_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        return run(url)
    finally:
        if not args.keep:
            with psycopg.connect(
                admin.render_as_string(hide_password=False), autocommit=True
            ) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            print(f"kept {url}")


def run(url: str) -> int:
    rng = random.Random(SEED)
    with Store.open(url) as store:
        store.migrate()
        libpq = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        started = time.perf_counter()
        with psycopg.connect(libpq, autocommit=True) as conn:
            generate(conn)
            events, size = conn.execute(
                "SELECT count(*), pg_size_pretty(pg_total_relation_size('chatledger_events')) "
                "FROM chatledger_events"
            ).fetchone() or (0, "")
            run_rows = conn.execute(
                "SELECT id::text, tenant FROM chatledger_runs ORDER BY id"
            ).fetchall()
            version = conn.execute("SHOW server_version").fetchone()
        generated = time.perf_counter() - started
        print(f"generated {events:,} events ({size} with indexes) in {generated:.0f} s")

        runs = rng.sample(run_rows, SAMPLES)
        tool_queries = [
            (
                f"tenant-{rng.randrange(TENANTS):02d}",
                rng.choice(TOOLS),
                START + timedelta(days=rng.randrange(1, DAYS - 1)),
            )
            for _ in range(SAMPLES)
        ]
        conversations = [
            (str(uuid.UUID(md5_hex(f"conv-{i}"))), f"tenant-{i % TENANTS:02d}")
            for i in rng.sample(range(CONVERSATIONS), SAMPLES)
        ]

        def timeline(sample: tuple[str, str]) -> object:
            run_id, tenant = sample
            page = store.tenant(tenant).audit.run_timeline(run_id, limit=1000)
            assert len(page.items) == 24 and not page.has_more
            return page

        def tool_day(sample: tuple[str, str, datetime]) -> list[object]:
            tenant, tool_name, day = sample
            audit = store.tenant(tenant).audit
            found: list[object] = []
            after = None
            while True:
                page = audit.tool_executions(
                    tool_name=tool_name, since=day, until=day + timedelta(days=1), after=after
                )
                found += page.items
                after = page.next_after
                if not page.has_more:
                    return found

        def conversation_page(sample: tuple[str, str]) -> object:
            conversation_id, tenant = sample
            return store.tenant(tenant).audit.events(conversation_id=conversation_id)

        def client_messages(sample: tuple[str, str]) -> object:
            conversation_id, tenant = sample
            return store.tenant(tenant).audit.supplied_and_repaired(conversation_id=conversation_id)

        rows = [
            ("run timeline (24 events, one page)", timed(runs, timeline), TARGET_MS),
            ("tool-name query over one day (all pages)", timed(tool_queries, tool_day), TARGET_MS),
            (
                "a conversation's events (first page of 100)",
                timed(conversations, conversation_page),
                None,
            ),
            (
                "a conversation's client/repair messages",
                timed(conversations, client_messages),
                None,
            ),
        ]
        hits = [len(tool_day(q)) for q in tool_queries]
        plans = {
            "run timeline": plan(store, lambda: timeline(runs[0]), "page_txid"),
            "tool-name query": plan(store, lambda: tool_day(tool_queries[0]), "page_txid"),
            "conversation events": plan(
                store, lambda: conversation_page(conversations[0]), "page_txid"
            ),
        }

    lines = [
        "## Audit",
        "",
        "`python bench/bench_audit.py` on Postgres "
        f"{version[0] if version else '?'}, {os.cpu_count()} CPUs: {events:,} events in "
        f"{CONVERSATIONS:,} conversations of {TENANTS} tenants over {DAYS} days "
        f"({size} with indexes; generated in SQL in {generated:.0f} s). "
        f"Each query through the library (`store.tenant(t).audit`), {SAMPLES} different "
        f"inputs after a warm-up; times in milliseconds, including the round trips.",
        "",
        "| query | median | p95 | target |",
        "|---|---:|---:|---|",
    ]
    ok = True
    for label, times, target in rows:
        median = statistics.median(times)
        p95 = statistics.quantiles(times, n=20)[-1]
        verdict = ""
        if target is not None:
            passed = median < target
            ok = ok and passed
            verdict = f"< {target:.0f} ms median: {'met' if passed else 'MISSED'}"
        lines.append(f"| {label} | {median:.1f} | {p95:.1f} | {verdict} |")
    lines += [
        "",
        f"The tool-name queries matched {statistics.median(hits):.0f} calls each (median; "
        f"{min(hits)} to {max(hits)}). Indexes the plans use: "
        + "; ".join(f"{k}: {v}" for k, v in plans.items())
        + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(text)
    return 0 if ok else 1


def md5_hex(value: str) -> str:
    return hashlib.md5(value.encode()).hexdigest()


def write_section(section: str) -> None:
    """Put `section` under its heading in RESULTS.md, keeping every other section."""
    heading = section.splitlines()[0]
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n\n"
    start = old.find(heading + "\n")
    if start == -1:
        new = old.rstrip("\n") + "\n\n" + section
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + section + (old[end + 1 :] if end != -1 else "")
    RESULTS.write_text(new.rstrip("\n") + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
