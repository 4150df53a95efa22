"""The live tail: a tenant's (or a conversation's) events in commit order, as they commit.

`Ledger.tail` and `AsyncLedger.tail` read pages with the audit pages' cursor
(`store._sql.pages`: `(txid, seq)` below the snapshot's xmin on Postgres,
`seq` on SQLite), so a commit that becomes visible late is never passed, and
wait between pages with `store._db.tail` (LISTEN/NOTIFY on Postgres, the
file's data version on SQLite). A caller's cursor is checked against the log's
end first (`start_op`). docs/tail.md, docs/adr/0024-tail.md and
docs/adr/0037-cli-errors-and-cursors.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from chatledger.store._checks import check_id
from chatledger.store._db.tail import AsyncPostgresWaiter, SqliteWaiter
from chatledger.store._errors import InvalidInputError
from chatledger.store._sql import audit as _audit
from chatledger.store._sql.dialect import is_sqlite, settled_position
from chatledger.store._sql.ops import Op
from chatledger.store._sql.pages import Page, check_cursor, check_limit, position
from chatledger.store._values import Event

__all__ = ["TailSettings", "async_tail", "start_op", "tail", "tail_op"]

# While a page holds events back, read again after this long, doubling up to a
# second (or `idle_seconds`, if shorter).
_PENDING_FIRST = 0.01
_PENDING_MOST = 1.0


class Stop(Protocol):
    """What ends a following tail once set: a `threading.Event`, or on the async
    face an `asyncio.Event`."""

    def is_set(self) -> bool: ...


class TailSettings:
    """A tail's arguments, every one checked here, before anything runs."""

    def __init__(
        self,
        *,
        after: str | None,
        conversation_id: str | None,
        limit: int,
        follow: bool,
        idle_seconds: float,
        poll_seconds: float,
        stop: Stop | None = None,
    ) -> None:
        check_cursor(after)
        if conversation_id is not None:
            check_id(conversation_id, "conversation")
        check_limit(limit)
        for name, value in (("idle_seconds", idle_seconds), ("poll_seconds", poll_seconds)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidInputError(
                    f"{name} must be a positive number of seconds, not {value!r}."
                )
        if not isinstance(follow, bool):
            raise InvalidInputError(f"follow must be True or False, not {follow!r}.")
        self.after = after
        self.stop = stop
        self.conversation_id = conversation_id
        self.limit = limit
        self.follow = follow
        self.idle_seconds = float(idle_seconds)
        self.poll_seconds = float(poll_seconds)


def tail_op(tenant: str, settings: TailSettings, after: str | None) -> Op[Page[Event]]:
    """One page of the tail (`after` is checked, or one the tail's own page returned). Read on the primary: a wake-up names what the
    primary committed, which a replica may not have yet.

    A page that is not full also moves its cursor past everything settled
    in the log, events of other tenants (or conversations) included
    (`settled_position`): a quiet tenant's tail on a busy log then never
    reads the same others' events twice. Every event of the tenant up to
    there is in the page or before it, so the cursor passes none.
    """
    f = _audit.Filter(conversation_id=settings.conversation_id)
    limit = settings.limit

    def read(conn: Connection) -> Page[Event]:
        if not is_sqlite(conn):
            # The page and the settled position from one snapshot.
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        page = _audit.list_events(conn, tenant, f, after=after, limit=limit)
        if page.has_more:
            return page
        settled = settled_position(conn)
        if settled is None or (
            page.next_after is not None and position(page.next_after) >= settled
        ):
            return page
        return replace(page, next_after=f"{settled[0]}:{settled[1]}")

    return Op("reading the tail of the log", write=False, tenant=tenant, fn=read)


def start_op(tenant: str, after: str) -> Op[None]:
    """`InvalidInputError` if the checked cursor `after` is past the end of the log.

    The end is `settled_position`, the furthest a page (`tail_op`) ever moves
    a cursor, and it only grows: a cursor past it is none that chatledger
    printed, and a tail from it would skip every event committed below it, for
    good. The end is the whole log's, not the tenant's: a page may already
    have moved the caller's cursor there past other tenants' events, so any
    position up to it, theirs included, is one the caller could have been
    given, and the refusal names nothing but the cursor
    (docs/adr/0037-cli-errors-and-cursors.md).
    """
    cursor = position(after)

    def check(conn: Connection) -> None:
        end = settled_position(conn)
        if end is None or cursor > end:
            raise InvalidInputError(
                f"Cursor {after!r} is past the end of the log: no page of this database "
                f"printed it (is it another database's, or one restored from an older "
                f"backup?). Pass the `next_after` of a page of this database exactly as "
                f"chatledger returned it, or None to start at the beginning."
            )

    return Op("checking the tail's cursor", write=False, tenant=tenant, fn=check)


class Waiter(Protocol):
    """What `tail` waits with (`store._db.tail`)."""

    def wait(self, seconds: float) -> bool: ...

    def close(self) -> None: ...


class _Pace:
    """How long to wait after a page: the one rule both loops share.

    A page that holds events back (`pending`) waits on a transaction still
    open, which may be another program's and end with no wake-up: the tail
    reads again after a delay that starts at 10 ms and doubles up to a
    second (or `idle_seconds`, if shorter), and starts over once a page
    brings events. Otherwise it waits for a wake-up (a store's commit), or
    `idle_seconds`: a transaction that was open, unseen, as the page was
    read and commits with no wake-up (not a store's) is found then.
    """

    def __init__(self, settings: TailSettings) -> None:
        self.settings = settings
        self.backoff = _PENDING_FIRST

    def shown(self, page: Page[Event]) -> bool:
        """Whether the caller sees `page`: one with events, or, when not
        following, an empty one that says events are held back."""
        return bool(page.items) or (page.pending and not self.settings.follow)

    def after(self, page: Page[Event]) -> float | None:
        """Seconds to wait before the next read; 0 to read on now; None to stop."""
        if page.has_more:
            return 0.0
        if not self.settings.follow:
            return None
        if page.items:
            self.backoff = _PENDING_FIRST
        if page.pending:
            most = min(_PENDING_MOST, self.settings.idle_seconds)
            wait, self.backoff = min(self.backoff, most), min(self.backoff * 2, most)
            return wait
        return self.settings.idle_seconds


def _slices(wait: float, stop: Stop | None) -> Iterator[float]:
    """The waits that make up a wait of `wait` seconds (none for 0): one, or with a
    `stop` event, slices of at most 0.2 s until it is set, to see it soon. The
    caller stops at a wait that was woken."""
    if not wait:
        return
    if stop is None:
        yield wait
        return
    deadline = time.monotonic() + wait
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(left, 0.2)


def tail(
    read: Callable[[str | None], Page[Event]],
    *,
    waiter: Waiter,
    settings: TailSettings,
) -> Iterator[Page[Event]]:
    """Pages of new events from `settings.after` on; see `Ledger.tail`."""
    after, stop = settings.after, settings.stop
    try:
        if settings.follow:
            waiter.wait(0)  # listening (or the data version noted) before the first read
        pace = _Pace(settings)
        while stop is None or not stop.is_set():
            page = read(after)
            after = page.next_after or after
            if pace.shown(page):
                yield page
            wait = pace.after(page)
            if wait is None:
                return
            for piece in _slices(wait, stop):
                if waiter.wait(piece):
                    break
    finally:
        waiter.close()


async def async_tail(
    read: Callable[[str | None], Any],
    *,
    start: Callable[[], Awaitable[None]] | None,
    waiter: AsyncPostgresWaiter | SqliteWaiter,
    settings: TailSettings,
) -> AsyncIterator[Page[Event]]:
    """`tail` for `AsyncLedger.tail`: `read` is a coroutine function; cancel the
    consuming task to stop following. `start` (`start_op`, which the call
    cannot await) runs first, before anything else is read or waited for."""
    after, stop = settings.after, settings.stop
    wait: Callable[[float], Awaitable[bool]]
    if isinstance(waiter, SqliteWaiter):
        sqlite_waiter = waiter
        wait = sqlite_waiter.wait_async

        async def close() -> None:
            sqlite_waiter.close()

    else:
        wait, close = waiter.wait, waiter.close
    try:
        if start is not None:
            await start()
        if settings.follow:
            await wait(0)
        pace = _Pace(settings)
        while stop is None or not stop.is_set():
            page: Page[Event] = await read(after)
            after = page.next_after or after
            if pace.shown(page):
                yield page
            seconds = pace.after(page)
            if seconds is None:
                return
            for piece in _slices(seconds, stop):
                if await wait(piece):
                    break
    finally:
        await close()
