"""Pure history algorithms: repair, sanitize, trim, budget, identity.

Every function here is deterministic and side-effect free: no I/O, no clock,
no randomness (the one exception is `resolve_conversation_id`, which mints a
new id when nothing else provides one). None of them rewrites the content of a
message; they drop, move, or add whole messages and parts, and a pass with
nothing to do returns the input's messages as they are (the same objects, in
a new list). Each runs in time linear in the length of the history.

- `normalize_history` repairs the pairing of tool calls and results into the
  shape every provider accepts.
- `sanitize_history` is the boundary pass for history that crossed a trust
  boundary: it drops system messages and unsafe URLs, then repairs.
- `trim_history` and `budget_history` build history processors that keep the
  newest messages, bounded by a count or a token budget, cut where a request
  can start.
- `resolve_conversation_id` and `from_pairs` are the identity and flat-history
  helpers of the engine.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from store import _repair
from store._errors import HistoryError, InvalidInputError
from store.ids import new_id
from store.messages import Message, TextPart, ThinkingPart, UrlPart

__all__ = [
    "HistoryProcessor",
    "HistoryRepair",
    "SanitizeReport",
    "UnsafePart",
    "approximate_tokens",
    "budget_history",
    "from_pairs",
    "normalize_history",
    "resolve_conversation_id",
    "sanitize_history",
    "tiktoken_counter",
    "trim_history",
]

HistoryProcessor = Callable[[list[Message]], list[Message]]
"""A function from a history to the history to send (e.g. `trim_history(50)`)."""


@dataclass(frozen=True)
class HistoryRepair:
    """What `normalize_history` changed. Every index refers to the caller's list."""

    synthesized: list[str] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UnsafePart:
    """A part `sanitize_history` dropped."""

    message_index: int
    kind: str
    scheme: str


@dataclass(frozen=True)
class SanitizeReport:
    """What `sanitize_history` changed."""

    system_prompts: int = 0
    unsafe_parts: list[UnsafePart] = field(default_factory=list)
    repair: HistoryRepair = field(default_factory=HistoryRepair)


# --- pairing repair --------------------------------------------------------------------


def normalize_history(messages: Sequence[Message]) -> tuple[list[Message], HistoryRepair]:
    """Repair the pairing of tool calls and tool results.

    The result has every tool call that carries an id answered exactly once, in
    one contiguous block of tool messages directly after the assistant message
    that made it:

    - a call with no result gets a synthesized, neutral one (`failed` stays
      false: it states that no outcome was recorded, so the model may call
      again). A turn's block lists its synthesized results first, in call
      order, then its real results in their recorded order;
    - a result answers the most recent open call with its id, so a later turn
      that reuses an id opens a new call;
    - a result whose call is absent (also one placed before its call, or one
      without a `tool_call_id`) is dropped, and of several results for one
      call the first is kept;
    - a real result separated from its call's turn by other messages is moved
      up into that turn's block;
    - calls without an id cannot be paired and pass through as they are.

    Content is never rewritten, and the repair is idempotent: repairing a
    repaired history returns it unchanged, with an empty report apart from
    `truncated`.

    Args:
        messages: The history, oldest first.

    Returns:
        The repaired messages and a `HistoryRepair` naming what changed:
        `synthesized` call ids, `dropped` and `moved` indexes into `messages`,
        and the ids of calls whose arguments are not a JSON object
        (`truncated`, reported on every pass; the arguments stay verbatim).
    """
    pairing = _repair.pair(messages)
    if pairing.changes_nothing:
        # The common case (a history repaired before, or without tool traffic):
        # skip the second pass.
        return list(messages), HistoryRepair(truncated=pairing.truncated)
    repaired, synthesized = _repair.assemble(messages, pairing)
    return repaired, HistoryRepair(
        synthesized=synthesized,
        dropped=pairing.dropped,
        moved=pairing.moved,
        truncated=pairing.truncated,
    )


# --- sanitize --------------------------------------------------------------------------

_SAFE_SCHEMES = frozenset({"http", "https"})


def sanitize_history(messages: Sequence[Message]) -> tuple[list[Message], SanitizeReport]:
    """Make history from outside a trust boundary safe to replay, then repair it.

    The passes, in order: drop system messages (instructions come from the
    agent, never from supplied history); drop `url` parts whose scheme is not
    `http` or `https`, compared case-insensitively (a URL that does not parse
    counts as unsafe with scheme `""`); remove user messages that these drops
    left with no content and no parts; repair the pairing with
    `normalize_history`. `data` parts and all other parts are left untouched,
    tool results are never removed by the drops (a tool message emptied of its
    parts stays), and no content is rewritten. Deterministic and idempotent.

    Args:
        messages: The history as received, oldest first.

    Returns:
        The sanitized, repaired messages and a `SanitizeReport`: the number of
        system messages dropped, each unsafe part dropped (with the index of
        its message in `messages`), and the `HistoryRepair` of the final pass,
        whose indexes also refer to `messages`.
    """
    # Passes that remove messages also return the positions they removed, so
    # that the reports of later passes can be mapped back to the caller's
    # indexes (`_restore`). Removed positions rather than a full index map:
    # on a long history, a map costs an int object per message.
    kept, system = _drop_system(messages)
    kept, unsafe, emptied = _drop_unsafe_urls(kept)
    kept = _without(kept, emptied)
    repaired, repair = normalize_history(kept)

    def to_callers(positions: list[int]) -> list[int]:
        return _restore(_restore(positions, emptied), system)

    # Unsafe parts were found before the emptied users left.
    unsafe_at = _restore([position for position, _ in unsafe], system)
    return repaired, SanitizeReport(
        system_prompts=len(system),
        unsafe_parts=[
            UnsafePart(message_index=index, kind="url", scheme=scheme)
            for index, (_, scheme) in zip(unsafe_at, unsafe, strict=True)
        ],
        repair=HistoryRepair(
            synthesized=repair.synthesized,
            dropped=to_callers(repair.dropped),
            moved=to_callers(repair.moved),
            truncated=repair.truncated,
        ),
    )


def _drop_system(messages: Sequence[Message]) -> tuple[list[Message], list[int]]:
    """Drop system messages: instructions come from the agent, never from history."""
    system = [index for index, message in enumerate(messages) if message.role == "system"]
    return _without(messages, system), system


def _drop_unsafe_urls(
    messages: list[Message],
) -> tuple[list[Message], list[tuple[int, str]], list[int]]:
    """Drop `url` parts that are not http(s).

    Returns the messages, the position and scheme of each dropped part, and
    the positions of the user messages the drops left empty.
    """
    unsafe: list[tuple[int, str]] = []
    emptied: list[int] = []
    out = messages
    for position, message in enumerate(messages):
        if not message.parts:
            continue
        parts = []
        for part in message.parts:
            if isinstance(part, UrlPart):
                scheme = _scheme(part.url)
                if scheme not in _SAFE_SCHEMES:
                    unsafe.append((position, scheme))
                    continue
            parts.append(part)
        if len(parts) == len(message.parts):
            continue
        if out is messages:
            out = list(messages)
        out[position] = message.model_copy(update={"parts": parts})
        # Only a user message the drops emptied goes: one that arrived empty is
        # the caller's to keep. Tool results always stay (their call needs them).
        if message.role == "user" and not message.content and not parts:
            emptied.append(position)
    return out, unsafe, emptied


def _scheme(url: str) -> str:
    # urlsplit lowercases the scheme and, like a browser, ignores leading
    # blanks and embedded tabs and newlines, so " JavaScript:" is caught too.
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return ""


def _without(messages: Sequence[Message], positions: list[int]) -> list[Message]:
    """`messages` without the ascending `positions`, copied as slices between them."""
    out: list[Message] = []
    start = 0
    for position in positions:
        out.extend(messages[start:position])
        start = position + 1
    out.extend(messages[start:])
    return out


def _restore(positions: list[int], removed: list[int]) -> list[int]:
    """Map ascending positions in a list back to the list before `removed` left it.

    `removed` holds the ascending indexes, in the list before, of the messages
    taken out. One merge-like walk over both lists.
    """
    if not removed:
        return positions
    restored = []
    skipped = 0
    for position in positions:
        while skipped < len(removed) and removed[skipped] <= position + skipped:
            skipped += 1
        restored.append(position + skipped)
    return restored


# --- trim and budget -------------------------------------------------------------------


def trim_history(max_messages: int) -> HistoryProcessor:
    """Build a processor that keeps at most the newest `max_messages` messages.

    A history of at most `max_messages` messages comes back unchanged. A longer
    one is cut to its newest `max_messages` messages, and the cut then moves
    forward to the first user message, the first message that can open a
    request. That skips tool results whose call was cut and assistant turns
    whose prompt was cut, and never separates a call from its results.

    Args:
        max_messages: The most messages to keep; at least 1.

    Returns:
        The processor. It raises `HistoryError` when the newest
        `max_messages` messages hold no user message to start from.

    Raises:
        InvalidInputError: `max_messages` is not a positive integer.
    """
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise InvalidInputError(
            f"trim_history needs max_messages to be a positive integer, got {max_messages!r}. "
            f"Pass the number of newest messages to keep, for example trim_history(50)."
        )

    def trim(history: list[Message]) -> list[Message]:
        if len(history) <= max_messages:
            return list(history)
        cut = _repair.cut_point(history, len(history) - max_messages)
        if cut is None:
            raise HistoryError(
                f"Trimming a history of {len(history)} messages to its newest {max_messages} "
                f"left no user message to start a request from. Raise max_messages so that "
                f"the newest messages include a user message."
            )
        return history[cut:]

    return trim


def budget_history(counter: Callable[[Message], int] | None, max_tokens: int) -> HistoryProcessor:
    """Build a processor that keeps the newest messages that fit in `max_tokens`.

    A history whose messages add up to at most `max_tokens` comes back
    unchanged. Otherwise the processor keeps the longest run of newest messages
    that fits, and moves the cut forward to the first user message, as
    `trim_history` does, so a call is never separated from its results.

    Args:
        counter: Counts the tokens of one message; `None` means
            `approximate_tokens`. Use `tiktoken_counter()` for exact counts
            with OpenAI encodings.
        max_tokens: The token budget; at least 1.

    Returns:
        The processor. It raises `HistoryError` when the messages that fit hold
        no user message to start from.

    Raises:
        InvalidInputError: `max_tokens` is not a positive integer.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInputError(
            f"budget_history needs max_tokens to be a positive integer, got {max_tokens!r}. "
            f"Pass the token budget for the history, for example budget_history(None, 8000)."
        )
    count = approximate_tokens if counter is None else counter

    def budget(history: list[Message]) -> list[Message]:
        # Walk back from the newest message; each message is counted once.
        total = 0
        start = len(history)
        while start > 0:
            total += count(history[start - 1])
            if total > max_tokens:
                break
            start -= 1
        if start == 0:
            return list(history)
        cut = _repair.cut_point(history, start)
        if cut is None:
            raise HistoryError(
                f"The newest messages of a history of {len(history)} messages that fit in "
                f"{max_tokens} tokens include no user message to start a request from. Raise "
                f"max_tokens so that the budget reaches back to a user message."
            )
        return history[cut:]

    return budget


def approximate_tokens(message: Message) -> int:
    """Estimate the tokens of a message: a quarter of its JSON length, rounded up.

    Cheap and dependency-free; good enough to keep a history within a budget
    with some margin. At least 1 for any message.

    Args:
        message: The message to count.

    Returns:
        The estimate.
    """
    try:
        text = message.model_dump_json(exclude_defaults=True)
    except ValueError:
        # Text pydantic cannot encode as UTF-8 (lone surrogates); json escapes it.
        text = json.dumps(message.model_dump(mode="json", exclude_defaults=True))
    return max(1, math.ceil(len(text) / 4))


def tiktoken_counter(encoding: str = "o200k_base") -> Callable[[Message], int]:
    """Build a token counter that uses a tiktoken encoding.

    It counts the text the model reads (content, text and thinking parts, URLs,
    tool names and call arguments) exactly, adds a small fixed overhead per
    message for the role and framing, and estimates parts with no text (inline
    data, unknown kinds) as `approximate_tokens` does.

    tiktoken is optional: install it with `pip install tiktoken`. It may
    download the encoding's file the first time an encoding is used.

    Args:
        encoding: The tiktoken encoding name, e.g. `o200k_base` or `cl100k_base`.

    Returns:
        A counter for `budget_history`.

    Raises:
        InvalidInputError: tiktoken is not installed, or does not know `encoding`.
    """
    try:
        # Imported by name so that tiktoken stays optional, for mypy too.
        tiktoken: Any = importlib.import_module("tiktoken")
    except ImportError as exc:
        raise InvalidInputError(
            "tiktoken_counter needs the tiktoken package, which is not installed. Install it "
            "with `pip install tiktoken`, or pass counter=None to use the approximate counter."
        ) from exc
    try:
        encoder = tiktoken.get_encoding(encoding)
    except ValueError as exc:
        raise InvalidInputError(
            f"tiktoken does not know the encoding {encoding!r}: {exc}. Pass one of "
            f"{', '.join(tiktoken.list_encoding_names())}."
        ) from exc

    def count(message: Message) -> int:
        texts, estimate = _readable_text(message)
        # disallowed_special=(): text that looks like a special token is counted
        # as ordinary text instead of raising.
        tokens = sum(len(encoder.encode(text, disallowed_special=())) for text in texts)
        return _MESSAGE_OVERHEAD + tokens + estimate

    return count


# Tokens a chat format spends on each message's role and delimiters (OpenAI's
# published rule of thumb).
_MESSAGE_OVERHEAD = 4


def _readable_text(message: Message) -> tuple[list[str], int]:
    """The texts of a message a tokenizer can count, and an estimate for the rest."""
    texts = [message.role, message.content]
    estimate = 0
    for part in message.parts:
        if isinstance(part, TextPart | ThinkingPart):
            texts.append(part.text)
        elif isinstance(part, UrlPart):
            texts.append(part.url)
        else:
            estimate += max(1, math.ceil(len(part.model_dump_json()) / 4))
    for call in message.tool_calls:
        texts.extend((call.name, call.arguments))
    if message.tool_name:
        texts.append(message.tool_name)
    return texts, estimate


# --- identity and flat history ---------------------------------------------------------


def resolve_conversation_id(history: Sequence[Message], explicit: str | None = None) -> str:
    """Decide which conversation a run belongs to.

    A non-empty `explicit` id wins; else the most recent message of `history`
    (the last in the list) that carries a non-empty `conversation_id` donates
    it; else a new UUIDv7 is minted. Apply it to the history as supplied,
    before any processor, so trimming never changes a conversation's identity.

    Args:
        history: The history as supplied, oldest first.
        explicit: The id the caller asked for, if any.

    Returns:
        The conversation id.
    """
    if explicit:
        return explicit
    for message in reversed(history):
        if message.conversation_id:
            return message.conversation_id
    return new_id()


def from_pairs(pairs: Iterable[tuple[str, str]]) -> list[Message]:
    """Build messages from the flat `(role, text)` history form.

    The form is meant for simple and untrusted callers, so it cannot express
    system or tool messages, nor tool calls: a role other than exactly `user`
    or `assistant` becomes `user`.

    Args:
        pairs: `(role, text)` pairs, oldest first.

    Returns:
        One message per pair, with `text` as its content.

    Raises:
        InvalidInputError: a pair is not two strings.
    """
    messages = []
    for position, pair in enumerate(pairs):
        # The pairs often come straight from a request body: check them here so
        # a bad one reads as a sentence rather than as a pydantic error.
        if not (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
        ):
            raise InvalidInputError(
                f"History pair {position} is {pair!r}, which is not a (role, text) pair of "
                f"strings. Pass pairs such as ('user', 'Hello') or ('assistant', 'Hi!')."
            )
        role, text = pair
        messages.append(Message(role="assistant" if role == "assistant" else "user", content=text))
    return messages
