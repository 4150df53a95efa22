"""The store's conformance suite, on both faces.

Every test here takes `ledger`, and runs on each backend with the fast paths
on and off (`tests/conftest.py`) on the sync face, and on each backend on the
async face (ids `sqlite-async`, `postgres-async`): there `ledger` is an
`AsyncLedger` called as a `Ledger` is (`Blocking`), each call run to its end
on the test's event loop, on a thread of its own (`Loop`), which the store
was opened on. A test writes its behaviour once, and both faces are held to
it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from chatledger.store import AsyncAudit, AsyncRetention, AsyncRuns, AsyncStore, Ledger, Store

T = TypeVar("T")


class Loop:
    """An event loop on a thread of its own, which runs coroutines for sync callers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Blocking:
    """An async face (`AsyncLedger` and its sub-handles) called as the sync one is:
    a coroutine's result is returned, an async iterator is iterated, a sub-handle
    is wrapped alike, and errors are raised as they were."""

    def __init__(self, target: Any, loop: Loop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if isinstance(value, AsyncAudit | AsyncRetention | AsyncRuns):
            return Blocking(value, self._loop)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = self._loop.run(_called(value, args, kwargs))  # on the loop, as a caller's
            if hasattr(result, "__aiter__"):
                return self._iterate(result)
            return result

        return call

    def _iterate(self, iterator: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._loop.run(_next(iterator))
                except StopAsyncIteration:
                    return
        finally:  # a test that stops early closes it, as `async for` would
            close = getattr(iterator, "aclose", None)
            if close is not None:
                self._loop.run(close())


async def _called(function: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`function(*args, **kwargs)`, awaited when it gives an awaitable."""
    result = function(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def _next(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


@pytest.fixture
def face(request: pytest.FixtureRequest) -> str:
    """The face this run's `ledger` is: `sync` or `async` (see tests/conftest.py)."""
    return str(getattr(request, "param", "sync"))


@pytest.fixture
def ledger(store: Store, face: str, database_url: str, fast_paths: bool) -> Iterator[Ledger]:
    """A handle on a tenant no other test uses, on this run's face."""
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    if face == "sync":
        yield store.tenant(tenant)
        return
    loop = Loop()
    try:
        # Opened on the loop that runs its calls: its engine belongs to it.
        opened: AsyncStore = loop.run(
            _called(AsyncStore.open, (database_url,), {"fast_paths": fast_paths})
        )
        try:
            yield Blocking(opened.tenant(tenant), loop)  # type: ignore[misc]
        finally:
            loop.run(opened.close())
    finally:
        loop.close()
