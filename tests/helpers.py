"""Message builders the store's and the history's tests share."""

from __future__ import annotations

from collections.abc import Sequence

from chatledger.store import Message, ToolCall


def user(text: str = "question") -> Message:
    return Message(role="user", content=text)


def assistant(text: str = "", calls: Sequence[ToolCall] = ()) -> Message:
    return Message(role="assistant", content=text, tool_calls=list(calls))


def turn(*texts: str) -> list[Message]:
    """Messages alternating user, assistant, user... with these texts."""
    return [
        Message(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(texts)
    ]
