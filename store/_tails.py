"""The repair report of an append, from the tail of the history it follows.

An append tells its caller what the history's repair does to the messages it
added (`Appended.repair`): a result without its call dropped, one moved up
into its call's block, a call waiting for its result. Which of these happens
depends on the history before the append only through a little: the calls
still open in it and where its last turn is (`Tail`). So an append computes
its report from the tail the previous append left, in time linear in what it
appends, and reads the history itself only when no append through this
store left that tail (`Operations.report`): never on the chat loop's path.

`extend` applies the rules of `store._repair.pair` to the appended messages;
a property test holds it to `pair` over the whole history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from chatledger.store.history import HistoryRepair
from chatledger.store.messages import Message

__all__ = ["EMPTY_TAIL", "Tail", "extend", "tail_of"]


class Tail(NamedTuple):
    """What the repair of later messages needs to know of a history.

    Indexes count the history's messages (the appended ones continue them). A
    tuple: one is built on every append.
    """

    size: int
    """How many messages the history holds."""
    last: int
    """The index of its last message that is not a tool message (-1: none)."""
    open: tuple[tuple[str, int], ...]
    """Its calls without a result, oldest first: (call id, index of the turn that made it)."""


EMPTY_TAIL = Tail(0, -1, ())
"""The tail of a history without messages."""


def extend(
    tail: Tail | None, messages: Sequence[Message]
) -> tuple[HistoryRepair | None, Tail | None] | None:
    """What repair does to `messages` appended after a history with `tail` (None:
    nothing), and the tail they leave.

    The report is in the terms of `normalize_history`, restricted to `messages`:
    `dropped` and `moved` index `messages`, `synthesized` names their calls left
    without a result. `truncated` stays empty: it names no repair (the arguments
    stay verbatim), and finding it would parse every call's arguments again.

    With `tail` None (the history is unknown), the report is given only when no
    tool message answers a call made before `messages` (None otherwise: read the
    history), and the tail left is unknown too.
    """
    size = 0 if tail is None else tail.size
    for message in messages:
        if message.role == "tool" or message.tool_calls:
            break
    else:  # the common turn, a text: nothing to repair, nothing opened or answered
        if tail is None or not messages:  # nothing appended: the tail stands
            return None, tail
        count = size + len(messages)
        return None, Tail(count, count - 1, tail.open)
    last = -1 if tail is None else tail.last
    # The calls, numbered in order: the open ones of the tail first. Per id, the
    # stack of its open calls' numbers (a result answers the most recent one).
    ids = [] if tail is None else [call_id for call_id, _ in tail.open]
    turns = [] if tail is None else [turn for _, turn in tail.open]
    stacks: dict[str, list[int]] = {}
    for number, open_id in enumerate(ids):
        stacks.setdefault(open_id, []).append(number)
    first_own = len(ids)
    answered: set[int] = set()
    dropped: list[int] = []
    moved: list[int] = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            call_id = message.tool_call_id
            stack = stacks.get(call_id) if call_id else None
            if not stack:
                if tail is None and call_id:
                    return None  # its call may be in the history before
                dropped.append(i)
                continue
            number = stack.pop()
            answered.add(number)
            if last != turns[number]:
                moved.append(i)
            continue
        last = size + i
        for call in message.tool_calls:
            if call.id:  # a call without an id cannot be answered: it passes through
                stacks.setdefault(call.id, []).append(len(ids))
                ids.append(call.id)
                turns.append(last)
    synthesized = [ids[n] for n in range(first_own, len(ids)) if n not in answered]
    repair = HistoryRepair(synthesized, dropped, moved) if synthesized or dropped or moved else None
    if tail is None:
        return repair, None
    still_open = tuple((ids[n], turns[n]) for n in range(len(ids)) if n not in answered)
    return repair, Tail(size + len(messages), last, still_open)


def tail_of(history: Sequence[Message]) -> Tail:
    """The tail of `history`."""
    found = extend(EMPTY_TAIL, history)
    assert found is not None and found[1] is not None  # a known tail gives one
    return found[1]
