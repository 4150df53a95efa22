"""The values the store returns: conversations, branches, events, runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from store.messages import Message, Usage, load_message

__all__ = [
    "Appended",
    "Branch",
    "BranchReason",
    "Conversation",
    "Event",
    "EventKind",
    "ForkPoint",
    "NewEvent",
    "Origin",
    "Position",
    "Run",
    "RunCursor",
    "RunStatus",
]

EventKind = Literal[
    "conversation.created",
    "branch.created",
    "run.started",
    "message.recorded",
    "model.requested",
    "model.responded",
    "tool.started",
    "tool.finished",
    "run.completed",
    "run.failed",
    "run.canceled",
    "head.moved",
]
Origin = Literal["run", "client", "repair"]
BranchReason = Literal["root", "run", "resume", "fork", "edit"]
RunStatus = Literal["running", "completed", "failed", "canceled"]


@dataclass(frozen=True, order=True)
class Position:
    """A point in a conversation's history: a branch and a position on it."""

    branch_id: str
    position: int


@dataclass(frozen=True)
class ForkPoint:
    """Where a forked conversation came from."""

    conversation_id: str
    branch_id: str
    position: int


@dataclass(frozen=True)
class Conversation:
    """A conversation: its head and where it came from."""

    id: str
    tenant: str
    head: Position
    created_at: datetime
    metadata: dict[str, Any]
    forked_from: ForkPoint | None = None
    head_open: bool = field(default=True, repr=False, compare=False)
    """Whether the next append may continue the head's branch in place."""


@dataclass(frozen=True)
class Branch:
    """An append-only line of events, continuing its parent at a position."""

    id: str
    conversation_id: str
    parent: Position | None
    reason: BranchReason
    run_id: str | None
    resumes_run_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class Event:
    """One row of the log."""

    seq: int
    id: str
    conversation_id: str
    branch_id: str
    position: int
    run_id: str | None
    kind: EventKind
    origin: Origin
    head: bool
    recorded_at: datetime
    idempotency_key: str | None
    payload_json: str = field(repr=False)
    hash: bytes = field(default=b"", repr=False)
    """sha256 chained to the previous event of the lineage (see `store._chain`)."""

    @property
    def payload(self) -> dict[str, Any]:
        """The payload, parsed. For `message.recorded` it is the message's JSON."""
        value: dict[str, Any] = json.loads(self.payload_json)
        return value

    @property
    def message(self) -> Message | None:
        """The recorded message, for `message.recorded` events; else None."""
        if self.kind != "message.recorded":
            return None
        return load_message(self.payload_json)


@dataclass(frozen=True)
class NewEvent:
    """An event to append: its kind, payload and origin.

    For `message.recorded`, use `NewEvent.of_message`.
    """

    kind: EventKind
    payload: dict[str, Any] = field(default_factory=dict)
    origin: Origin = "run"
    message: Message | None = None

    @staticmethod
    def of_message(message: Message, origin: Origin = "run") -> NewEvent:
        """A `message.recorded` event for `message`."""
        return NewEvent("message.recorded", origin=origin, message=message)


@dataclass(frozen=True)
class Appended:
    """What an append wrote: its events, and the conversation head afterwards."""

    conversation_id: str
    events: list[Event]
    head: Position

    @property
    def positions(self) -> list[int]:
        """The positions of the appended events."""
        return [e.position for e in self.events]


@dataclass(frozen=True)
class Run:
    """A run, as its projection row shows it."""

    id: str
    tenant: str
    conversation_id: str
    branch_id: str
    position: int
    base: Position
    head_at_start: Position
    status: RunStatus
    stage: str | None
    error: str | None
    request_count: int
    tool_count: int
    usage: Usage
    model: str | None
    resumes: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempt: int
    attention: str | None
    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class RunCursor:
    """A worker's handle on a run it holds: where to append next, and its lease.

    Every append names the cursor; the database refuses it unless the run is
    still running, leased to `owner` at `attempt`, and at `position`.
    """

    run_id: str
    conversation_id: str
    branch_id: str
    position: int
    owner: str
    attempt: int
