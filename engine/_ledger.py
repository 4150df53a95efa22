"""The ledger as the run loop sees it: `LedgerLike`, one async face of either kind.

The run loop is async. An `AsyncLedger` is a `LedgerLike` as it is; a sync
`Ledger` is wrapped in `ThreadedLedger`, whose calls run in a worker thread
so they never block the loop. `as_async` picks one, so every call the loop
makes is a typed method call that `mypy --strict` checks.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, cast

from chatledger.store import (
    AsyncLedger,
    Conversation,
    Event,
    Ledger,
    Message,
    NewEvent,
    Position,
    Run,
    RunCursor,
    Usage,
)

__all__ = ["LedgerLike", "ThreadedLedger", "as_async"]


class LedgerLike(Protocol):
    """The ledger calls a run makes, as coroutines (a subset of `AsyncLedger`)."""

    async def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]: ...

    async def events(self, *, run_id: str | None = None) -> list[Event]: ...

    async def start_run(
        self,
        conversation_id: str,
        *,
        owner: str,
        run_id: str | None = None,
        base: int | Position | None = None,
        resumes: str | None = None,
        model: str | None = None,
        instructions_digest: str | None = None,
        lease_seconds: float = 60.0,
        events: Sequence[NewEvent] = (),
        create: bool = False,
        exclusive: bool = False,
    ) -> RunCursor: ...

    async def record(
        self, cursor: RunCursor, events: Sequence[NewEvent]
    ) -> tuple[list[Event], RunCursor]: ...

    async def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None: ...

    async def complete_run(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation: ...

    async def fail_run(
        self,
        cursor: RunCursor,
        *,
        stage: str,
        error: str,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
        canceled: bool = False,
    ) -> None: ...

    async def run(self, run_id: str) -> Run: ...


class ThreadedLedger:
    """A sync `Ledger` as a `LedgerLike`: each call runs in a worker thread."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """See `Ledger.history`."""
        return await asyncio.to_thread(
            self.ledger.history, conversation_id, at=at, repaired=repaired
        )

    async def events(self, *, run_id: str | None = None) -> list[Event]:
        """See `Ledger.events`."""
        return await asyncio.to_thread(self.ledger.events, run_id=run_id)

    async def start_run(
        self,
        conversation_id: str,
        *,
        owner: str,
        run_id: str | None = None,
        base: int | Position | None = None,
        resumes: str | None = None,
        model: str | None = None,
        instructions_digest: str | None = None,
        lease_seconds: float = 60.0,
        events: Sequence[NewEvent] = (),
        create: bool = False,
        exclusive: bool = False,
    ) -> RunCursor:
        """See `Ledger.start_run`."""
        return await asyncio.to_thread(
            self.ledger.start_run,
            conversation_id,
            owner=owner,
            run_id=run_id,
            base=base,
            resumes=resumes,
            model=model,
            instructions_digest=instructions_digest,
            lease_seconds=lease_seconds,
            events=events,
            create=create,
            exclusive=exclusive,
        )

    async def record(
        self, cursor: RunCursor, events: Sequence[NewEvent]
    ) -> tuple[list[Event], RunCursor]:
        """See `Ledger.record`."""
        return await asyncio.to_thread(self.ledger.record, cursor, events)

    async def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """See `Ledger.renew_lease`."""
        await asyncio.to_thread(self.ledger.renew_lease, cursor, seconds)

    async def complete_run(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation:
        """See `Ledger.complete_run`."""
        return await asyncio.to_thread(
            self.ledger.complete_run,
            cursor,
            usage=usage,
            request_count=request_count,
            tool_count=tool_count,
        )

    async def fail_run(
        self,
        cursor: RunCursor,
        *,
        stage: str,
        error: str,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
        canceled: bool = False,
    ) -> None:
        """See `Ledger.fail_run`."""
        await asyncio.to_thread(
            self.ledger.fail_run,
            cursor,
            stage=stage,
            error=error,
            usage=usage,
            request_count=request_count,
            tool_count=tool_count,
            canceled=canceled,
        )

    async def run(self, run_id: str) -> Run:
        """See `Ledger.run`."""
        return await asyncio.to_thread(self.ledger.run, run_id)


def as_async(ledger: Ledger | AsyncLedger) -> LedgerLike:
    """The ledger as coroutines: an `AsyncLedger` as it is, a `Ledger` in a `ThreadedLedger`."""
    if isinstance(ledger, AsyncLedger):
        return ledger
    # By behaviour, not only by class: a wrapper around a ledger (a proxy that
    # logs or injects faults) is served by the kind of calls it makes.
    if inspect.iscoroutinefunction(getattr(ledger, "record", None)):
        return cast(LedgerLike, ledger)
    return ThreadedLedger(ledger)
