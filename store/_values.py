"""The values the store returns: conversations, branches, events, runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

from chatledger.store.history import HistoryRepair
from chatledger.store.messages import Message, Usage, dump_message, load_message

__all__ = [
    "VALUE_CONFIG",
    "Appended",
    "Branch",
    "BranchReason",
    "Conversation",
    "Entry",
    "Event",
    "EventKind",
    "Expected",
    "ForkPoint",
    "NewConversation",
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
    "state.changed",
    "conversation.erased",
]
Origin = Literal["run", "client", "repair"]
BranchReason = Literal["root", "run", "resume", "fork", "edit"]
RunStatus = Literal["running", "completed", "failed", "canceled"]


# -- serialization -------------------------------------------------------------------
#
# The values are plain dataclasses; nothing here validates or converts them.
# `pydantic.TypeAdapter(Event).dump_python(event, mode="json")` reads the
# config and the annotations below to give each value one JSON form: camelCase
# keys, like the message contract's, and times as `datetime.isoformat()`
# writes them (`+00:00`, where pydantic would write `Z`). The JSON form is for
# output (the command line's `--json`, a service's responses): an event's
# payload appears parsed. In Python mode nothing changes but the keys, and
# `validate_python(dump_python(value))` gives the value back.

VALUE_CONFIG = ConfigDict(
    alias_generator=to_camel,
    serialize_by_alias=True,
    validate_by_name=True,
    ser_json_bytes="hex",
)
"""The `__pydantic_config__` of every value the store returns."""


def _isoformat(value: datetime) -> str:
    return value.isoformat()


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _parsed(payload_json: str) -> Any:
    return json.loads(payload_json)


def _stored(message: Message) -> Any:
    return json.loads(dump_message(message))


Timestamp = Annotated[datetime, PlainSerializer(_isoformat, return_type=str, when_used="json")]
"""A `datetime`; in JSON, its `isoformat()`."""

Seconds = Annotated[timedelta, PlainSerializer(_seconds, return_type=float, when_used="json")]
"""A `timedelta`; in JSON, its length in seconds."""

StoredMessage = Annotated[Message, PlainSerializer(_stored, return_type=Any, when_used="json")]
"""A `Message`; in JSON, as the log stores it (defaults left out, see `dump_message`)."""


@dataclass(frozen=True, order=True)
class Position:
    """A point in a conversation's history: a branch and a position on it."""

    __pydantic_config__ = VALUE_CONFIG

    branch_id: str
    position: int


@dataclass(frozen=True)
class Expected:
    """What an append expects to find, else `ConflictError` and nothing written
    (`append_messages(expected=Expected(head=..., state=...))`; `expected=3` or a
    `Position` is the head alone).

    Attributes:
        head: the head position the caller last saw (an `int` counts events on
            the head's lineage; a `Position` names its branch too).
        state: a compare-and-set on the conversation's state: each field given
            must hold that value now (a field given as `None` must be absent).
    """

    head: int | Position | None = None
    state: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NewConversation:
    """The conversation an append creates when the tenant has none by its id
    (`append_messages(create=NewConversation(...))`; `create=True` is one with
    neither).

    Attributes:
        metadata: the new conversation's metadata (a JSON object).
        subject: the erasure subject of the sealed conversation it creates
            (docs/erasure.md), on a store with a key-encryption key.
    """

    metadata: dict[str, Any] | None = None
    subject: str | None = None


@dataclass(frozen=True)
class ForkPoint:
    """Where a forked conversation came from."""

    __pydantic_config__ = VALUE_CONFIG

    conversation_id: str
    branch_id: str
    position: int


@dataclass(frozen=True)
class Conversation:
    """A conversation: its head and where it came from."""

    __pydantic_config__ = VALUE_CONFIG

    id: str
    tenant: str
    head: Position
    created_at: Timestamp
    metadata: dict[str, Any]
    forked_from: ForkPoint | None = None
    key: str | None = None
    """The caller's own name for it (`create_conversation(key=...)`), unique in the tenant."""
    state: dict[str, Any] = field(default_factory=dict)
    """Its current state: a JSON object that changes after creation (`append_messages(state=...)`)."""
    subject: str | None = None
    """Its erasure subject when its content is sealed (docs/erasure.md); None: in the clear."""
    erased_at: Timestamp | None = None
    """When its subject was erased (`ledger.erase`): its content reads as erased markers."""
    head_open: bool = field(default=True, repr=False, compare=False)
    """Whether the next append may continue the head's branch in place."""


@dataclass(frozen=True)
class Entry:
    """A message where it stands in a lineage: its event, position and time."""

    __pydantic_config__ = VALUE_CONFIG

    event_id: str
    conversation_id: str
    """The conversation whose log holds the event (a fork's early entries are its source's)."""
    position: Position
    seq: int
    recorded_at: Timestamp
    message: StoredMessage


@dataclass(frozen=True)
class Branch:
    """An append-only line of events, continuing its parent at a position."""

    __pydantic_config__ = VALUE_CONFIG

    id: str
    conversation_id: str
    parent: Position | None
    reason: BranchReason
    run_id: str | None
    resumes_run_id: str | None
    created_at: Timestamp


@dataclass(frozen=True)
class Event:
    """One row of the log."""

    __pydantic_config__ = VALUE_CONFIG

    seq: int
    id: str
    conversation_id: str
    branch_id: str
    position: int
    run_id: str | None
    kind: EventKind
    origin: Origin
    head: bool
    recorded_at: Timestamp
    idempotency_key: str | None
    # In JSON: `payload`, parsed, as the property below gives it.
    payload_json: Annotated[
        str, Field(alias="payload"), PlainSerializer(_parsed, return_type=Any, when_used="json")
    ] = field(repr=False)
    hash: bytes = field(default=b"", repr=False)
    """sha256 chained to the previous event of the lineage (see `store._sql.chain`)."""

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

    __pydantic_config__ = VALUE_CONFIG

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

    __pydantic_config__ = VALUE_CONFIG

    conversation_id: str
    events: list[Event]
    head: Position
    created: bool = False
    """Whether this append created the conversation (`append_messages(create=True)`);
    its `conversation.created` event is then the first of `events`."""
    repair: HistoryRepair = field(default_factory=HistoryRepair)
    """What the repaired history (`history()`) does to the messages appended, as
    `normalize_history` reports it, in the indexes of the list passed: results
    `dropped` (no call they answer: kept in the log, left out of the history) or
    `moved` into their call's block, the appended calls still without a result
    (`synthesized`: the history shows the neutral result until one is appended),
    and those whose arguments are no JSON object (`truncated`)."""

    @property
    def positions(self) -> list[int]:
        """The positions of the appended events."""
        return [e.position for e in self.events]


@dataclass(frozen=True)
class Run:
    """A run, as its projection row shows it."""

    __pydantic_config__ = VALUE_CONFIG

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
    lease_expires_at: Timestamp | None
    attempt: int
    attention: str | None
    started_at: Timestamp
    ended_at: Timestamp | None


@dataclass(frozen=True)
class RunCursor:
    """A worker's handle on a run it holds: where to append next, and its lease.

    Every append names the cursor; the database refuses it unless the run is
    still running, leased to `owner` at `attempt`, and at `position`.
    """

    __pydantic_config__ = VALUE_CONFIG

    run_id: str
    conversation_id: str
    branch_id: str
    position: int
    owner: str
    attempt: int


# -- audit values (store._sql.audit answers with these) ------------------------------

Stage = Literal["conversation", "run", "model", "tool", "message", "other"]
ToolStatus = Literal["finished", "failed", "running", "uncertain"]


@dataclass(frozen=True)
class TimelineEntry:
    """One event of a run's timeline.

    Attributes:
        stage: what part of the run the event belongs to, from its kind.
        elapsed: time since the run's `run.started` event (zero for the
            `branch.created` recorded just before it, in the same transaction).
    """

    __pydantic_config__ = VALUE_CONFIG

    event: Event
    stage: Stage
    elapsed: Seconds


@dataclass(frozen=True)
class ToolExecution:
    """One tool call a run started, and how it ended.

    `status` is `finished` or `failed` (the run recorded `tool.finished`),
    `running` (no result yet, and the run still holds a live lease), or
    `uncertain`: the call started but never finished and its run ended or its
    worker died, so whether its side effects happened is unknown.
    """

    __pydantic_config__ = VALUE_CONFIG

    call_id: str | None
    name: str
    run_id: str | None
    conversation_id: str
    branch_id: str
    started_seq: int
    started_at: Timestamp
    finished_at: Timestamp | None
    status: ToolStatus

    @property
    def uncertain(self) -> bool:
        """Started, never finished, and nobody is working on it any more."""
        return self.status == "uncertain"


@dataclass(frozen=True)
class RecordedRequest:
    """Model request `request` of a run, rebuilt from the log, provider-neutral.

    `messages` are what the engine sent: the system message (the run's
    instructions, then `context`), the repaired history at the run's base
    (through its history processor, when given), then the run's own turns
    recorded before the request, without run and conversation stamps. An
    adapter's `prepare()` turns them into the wire body whose sha256 the run
    recorded as `digest` (see `engine.audit`).

    Attributes:
        repair: what repair changed in the history (synthesized results of
            unanswered calls, dropped orphan results): the model saw the
            synthesized results, which no tool produced.
    """

    __pydantic_config__ = VALUE_CONFIG

    run_id: str
    conversation_id: str
    request: int
    digest: str
    model: str | None
    recorded_at: Timestamp
    messages: list[StoredMessage]
    repair: HistoryRepair


@dataclass(frozen=True)
class LineageBranch:
    """A branch of a conversation: why it exists and which positions it holds."""

    __pydantic_config__ = VALUE_CONFIG

    id: str
    reason: str
    parent: Position | None
    run_id: str | None
    resumes_run_id: str | None
    created_at: Timestamp
    first_position: int
    tip: int
    holds_head: bool


@dataclass(frozen=True)
class LineageResume:
    """A run that resumes another run of the conversation."""

    __pydantic_config__ = VALUE_CONFIG

    run_id: str
    resumes: str
    branch_id: str
    status: RunStatus


@dataclass(frozen=True)
class Lineage:
    """Where a conversation came from and what came of it.

    Attributes:
        branches: every branch, oldest first.
        forks: the conversations forked from this one (forks out), oldest first.
        resumes: runs that resume a failed or canceled run of it.
    """

    __pydantic_config__ = VALUE_CONFIG

    conversation: Conversation
    branches: list[LineageBranch]
    forks: list[Conversation]
    resumes: list[LineageResume]

    @property
    def forked_from(self) -> ForkPoint | None:
        """Where this conversation was forked from (the fork in), or None."""
        return self.conversation.forked_from
