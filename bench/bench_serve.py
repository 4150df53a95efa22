"""The ask service under load on loopback, against the same runs in process.

    python bench/bench_serve.py [--seconds 30] [--clients 50] [--warmup 3]
                                [--admin-url URL] [--record]

On a throwaway Postgres database (created on the server of `--admin-url`,
default $CHATLEDGER_BENCH_POSTGRES_URL, else $CHATLEDGER_TEST_POSTGRES_URL,
else postgres@127.0.0.1:5432/test; migrated with `Store.open(url).migrate()`,
dropped at the end):

1. The real service: `python -m chatledger serve --agent bench._serve_agent:agent
   --keys FILE --port 0` in its own process (uvicorn, as `chatledger serve`
   runs it), with a new API key whose digest is the key file's one entry.
   `--clients` concurrent clients (one process, each its own httpx.AsyncClient:
   a pool shared by all measured httpcore's pool more than the service) each ask,
   in a loop, a new question on `/v1/ask/stream`, alternately opening a new
   conversation and continuing the one they just opened, and read the
   Server-Sent Events to the end. Each stream is checked: `start`, text
   deltas, one `tool_call`, one `tool_result`, text deltas that add up to the
   answer, `answer` (same run id as `start`). Timed per run: the first event
   of the run after `start` (`start` itself is sent before the run begins, so
   it is reported apart) and the `answer` event, from just before the request.
2. The same agent in process: as many concurrent tasks calling
   `agent.run_stream_async(ledger, question, conversation_id, on_delta=...,
   on_message=...)` on an `AsyncStore` on the same database (another tenant),
   the same question pattern, for the same time. Timed per run: the first
   callback (the first text delta, the same point of the run as the
   service's first event) and the returned result.

The agent (bench/_serve_agent.py) is a `ScriptedModel`: no model I/O, so
what is measured is the engine, the store and, in the first case, HTTP, SSE
and the event loop of the service. Runs that start during the first
`--warmup` seconds are checked but not timed; clients start no run after the
warm-up plus `--seconds`, and finish the one under way.

After each load, every acknowledged run (the `answer` event's run id, or the
returned result's) is looked for in the log with the sync `Store`: one
`runs()` and one `events()` read of the tenant. "lost" counts acknowledged
runs that are missing, not `completed`, or whose last assistant message is
not the answer the client got. "errors" counts HTTP errors, `error` events,
malformed streams and exceptions. Both must be 0; the script exits 1
otherwise.

CPU per run: the client process (getrusage), the server process
(/proc/<pid>/stat) and the Postgres backends of each side (by
application_name); in process, client and server are one process.

`--record` appends the run's figures to the "Ask service under load" section
of bench/RESULTS.md (creating it), keeping the runs recorded before.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ADMIN_URL,
    CLOCK_TICKS,
    _proc_cpu,
    client_cpu,
    cpu_spent,
    libpq,
    machine,
    postgres_database,
    server_cpu,
    with_application_name,
)
from bench._serve_agent import make_agent
from chatledger.engine import Agent
from chatledger.engine.providers import Delta
from chatledger.service import key_digest, new_api_key
from chatledger.store import AsyncLedger, AsyncStore, Message, Store

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
HEADING = "## Ask service under load: HTTP+SSE against in-process"
AGENT = "bench._serve_agent:agent"
PREFACE = "Let me look that up."  # what the scripted model says before its tool call
SERVE_APP, INPROC_APP = "chatledger_bench_serve", "chatledger_bench_inproc"
SERVE_TENANT, INPROC_TENANT = "bench-serve", "bench-inproc"
SLACK = 120.0  # seconds past the deadline before a load is declared hung


# -- measurements -------------------------------------------------------------------


@dataclass
class Tally:
    """What one side's load produced."""

    name: str
    first: list[float] = field(default_factory=list)  # s, first run event (timed runs)
    start: list[float] = field(default_factory=list)  # s, the `start` event (service only)
    whole: list[float] = field(default_factory=list)  # s, the answer (timed runs)
    last_finish: float = 0.0  # perf_counter of the last timed run's answer
    acknowledged: dict[str, str] = field(default_factory=dict)  # run id -> answer
    errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # the first few errors, verbatim
    untimed: int = 0  # acknowledged during the warm-up
    hung: int = 0  # clients still running SLACK seconds after the deadline
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by process
    other: str = ""  # the machine's CPU not spent by the measured processes
    check: dict[str, Any] = field(default_factory=dict)  # the log check's findings
    window: float = 0.0  # seconds from the warm-up's end to the last timed answer

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {detail}")

    def done(self, began: float, first: float | None, end: float, timed: bool) -> None:
        if not timed:
            self.untimed += 1
            return
        self.whole.append(end - began)
        if first is not None:
            self.first.append(first - began)
        self.last_finish = max(self.last_finish, end)

    @property
    def runs(self) -> int:
        return len(self.whole)

    @property
    def rate(self) -> float:
        return self.runs / self.window if self.window > 0 else 0.0

    @property
    def lost(self) -> int:
        c = self.check
        return c.get("missing", 0) + c.get("not completed", 0) + c.get("other answer", 0)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`, in milliseconds."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return 1000 * ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def question(client: int, n: int) -> str:
    return f"What does term-{client}-{n} mean?"


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:8]]
    except OSError:
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


class Meter:
    """CPU seconds spent between `start` and `stop`: this process, the server process
    (if any) and the Postgres backends whose application_name is `application`; and
    what the whole machine spent meanwhile, to tell how much went to anything else."""

    def __init__(
        self, admin: psycopg.Connection[Any], application: str, server: ServeProcess | None
    ) -> None:
        self.admin, self.application, self.server = admin, application, server
        self._before: tuple[float, float, dict[int, float], float, float] = (0, 0, {}, 0, 0)
        self.machine = 0.0  # CPU seconds the machine was busy, all processes
        self.elapsed = 0.0  # wall seconds between start and stop

    def _now(self) -> tuple[float, float, dict[int, float], float, float]:
        served = self.server.cpu() if self.server is not None else 0.0
        pg = server_cpu(self.admin, self.application)
        return client_cpu(), served, pg, machine_busy(), time.perf_counter()

    def start(self) -> None:
        self._before = self._now()

    def stop(self) -> dict[str, float]:
        (me0, served0, pg0, busy0, t0), (me1, served1, pg1, busy1, t1) = self._before, self._now()
        self.machine, self.elapsed = busy1 - busy0, t1 - t0
        if self.server is None:
            return {"process": me1 - me0, "postgres": cpu_spent(pg0, pg1)}
        return {"client": me1 - me0, "server": served1 - served0, "postgres": cpu_spent(pg0, pg1)}

    def other(self, ours: dict[str, float]) -> str:
        """The machine's CPU not spent by the measured processes, as a sentence."""
        cores = os.cpu_count() or 1
        rest = self.machine - sum(ours.values())
        return (
            f"the machine was busy {self.machine:.1f} CPU s of {cores * self.elapsed:.1f} "
            f"({cores} cores x {self.elapsed:.1f} s); {rest:.1f} CPU s went to other "
            f"processes (Postgres background workers included)"
        )


# -- the service side ---------------------------------------------------------------


class ServeProcess:
    """`python -m chatledger serve` on a loopback port, its stderr kept."""

    def __init__(self, url: str, keys: Path) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chatledger",
                "serve",
                "--agent",
                AGENT,
                "--database-url",
                url,
                "--keys",
                str(keys),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,  # uvicorn's access log, one line per request
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line.rstrip("\n"))
            found = re.search(r"Uvicorn running on (http://\S+)", line)
            if found and self.url is None:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()  # the process ended (without a URL, it failed to start)

    def wait_ready(self, seconds: float = 60.0) -> str:
        self._ready.wait(seconds)
        if self.url is None:
            self.stop()
            raise SystemExit("the service did not start:\n" + "\n".join(self.stderr[-30:]))
        return self.url

    def cpu(self) -> float:
        return _proc_cpu(self.process.pid)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        return self.process.returncode

    def problems(self) -> list[str]:
        """stderr lines that are not uvicorn's and chatledger's start and stop notices."""
        quiet = re.compile(r"^(INFO: |chatledger: serving )")
        return [line for line in self.stderr if not quiet.match(line)]


def parse_sse(line: str, state: dict[str, Any]) -> tuple[str, str] | None:
    """Feed one line; an `(event, data)` pair when a blank line ends one."""
    if not line:
        data = state.pop("data", None)
        event = state.pop("event", "message")
        return (event, "\n".join(data)) if data is not None else None
    if line.startswith(":"):
        return None  # a comment (sse-starlette's ping)
    if line.startswith("event:"):
        state["event"] = line[6:].strip()
    elif line.startswith("data:"):
        state.setdefault("data", []).append(line[5:].removeprefix(" "))
    return None


def stream_problem(events: list[tuple[str, Any]], conversation_id: str | None) -> str | None:
    """What is wrong with a finished run's events, or None."""
    kinds = [k for k, _ in events]
    if kinds[:1] != ["start"] or kinds[-1:] != ["answer"]:
        return f"events {kinds}"
    if kinds.count("tool_call") != 1 or kinds.count("tool_result") != 1:
        return f"events {kinds}"
    call, result = kinds.index("tool_call"), kinds.index("tool_result")
    if not 0 < call < result or set(kinds[1:call]) | set(kinds[result + 1 : -1]) != {"delta"}:
        return f"events {kinds}"
    start, answer = events[0][1], events[-1][1]
    before = "".join(d["text"] for _, d in events[1:call])
    after = "".join(d["text"] for _, d in events[result + 1 : -1])
    if before != PREFACE or after != answer["answer"]:
        return f"deltas {before!r} / {after!r} against the answer {answer['answer']!r}"
    if start["runId"] != answer["runId"]:
        return f"start run {start['runId']} but answer run {answer['runId']}"
    if conversation_id is not None and answer["conversationId"] != conversation_id:
        return f"asked in {conversation_id}, answered in {answer['conversationId']}"
    return None


async def http_client(
    number: int,
    client: httpx.AsyncClient,
    tally: Tally,
    warm_end: float,
    deadline: float,
) -> None:
    conversation: str | None = None
    n = 0
    while time.perf_counter() < deadline:
        continuing = n % 2 == 1 and conversation is not None
        body: dict[str, Any] = {"question": question(number, n)}
        if continuing:
            body["conversationId"] = conversation
        n += 1
        began = time.perf_counter()
        timed = began >= warm_end
        started = first = answered = None
        events: list[tuple[str, Any]] = []
        state: dict[str, Any] = {}
        try:
            async with client.stream("POST", "/v1/ask/stream", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    tally.error(f"HTTP {response.status_code}", text[:300])
                    conversation = None
                    continue
                async for line in response.aiter_lines():
                    parsed = parse_sse(line, state)
                    if parsed is None:
                        continue
                    now = time.perf_counter()
                    event, data = parsed
                    events.append((event, json.loads(data)))
                    if started is None:
                        started = now
                    elif first is None:
                        first = now
                    if event == "answer":
                        answered = now
            if (last := parse_sse("", state)) is not None:  # a last event without its blank line
                events.append((last[0], json.loads(last[1])))
        except Exception as error:
            tally.error(f"exception {type(error).__name__}", f"{body}: {error!r}")
            conversation = None
            continue
        if any(kind == "error" for kind, _ in events):
            detail = next(d for kind, d in events if kind == "error")
            tally.error("error event", json.dumps(detail)[:300])
            conversation = None
            continue
        problem = stream_problem(events, body.get("conversation_id"))
        if problem is not None or answered is None:
            tally.error("malformed stream", problem or "no answer event")
            conversation = None
            continue
        answer = events[-1][1]
        tally.acknowledged[answer["runId"]] = answer["answer"]
        if started is not None and timed:
            tally.start.append(started - began)
        tally.done(began, first, answered, timed)
        conversation = answer["conversationId"]


async def load_service(
    base_url: str, key: str, meter: Meter, clients: int, warmup: float, seconds: float
) -> Tally:
    tally = Tally("service (HTTP+SSE)")
    # One httpx client (and connection pool) per simulated client, made before the clock
    # starts. Fifty streams sharing one pool measured httpcore's pool, not the service:
    # requests waited up to seconds before their first byte was sent (see RESULTS.md).
    async with contextlib.AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=base_url,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=httpx.Timeout(60.0),
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                )
            )
            for _ in range(clients)
        ]
        (await pool[0].get("/healthz")).raise_for_status()
        meter.start()
        begin = time.perf_counter()
        warm_end = begin + warmup
        deadline = warm_end + seconds
        await run_clients(
            tally,
            [http_client(i, pool[i], tally, warm_end, deadline) for i in range(clients)],
            deadline,
        )
        tally.cpu = meter.stop()
        tally.other = meter.other(tally.cpu)
    tally.window = tally.last_finish - warm_end
    return tally


# -- the in-process side ------------------------------------------------------------


class Callbacks:
    """One in-process run's callbacks: when the first came, the answer's text deltas."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.texts: list[str] = []  # text deltas after the tool result: the answer's
        self.tool_seen = False

    def on_delta(self, delta: Delta) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        if delta.kind == "text" and delta.text and self.tool_seen:
            self.texts.append(delta.text)

    def on_message(self, message: Message) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        if message.role == "tool":
            self.tool_seen = True


async def inproc_client(
    number: int,
    agent: Agent,
    ledger: AsyncLedger,
    tally: Tally,
    warm_end: float,
    deadline: float,
) -> None:
    conversation: str | None = None
    n = 0
    while time.perf_counter() < deadline:
        continuing = n % 2 == 1 and conversation is not None
        prompt = question(number, n)
        n += 1
        began = time.perf_counter()
        timed = began >= warm_end
        seen = Callbacks()
        try:
            result = await agent.run_stream_async(
                ledger,
                prompt,
                conversation if continuing else None,
                on_delta=seen.on_delta,
                on_message=seen.on_message,
            )
        except Exception as error:
            tally.error(f"exception {type(error).__name__}", f"{prompt}: {error!r}")
            conversation = None
            continue
        end = time.perf_counter()
        if "".join(seen.texts) != result.output:
            tally.error("malformed stream", f"deltas {''.join(seen.texts)!r} / {result.output!r}")
            conversation = None
            continue
        tally.acknowledged[result.run_id] = result.output
        tally.done(began, seen.first, end, timed)
        conversation = result.conversation_id


async def load_inproc(
    url: str, admin: psycopg.Connection[Any], clients: int, warmup: float, seconds: float
) -> Tally:
    meter = Meter(admin, INPROC_APP, None)
    tally = Tally("in-process")
    agent = make_agent()
    store = AsyncStore.open(with_application_name(url, INPROC_APP))
    try:
        await store.check_schema()
        ledger = store.tenant(INPROC_TENANT)
        meter.start()
        begin = time.perf_counter()
        warm_end = begin + warmup
        deadline = warm_end + seconds
        await run_clients(
            tally,
            [inproc_client(i, agent, ledger, tally, warm_end, deadline) for i in range(clients)],
            deadline,
        )
        tally.window = tally.last_finish - warm_end
        tally.cpu = meter.stop()  # before the store closes: its backends' CPU goes with them
        tally.other = meter.other(tally.cpu)
    finally:
        await store.close()
    return tally


async def run_clients(tally: Tally, clients: list[Any], deadline: float) -> None:
    """Run the clients to their end; any still running SLACK s after the deadline hung."""
    tasks = [asyncio.create_task(c) for c in clients]
    timeout = deadline - time.perf_counter() + SLACK
    _done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    tally.hung = len(pending)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            tally.error(f"client crashed {type(error).__name__}", repr(error))


# -- the log check ------------------------------------------------------------------


def check_log(url: str, tenant: str, tally: Tally) -> None:
    """Each acknowledged run: in the log, completed, its last assistant text the answer."""
    with Store.open(url) as store:
        ledger = store.tenant(tenant)
        runs = {r.id: r for r in ledger.runs.recent(limit=2**31 - 1)}
        last_text: dict[str, str] = {}
        for event in ledger.events():
            if event.kind == "message.recorded" and event.run_id is not None:
                message = event.message
                if message is not None and message.role == "assistant":
                    last_text[event.run_id] = message.text
    missing = [r for r in tally.acknowledged if r not in runs]
    not_completed = [r for r in tally.acknowledged if r in runs and runs[r].status != "completed"]
    other = [
        r
        for r, answer in tally.acknowledged.items()
        if r in runs and runs[r].status == "completed" and last_text.get(r) != answer
    ]
    tally.check = {
        "acknowledged": len(tally.acknowledged),
        "runs in the log": len(runs),
        "statuses": dict(Counter(r.status for r in runs.values())),
        "missing": len(missing),
        "not completed": len(not_completed),
        "other answer": len(other),
        "not acknowledged": len(set(runs) - set(tally.acknowledged)),
        "examples": (missing + not_completed + other)[:5],
    }


# -- the whole ----------------------------------------------------------------------


def serve_side(url: str, admin_url: str, args: argparse.Namespace) -> tuple[Tally, list[str], int]:
    key = new_api_key()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({key_digest(key): SERVE_TENANT}))
        server = ServeProcess(with_application_name(url, SERVE_APP), keys)
        try:
            base_url = server.wait_ready()
            with psycopg.connect(libpq(admin_url)) as admin:
                meter = Meter(admin, SERVE_APP, server)
                tally = asyncio.run(
                    load_service(base_url, key, meter, args.clients, args.warmup, args.seconds)
                )
            check_log(url, SERVE_TENANT, tally)  # while the service still runs
        finally:
            code = server.stop()
    return tally, server.problems(), code


def inproc_side(url: str, admin_url: str, args: argparse.Namespace) -> Tally:
    with psycopg.connect(libpq(admin_url)) as admin:
        tally = asyncio.run(load_inproc(url, admin, args.clients, args.warmup, args.seconds))
    check_log(url, INPROC_TENANT, tally)
    return tally


def table(serve: Tally, inproc: Tally) -> list[str]:
    def row(t: Tally) -> str:
        cpu = " + ".join(f"{1000 * s / max(t.runs + t.untimed, 1):.1f}" for s in t.cpu.values())
        return (
            f"| {t.name} | {t.runs:,} | {t.rate:.1f} | {percentile(t.first, 50):.1f} | "
            f"{percentile(t.first, 99):.1f} | {percentile(t.whole, 50):.1f} | "
            f"{percentile(t.whole, 99):.1f} | {sum(t.errors.values())} | {t.lost} | {cpu} |"
        )

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "n/a"

    return [
        "| side | runs completed | runs/s | first event p50 (ms) | first event p99 (ms) "
        "| answer p50 (ms) | answer p99 (ms) | errors | lost | CPU/run (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        row(serve),
        row(inproc),
        f"| service / in-process | {ratio(serve.runs, inproc.runs)} | "
        f"{ratio(serve.rate, inproc.rate)} | "
        f"{ratio(percentile(serve.first, 50), percentile(inproc.first, 50))} | "
        f"{ratio(percentile(serve.first, 99), percentile(inproc.first, 99))} | "
        f"{ratio(percentile(serve.whole, 50), percentile(inproc.whole, 50))} | "
        f"{ratio(percentile(serve.whole, 99), percentile(inproc.whole, 99))} | | | "
        f"{ratio(sum(serve.cpu.values()), sum(inproc.cpu.values()))} |",
    ]


def notes(serve: Tally, inproc: Tally, problems: list[str], code: int) -> list[str]:
    lines = [
        f"- Service `start` event (sent before the run begins): p50 "
        f"{percentile(serve.start, 50):.1f} ms, p99 {percentile(serve.start, 99):.1f} ms. "
        f"CPU/run: service = client process + server process + its Postgres backends; "
        f"in-process = the one process + its Postgres backends (over all runs, warm-up "
        f"included).",
    ]
    for t in (serve, inproc):
        c = t.check
        lines.append(
            f"- {t.name}: {c['acknowledged']:,} runs acknowledged ({t.untimed} in the warm-up), "
            f"{c['runs in the log']:,} in the log {c['statuses']}; missing {c['missing']}, "
            f"not completed {c['not completed']}, another answer {c['other answer']}, "
            f"in the log but not acknowledged {c['not acknowledged']}; errors "
            f"{dict(t.errors) or 0}; clients hung {t.hung}. During the load {t.other}."
        )
        lines.extend(f"  - {t.name} error: {e}" for e in t.examples)
        lines.extend(f"  - {t.name} lost run: {r}" for r in c["examples"])
    lines.append(
        f"- Service exit status {code}; stderr lines other than start/stop notices: "
        f"{len(problems)}."
    )
    lines.extend(f"  - `{line}`" for line in problems[:20])
    return lines


def record(title: str, figures: list[str]) -> None:
    """Append this run to the section (made if missing), keeping the other sections."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    intro = (
        f"{HEADING}\n\n"
        "`bench/bench_serve.py`: the ask service (`chatledger serve`, uvicorn, one process) "
        "on a loopback port, streaming clients (one other process, each its own "
        "`httpx.AsyncClient`) asking questions "
        "of a scripted agent (bench/_serve_agent.py: one tool call, then an answer; no "
        "model I/O), against the same agent run in process with the same concurrency "
        "(`run_stream_async` on an `AsyncStore`). Both on one throwaway Postgres database. "
        "Latencies are from the client's side, from just before the request; first event "
        "is the run's first event after `start` (the first text delta), answer the `answer` "
        "event (in process: the first callback and the returned result). Lost: acknowledged "
        "runs missing from the log, not completed, or whose last assistant message is not "
        "the answer streamed.\n"
    )
    start = text.find(f"\n{HEADING}\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + intro
        start = text.find(f"\n{HEADING}\n")
    end = text.find("\n## ", start + len(HEADING) + 2)
    end = len(text) if end < 0 else end
    run = "\n".join([f"### {title}", "", *figures]).strip("\n")
    text = text[:end].rstrip("\n") + "\n\n" + run + "\n" + text[end:]
    RESULTS.write_text(text.rstrip("\n") + "\n")


def working_tree() -> str:
    """Whether the code measured is the commit's: uncommitted files of the library."""
    try:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "store", "engine", "service"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    files = [line[3:] for line in changed if line.strip()]
    return f"uncommitted changes in {', '.join(files)}" if files else "clean"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="timed load per side")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients per side")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds first")
    parser.add_argument(
        "--admin-url", default=ADMIN_URL, help="a Postgres URL whose server gets the database"
    )
    parser.add_argument("--record", action="store_true", help="append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    command = "python bench/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])

    facts = machine()
    facts["library working tree at start"] = working_tree()
    with postgres_database("chatledger_bench_serve", args.admin_url) as url:
        with Store.open(url) as store:
            store.migrate()
        print(
            f"service: {args.clients} clients, {args.warmup:g} s warm-up + {args.seconds:g} s ..."
        )
        serve, problems, code = serve_side(url, args.admin_url, args)
        print(
            f"in process: {args.clients} tasks, {args.warmup:g} s warm-up + {args.seconds:g} s ..."
        )
        inproc = inproc_side(url, args.admin_url, args)

    if (now := working_tree()) != facts["library working tree at start"]:
        facts["library working tree at end"] = now  # someone edited the library meanwhile
    figures = [
        "Machine: " + "; ".join(f"{k} {v}" for k, v in facts.items()),
        "",
        f"{args.clients} concurrent clients per side, {args.warmup:g} s warm-up (not timed), "
        f"{args.seconds:g} s timed.",
        "",
        *table(serve, inproc),
        "",
        *notes(serve, inproc, problems, code),
    ]
    print("\n".join(figures))
    if args.record:
        record(f"{facts['when']}: `{command.strip()}`", figures)
    failed = any(sum(t.errors.values()) or t.lost or t.hung for t in (serve, inproc))
    return 1 if failed or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
