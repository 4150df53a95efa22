"""What the tests share: message builders, and the async face called as the sync one is."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from chatledger.store import AsyncAudit, AsyncRetention, AsyncRuns, Message, ToolCall

T = TypeVar("T")


def user(text: str = "question") -> Message:
    return Message(role="user", content=text)


def assistant(text: str = "", calls: Sequence[ToolCall] = ()) -> Message:
    return Message(role="assistant", content=text, tool_calls=list(calls))


def turn(*texts: str) -> list[Message]:
    """Messages alternating user, assistant, user... with these texts."""
    return [
        Message(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(texts)
    ]


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
            result = self._loop.run(called(value, args, kwargs))  # on the loop, as a caller's
            if hasattr(result, "__aiter__"):
                return self._iterate(result)
            return result

        return call

    def _iterate(self, iterator: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._loop.run(next_item(iterator))
                except StopAsyncIteration:
                    return
        finally:  # a test that stops early closes it, as `async for` would
            close = getattr(iterator, "aclose", None)
            if close is not None:
                self._loop.run(close())


async def called(function: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`function(*args, **kwargs)`, awaited when it gives an awaitable."""
    result = function(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def next_item(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()
