"""Pure history algorithms: repair, sanitize, trim, budget, the model's view, identity.

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
- `model_view` is what the model sees of a run: the system message, then the
  processed, repaired history, then the run's own turns. The engine builds
  every request with it and the audit rebuilds every request with it, so the
  two cannot disagree; `instructions_digest` is the hash `run.started` keeps.
- `resolve_conversation_id` and `from_pairs` are the identity and flat-history
  helpers of the engine.
"""

from __future__ import annotations

import hashlib
import reprlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from chatledger.store import _repair
from chatledger.store._errors import HistoryError, InvalidInputError
from chatledger.store._tokens import approximate_tokens, tiktoken_counter
from chatledger.store.ids import new_id
from chatledger.store.messages import Message, ToolCall, UrlPart

__all__ = [
    "HistoryProcessor",
    "HistoryRepair",
    "ModelView",
    "SanitizeReport",
    "UnsafePart",
    "approximate_tokens",
    "budget_history",
    "from_pairs",
    "instructions_digest",
    "model_view",
    "no_result",
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
    """What `normalize_history` changed. Every index refers to the caller's list.

    Attributes:
        synthesized: Ids of the calls that got a synthesized result, in order.
        dropped: Indexes of the tool messages dropped: results without a call
            (or placed before it) and duplicates.
        moved: Indexes of the real results moved up into their call's block.
        truncated: Ids of the calls whose arguments are not a JSON object to
            a strict parser (`NaN` and `Infinity` are not JSON), in order of
            appearance (detection only; listed on every pass).
    """

    synthesized: list[str] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UnsafePart:
    """A part `sanitize_history` dropped.

    Attributes:
        message_index: The index of its message in the caller's list.
        kind: The part's kind (`url`).
        scheme: The URL's scheme, lowercased; `""` when it has none or does not parse.
    """

    message_index: int
    kind: str
    scheme: str


@dataclass(frozen=True)
class SanitizeReport:
    """What `sanitize_history` changed.

    Attributes:
        system_prompts: How many system messages were dropped.
        unsafe_parts: The parts dropped, in order.
        repair: What the pairing repair changed; its indexes refer to the
            caller's list too.
    """

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
      whose `tool_call_id` is None or empty) is dropped, and of several
      results for one call the first is kept;
    - a real result separated from its call's turn by other messages is moved
      up into that turn's block;
    - calls without an id (None or empty) cannot be paired and pass through
      as they are: no result is synthesized for them.

    Content is never rewritten, and the repair is idempotent: repairing a
    repaired history returns it unchanged, with an empty report apart from
    `truncated`.

    Args:
        messages: The history, oldest first.

    Returns:
        The repaired messages and a `HistoryRepair` naming what changed:
        `synthesized` call ids, `dropped` and `moved` indexes into `messages`,
        and the ids of calls whose arguments are not a JSON object to a strict
        parser, `NaN` and `Infinity` being no JSON (`truncated`, reported on
        every pass; the arguments stay verbatim).
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
    system, unsafe, replaced, emptied = _screen(messages)
    # Timsort merges the two ascending runs in linear time.
    removed = sorted(system + emptied)
    kept = _without(messages, removed, replaced)
    repaired, repair = normalize_history(kept)
    return repaired, SanitizeReport(
        system_prompts=len(system),
        unsafe_parts=unsafe,
        repair=HistoryRepair(
            synthesized=repair.synthesized,
            dropped=_restore(repair.dropped, removed),
            moved=_restore(repair.moved, removed),
            truncated=repair.truncated,
        ),
    )


def _screen(
    messages: Sequence[Message],
) -> tuple[list[int], list[UnsafePart], dict[int, Message], list[int]]:
    """Find the system messages and the `url` parts that are not http(s).

    Returns, with indexes into `messages`: the system messages, which go
    (instructions come from the agent, never from supplied history); the unsafe
    parts; each message that loses parts, with those parts dropped; and the
    user messages that the drops leave empty, which go too. A user message
    that arrived empty is the caller's to keep, and tool results always stay,
    since their call needs them.
    """
    # One loop that only reads: on a long history, every pass over the
    # messages costs a cache miss per message, as much as the work itself.
    system: list[int] = []
    unsafe: list[UnsafePart] = []
    replaced: dict[int, Message] = {}
    emptied: list[int] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            system.append(index)
            continue
        if not message.parts:
            continue
        parts = []
        for part in message.parts:
            if isinstance(part, UrlPart):
                scheme = _scheme(part.url)
                if scheme not in _SAFE_SCHEMES:
                    unsafe.append(UnsafePart(message_index=index, kind="url", scheme=scheme))
                    continue
            parts.append(part)
        if len(parts) == len(message.parts):
            continue
        replaced[index] = message.model_copy(update={"parts": parts})
        if message.role == "user" and not message.content and not parts:
            emptied.append(index)
    return system, unsafe, replaced, emptied


def _scheme(url: str) -> str:
    # urlsplit lowercases the scheme and, like a browser, ignores leading
    # blanks and embedded tabs and newlines, so " JavaScript:" is caught too.
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return ""


def _without(
    messages: Sequence[Message], removed: list[int], replaced: dict[int, Message]
) -> list[Message]:
    """`messages` without the ascending `removed` indexes, and with `replaced` swapped in."""
    # Copied as slices between the removed ones: the messages themselves are
    # not visited again.
    out = list(messages)
    for index, message in replaced.items():
        out[index] = message
    if not removed:
        return out
    kept: list[Message] = []
    start = 0
    for index in removed:
        kept.extend(out[start:index])
        start = index + 1
    kept.extend(out[start:])
    return kept


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
                f"Fitting a history of {len(history)} messages into {max_tokens} tokens left "
                f"no user message to start a request from. Raise max_tokens so that the "
                f"budget reaches back to a user message."
            )
        return history[cut:]

    return budget


# --- what the model sees --------------------------------------------------------------


@dataclass(frozen=True)
class ModelView:
    """What the model sees of a run: the fixed start of each of its requests.

    Built once per run by `model_view`; each request of the run is
    `messages(turns)` with the turns the run recorded before it.

    Attributes:
        head: The system message (when there is one), then the processed,
            repaired history, without run and conversation stamps.
        repair: What repair changed in the processed history; its indexes
            refer to the processor's output.
    """

    head: list[Message]
    repair: HistoryRepair

    def messages(self, turns: Sequence[Message]) -> list[Message]:
        """The messages of a request: the head, then the run's `turns` so far, unstamped.

        The turns are the run's own model turns and tool results, in the order
        recorded; they are not processed or repaired (each completed turn's
        calls are answered before the next request).
        """
        return [*self.head, *(_unstamped(m) for m in turns)]


def model_view(
    replayed: Sequence[Message],
    *,
    instructions: str,
    context: str,
    processor: HistoryProcessor | None,
) -> ModelView:
    """The model's view of a run: the one rule for what every request of it holds.

    The engine builds its requests with it and the audit rebuilds them with
    it, so a rebuilt request equals the one sent, failures included. The steps:

    1. drop the system messages of `replayed` (instructions come from the
       agent, never from history);
    2. apply `processor` (e.g. `trim_history(50)`), whose output must still
       end with the prompt: its last user message may be followed by no more
       messages than followed the prompt (none, except on a resume, where the
       failed run's completed turns follow it); else `HistoryError`;
    3. repair the pairing of calls and results (`normalize_history`);
    4. put first a system message of `instructions`, then `context`, joined
       by a blank line (none when both are empty);
    5. remove run and conversation stamps: they are bookkeeping the model never
       sees, so identical conversations make byte-identical requests.

    Deterministic, with no I/O, as long as `processor` is.

    Args:
        replayed: The run's lineage up to its first request, unrepaired:
            the history at its base and the prompt (on a resume, the failed
            run's partial).
        instructions: The instructions the run resolved.
        context: Text for the system message after the instructions (the
            engine's retrieval context), or `""`.
        processor: The agent's history processor, if it has one.

    Returns:
        The `ModelView`: its `head` and the `repair` report.

    Raises:
        HistoryError: the processor dropped the prompt (or raised it itself).
    """
    history = [m for m in replayed if m.role != "system"]
    if processor is not None:
        after = _after_last_user(history)
        history = processor(history)
        if after is not None and not _keeps_the_prompt(history, after):
            raise HistoryError(
                "The history processor dropped the current prompt, which must stay the "
                "final user message. Make the processor keep the newest messages."
            )
    history, repair = normalize_history(history)
    system = "\n\n".join(p for p in (instructions, context) if p)
    head = [Message(role="system", content=system)] if system else []
    return ModelView([*head, *(_unstamped(m) for m in history)], repair)


def instructions_digest(instructions: str) -> str:
    """The sha256 of a run's instructions (UTF-8, hex), as `run.started` records it."""
    return hashlib.sha256(instructions.encode("utf-8")).hexdigest()


def no_result(call: ToolCall) -> Message:
    """The neutral result repair gives `call` when none was recorded.

    Its text is fixed and states that no outcome was recorded, not a failure,
    so the model may call the tool again.
    """
    return _repair.no_result(call)


def _after_last_user(history: Sequence[Message]) -> int | None:
    """How many messages follow the last user message, or None when there is none."""
    for back, message in enumerate(reversed(history)):
        if message.role == "user":
            return back
    return None


def _keeps_the_prompt(processed: Sequence[Message], after: int) -> bool:
    """Whether a processor's output still ends with the current prompt.

    The prompt is the final user message of the history handed to the
    processor, followed by `after` messages. A processor may copy, redact or
    rebuild any message, the prompt included, so the prompt cannot be found by
    identity or by equality, only by its place: the output's last user
    message must be followed by no more than `after` messages (fewer is fine:
    a processor may drop tool traffic). A processor that drops the prompt
    leaves an earlier user message as the last, followed by at least its
    answer and whatever followed the prompt, so it fails; the one drop the
    shape cannot see is of a prompt that directly follows another user
    message, which then stands in for it.
    """
    kept = _after_last_user(processed)
    return kept is not None and kept <= after


def _unstamped(message: Message) -> Message:
    # Run and conversation ids are bookkeeping, not content: the model never
    # sees them, so identical conversations make byte-identical requests.
    if message.run_id is None and message.conversation_id is None:
        return message
    return message.model_copy(update={"run_id": None, "conversation_id": None})


# --- identity and flat history ---------------------------------------------------------


def resolve_conversation_id(history: Sequence[Message], explicit: str | None = None) -> str:
    """Decide which conversation a run belongs to.

    A non-empty `explicit` id wins; else the most recent message of `history`
    (the last in the list) that carries a non-empty `conversation_id` donates
    it; else a new UUIDv7 is minted. Apply it to the history as supplied,
    before any processor, so trimming never changes a conversation's identity.

    It does not know which conversations exist, nor whose they are: a
    donated id may name another tenant's conversation, or none. The engine's
    `run_with_history` applies the same rule and then keeps a donated id only
    if it is a conversation of the handle's tenant, opening a new one
    otherwise (ADR 0033).

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
                f"History pair {position} is {reprlib.repr(pair)}, which is not a (role, text) pair of "
                f"strings. Pass pairs such as ('user', 'Hello') or ('assistant', 'Hi!')."
            )
        role, text = pair
        messages.append(Message(role="assistant" if role == "assistant" else "user", content=text))
    return messages
