"""A store's cache of parsed messages, keyed by event `seq`.

Events are never updated or deleted, so a message parsed once from an event
stays right forever: the cache needs no invalidation. A chat loop replays
the same head history on every turn; with the cache only the new messages
are parsed. Bounded (least recently used goes first) and thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from store.messages import Message, load_messages

__all__ = ["MessageCache"]


class MessageCache:
    """Parsed messages by event seq; `size` 0 turns it off."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[int, Message] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, rows: Sequence[tuple[int, str]]) -> list[Message]:
        """The messages of `(seq, payload)` rows, parsing only those not cached."""
        if not self.size:
            return load_messages([payload for _, payload in rows])
        with self._lock:
            found = [self._items.get(seq) for seq, _ in rows]
            for seq, message in zip(rows, found, strict=True):
                if message is not None:
                    self._items.move_to_end(seq[0])
        missing = [i for i, message in enumerate(found) if message is None]
        if missing:
            parsed = load_messages([rows[i][1] for i in missing])
            with self._lock:
                for i, message in zip(missing, parsed, strict=True):
                    found[i] = message
                    self._items[rows[i][0]] = message
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return found  # type: ignore[return-value]
