"""The resume-after-crash worker.

A run whose process died keeps status `running` until its lease expires (the
lease is renewed by a live run's heartbeat, on the database's clock). A worker
then claims it (Postgres: `FOR UPDATE SKIP LOCKED`; SQLite: one writer
transaction), which makes the claim a new attempt: the fencing token that
shuts out the dead process if it was only paused. The worker records the run
as failed at stage `crashed` and continues it with `Agent.resume`, on a resume
branch that can exist only once per run, so each crashed run is continued
exactly once however many workers race.

A run whose partial shows a tool started but never finished, for a tool the
agent declares must not run twice (`protected_tools`), is not resumed
automatically: it is marked as needing attention, with the uncertain calls
named. So is a run whose resume chain already crashed `max_attempts` times.

`resume_run` takes one run by id, now: a crashed one as the worker would, a
failed or canceled one (a client that disconnected) straight to
`Agent.resume`; the worker never picks those up itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from chatledger.engine._errors import RunError
from chatledger.engine._values import Result
from chatledger.engine.agent import Agent
from chatledger.store import LeaseError, Ledger, ResumeConflictError, Run, RunCursor, Store

__all__ = ["ResumeOutcome", "ResumeWorker", "uncertain_tool_calls"]


@dataclass(frozen=True)
class ResumeOutcome:
    """What the worker did with one claimed run."""

    run_id: str
    conversation_id: str
    action: Literal["resumed", "failed", "attention", "skipped"]
    detail: str = ""
    result: Result | None = None
    uncertain: list[str] = field(default_factory=list)


def uncertain_tool_calls(ledger: Ledger, run_id: str) -> list[tuple[str, str]]:
    """The (call id, tool name) pairs a run started but never recorded a result for."""
    started: dict[str, str] = {}
    for event in ledger.events(run_id=run_id):
        if event.kind == "tool.started":
            started[event.payload["callId"]] = event.payload["name"]
        elif event.kind == "tool.finished":
            started.pop(event.payload["callId"], None)
    return list(started.items())


class ResumeWorker:
    """Claims crashed runs of every tenant and continues each exactly once.

    Args:
        agent: the agent the crashed runs belong to.
        store: the store to serve.
        owner: this worker's name in leases (default: host and process).
        lease_seconds: how long a claim or a run's lease lasts unrenewed.
        max_attempts: how many crashes a run's resume chain may have before
            it is given up and marked as needing attention.
        protected_tools: tools that must not be re-run automatically, besides
            the agent's tools declared with `rerun=False`.
    """

    def __init__(
        self,
        agent: Agent,
        store: Store,
        *,
        owner: str | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 3,
        protected_tools: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.agent = agent
        self.store = store
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.protected_tools = frozenset(protected_tools) | {
            t.name for t in agent.tools.values() if not t.rerun
        }

    async def run_once(self, limit: int = 10) -> list[ResumeOutcome]:
        """Handle up to `limit` stale runs, claiming one at a time; return what happened.

        One at a time, so a claim's lease never runs out while it waits behind
        the others (and other workers share the backlog).
        """
        outcomes = []
        for _ in range(limit):
            claimed = await self._claim_one(self.store.claim_stale_runs)
            if not claimed:
                break
            ((run, cursor),) = claimed
            try:
                outcomes.append(await self._handle(run, cursor))
            except LeaseError as error:
                outcomes.append(ResumeOutcome(run.id, run.conversation_id, "skipped", str(error)))
        return outcomes

    async def resume_run(self, ledger: Ledger, run_id: str) -> ResumeOutcome | None:
        """Resume the run `run_id` of `ledger`'s tenant now, whatever its state allows.

        A running run is claimed only once its lease has run out (then handled as
        a crashed one); None while a live lease holds it. A failed or canceled
        run is resumed with `Agent.resume`. A completed run raises
        `store.RunStateError`, as does any run the store will not resume.
        """
        run = await asyncio.to_thread(ledger.runs.get, run_id)
        if run.status == "running":
            claimed = await self._claim_one(ledger.runs.claim_stale, run_id=run_id)
            if claimed:
                return await self._handle(*claimed[0])
            run = await asyncio.to_thread(ledger.runs.get, run_id)
            if run.status == "running":
                return None  # its lease is live
        return await self._resumed(ledger, run)

    async def serve(self, *, poll_seconds: float = 1.0, stop: asyncio.Event | None = None) -> None:
        """Keep claiming and resuming until `stop` is set."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            if not await self.run_once():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=poll_seconds)

    async def _claim_one(
        self, claim: Callable[..., list[tuple[Run, RunCursor]]], **which: str
    ) -> list[tuple[Run, RunCursor]]:
        """At most one stale run by `claim`, leased to this worker on its terms."""
        return await asyncio.to_thread(
            claim,
            owner=self.owner,
            limit=1,
            lease_seconds=self.lease_seconds,
            max_attempts=self.max_attempts,
            **which,
        )

    async def _handle(self, run: Run, cursor: RunCursor) -> ResumeOutcome:
        ledger = self.store.tenant(run.tenant)
        crashes = await asyncio.to_thread(_chain_length, ledger, run)
        uncertain = await asyncio.to_thread(uncertain_tool_calls, ledger, run.id)
        protected = [f"{call} ({name})" for call, name in uncertain if name in self.protected_tools]
        attention = None
        if crashes >= self.max_attempts:
            attention = (
                f"its resume chain crashed {crashes} times (the bound is {self.max_attempts}); "
                f"a person should look at it"
            )
        elif protected:
            attention = (
                f"tools that must not run twice were started but never finished: "
                f"{', '.join(protected)}; check their side effects, then resume it by hand"
            )
        await asyncio.to_thread(
            ledger.runs.fail,
            cursor,
            stage="crashed",
            error=f"the process holding the run stopped; claimed by {self.owner} "
            f"at attempt {cursor.attempt}",
            attention=attention,
        )
        if attention is not None:
            return ResumeOutcome(
                run.id, run.conversation_id, "attention", attention, uncertain=protected
            )
        return await self._resumed(ledger, run)

    async def _resumed(self, ledger: Ledger, run: Run) -> ResumeOutcome:
        """Continue the ended run `run` with the agent."""
        try:
            result = await self.agent.resume_async(
                ledger, run.id, owner=self.owner, lease_seconds=self.lease_seconds
            )
        except ResumeConflictError as error:
            return ResumeOutcome(run.id, run.conversation_id, "skipped", str(error))
        except RunError as error:
            return ResumeOutcome(run.id, run.conversation_id, "failed", str(error))
        return ResumeOutcome(run.id, run.conversation_id, "resumed", result=result)


def _chain_length(ledger: Ledger, run: Run) -> int:
    """How many runs the resume chain ending at `run` has (each one crashed or failed)."""
    length = 1
    current = run
    while current.resumes is not None:
        current = ledger.runs.get(current.resumes)
        length += 1
    return length
