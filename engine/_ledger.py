"""One async face over a sync `Ledger` or an `AsyncLedger`.

The run loop is async. A sync ledger's calls run in a worker thread so they
never block the loop; an async ledger's coroutines are awaited directly.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

__all__ = ["LedgerCalls"]


class LedgerCalls:
    """Calls a ledger's methods as coroutines, whichever kind it is."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self._is_async = inspect.iscoroutinefunction(getattr(ledger, "record", None))

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        function = getattr(self.ledger, method)
        if self._is_async:
            return await function(*args, **kwargs)
        return await asyncio.to_thread(function, *args, **kwargs)
