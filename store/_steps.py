"""`Steps`: a tenant's operations, and how the run loop awaits one.

The engine's run loop is async and takes either face of a tenant (`Ledger` or
`AsyncLedger`). It does not call a face's methods: it builds each step from
the declarations both faces run (`ops`, `store._ops.Operations`) and awaits
`run(step)`, which runs it on the face's store: `AsyncStore.execute` as it
is, `Store.execute` in a worker thread, so that no step blocks the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from chatledger.store._async import AsyncLedger
from chatledger.store._ops import Operations
from chatledger.store._sealing import Program, adrive
from chatledger.store._sql.ops import Op
from chatledger.store._store import Ledger

__all__ = ["Steps"]

T = TypeVar("T")


class Steps:
    """The operations of `ledger`'s tenant (`ops`), run by `run` without blocking the loop."""

    def __init__(self, ledger: Ledger | AsyncLedger) -> None:
        self.ops: Operations = ledger._ops
        self.execute: Callable[[Op[Any]], Awaitable[Any]]
        if isinstance(ledger, AsyncLedger):
            self.execute = ledger._store.execute
        else:
            store = ledger._store
            self.execute = lambda op: asyncio.to_thread(store.execute, op)

    async def run(self, step: Op[T] | Program[T]) -> T:
        """The result of `step`, an operation or a program of operations."""
        if isinstance(step, Op):
            done: T = await self.execute(step)
            return done
        return await adrive(step, self.execute)
