"""`Workers`, the threads an `AsyncStore` hops to: what `asyncio.to_thread` promised.

A call runs once, with the caller's context variables, its result or error
comes back; a caller cancelled while its call runs stops waiting while the
call runs to its end; a call cancelled before a thread took it never runs; at
most `size` threads run at once, and closing stops them.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from chatledger.store._db.workers import Workers

REQUEST = contextvars.ContextVar("REQUEST", default="none")


async def test_a_call_returns_its_result_or_raises_its_error_in_the_caller() -> None:
    workers = Workers()
    assert await workers.run(lambda a, b: a + b, 2, 3) == 5
    assert await workers.run(threading.get_ident) != threading.get_ident()

    def fail() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        await workers.run(fail)
    workers.close()


async def test_a_call_sees_the_callers_context_variables() -> None:
    workers = Workers()
    REQUEST.set("r-1")
    assert await workers.run(REQUEST.get) == "r-1"
    workers.close()


async def test_a_cancelled_caller_stops_waiting_but_its_call_runs_to_its_end() -> None:
    workers = Workers()
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def transaction() -> str:
        started.set()
        release.wait()
        finished.set()  # what a commit would be: it still happens
        return "committed"

    task = asyncio.create_task(workers.run(transaction))
    await asyncio.to_thread(started.wait)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await asyncio.to_thread(finished.wait)
    assert finished.is_set()
    workers.close()


async def test_a_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    workers = Workers(size=1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def busy() -> None:
        started.set()
        release.wait()

    first = asyncio.create_task(workers.run(busy))
    await asyncio.to_thread(started.wait)  # the one thread is taken
    queued = asyncio.create_task(workers.run(lambda: ran.append("queued")))
    await asyncio.sleep(0)  # let it put its call on the queue
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    await first
    # The thread has taken (and skipped) the cancelled call by the time it runs this one.
    assert await workers.run(lambda: list(ran)) == []
    workers.close()


async def test_no_more_than_size_threads_run_and_closing_stops_them() -> None:
    workers = Workers(size=3)
    barrier = threading.Barrier(3)
    release = threading.Event()
    used: set[int] = set()

    def hold() -> None:
        used.add(threading.get_ident())
        barrier.wait()  # three calls run at once: three threads
        release.wait()

    def note() -> None:
        used.add(threading.get_ident())

    holders = [asyncio.create_task(workers.run(hold)) for _ in range(3)]
    queued = [asyncio.create_task(workers.run(note)) for _ in range(5)]  # behind them
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*holders, *queued)
    for _ in range(5):  # calls one after another reuse the threads
        await workers.run(note)
    assert len(used) == 3

    threads = [t for t in threading.enumerate() if t.ident in used]
    assert len(threads) == 3
    workers.close()
    for thread in threads:
        await asyncio.to_thread(thread.join)  # each ends: a join that returns
    assert await workers.run(lambda: 7) == 7  # a closed pool starts threads anew
    workers.close()
