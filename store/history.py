"""Pure history algorithms: repair, sanitize, trim, budget, identity.

(Interface fixed; implementation in progress.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from store._errors import HistoryError
from store.messages import Message

__all__ = [
    "HistoryProcessor",
    "HistoryRepair",
    "SanitizeReport",
    "UnsafePart",
    "budget_history",
    "from_pairs",
    "normalize_history",
    "resolve_conversation_id",
    "sanitize_history",
    "trim_history",
]

HistoryProcessor = Callable[[list[Message]], list[Message]]


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


def normalize_history(messages: Sequence[Message]) -> tuple[list[Message], HistoryRepair]:
    raise NotImplementedError


def sanitize_history(messages: Sequence[Message]) -> tuple[list[Message], SanitizeReport]:
    raise NotImplementedError


def trim_history(max_messages: int) -> HistoryProcessor:
    raise NotImplementedError


def budget_history(counter: Callable[[Message], int] | None, max_tokens: int) -> HistoryProcessor:
    raise NotImplementedError


def resolve_conversation_id(history: Sequence[Message], explicit: str | None = None) -> str:
    raise NotImplementedError


def from_pairs(pairs: Iterable[tuple[str, str]]) -> list[Message]:
    raise NotImplementedError


_ = HistoryError
