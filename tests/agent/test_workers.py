"""Resume workers as real processes: racing, killed, paused (fencing), dead-lettered."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from chatledger.engine.resume import ResumeWorker
from chatledger.store import Ledger, Message, NewEvent, Store, ToolCall
from chatledger.store.schema import runs
from tests.agent import crash_agent

LEASE = 1.0
"""The lease of a worker the test kills or pauses: it runs out soon after."""
LIVE_LEASE = 30.0
"""The lease of a worker that must finish what it claimed: long enough that a worker
starved by a busy machine keeps its claim, so each crashed run is resumed by the
one worker that claimed it. (With a lease shorter than a stall, another worker, or
the same one's next claim, rightly takes the stalled resume over: a rescuer with a
one-second lease once lost its own resume that way, under a full suite, and
claimed it again as a crash.)"""


@pytest.fixture
def database_url(own_database: str) -> str:
    """A database of each test's own: a resume worker claims stale runs store-wide,
    so on the session's shared database it would also take other tests' runs."""
    return own_database


def crashed_run(ledger: Ledger) -> tuple[str, str]:
    """A run whose process died after its first model turn and one tool start."""
    conv = ledger.create_conversation()
    prompt = Message(role="user", content=crash_agent.PROMPT)
    cursor = ledger.runs.start(
        conv.id, owner="dead-process", lease_seconds=LEASE, events=[NewEvent.of_message(prompt)]
    )
    turn = Message(
        role="assistant",
        tool_calls=[
            ToolCall(id=f"{c.lower()}-1", name="weather", arguments={"city": c})
            for c in crash_agent.CITIES
        ],
    )
    _, cursor = ledger.runs.record(cursor, [NewEvent("model.responded"), NewEvent.of_message(turn)])
    ledger.runs.record(cursor, [NewEvent("tool.started", {"callId": "oslo-1", "name": "weather"})])
    return conv.id, cursor.run_id


def wait_until_stale(store: Store) -> None:
    """Poll (on the database's clock) until no running run holds a live lease."""
    deadline = time.monotonic() + 30
    with store.engine.connect() as conn:
        while True:
            now = (
                sa.func.clock_timestamp()
                if conn.dialect.name != "sqlite"
                else sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now")
            )
            live = conn.execute(
                sa.select(sa.func.count()).where(
                    runs.c.status == "running", runs.c.lease_expires_at > now
                )
            ).scalar_one()
            conn.rollback()
            if not live:
                return
            assert time.monotonic() < deadline, "leases never expired"
            time.sleep(0.05)


def worker_process(
    url: str, *extra: str, env: dict[str, str] | None = None, lease: float = LEASE
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chatledger",
            "resume",
            "--agent",
            "tests.agent.crash_agent:agent",
            "--once",
            "--json",
            "--lease-seconds",
            str(lease),
            "--database-url",
            url,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def completed_once(ledger: Ledger, conversation_id: str) -> bool:
    completed = [r for r in ledger.runs.recent(conversation_id=conversation_id) if r.status == "completed"]
    history = ledger.history(conversation_id)
    return len(completed) == 1 and history[-1].content.startswith("Summary: ")


def wait_for(condition, what: str, seconds: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_racing_workers_resume_each_run_exactly_once(
    database_url: str, store: Store, ledger: Ledger
) -> None:
    crashed = [crashed_run(ledger) for _ in range(20)]
    wait_until_stale(store)
    workers = [worker_process(database_url, lease=LIVE_LEASE) for _ in range(4)]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert all(w.returncode == 0 for w in workers), [e for _, e in outputs]
    actions = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    resumed = sorted(a["run"] for a in actions if a["action"] == "resumed")
    assert resumed == sorted(run_id for _, run_id in crashed)
    for conversation_id, run_id in crashed:
        resumes = [r for r in ledger.runs.recent(conversation_id=conversation_id) if r.resumes == run_id]
        assert len(resumes) == 1
        assert completed_once(ledger, conversation_id)


@pytest.mark.slow
def test_a_killed_worker_loses_its_lease_and_another_finishes(
    database_url: str, store: Store, ledger: Ledger
) -> None:
    conversation_id, run_id = crashed_run(ledger)
    wait_until_stale(store)
    doomed = worker_process(database_url, env={"CHATLEDGER_TEST_HANG": "Cairo"})
    wait_for(
        lambda: any(r.resumes == run_id for r in ledger.runs.recent(conversation_id=conversation_id)),
        "the first worker to start the resume",
    )
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.communicate()
    wait_until_stale(store)
    rescuer = ResumeWorker(crash_agent.agent, store, owner="rescuer", lease_seconds=LIVE_LEASE)
    outcomes = asyncio.run(rescuer.run_once())
    assert [o.action for o in outcomes] == ["resumed"]
    assert completed_once(ledger, conversation_id)
    chain = ledger.runs.recent(conversation_id=conversation_id)
    assert [(r.status, r.stage) for r in reversed(chain)] == [
        ("failed", "crashed"),
        ("failed", "crashed"),
        ("completed", None),
    ]


@pytest.mark.slow
def test_a_paused_worker_cannot_append_after_losing_its_lease(
    database_url: str, store: Store, ledger: Ledger
) -> None:
    conversation_id, run_id = crashed_run(ledger)
    wait_until_stale(store)
    paused = worker_process(database_url, env={"CHATLEDGER_TEST_SLOW": "Cairo:3"})
    resume_run: list[str] = []

    def resume_started_tools() -> bool:
        for run in ledger.runs.recent(conversation_id=conversation_id):
            if run.resumes == run_id and any(
                e.kind == "tool.started" for e in ledger.events(run_id=run.id)
            ):
                resume_run.append(run.id)
                return True
        return False

    wait_for(resume_started_tools, "the first worker to start its tools")
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        wait_until_stale(store)
        taker = ResumeWorker(crash_agent.agent, store, owner="taker", lease_seconds=LIVE_LEASE)
        assert [o.action for o in asyncio.run(taker.run_once())] == ["resumed"]
        taken_over = ledger.events(run_id=resume_run[0])
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    out, _err = paused.communicate(timeout=60)
    assert ledger.events(run_id=resume_run[0]) == taken_over, "the paused worker appended"
    assert completed_once(ledger, conversation_id)
    outcome = json.loads(out.splitlines()[-1])
    assert outcome["action"] == "failed"
    assert "is not leased to worker" in outcome["detail"]


@pytest.mark.slow
def test_a_run_crashing_on_every_attempt_is_dead_lettered(
    database_url: str, store: Store, ledger: Ledger
) -> None:
    conversation_id, _run_id = crashed_run(ledger)
    wait_until_stale(store)
    # The first resume crashes its worker too: now the chain has crashed twice.
    dying = worker_process(
        database_url, "--max-attempts", "2", env={"CHATLEDGER_TEST_EXIT": "Oslo"}
    )
    dying.communicate(timeout=60)
    assert dying.returncode == 9
    wait_until_stale(store)
    final = worker_process(database_url, "--max-attempts", "2")
    out, _ = final.communicate(timeout=60)
    assert [json.loads(line)["action"] for line in out.splitlines()] == ["attention"]
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "chatledger",
            "runs",
            "--tenant",
            ledger.tenant,
            "--status",
            "failed",
            "--attention",
            "--json",
            "--database-url",
            database_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = json.loads(listed.stdout)
    assert len(rows) == 1 and "crashed 2 times" in rows[0]["attention"]
    assert not any(r.status == "completed" for r in ledger.runs.recent(conversation_id=conversation_id))


def test_a_crash_inside_a_tool_that_must_not_rerun_needs_attention(
    store: Store, ledger: Ledger
) -> None:
    from chatledger.engine import Agent, tool
    from chatledger.engine.providers.scripted import ScriptedModel

    @tool(name="weather", rerun=False)
    def charge_card(city: str) -> str:
        """Pretend this moves money."""
        return city

    conversation_id, run_id = crashed_run(ledger)  # weather oslo-1 started, never finished
    wait_until_stale(store)
    worker = ResumeWorker(
        Agent(ScriptedModel(["never"]), tools=[charge_card]), store, lease_seconds=LEASE
    )
    (outcome,) = asyncio.run(worker.run_once())
    assert outcome.action == "attention"
    assert outcome.uncertain == ["oslo-1 (weather)"]
    run = ledger.runs.get(run_id)
    assert run.attention is not None and "must not run twice" in run.attention
    assert not any(r.resumes == run_id for r in ledger.runs.recent(conversation_id=conversation_id))
