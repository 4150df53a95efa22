"""The engine's values: what hooks receive, what a run returns, what a request holds.

They live apart from `engine.agent` so that the run loop (`engine._run`), the
`Agent` face and the audit (`engine.audit`) can all import them without
importing each other. Two small pure rules live here too, because the run
and the audit must apply them alike: `context_block` (how retrieval hits
read in the system message) and `model_request` (what an agent adds to a
request's messages).
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from chatledger.engine.providers import ModelRequest
from chatledger.engine.tools import Tool
from chatledger.store import Message, Usage

__all__ = [
    "RESTRICTED",
    "Guard",
    "Hit",
    "HitFilter",
    "Instructions",
    "MessageCallback",
    "RequestOptions",
    "Result",
    "Retriever",
    "RunContext",
    "Source",
    "context_block",
    "drop_restricted",
    "given_hits",
    "model_request",
]

RESTRICTED = "RESTRICTED"
"""The classification of content that must never leave for a model or a caller.

`drop_restricted` removes it wherever content leaves: an `Agent`'s default
`context_filter` (before the model) and the ask service's source filter
(before the caller). The comparison ignores case, so a retriever that writes
`restricted` is not let through by a spelling.
"""


@dataclass(frozen=True)
class RunContext:
    """What dynamic instructions and hooks may know about the run."""

    run_id: str
    conversation_id: str
    prompt: str


@dataclass(frozen=True)
class Hit:
    """A retrieval hit: evidence a retrieval hook found for the current prompt."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    classification: str | None = None
    """The content's sensitivity label, as the retriever's source gives it.

    `RESTRICTED` (any case) content is dropped by `drop_restricted`, which an
    `Agent` applies before the model sees any hit.
    """

    @property
    def restricted(self) -> bool:
        """Whether the hit is classified `RESTRICTED`."""
        return is_restricted(self.classification)


@dataclass(frozen=True)
class Source:
    """Evidence a result rests on: a tool result or a retrieval hit of this run.

    Content that came in as history is never a source.
    """

    kind: Literal["tool", "retrieval"]
    ref: str
    name: str | None = None
    failed: bool = False
    text: str | None = None
    """A retrieval hit's text (what the model was given); `None` for a tool."""
    classification: str | None = None
    """A retrieval hit's classification, as its `Hit` carried it."""

    @property
    def restricted(self) -> bool:
        """Whether the source is a hit classified `RESTRICTED`."""
        return is_restricted(self.classification)


@dataclass(frozen=True)
class Result:
    """A completed run.

    Attributes:
        messages: the whole conversation after the run, repaired.
        new_messages: what the run added (prompt, model turns, tool results).
        output: the final assistant text.
    """

    run_id: str
    conversation_id: str
    messages: list[Message]
    new_messages: list[Message]
    output: str
    usage: Usage
    sources: list[Source]
    request_count: int
    tool_count: int


Instructions = Callable[[RunContext], str | Awaitable[str]]
"""Dynamic instructions: resolved once per run from what the run is about."""

MessageCallback = Callable[[Message], Awaitable[None] | None]
"""Receives each message a run records (model turns, tool results), once it is in the log."""

Guard = Callable[[str], Awaitable[None] | None]
"""Screens a prompt before anything is written; raising rejects it."""

Retriever = Callable[[str], Iterable[Hit] | Awaitable[Iterable[Hit]]]
"""Finds evidence for a prompt; the hits become context and sources."""

HitFilter = Callable[[Sequence[Hit]], Iterable[Hit]]
"""Chooses which retrieval hits may reach the model (an `Agent`'s `context_filter`)."""


def is_restricted(classification: str | None) -> bool:
    """Whether `classification` is `RESTRICTED`, however it is spelled.

    The label is compared after Unicode compatibility normalization (NFKC:
    full-width letters are letters), without invisible format characters
    (zero-width spaces, byte-order marks), surrounding blanks and
    punctuation, and in any case: a label is not let through by a spelling.
    """
    if classification is None:
        return False
    text = unicodedata.normalize("NFKC", classification)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text.strip(_NOT_LETTERS).upper() == RESTRICTED


_NOT_LETTERS = string.whitespace + string.punctuation


def drop_restricted(hits: Sequence[Hit]) -> list[Hit]:
    """The hits not classified `RESTRICTED`, in their order."""
    return [h for h in hits if not h.restricted]


def given_hits(context_filter: HitFilter | None, hits: Sequence[Hit]) -> list[Hit]:
    """The hits a model is given: `drop_restricted`, then the agent's own `context_filter`.

    A filter of the agent's own (a top-k, a finer classification) cannot let
    RESTRICTED content back in; only `context_filter=None` opts out of every
    filter, the restricted one included.
    """
    if context_filter is None:
        return list(hits)
    return list(context_filter(drop_restricted(hits)))


def context_block(hits: Sequence[Hit]) -> str:
    """The text retrieval hits add to the system message after the instructions.

    `""` when there are none, so a run without hits sends no block.
    """
    hits = list(hits)  # a generator is truthy even when empty
    if not hits:
        return ""
    lines = [f"[{h.id}] {h.text}" for h in hits]
    return "Context retrieved for this request:\n" + "\n".join(lines)


class RequestOptions(Protocol):
    """What an agent adds to every request's messages (an `Agent` is one)."""

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def tool_choice(self) -> str | None: ...

    @property
    def settings(self) -> dict[str, Any]: ...


def model_request(options: RequestOptions, messages: Sequence[Message]) -> ModelRequest:
    """The provider-neutral request of `messages` with the agent's tools and settings.

    The tool choice goes only with tools: without tools there is nothing to choose.
    """
    specs = [t.spec for t in options.tools.values()]
    return ModelRequest(
        messages=list(messages),
        tools=specs,
        tool_choice=options.tool_choice if specs else None,
        settings=options.settings,
    )
