"""The live tail under stress: racing writers, a consumer killed and restarted.

Eight writer processes append to a few conversations of one tenant, in
transactions held open for a random moment before they commit, some rolled
back (tests/_tail_procs.py). One consumer process follows `ledger.tail` and
stores each page's events with its cursor in one transaction of a sink of its
own; while the writers run, the test kills it with SIGKILL, at a random
moment or just as it starts on a page, and starts it again from the stored
cursor. Then:

* the sink holds every committed event exactly once, and no event of a
  transaction that rolled back;
* the order is commit order: when one transaction's commit returned before
  another began, every event of the first arrived before any of the second,
  and a transaction's events arrived together, in seq order;
* the kills were real: the consumer was restarted at least three times, and
  a kill left events that had committed before it to a later consumer.

On Postgres, `seq` is taken at insert, not commit, so a consumer that paged
by `seq` alone would skip the late commits; on SQLite one writer at a time
holds the write lock, so commit order is seq order.

A Postgres tail holds back what commits after an older transaction that is
still open anywhere on the server, in any database: a stall past DEADLINE
fails the test with the transactions that were open.
"""

from __future__ import annotations

import bisect
import functools
import json
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import sqlalchemy as sa

from chatledger.store import Store
from tests._tail_procs import create_sink

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
SEED = 20_240_611
WRITERS = 8
CONVERSATIONS = 4
# Each writer makes at least LEAST transactions (~0.2 s apart), and goes on
# until the consumer has been killed RESTARTS times (MOST at most).
LEAST, MOST = 15, 400
RESTARTS = 6
MIN_RESTARTS = 3
KILL_AFTER = (0.0, 0.5)  # seconds after a consumer's first page, at random
DEADLINE = 60.0  # for any one wait below; a healthy run takes a fraction of it


def _spawn(role: str, args: dict[str, Any], output: Path) -> subprocess.Popen[bytes]:
    with open(output, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests._tail_procs", role, json.dumps(args)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(
    what: str,
    condition: Callable[[], T],
    explain: Callable[[], str] = lambda: "",
    poll: float = 0.02,
) -> T:
    """Poll `condition` until it is truthy; fail after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE} s waiting for {what}{explain()}")
        time.sleep(poll)


def _sink(path: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(query, params).fetchall()
    finally:
        db.close()


def _output(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _open_transactions(database_url: str) -> str:
    """Postgres: the transactions of the whole cluster that hold the tail's horizon back.

    The snapshot's xmin is the oldest transaction id still running in any
    database of the cluster, so another program's open transaction, even in
    another database, holds every tail's newer events back (`Page.pending`).
    """
    if not database_url.startswith("postgresql"):
        return ""
    url = sa.make_url(database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, datname, state, backend_xid::text, now() - xact_start, left(query, 80)"
            " FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start"
        ).fetchall()
    return "; transactions open in the cluster (pid, database, state, xid, age, query): " + (
        "; ".join(str(r) for r in rows) or "none"
    )


@pytest.mark.slow
def test_killed_consumer_sees_every_commit_once_in_commit_order(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    tenant = f"tail-stress-{uuid.uuid4().hex[:8]}"
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        conversations = [ledger.create_conversation().id for _ in range(CONVERSATIONS)]
        # Each conversation's one event so far: conversation.created.
        created = [e.id for c in conversations for e in ledger.events(conversation_id=c)]
    sink, pages_log, stop = tmp_path / "sink.db", tmp_path / "pages.log", tmp_path / "stop"
    create_sink(sink)

    def consumer(incarnation: int) -> subprocess.Popen[bytes]:
        args = {
            "url": database_url,
            "tenant": tenant,
            "sink": str(sink),
            "incarnation": incarnation,
            "pages_log": str(pages_log),
        }
        return _spawn("consume", args, tmp_path / f"consumer-{incarnation}.out")

    def alive(proc: subprocess.Popen[bytes], incarnation: int) -> None:
        assert proc.poll() is None, (
            f"consumer {incarnation} died: {_output(tmp_path / f'consumer-{incarnation}.out')}"
        )

    def handled_a_page(proc: subprocess.Popen[bytes], incarnation: int) -> bool:
        alive(proc, incarnation)
        query = "SELECT 1 FROM arrivals WHERE incarnation = ? LIMIT 1"
        return bool(_sink(sink, query, incarnation))

    def pages_started(incarnation: int) -> int:
        lines = pages_log.read_text().splitlines()
        return sum(
            1 for line in lines if line.startswith(f"{incarnation} ") and "ready" not in line
        )

    def started_another(proc: subprocess.Popen[bytes], incarnation: int, seen: int) -> bool:
        alive(proc, incarnation)
        return pages_started(incarnation) > seen

    def ready(incarnation: int) -> bool:
        lines = pages_log.read_text().splitlines()
        return any(line.startswith(f"{incarnation} ready ") for line in lines)

    writers = [
        _spawn(
            "write",
            {
                "url": database_url,
                "tenant": tenant,
                "conversation_ids": conversations,
                "writer": w,
                "least": LEAST,
                "most": MOST,
                "seed": SEED + w,
                "out": str(tmp_path / f"writer-{w}.jsonl"),
                "stop": str(stop),
            },
            tmp_path / f"writer-{w}.out",
        )
        for w in range(WRITERS)
    ]
    kills: list[tuple[int, float]] = []  # (incarnation killed, monotonic time just before)
    incarnation = 0
    live = consumer(incarnation)
    stalled = functools.partial(_open_transactions, database_url)
    try:
        # Kill the consumer and start it again while the writers run, each
        # time once it has handled a page: then at a random moment, or (every
        # other time) as soon as it starts on its next page, so that some
        # kills land inside a page's transaction.
        while len(kills) < RESTARTS:
            _wait_for(
                f"consumer {incarnation} to handle a page",
                functools.partial(handled_a_page, live, incarnation),
                stalled,
            )
            if len(kills) % 2:
                started = pages_started(incarnation)
                _wait_for(
                    f"consumer {incarnation} to start on a page",
                    functools.partial(started_another, live, incarnation, started),
                    stalled,
                    poll=0.002,
                )
            else:
                time.sleep(rng.uniform(*KILL_AFTER))  # the random moment of the kill
            alive(live, incarnation)
            assert all(w.poll() is None for w in writers), "a writer ended before the kills did"
            kills.append((incarnation, time.monotonic()))
            live.kill()
            live.wait()
            incarnation += 1
            live = consumer(incarnation)
        stop.touch()

        for w, proc in enumerate(writers):
            assert proc.wait(timeout=DEADLINE) == 0, (
                f"writer {w} failed: {_output(tmp_path / f'writer-{w}.out')}"
            )
        transactions = [
            json.loads(line)
            for w in range(WRITERS)
            for line in (tmp_path / f"writer-{w}.jsonl").read_text().splitlines()
        ]
        assert len(transactions) >= WRITERS * LEAST
        committed = [t for t in transactions if t["committed"]]
        rolled_back = [t for t in transactions if not t["committed"]]
        expected = {e[0] for t in committed for e in t["events"]} | set(created)

        # The last consumer runs until it has handled every committed event.
        def caught_up() -> bool:
            alive(live, incarnation)
            return expected <= {r[0] for r in _sink(sink, "SELECT event_id FROM arrivals")}

        def missing() -> str:
            have = {r[0] for r in _sink(sink, "SELECT event_id FROM arrivals")}
            labels = [t["label"] for t in committed if {e[0] for e in t["events"]} - have]
            return f"; transactions missing: {labels[:20]}{stalled()}"

        _wait_for("the last consumer to handle every committed event", caught_up, missing)
        _wait_for(f"consumer {incarnation} to handle SIGTERM", lambda: ready(incarnation))
        live.terminate()  # SIGTERM: the consumer sets the tail's `stop` and ends cleanly
        assert live.wait(timeout=DEADLINE) == 0, _output(tmp_path / f"consumer-{incarnation}.out")
    finally:
        for proc in [*writers, live]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    arrivals = _sink(
        sink,
        "SELECT n, incarnation, page, seq, event_id, kind, content FROM arrivals ORDER BY n",
    )
    ids = [a[4] for a in arrivals]
    rank = {event_id: i for i, event_id in enumerate(ids)}
    label = f"{backend}, seed {SEED}"

    # (1) Every committed event exactly once; nothing that rolled back.
    duplicates = sorted(event_id for event_id, n in Counter(ids).items() if n > 1)
    assert duplicates == [], f"events delivered twice ({label})"
    rolled_back_ids = {e[0] for t in rolled_back for e in t["events"]}
    assert rolled_back_ids.isdisjoint(ids), f"rolled-back events delivered ({label})"
    assert set(ids) == expected, f"delivered events differ from the committed ones ({label})"
    assert Counter(a[6] for a in arrivals if a[5] == "message.recorded") == Counter(
        e[2] for t in committed for e in t["events"]
    ), f"delivered messages differ from the committed ones ({label})"
    assert sorted(a[4] for a in arrivals if a[5] != "message.recorded") == sorted(created)
    assert {a[5] for a in arrivals} == {"conversation.created", "message.recorded"}
    seqs = {e[0]: e[1] for t in committed for e in t["events"]}
    assert all(a[3] == seqs[a[4]] for a in arrivals if a[4] in seqs), "seqs as appended"

    # (2) Commit order. A transaction's events arrive together, in seq order.
    spans: list[tuple[float, float, int, int, str]] = []  # began, ended, first, last, label
    for t in committed:
        ranks = [rank[e[0]] for e in sorted(t["events"], key=lambda e: e[1])]
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), (
            f"{t['label']}'s events did not arrive together in seq order ({label})"
        )
        spans.append((t["began"], t["ended"], ranks[0], ranks[-1], t["label"]))
    # The conversations were created before any writer began.
    assert max(rank[c] for c in created) < min(s[2] for s in spans)
    # When T1's commit returned before T2 began, all of T1 arrived before T2.
    by_commit = sorted(spans, key=lambda s: s[1])
    ended = [s[1] for s in by_commit]
    latest: list[tuple[int, str]] = []  # the latest-arriving last event of each prefix
    for s in by_commit:
        latest.append(max(latest[-1], (s[3], s[4])) if latest else (s[3], s[4]))
    inversions = []
    for began, _, first, _, name in spans:
        before = bisect.bisect_left(ended, began)  # transactions committed before this began
        if before and latest[before - 1][0] > first:
            inversions.append(f"{latest[before - 1][1]} arrived after {name}")
    assert inversions == [], f"arrivals out of commit order ({label})"
    if backend == "sqlite":  # one writer at a time: commit order is seq order
        assert [a[3] for a in arrivals] == sorted(a[3] for a in arrivals)

    # The tail agrees with itself: from the stored cursor nothing is left, and
    # a fresh read of the whole log is exactly what the sink holds, in order.
    ((stored,),) = _sink(sink, "SELECT after FROM cursor")
    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        assert list(ledger.tail(stored)) == []
        assert [e.id for page in ledger.tail() for e in page.items] == ids

    # (3) The consumer really was killed and restarted, mid-stream.
    incarnations = {a[1] for a in arrivals}
    assert len(kills) >= MIN_RESTARTS, f"only {len(kills)} restarts ({label})"
    assert len(incarnations) >= MIN_RESTARTS, f"only {len(incarnations)} consumers delivered"
    first_arrival = {a[4]: a[1] for a in arrivals}
    # A kill "interrupted" the stream when events that had committed before it
    # were left to a later consumer (its backlog, or a page it was handling).
    interrupted = [
        (k, at)
        for k, at in kills
        if any(t["ended"] < at and first_arrival[t["events"][0][0]] > k for t in committed)
    ]
    assert interrupted, f"no kill left committed events to a later consumer ({label})"
    # Pages a killed consumer got but never stored: kills inside a page's handling.
    lines = [line.split() for line in pages_log.read_text().splitlines()]
    logged = {(int(line[0]), int(line[1])) for line in lines if line[1] != "ready"}
    stored_pages = {(a[1], a[2]) for a in arrivals}
    torn = sorted(logged - stored_pages)
    # The workload did race: on Postgres some transaction took its seqs before
    # another's and committed after it (a late commit, which a tail by seq
    # alone would skip).
    late, earliest = 0, float("inf")  # the earliest commit among the later seqs
    for t in sorted(committed, key=lambda t: -min(e[1] for e in t["events"])):
        late += earliest < t["ended"]
        earliest = min(earliest, t["ended"])
    if backend == "postgres":
        assert late, "no transaction committed after one with later seqs: the race never happened"
    print(
        f"\n{label}: {len(committed)} committed, {len(rolled_back)} rolled back, "
        f"{len(arrivals)} events, {len(kills)} kills ({len(interrupted)} mid-stream, "
        f"{len(torn)} inside a page), {len(incarnations)} consumers delivered, "
        f"{late} late commits"
    )
