"""`Workers`: the threads an `AsyncStore` runs its blocking calls on.

`asyncio.to_thread` hands a call to the loop's default executor: a work item
and a `concurrent.futures.Future`, chained to an asyncio future by callbacks
that cross the threads twice. Here a call is a tuple on a queue, and the
worker sets its result on the caller's future with one
`call_soon_threadsafe`: a hop costs about two thirds of what `to_thread`'s
does (58 against 85-90 µs of wall time on the development machine, where a
SQLite chat-loop append is 300 µs). The waking of the two threads, which
neither way can avoid, is most of what is left.

Threads start as calls need them, up to `size`, and stop when the store
closes. As with `to_thread`, a call runs with the caller's context variables,
and a caller cancelled while its call runs stops waiting for it, while the
call itself runs to its end (a transaction commits or rolls back as it would
have); a call cancelled before a thread took it does not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["Workers"]

T = TypeVar("T")
P = ParamSpec("P")

_Call = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]
]


class Workers:
    """Up to `size` threads of a store's own for its blocking calls (see the module)."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._threads = _Threads()
        self._pid = os.getpid()

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in a worker thread, awaited."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if os.getpid() != self._pid:  # a forked child has none of its parent's threads
            self._threads, self._pid = _Threads(), os.getpid()
        threads = self._threads
        call = functools.partial(fn, *args, **kwargs)
        with threads.lock:
            if threads.spare <= 0 and threads.started < self._size:
                threads.started += 1
                threads.spare += 1
                threading.Thread(target=threads.work, name="chatledger-worker", daemon=True).start()
            threads.spare -= 1
        threads.calls.put((loop, future, contextvars.copy_context(), call))
        return await future

    def close(self) -> None:
        """Stop the threads once the calls queued before this have run; a later call
        starts threads anew."""
        threads, self._threads = self._threads, _Threads()
        with threads.lock:
            started = threads.started
        for _ in range(started):
            threads.calls.put(None)


class _Threads:
    """The threads started since the store opened or last closed, and their queue."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.started = 0
        self.spare = 0
        """Threads waiting for a call, less the calls waiting for a thread."""

    def work(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            loop, future, context, fn = call
            if not future.cancelled():
                try:
                    result = context.run(fn)
                except BaseException as error:
                    _settle(loop, future, None, error)
                else:
                    _settle(loop, future, result, None)
            with self.lock:
                self.spare += 1


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # its caller was cancelled meanwhile
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(settle)
