"""`Agent`: replays a conversation's repaired history into a model run.

```python
agent = Agent(model, instructions="Be brief.", tools=[lookup])
result = agent.run(store.tenant("acme"), "What is the weather?")
result = agent.run(store.tenant("acme"), "And tomorrow?", conversation_id=result.conversation_id)
```

Every step of a run is recorded as events before the loop moves on (see
`engine._run`), so a process killed at any point leaves an exact partial, and
a failed run raises `RunError` carrying it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from chatledger.engine._run import Run
from chatledger.engine._values import (
    Guard,
    Hit,
    HitFilter,
    Instructions,
    MessageCallback,
    Result,
    Retriever,
    RunContext,
    Source,
    drop_restricted,
)
from chatledger.engine.providers import DeltaCallback, Model
from chatledger.engine.tools import Tool
from chatledger.store import AsyncLedger, HistoryProcessor, Ledger, Message, RunCursor
from chatledger.store._steps import Steps
from chatledger.store.history import instructions_digest

__all__ = ["Agent", "Hit", "Result", "RunContext", "Source"]


class Agent:
    """A model, its instructions and tools, and the rules of a run.

    Args:
        model: any `chatledger.engine.providers.Model`.
        instructions: static instructions, first in the system message.
        instructions_fn: dynamic instructions, resolved once per run and
            placed after the static text and a blank line (empty adds nothing).
        tools: functions or `Tool`s the model may call.
        history_processor: applied once per run to the replayed history and
            the prompt, before repair (e.g. `trim_history(50)`). Any
            `list[Message] -> list[Message]` callable: it may copy, redact or
            rebuild messages, the prompt included, but its output must still
            end with a user message in the prompt's place (followed, on a
            resume, by no more than the failed run's turns), or the run fails
            at stage `processor` before any model request.
        guard: sees only the current prompt, before anything is written (on a
            resume, the resumed run's prompt, read from the log); raising
            rejects the run with `RunError` at stage `guard`.
        retriever: sees only the current prompt; its hits are given to the
            model as context and become the result's retrieval sources.
        context_filter: chooses which hits reach the model and the sources.
            Hits classified `RESTRICTED` are dropped first, whatever the
            filter (the default, `drop_restricted`, does only that); `None`
            opts out of every filter and lets every hit through.
        max_requests: the bound on model requests in one run.
        max_invalid_calls: how many invalid tool calls the model may correct.
        tool_choice: passed to the model with every request that offers
            tools: `"auto"`, `"required"`, `"none"` or a tool's name; `None`
            leaves it to the provider's default.
        settings: provider settings sent with every request (`temperature`,
            `max_tokens`, ...), as the model's provider names them.
    """

    def __init__(
        self,
        model: Model,
        *,
        instructions: str = "",
        instructions_fn: Instructions | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        history_processor: HistoryProcessor | None = None,
        guard: Guard | None = None,
        retriever: Retriever | None = None,
        context_filter: HitFilter | None = drop_restricted,
        max_requests: int = 25,
        max_invalid_calls: int = 3,
        tool_choice: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.instructions = instructions
        self.instructions_fn = instructions_fn
        self.tools = {t.name: t for t in (x if isinstance(x, Tool) else Tool(x) for x in tools)}
        self.history_processor = history_processor
        self.guard = guard
        self.retriever = retriever
        self.context_filter = context_filter
        self.max_requests = max_requests
        self.max_invalid_calls = max_invalid_calls
        self.tool_choice = tool_choice
        self.settings = settings or {}

    async def resolve_instructions(self, context: RunContext) -> str:
        """The run's instructions: static text, then the dynamic part after a blank line."""
        dynamic = ""
        if self.instructions_fn is not None:
            value = self.instructions_fn(context)
            dynamic = await value if inspect.isawaitable(value) else value
        return "\n\n".join(p for p in (self.instructions, dynamic) if p)

    @staticmethod
    def digest(instructions: str) -> str:
        """The sha256 of the instructions, as `run.started` records it.

        Informational: runs and audits compute it with
        `store.history.instructions_digest`, so overriding this changes neither.
        """
        return instructions_digest(instructions)

    async def run_async(
        self,
        ledger: Ledger | AsyncLedger,
        prompt: str,
        conversation_id: str | None = None,
        *,
        history: Sequence[tuple[str, str]] | None = None,
        run_id: str | None = None,
        owner: str = "agent",
        lease_seconds: float = 60.0,
    ) -> Result:
        """Run the agent on a conversation of `ledger` (a `Ledger` or `AsyncLedger`).

        With `conversation_id`, the run continues that conversation, which
        must exist in the ledger's tenant: an id that was never created and an
        id of another tenant both raise `store.NotFoundError`, before anything
        is written (to use an id of your own, create it first with
        `ledger.create_conversation(conversation_id=...)`). Without it, a new
        conversation is created. With `history` (flat `(role, text)` pairs,
        untrusted), the run continues that history instead of the ledger's,
        as `run_with_history` does.

        Args:
            ledger: the tenant's ledger the run reads and records in.
            prompt: the user's message for this run.
            conversation_id: the conversation to continue; `None` opens a
                new one.
            history: flat `(role, text)` pairs the caller brings (untrusted),
                continued instead of the ledger's history.
            run_id: the new run's id (a UUID), for a caller that mints its
                own; by default one is minted.
            owner: the lease owner recorded on the run (a worker's name), so
                `chatledger runs` tells who holds it.
            lease_seconds: how long the run's lease lasts without renewal;
                the run renews it while it works, and a resume worker may
                take a run whose lease has run out.

        Raises:
            RunError: the run failed, was canceled or rejected by the guard.
            store.NotFoundError: `conversation_id` names no conversation of
                this tenant (the store's own error, not wrapped: the request
                was refused before a run began).
        """
        return await Run(
            self, Steps(ledger), prompt, conversation_id, history, run_id, owner, lease_seconds
        ).execute()

    async def run_stream_async(
        self,
        ledger: Ledger | AsyncLedger,
        prompt: str,
        conversation_id: str | None = None,
        *,
        on_delta: DeltaCallback,
        on_message: MessageCallback | None = None,
        on_start: Callable[[RunCursor], Awaitable[None] | None] | None = None,
        history: Sequence[tuple[str, str]] | None = None,
        run_id: str | None = None,
        owner: str = "agent",
        lease_seconds: float = 60.0,
    ) -> Result:
        """`run_async`, streaming each model response's deltas to `on_delta`.

        `on_start` receives the run's cursor (its id and its conversation's,
        a new conversation's too) once the log has the run, before the first
        model request. `on_message` receives each message the run records (a
        model turn with its tool calls, a tool result), after the log has it:
        a stream built from them never shows what a crash could lose.

        Args:
            ledger: the tenant's ledger the run reads and records in.
            prompt: the user's message for this run.
            conversation_id: the conversation to continue; `None` opens a
                new one.
            on_delta: called with each fragment of the model's text as it
                streams.
            on_message: called with each message once the log has it.
            on_start: called with the run's cursor once the log has the run.
            history: flat `(role, text)` pairs the caller brings (untrusted),
                continued instead of the ledger's history.
            run_id: the new run's id (a UUID), for a caller that mints its
                own; by default one is minted.
            owner: the lease owner recorded on the run (a worker's name), so
                `chatledger runs` tells who holds it.
            lease_seconds: how long the run's lease lasts without renewal;
                the run renews it while it works, and a resume worker may
                take a run whose lease has run out.
        """
        return await Run(
            self,
            Steps(ledger),
            prompt,
            conversation_id,
            history,
            run_id,
            owner,
            lease_seconds,
            on_delta=on_delta,
            on_message=on_message,
            on_start=on_start,
        ).execute()

    async def run_with_history_async(
        self,
        ledger: Ledger | AsyncLedger,
        history: Sequence[Message],
        prompt: str,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
        owner: str = "agent",
    ) -> Result:
        """Run on a history the caller brings (untrusted).

        The history is sanitized at the boundary (`sanitize_history`),
        recorded with origin `client`, and continued by the run (ADR 0033):
        in the explicit `conversation_id`, which must exist in the ledger's
        tenant (else `store.NotFoundError`, as for `run_async`); else in the
        conversation the history donates, named by its most recent message
        stamped with a `conversation_id`, if that is a conversation of this
        tenant (so a run on a previous result's `messages` continues it);
        else in a new conversation. A stamp naming another tenant's
        conversation, or no conversation, chooses nothing: a new one is
        opened, as for a history without stamps. The supplied history goes on
        an edit branch from the conversation's start, since it is the truth
        for this run. A `run_id` stamp chooses nothing.

        Args:
            ledger: the tenant's ledger the run reads and records in.
            history: the caller's messages, oldest first (untrusted).
            prompt: the user's message for this run.
            conversation_id: the conversation the history goes into (on an
                edit branch); `None` continues the one the history donates, or
                opens a new one.
            run_id: the new run's id (a UUID); by default one is minted.
            owner: the lease owner recorded on the run.
        """
        return await Run(
            self, Steps(ledger), prompt, conversation_id, list(history), run_id, owner, 60.0
        ).execute()

    async def resume_async(
        self,
        ledger: Ledger | AsyncLedger,
        run_id: str,
        *,
        owner: str = "agent",
        lease_seconds: float = 60.0,
        new_run_id: str | None = None,
    ) -> Result:
        """Continue the failed or canceled run `run_id` from its partial.

        The resume runs on a `resume` branch at the failed run's last recorded
        position (its prompt, completed model turns and recorded tool
        results); a call left without a result gets the neutral synthesized
        result, so the model may call it again. Only one resume of a run can
        ever exist (`store.ResumeConflictError` for the others), and it moves
        the head only if the head is still where the failed run started.

        The agent's guard screens the resumed run's prompt, read from the log
        before anything is written, as it screens every prompt: the resume
        may run under another agent or guard than the failed run did. A
        rejection raises `RunError` at stage `guard` and writes nothing, so
        the failed run can still be resumed later.

        Args:
            ledger: the tenant's ledger that holds the failed run.
            run_id: the failed or canceled run to continue.
            owner: the lease owner recorded on the resume.
            lease_seconds: how long the resume's lease lasts without renewal.
            new_run_id: the resume's own run id (a UUID); by default one is
                minted.
        """
        return await Run(
            self, Steps(ledger), "", None, None, new_run_id, owner, lease_seconds, resumes=run_id
        ).execute()

    def resume(
        self,
        ledger: Ledger | AsyncLedger,
        run_id: str,
        *,
        owner: str = "agent",
        lease_seconds: float = 60.0,
        new_run_id: str | None = None,
    ) -> Result:
        """`resume_async` for scripts and jobs (not inside a running event loop)."""
        return asyncio.run(
            self.resume_async(
                ledger, run_id, owner=owner, lease_seconds=lease_seconds, new_run_id=new_run_id
            )
        )

    def run(
        self,
        ledger: Ledger | AsyncLedger,
        prompt: str,
        conversation_id: str | None = None,
        *,
        history: Sequence[tuple[str, str]] | None = None,
        run_id: str | None = None,
        owner: str = "agent",
        lease_seconds: float = 60.0,
    ) -> Result:
        """`run_async` for scripts and jobs (not inside a running event loop)."""
        return asyncio.run(
            self.run_async(
                ledger,
                prompt,
                conversation_id,
                history=history,
                run_id=run_id,
                owner=owner,
                lease_seconds=lease_seconds,
            )
        )

    def run_stream(
        self,
        ledger: Ledger | AsyncLedger,
        prompt: str,
        conversation_id: str | None = None,
        *,
        on_delta: DeltaCallback,
        on_message: MessageCallback | None = None,
        on_start: Callable[[RunCursor], Awaitable[None] | None] | None = None,
        history: Sequence[tuple[str, str]] | None = None,
        run_id: str | None = None,
        owner: str = "agent",
        lease_seconds: float = 60.0,
    ) -> Result:
        """`run_stream_async` for scripts and jobs (not inside a running event loop)."""
        return asyncio.run(
            self.run_stream_async(
                ledger,
                prompt,
                conversation_id,
                on_delta=on_delta,
                on_message=on_message,
                on_start=on_start,
                history=history,
                run_id=run_id,
                owner=owner,
                lease_seconds=lease_seconds,
            )
        )

    def run_with_history(
        self,
        ledger: Ledger | AsyncLedger,
        history: Sequence[Message],
        prompt: str,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
        owner: str = "agent",
    ) -> Result:
        """`run_with_history_async` for scripts and jobs (not inside a running event loop)."""
        return asyncio.run(
            self.run_with_history_async(
                ledger, history, prompt, conversation_id, run_id=run_id, owner=owner
            )
        )
