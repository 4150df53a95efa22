"""Live tail lag: from an append's return in a writer to its delivery by `ledger.tail`.

    python bench/bench_tail.py [--seconds 20] [--pace 20] [--quick] [--no-record]

Four writer processes (multiprocessing, spawn) append one message at a time
to conversations of their own in one tenant (a new conversation every 20
messages), at full speed or `--pace` messages per second each, for
`--seconds`. Each writer notes `time.monotonic()` when each append returns
(one clock for every process on Linux). A consumer process follows the
tenant with `ledger.tail(follow=True)` and notes `time.monotonic()` when each
page arrives; an event's lag is its page's arrival less its append's return.
The figures: p50, p99 and max lag over every event the writers appended,
how many were delivered (and how many twice, or out of a writer's order).

Runs: Postgres with the store's defaults (writers send `NOTIFY` from their
notifier thread; the tail LISTENs, `idle_seconds=5`); Postgres with writers
opened `notify=False` and the tail at `idle_seconds=0.5` (it then finds
writes on its re-reads alone: the idle one, and the quick ones while a page
holds events back behind an open transaction); SQLite (one writer at a
time holds the file's lock; the tail checks `PRAGMA data_version` every
`poll_seconds=0.05`). Each at full speed and paced. Then writer throughput
alone (no tail), 4 writers on Postgres with notify on and off, alternating,
to show what the notifier costs a writer.

Each row says how much CPU went to other processes on the machine while it
ran (busy CPU from /proc/stat less the benchmark's clients and, on Postgres,
less the backends serving them): the figures are only as quiet as that.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CLOCK_TICKS,
    client_cpu,
    cpu_spent,
    libpq,
    machine,
    postgres_database,
    server_cpu,
    with_application_name,
    write_section,
)

RESULTS = str(Path(__file__).resolve().parent / "RESULTS.md")
SECTION = "Live tail lag"
TENANT = "bench-tail"
WRITERS = 4
PER_CONVERSATION = 20
DRAIN_SECONDS = 60.0  # the most a consumer may take to deliver what was appended


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


# -- the processes ----------------------------------------------------------------------


def _writer(
    url: str,
    notify: bool,
    index: int,
    seconds: float,
    pace: float | None,
    start: Any,
    leave: Any,
    results: Any,
) -> None:
    from bench.bench_store import MESSAGES
    from chatledger.store import Store, new_id

    store = Store.open(url, message_cache=0, notify=notify)
    ledger = store.tenant(TENANT)
    conv = ""

    def turn(k: int) -> list[str]:
        nonlocal conv
        if k % PER_CONVERSATION == 0:  # a new conversation with its first message
            conv = new_id()
            done = ledger.append_messages(conv, [MESSAGES[k % 4]], create=True)
        else:
            done = ledger.append_messages(conv, [MESSAGES[k % 4]])
        return [e.id for e in done.events]

    turn(0)  # connections open before the clock starts; not measured
    start.wait()
    cpu = client_cpu()
    began = time.monotonic()
    deadline = began + seconds
    commits: list[tuple[str, float]] = []  # (event id, monotonic time its append returned)
    n = 1
    while (now := time.monotonic()) < deadline:
        if pace is not None and now < began + (n - 1) / pace:
            time.sleep(began + (n - 1) / pace - now)
            continue
        ids = turn(n)
        returned = time.monotonic()
        commits += [(event_id, returned) for event_id in ids]
        n += 1
    elapsed = time.monotonic() - began
    results.put((index, n - 1, elapsed, client_cpu() - cpu, commits))
    leave.wait()
    store.close()


def _consumer(url: str, idle_seconds: float, ready: Any, go: Any, wanted: Any, out: Any) -> None:
    from chatledger.store import Store

    store = Store.open(url)
    ledger = store.tenant(TENANT)
    stop = threading.Event()
    arrived: dict[str, float] = {}
    order: list[str] = []
    twice = 0
    pages = 0
    held = 0  # pages that said newer events were held back behind an open transaction
    cpu: list[float] = []

    def watch() -> None:
        # The CPU of this process from the writers' start; then stop once every
        # event the writers reported has arrived (or after DRAIN_SECONDS).
        go.wait()
        cpu.append(client_cpu())
        expected: set[str] = wanted.get()
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            if len(arrived) >= len(expected) and expected <= arrived.keys():
                break
            time.sleep(0.05)
        cpu.append(client_cpu())
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for page in ledger.tail(follow=True, idle_seconds=idle_seconds, stop=stop):
        now = time.monotonic()
        for event in page.items:
            if event.id in arrived:
                twice += 1
            else:
                arrived[event.id] = now
                order.append(event.id)
        pages += 1
        held += page.pending
        ready.set()
    watcher.join()
    store.close()
    out.put((arrived, order, twice, pages, held, cpu[-1] - cpu[0]))


class LongestTransaction:
    """The longest-running writing transaction seen on the server, ten looks a second.

    Every Postgres tail holds back events behind the oldest writing
    transaction open anywhere on the server (docs/tail.md): this says how
    long such a transaction stayed open during a run.
    """

    def __init__(self, url: str) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._conn = psycopg.connect(libpq(url), autocommit=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            row = self._conn.execute(
                "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
                "FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
            ).fetchone()
            self.longest = max(self.longest, float(row[0]) if row else 0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


# -- one measured run ---------------------------------------------------------------------


@dataclass
class Run:
    label: str
    settings: str
    rate: float
    committed: int
    delivered: int
    twice: int
    out_of_order: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    pages: int
    held: int
    longest_writer: float | None
    cpu_ours: float
    cpu_others: float
    load: float


def _spawn_writers(
    ctx: Any, url: str, notify: bool, seconds: float, pace: float | None
) -> tuple[list[Any], Any, Any, Any]:
    start, leave, results = ctx.Barrier(WRITERS + 1), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, notify, i, seconds, pace, start, leave, results))
        for i in range(WRITERS)
    ]
    for p in procs:
        p.start()
    return procs, start, leave, results


def _cpu_snapshot(admin: psycopg.Connection[Any] | None, app: str) -> dict[int, float]:
    return {} if admin is None else server_cpu(admin, app)


def lag_run(
    url: str,
    label: str,
    *,
    notify: bool,
    idle_seconds: float,
    seconds: float,
    pace: float | None,
) -> Run:
    """Four writers and one following consumer; the lag of every appended event."""
    from chatledger.store import Message, Store

    postgres = url.startswith("postgresql")
    app = f"bench_tail_{uuid.uuid4().hex[:6]}"
    if postgres:
        url = with_application_name(url, app)
    ctx = multiprocessing.get_context("spawn")
    ready, go, wanted, out = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_consumer, args=(url, idle_seconds, ready, go, wanted, out))
    consumer.start()
    # An event the consumer must deliver first: once it has, it is following.
    with Store.open(url) as store:
        store.tenant(TENANT).append_messages(
            str(uuid.uuid4()), [Message(role="user", content="ready")], create=True
        )
    if not ready.wait(timeout=120):
        consumer.kill()
        raise RuntimeError("the consumer did not start following within 120 s")

    procs, start, leave, results = _spawn_writers(ctx, url, notify, seconds, pace)
    admin = psycopg.connect(libpq(url)) if postgres else None
    watch: LongestTransaction | None = None
    try:
        start.wait(timeout=300)
        go.set()
        watch = LongestTransaction(url) if postgres else None
        load = os.getloadavg()[0]
        busy, ours_before = machine_busy(), _cpu_snapshot(admin, app)
        got = [results.get(timeout=seconds + 120) for _ in procs]
        server = cpu_spent(ours_before, _cpu_snapshot(admin, app))
        busy = machine_busy() - busy
        commits = {event_id: t for *_, c in got for event_id, t in c}
        wanted.put(set(commits))
        arrived, order, twice, pages, held, consumer_cpu = out.get(timeout=DRAIN_SECONDS + 60)
    finally:
        leave.set()
        for p in [*procs, consumer]:
            p.join(timeout=60)
        if admin is not None:
            admin.close()
        if watch is not None:
            watch.close()

    lags = sorted((arrived[i] - t) * 1000 for i, t in commits.items() if i in arrived)
    # Each writer's appends commit one after another: the tail must give them in that order.
    position = {event_id: k for k, event_id in enumerate(order)}
    out_of_order = 0
    for *_, c in got:
        seen = [position[i] for i, _ in c if i in position]
        out_of_order += sum(1 for a, b in itertools.pairwise(seen) if b < a)
    ours = sum(cpu for _, _, _, cpu, _ in got) + consumer_cpu + server
    pace_text = "full speed" if pace is None else f"{pace:g} msg/s each"
    return Run(
        label=label,
        settings=pace_text,
        rate=sum(n / elapsed for _, n, elapsed, _, _ in got),
        committed=len(commits),
        delivered=len(lags),
        twice=twice,
        out_of_order=out_of_order,
        p50_ms=statistics.median(lags) if lags else float("nan"),
        p99_ms=statistics.quantiles(lags, n=100)[98] if len(lags) > 1 else float("nan"),
        max_ms=lags[-1] if lags else float("nan"),
        pages=pages,
        held=held,
        longest_writer=None if watch is None else watch.longest,
        cpu_ours=ours,
        cpu_others=max(busy - ours, 0.0),
        load=load,
    )


@dataclass
class Throughput:
    rate: float
    transactions_per_append: float
    cpu_others: float
    load: float


def _commits(url: str) -> int:
    """Transactions committed so far in the database (`pg_stat_database`)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _gone(url: str, app: str) -> None:
    """Wait (at most 10 s) until no backend serves `app`: each reports its counts as it ends."""
    deadline = time.monotonic() + 10
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
            ).fetchone()
            if not row or not row[0]:
                return
            time.sleep(0.05)


def throughput_run(url: str, *, notify: bool, seconds: float) -> Throughput:
    """Four writers, no tail: messages per second and server transactions per append
    (a writer's own, plus its notifier's)."""
    app = f"bench_tail_w_{uuid.uuid4().hex[:6]}"
    url = with_application_name(url, app)
    ctx = multiprocessing.get_context("spawn")
    committed = _commits(url)
    procs, start, leave, results = _spawn_writers(ctx, url, notify, seconds, None)
    with psycopg.connect(libpq(url)) as admin:
        try:
            start.wait(timeout=300)
            load = os.getloadavg()[0]
            busy, before = machine_busy(), server_cpu(admin, app)
            got = [results.get(timeout=seconds + 120) for _ in procs]
            server = cpu_spent(before, server_cpu(admin, app))
            busy = machine_busy() - busy
        finally:
            leave.set()
            for p in procs:
                p.join(timeout=60)
    _gone(url, app)
    appends = sum(n for _, n, _, _, _ in got) + WRITERS  # and each writer's first, untimed
    ours = sum(cpu for _, _, _, cpu, _ in got) + server
    return Throughput(
        rate=sum(n / elapsed for _, n, elapsed, _, _ in got),
        transactions_per_append=(_commits(url) - committed) / appends,
        cpu_others=max(busy - ours, 0.0),
        load=load,
    )


# -- the report ---------------------------------------------------------------------------


def migrated(url: str) -> str:
    from chatledger.store import Store

    with Store.open(url) as store:
        store.migrate()
    return url


def lag_table(runs: list[Run]) -> list[str]:
    rows = [
        "| backend and tail | writers | writers' msg/s | events appended | delivered "
        "| p50 lag ms | p99 lag ms | max lag ms | pages (held back) "
        "| longest writing transaction on the server, s | CPU s: ours / others | load at start |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        delivered = f"{r.delivered}"
        if r.twice or r.out_of_order or r.delivered != r.committed:
            delivered += f" ({r.twice} twice, {r.out_of_order} out of order)"
        longest = "-" if r.longest_writer is None else f"{r.longest_writer:.2f}"
        rows.append(
            f"| {r.label} | {WRITERS}, {r.settings} | {r.rate:.0f} | {r.committed} | {delivered} "
            f"| {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.max_ms:.1f} | {r.pages} ({r.held}) "
            f"| {longest} | {r.cpu_ours:.0f} / {r.cpu_others:.0f} | {r.load:.2f} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each lag run (default 20)")
    parser.add_argument(
        "--pace", type=float, default=20.0, help="msg/s of each writer in the paced runs"
    )
    parser.add_argument(
        "--throughput-seconds", type=float, default=10.0, help="each throughput round"
    )
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds of each side")
    parser.add_argument("--quick", action="store_true", help="3 s runs, one round: a smoke run")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.throughput_seconds, args.rounds = 3.0, 2.0, 1
    details = machine()
    began = time.monotonic()
    runs: list[Run] = []
    rates: dict[bool, list[Throughput]] = {True: [], False: []}

    def show(run: Run) -> None:
        print(*lag_table([run])[2:], flush=True)

    default_pg = "Postgres, defaults (NOTIFY; tail `idle_seconds=5`)"
    quiet_pg = "Postgres, writers `notify=False` (tail `idle_seconds=0.5`)"
    sqlite = "SQLite (tail `poll_seconds=0.05`)"
    for pace in (None, args.pace):
        for label, notify, idle in ((default_pg, True, 5.0), (quiet_pg, False, 0.5)):
            with postgres_database("bench_tail") as url:
                runs.append(
                    lag_run(
                        migrated(url),
                        label,
                        notify=notify,
                        idle_seconds=idle,
                        seconds=args.seconds,
                        pace=pace,
                    )
                )
                show(runs[-1])
        with tempfile.TemporaryDirectory() as tmp:
            url = migrated(f"sqlite:///{os.path.join(tmp, 'tail.db')}")
            runs.append(
                lag_run(url, sqlite, notify=True, idle_seconds=5.0, seconds=args.seconds, pace=pace)
            )
            show(runs[-1])

    with postgres_database("bench_tail_writers") as url:
        migrated(url)
        for r in range(args.rounds):
            for notify in (True, False) if r % 2 == 0 else (False, True):
                rates[notify].append(
                    throughput_run(url, notify=notify, seconds=args.throughput_seconds)
                )
                print(f"writers, notify={notify}: {rates[notify][-1]}", flush=True)

    on = statistics.median(r.rate for r in rates[True])
    off = statistics.median(r.rate for r in rates[False])
    took = (time.monotonic() - began) / 60
    command = "python bench/bench_tail.py" + (" --quick" if args.quick else "")
    body = [
        f"`{command}` ({details['when']}; the whole run took {took:.1f} minutes): four writer "
        f"processes append one message at a time (a new conversation every {PER_CONVERSATION}) "
        f"for {args.seconds:g} s, at full speed or paced; a consumer process follows the "
        "tenant with `ledger.tail(follow=True)`. Lag is the time from an append's return in "
        "its writer to the arrival of the page holding its events in the consumer "
        "(`time.monotonic()` in both, one clock on Linux), over every event appended. "
        "Postgres with `notify=False` writers shows what NOTIFY buys: the tail then finds "
        "writes only by reading again: after `idle_seconds` (0.5 here), or after 10 ms "
        "doubling to 0.5 s while a page holds events back behind an open transaction. "
        "SQLite has one writer at a time, so its four writers take turns at the file's lock.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in details.items()),
        "",
        *lag_table(runs),
        "",
        "CPU s: ours is the writers' and the consumer's processes (and on Postgres the "
        "backends serving them) during the writers' run; others is every other busy second "
        "of the machine in that time (other programs, and Postgres's own background "
        f"processes), out of {os.cpu_count()} per second on this machine. Pages: those the "
        "consumer got; "
        "held back: of those, the ones that said newer events were committed but held back "
        "behind an older open transaction (`pending`). Longest writing transaction: the "
        "oldest transaction holding a transaction id anywhere on the Postgres server, "
        "sampled ten times a second during the run; a tail cannot pass it.",
        "",
        f"Writer throughput with no tail, 4 writers on Postgres at full speed, "
        f"{args.throughput_seconds:g} s rounds alternating which side goes first "
        f"(msg/s, median of {args.rounds}):",
        "",
        "| writers | msg/s | server transactions per append | rounds (msg/s, CPU s of others, "
        "load at start) |",
        "|---|---:|---:|---|",
        *(
            f"| {'notify on (default)' if notify else '`notify=False`'} | "
            f"{statistics.median(r.rate for r in rates[notify]):.0f} | "
            f"{statistics.median(r.transactions_per_append for r in rates[notify]):.2f} | "
            + "; ".join(f"{r.rate:.0f}, {r.cpu_others:.0f}, {r.load:.2f}" for r in rates[notify])
            + " |"
            for notify in (True, False)
        ),
        "",
        f"Notify on / off: {on / off:.3f}x. Server transactions per append: the "
        "database's `xact_commit` over the round (every writer's backend gone) per append; "
        "with notify on, the excess over 1 is the notifiers' `NOTIFY` transactions.",
    ]
    text = "\n".join(body)
    print(text)
    if not args.no_record:
        write_section(RESULTS, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
