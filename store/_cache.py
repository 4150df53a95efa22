"""A store's cache of parsed messages, keyed by event `seq`.

Events are never updated or deleted, so a message parsed once from an event
stays right forever: the cache needs no invalidation. A chat loop replays
the same head history on every turn; with the cache only the new messages
are parsed. Bounded (least recently used goes first) and thread-safe.

A cached message is served only for the very payload it was parsed from
(the row's text, compared whole): a `seq` alone can name two events on
SQLite, whose rowid is taken again after a transaction that read its own
uncommitted append rolls back.

A sealed message is kept opened: the read that serves it checks, row by
row, that its key still exists (`servable`), so an erasure shows at once,
and the store that erases empties the cache (docs/erasure.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from chatledger.store._tails import Tail
from chatledger.store.messages import Message, load_messages

__all__ = ["HeadCache", "MessageCache", "TailCache"]

V = TypeVar("V")


class MessageCache:
    """Parsed messages by event seq; `size` 0 turns it off."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[int, tuple[str, Message]] = OrderedDict()
        self._lock = threading.Lock()

    def load(
        self,
        rows: Sequence[tuple[Any, ...]],
        parse: Callable[[list[str]], list[Message]] = load_messages,
        servable: Sequence[bool] | None = None,
    ) -> list[Message]:
        """The messages of `(seq, payload, ...)` rows, parsing only those not cached.

        `parse` turns the payloads of the rows not cached into messages;
        `servable`, when given, says row by row which may be served from the
        cache and kept in it (a sealed row only while its key exists: the
        reader checks that on every read)."""
        if not self.size:
            return parse([row[1] for row in rows])
        with self._lock:
            items = self._items
            found: list[Message | None] = []
            for k, row in enumerate(rows):
                kept = items.get(row[0])
                if kept is not None and kept[0] == row[1] and (servable is None or servable[k]):
                    items.move_to_end(row[0])
                    found.append(kept[1])
                else:
                    found.append(None)
        missing = [i for i, message in enumerate(found) if message is None]
        if missing:
            parsed = parse([rows[i][1] for i in missing])
            with self._lock:
                for i, message in zip(missing, parsed, strict=True):
                    found[i] = message
                    if servable is None or servable[i]:
                        self._items[rows[i][0]] = (rows[i][1], message)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return found  # type: ignore[return-value]

    def clear(self) -> None:
        """Forget every message (after an erasure: opened ones leave memory too)."""
        with self._lock:
            self._items.clear()


class _Recent(Generic[V]):
    """Values by (tenant, conversation id); past `size`, the least recently used goes
    first. Thread-safe."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, conversation_id: str) -> V | None:
        with self._lock:
            value = self._items.get((tenant, conversation_id))
            if value is not None:
                self._items.move_to_end((tenant, conversation_id))
            return value

    def put(self, tenant: str, conversation_id: str, value: V) -> None:
        with self._lock:
            self._items[(tenant, conversation_id)] = value
            self._items.move_to_end((tenant, conversation_id))
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def forget(self, tenant: str, conversation_id: str) -> None:
        with self._lock:
            self._items.pop((tenant, conversation_id), None)


class HeadCache(_Recent[tuple[str, int, bytes, str]]):
    """The head each conversation's last fast-path append left, by (tenant,
    conversation id): its branch, position and hash, and the state there (an
    expected state is checked against it: the state changes only with the head).

    With it the next append to that conversation writes straight at that head
    (`store._sql.append`'s `kept` form), by a statement that moves the head
    only where it still is; a head that moved since (another writer, a head
    move, an erasure) fails that statement's check and the append reads the
    head. So an entry is never trusted, only tried: a stale one (or, on SQLite,
    one whose transaction then failed to commit) costs one round trip.
    """


class TailCache(_Recent[tuple[str, int, Tail]]):
    """The head each conversation's last append through this store left, by (tenant,
    conversation id): its branch and position, and the `Tail` of the history there,
    from which the next append's repair report is computed (`store._tails`).

    The history at a committed position never changes, so an entry is right for
    the head it names whatever was written since; an append after another head
    misses it, and reads the history instead. Entries are put after the append's
    transaction committed, never for a head that may roll back.
    """
