"""Plumbing of `store.history`: pairing tool results with the calls they answer.

Everything here is a small pure pass over a message list, linear in its length
(dict and list lookups only), so a 100,000-message history repairs in about the
same time per message as a short one. `store.history` strings the passes
together and builds the public reports; nothing here is public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from chatledger.store.messages import Message, ToolCall

# The text of a synthesized result. It is fixed, with no timestamp, id or other
# varying data, so repairing a repaired history returns it byte for byte (and a
# provider's prompt cache survives). It states the absence of an outcome, not a
# failure, so the model is free to call the tool again.
NO_RESULT_CONTENT = (
    "No result was recorded for this tool call; it may not have run. "
    "Call the tool again if you still need its result."
)


@dataclass(slots=True)
class Pairing:
    """Which tool message answers which call, for one message list.

    Calls with an id are numbered in order of appearance; the per-call facts
    are flat lists indexed by that number, rather than an object per turn or
    per call: on a long history, allocating several objects per call was a
    measurable share of the time.
    """

    calls: list[ToolCall] = field(default_factory=list)
    """Every call with an id, in order of appearance."""
    ids: list[str] = field(default_factory=list)
    """Per call: its id."""
    answered: list[bool] = field(default_factory=list)
    """Per call: whether a result answers it."""
    turns: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per assistant message with id'd calls (by index): the range of its call numbers."""
    results: dict[int, list[int]] = field(default_factory=dict)
    """Per assistant message (by index): its real results' indexes, in recorded order."""
    tools: list[int] = field(default_factory=list)
    """Indexes of all tool messages, kept or dropped."""
    dropped: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    """Ids of calls whose arguments are not a JSON object (see `is_truncated`)."""
    unanswered: int = 0
    """How many calls are left without a result."""

    @property
    def changes_nothing(self) -> bool:
        """Whether `assemble` would return the messages as they are."""
        # With nothing dropped or moved, every tool message already sits in the
        # block right after its turn, in recorded order; with nothing
        # unanswered, nothing is added.
        return not (self.dropped or self.moved or self.unanswered)


def repaired(messages: Sequence[Message]) -> list[Message]:
    """`normalize_history`'s messages without its report (no truncation scan)."""
    if well_formed(messages):
        return list(messages)
    pairing = pair(messages, detect_truncated=False)
    return list(messages) if pairing.changes_nothing else assemble(messages, pairing)[0]


def well_formed(messages: Sequence[Message]) -> bool:
    """Whether the history needs no repair: every call with an id answered once,
    in the block of tool messages right after its turn, and nothing else there.

    A cheaper pass than `pair` for the common case (a history that was
    repaired before it was stored): only the current turn's open calls are
    tracked. True implies `pair(messages).changes_nothing`; False only means
    `pair` must look.
    """
    open_ids: set[str | None] = set()
    for message in messages:
        role = message.role
        if role == "tool":
            call_id = message.tool_call_id
            if call_id not in open_ids:  # dropped, misplaced or a duplicate
                return False
            open_ids.remove(call_id)
            continue
        if open_ids:  # a call left unanswered
            return False
        if role == "assistant" and message.tool_calls:
            # As in `pair`: a call whose id is None or "" has no id.
            ids = [call.id for call in message.tool_calls if call.id]
            open_ids.update(ids)
            if len(open_ids) != len(ids):  # an id used twice in one turn
                return False
    return not open_ids


def pair(messages: Sequence[Message], *, detect_truncated: bool = True) -> Pairing:
    """Assign every tool message to the call it answers, or mark it dropped.

    A result answers the most recent *open* call with its id: each id keeps a
    stack of its unanswered calls, a call pushes, a result pops. A later turn
    that reuses an id therefore opens a new call, results can never reach a
    call made after them (a result placed before its call is an orphan), and a
    second result for an answered call finds nothing open and is dropped as a
    duplicate. A result is `moved` when something other than tool messages
    lies between it and its turn.

    One loop does it all, truncation detection included: on a long history,
    each extra pass over the messages costs about as much as the work itself.
    """
    pairing = Pairing()
    calls, answered, results = pairing.calls, pairing.answered, pairing.results
    call_turn: list[int] = []
    # The stack of open calls of each id: its top in `top`, the rest (only
    # when an id is reused while still open) in `below`.
    top: dict[str, int] = {}
    below: dict[str, list[int]] = {}
    last_non_tool = -1
    for index, message in enumerate(messages):
        if message.role == "tool":
            pairing.tools.append(index)
            call_id = message.tool_call_id
            number = top.pop(call_id, None) if call_id else None
            if number is None:
                pairing.dropped.append(index)
                continue
            if call_id in below:
                hidden = below[call_id]
                top[call_id] = hidden.pop()
                if not hidden:
                    del below[call_id]
            answered[number] = True
            pairing.unanswered -= 1
            turn = call_turn[number]
            turn_results = results.get(turn)
            if turn_results is None:
                results[turn] = [index]
            else:
                turn_results.append(index)
            if last_non_tool != turn:
                pairing.moved.append(index)
            continue
        last_non_tool = index
        if message.role != "assistant" or not message.tool_calls:
            continue
        first = len(calls)
        for call in message.tool_calls:
            call_id = call.id
            # A call without an id cannot be answered: it passes through as is.
            # An empty id is no id: no result can name it (a result with an
            # empty `tool_call_id` is one without an id, dropped below), and
            # a provider would reject a synthesized result that names "".
            if not call_id:
                continue
            if detect_truncated and is_truncated(call):
                pairing.truncated.append(call_id)
            opened = top.get(call_id)
            if opened is not None:
                below.setdefault(call_id, []).append(opened)
            top[call_id] = len(calls)
            calls.append(call)
            pairing.ids.append(call_id)
            answered.append(False)
            call_turn.append(index)
        if len(calls) > first:
            pairing.turns[index] = (first, len(calls))
            pairing.unanswered += len(calls) - first
    return pairing


def assemble(messages: Sequence[Message], pairing: Pairing) -> tuple[list[Message], list[str]]:
    """Lay out the repaired list: each turn followed by its block of results.

    Returns the messages and the ids of the calls that got a synthesized
    result. Messages are reused as they are; only synthesized results are new.
    """
    # Copy the runs of messages between tool messages and turns as slices:
    # only the indexes found by `pair` are visited, never the messages, which
    # on a long history are spread all over memory.
    out: list[Message] = []
    synthesized: list[str] = []
    calls, answered, results = pairing.calls, pairing.answered, pairing.results
    tools, turns = pairing.tools, iter(pairing.turns.items())
    next_tool = 0
    copied = 0  # messages[:copied] are laid out
    for turn, numbers in turns:
        while next_tool < len(tools) and tools[next_tool] < turn:
            out.extend(messages[copied : tools[next_tool]])
            copied = tools[next_tool] + 1
            next_tool += 1
        out.extend(messages[copied : turn + 1])
        copied = turn + 1
        for number in range(*numbers):
            if not answered[number]:
                out.append(no_result(calls[number]))
                synthesized.append(pairing.ids[number])
        out.extend(messages[result] for result in results.get(turn, ()))
    for tool in tools[next_tool:]:
        out.extend(messages[copied:tool])
        copied = tool + 1
    out.extend(messages[copied:])
    return out, synthesized


def no_result(call: ToolCall) -> Message:
    """The neutral result that stands in for a call whose outcome was never recorded."""
    return Message(
        role="tool", tool_call_id=call.id, tool_name=call.name, content=NO_RESULT_CONTENT
    )


def is_truncated(call: ToolCall) -> bool:
    """Whether the call's arguments are not a JSON object (a stream that died, say).

    Strict JSON, as Go's and the providers' parsers read it (see
    `ToolCall.arguments_object`): `{"x": NaN}` is truncated. Detection only:
    the arguments are never rewritten.
    """
    # Calls without arguments are common: no need to parse their "{}".
    return call.arguments != "{}" and call.arguments_object() is None


def cut_point(messages: Sequence[Message], start: int) -> int | None:
    """The first index at or after `start` where a suffix can open a request.

    That is a user message such that no tool message after it answers a call
    made before it, so a cut there never separates a call from its results.
    Returns None when there is no such index.
    """
    size = len(messages)
    if start >= size:
        return None
    answers = {
        result: turn
        for turn, results in pair(messages, detect_truncated=False).results.items()
        for result in results
    }
    # earliest[k]: the earliest turn answered by a tool message at start + k or
    # later (size when none). A cut at u is clean when earliest[u - start] >= u.
    earliest = [size] * (size - start + 1)
    for index in range(size - 1, start - 1, -1):
        turn = answers.get(index, size)
        following = earliest[index - start + 1]
        earliest[index - start] = turn if turn < following else following
    for index in range(start, size):
        if messages[index].role == "user" and earliest[index - start] >= index:
            return index
    return None
