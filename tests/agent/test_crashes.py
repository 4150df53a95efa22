"""Real crashes: agent processes killed with SIGKILL, then resumed by workers.

CHATLEDGER_CRASH_TRIALS (default 24) trials per backend. Each starts a real
agent process, kills it at a random moment of its run, and after all are
dead a resume worker finishes every crashed run. Every trial must end with
its conversation completed exactly once, no acknowledged event lost, a head
history the strict provider server accepts, and no tool re-executed whose
result was recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chatledger.engine import ModelRequest
from chatledger.engine.providers.anthropic import AnthropicModel
from chatledger.engine.providers.openai import OpenAIChatModel
from chatledger.engine.resume import ResumeWorker
from chatledger.store import Ledger, Store
from tests.agent import crash_agent
from tests.providers.strict_rules import check_anthropic, check_openai

TRIALS = int(os.environ.get("CHATLEDGER_CRASH_TRIALS", "24"))
PARALLEL = 6
# A live agent renews its lease every third of it; one whose renewal comes late
# is fenced off (its run fails at stage store) and is not resumed. On a loaded
# two-core machine (two suites, six agents) a 0.5 s lease has run out between
# renewals, so this one leaves more than a second of slack: crashed runs wait
# 2 s to be claimed.
LEASE = 2.0


@pytest.fixture
def database_url(own_database: str) -> str:
    """A database of each test's own: a resume worker claims stale runs store-wide,
    so on the session's shared database it would also take other tests' runs."""
    return own_database


@dataclass
class Trial:
    conversation_id: str
    process: subprocess.Popen[str]
    acked: list[int]
    stderr: str = ""


def executions(path: Path) -> list[tuple[str, str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]


def run_trials(url: str, ledger: Ledger, exec_log: Path) -> list[Trial]:
    env = {**os.environ, "CHATLEDGER_TEST_EXECUTIONS": str(exec_log), "PYTHONUNBUFFERED": "1"}
    trials: list[Trial] = []
    rng = random.Random(int(os.environ.get("CHATLEDGER_CRASH_SEED", "7")))
    for start in range(0, TRIALS, PARALLEL):
        batch = []
        for _ in range(min(PARALLEL, TRIALS - start)):
            conv = ledger.create_conversation()
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.agent.crash_agent",
                    url,
                    ledger.tenant,
                    conv.id,
                    str(LEASE),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            batch.append(Trial(conv.id, process, []))
        try:
            kills: list[tuple[float, Trial]] = []
            waiting = list(batch)
            # Each kill fires at its moment while the other processes of the batch are
            # still starting: a kill held until the whole batch had started came, on a
            # loaded machine, after its run had ended (11 of 24 trials crashed).
            while waiting or kills:
                for trial in list(waiting):
                    # Whether it had exited is read before its runs: a process can
                    # start and finish its whole run between the two reads.
                    exited = trial.process.poll() is not None
                    runs = ledger.runs.recent(conversation_id=trial.conversation_id)
                    if runs:
                        # The random moment of the kill, counted from when its run
                        # began as the run records it (this host's clock on both
                        # databases), not from when this loop saw it: on a loaded
                        # machine that is late by more than a run takes.
                        began = runs[-1].started_at.timestamp() - time.time()
                        kills.append((time.monotonic() + began + rng.uniform(0, 0.4), trial))
                        waiting.remove(trial)
                    else:
                        assert not exited, (
                            f"an agent process died before starting its run: "
                            f"{trial.process.communicate()[1]}"
                        )
                kills.sort(key=lambda k: k[0])
                while kills and kills[0][0] <= time.monotonic():
                    _, trial = kills.pop(0)
                    if trial.process.poll() is None:
                        os.kill(trial.process.pid, signal.SIGKILL)
                # Paced by the next kill's moment, or a process's exit, or 50 ms: reads
                # of the runs in a tight loop would take the CPU from the processes
                # starting up.
                pause = 0.05 if not kills else min(0.05, max(0.0, kills[0][0] - time.monotonic()))
                if waiting:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        waiting[0].process.wait(timeout=pause)
                elif kills:
                    time.sleep(pause)  # the moment of the next kill
            for trial in batch:
                out, trial.stderr = trial.process.communicate(timeout=60)
                for line in out.splitlines():
                    if line.startswith("ack "):
                        trial.acked += [int(s) for s in line.split()[1:]]
        finally:  # a failed or timed-out trial leaves no process, and no open pipe, behind
            for trial in batch:
                if trial.process.poll() is None:
                    trial.process.kill()
                trial.process.communicate()
        trials += batch
    return trials


async def resume_all(worker: ResumeWorker, ledger: Ledger, conversations: list[str]) -> None:
    deadline = time.monotonic() + 120
    while any(ledger.runs.recent(conversation_id=c, status="running") for c in conversations):
        assert time.monotonic() < deadline, "crashed runs were not all resumed"
        if not await worker.run_once(limit=100):
            await asyncio.sleep(0.05)  # leases expire on the database's clock


def strict_providers_accept(history: list) -> None:  # type: ignore[type-arg]
    request = ModelRequest(messages=history)
    openai = OpenAIChatModel("gpt-test", api_key="k", base_url="http://127.0.0.1:9/v1")
    body = json.loads(openai.prepare(request).body)
    assert check_openai({"authorization": "Bearer k"}, body, "k") is None
    anthropic = AnthropicModel("claude-test", api_key="k", base_url="http://127.0.0.1:9")
    body = json.loads(anthropic.prepare(request).body)
    assert check_anthropic({"x-api-key": "k", "anthropic-version": "2023-06-01"}, body, "k") is None


@pytest.fixture
def exec_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "executions.log"
    monkeypatch.setenv("CHATLEDGER_TEST_EXECUTIONS", str(path))
    yield path


@pytest.mark.slow
def test_killed_agents_are_resumed_exactly_once(
    database_url: str, store: Store, ledger: Ledger, exec_log: Path
) -> None:
    trials = run_trials(database_url, ledger, exec_log)
    conversations = [t.conversation_id for t in trials]
    worker = ResumeWorker(crash_agent.agent, store, owner="crash-test-worker", lease_seconds=5)
    asyncio.run(resume_all(worker, ledger, conversations))

    ran = executions(exec_log)
    crashed = [
        t
        for t in trials
        if any(r.stage == "crashed" for r in ledger.runs.recent(conversation_id=t.conversation_id))
    ]
    assert len(crashed) >= len(trials) // 2, "most trials must really crash mid-run"
    for trial in trials:
        conv = trial.conversation_id
        runs = ledger.runs.recent(conversation_id=conv)
        completed = [r for r in runs if r.status == "completed"]
        assert len(completed) == 1, (
            f"{conv}: {[(r.status, r.stage, r.error) for r in runs]}; "
            f"its agent process wrote: {trial.stderr[-2000:]}"
        )
        history = ledger.history(conv)
        assert [m.content for m in history].count(crash_agent.PROMPT) == 1
        assert history[-1].role == "assistant" and history[-1].content.startswith("Summary: ")
        assert sorted(history[-1].content.removeprefix("Summary: ").split("; ")) == [
            "Cairo: fine",
            "Lima: fine",
            "Oslo: fine",
        ]
        logged = {e.seq for e in ledger.events(conversation_id=conv)}
        assert set(trial.acked) <= logged, "an acknowledged event was lost"
        strict_providers_accept(history)
        # No tool re-executed whose result was recorded: a city answered in one
        # run is never executed again by a later run of the chain.
        by_run: dict[str, set[str]] = {}
        for run in runs:
            by_run[run.id] = {
                e.message.content.split(":")[0]
                for e in ledger.events(run_id=run.id)
                if e.message is not None
                and e.message.role == "tool"
                and e.origin == "run"
                and not e.message.content.startswith(crash_agent.NO_RESULT)
            }
        chain = sorted(runs, key=lambda r: r.started_at)
        for i, run in enumerate(chain):
            answered_before = set().union(*(by_run[r.id] for r in chain[:i]))
            again = {city for c, city, run_id in ran if c == conv and run_id == run.id}
            assert not again & answered_before, f"{conv}: re-executed {again & answered_before}"
