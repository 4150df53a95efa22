"""Token counters for `store.history.budget_history`.

A counter maps one message to a token count. `approximate_tokens` needs
nothing and is the default; `tiktoken_counter` counts exactly with an OpenAI
encoding when the optional tiktoken package is installed. Both are pure: the
only I/O is tiktoken loading its encoding file when a counter is built.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from typing import Any

from chatledger.store._errors import InvalidInputError
from chatledger.store.messages import Message, TextPart, ThinkingPart, UrlPart

__all__ = ["approximate_tokens", "tiktoken_counter"]


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
        OSError: tiktoken could not download the encoding's file (offline, say);
            tiktoken reads it from `TIKTOKEN_CACHE_DIR` when set.
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
            f"tiktoken does not know the encoding {encoding!r}. Pass one of "
            f"{', '.join(tiktoken.list_encoding_names())}."
        ) from exc

    def count(message: Message) -> int:
        texts, estimate = _readable_text(message)
        # disallowed_special=(): text that looks like a special token is counted
        # as ordinary text instead of raising.
        tokens = sum(len(encoder.encode(text, disallowed_special=())) for text in texts)
        return _MESSAGE_OVERHEAD + tokens + estimate

    return count


# Tokens a chat format spends on each message's delimiters, beyond its fields
# (OpenAI's published rule of thumb; the role is counted as text).
_MESSAGE_OVERHEAD = 3


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
