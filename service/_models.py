"""The service's wire values: what a request may hold and what a response says.

The models are the OpenAPI schema too (`/openapi.json`): every route answers
with one of them. Field names are camelCase on the wire, everywhere, as in
chatledger's own JSON (`Message` and the store's values, which the responses
embed as they are), so one convention covers every body and stream event. A
request may spell a field in snake_case too (`conversation_id`), but not both
ways at once (docs/adr/0038-one-http-api-shape.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from chatledger.engine import Result, Source
from chatledger.store import Conversation, Event, ForkPoint, Message, Position, Run
from chatledger.store.ids import canonical_id

__all__ = [
    "AskRequest",
    "AskResponse",
    "ConversationOut",
    "ConversationsOut",
    "ErrorBody",
    "ErrorDetail",
    "ForkRequest",
    "ForkResponse",
    "Health",
    "MessagesOut",
    "PositionedMessage",
    "RunOut",
    "RunsOut",
    "StartEvent",
    "ToolCallEvent",
    "ToolResultEvent",
    "UsageOut",
    "Wire",
]


Id = Annotated[str, AfterValidator(canonical_id)]
"""An id as a person may type or paste it: a UUID in capitals is lower-cased, as the
command line does (`canonical_id`); the store checks the rest."""


class Wire(BaseModel):
    """A body of the service: camelCase on the wire, snake_case accepted on input."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class AskRequest(Wire):
    """A question for the agent, with an optional conversation and flat history."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, description="The current prompt.")
    conversation_id: Id | None = Field(
        default=None,
        description="Continue this conversation of your tenant; absent starts a new one.",
    )
    history: list[tuple[str, str]] | None = Field(
        default=None,
        description=(
            "Flat `[role, text]` pairs, oldest first, continued instead of the stored "
            "history: generation context only, never seen by the guard or retrieval, never "
            "a source. A role other than `user` or `assistant` becomes `user`; system and "
            "tool messages and tool calls cannot be expressed. Absent or null is exactly "
            "a request without it."
        ),
    )

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is blank; send the text to answer")
        return value

    @field_validator("history", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        # A sentence that names the bad pair, rather than pydantic's per-item errors.
        if value is None:
            return value
        if not isinstance(value, list):
            raise ValueError(
                f"history is a list of [role, text] pairs, not a {type(value).__name__}"
            )
        for index, pair in enumerate(value):
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and isinstance(pair[0], str)
                and isinstance(pair[1], str)
            ):
                raise ValueError(
                    f"history[{index}] is {pair!r:.60}, not a [role, text] pair of two strings"
                )
        return value


class UsageOut(Wire):
    """The run's token usage."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


class AskResponse(Wire):
    """A completed run's answer."""

    conversation_id: str
    run_id: str
    answer: str
    sources: list[Source] = Field(
        description="Evidence of this run: tool results and retrieval hits (never history)."
    )
    usage: UsageOut
    request_count: int
    tool_count: int

    @classmethod
    def of(cls, result: Result, sources: list[Source]) -> AskResponse:
        return cls(
            conversation_id=result.conversation_id,
            run_id=result.run_id,
            answer=result.output,
            sources=list(sources),
            usage=UsageOut.model_validate(result.usage, from_attributes=True),
            request_count=result.request_count,
            tool_count=result.tool_count,
        )


class ForkRequest(Wire):
    """Where to fork: a position on the head's lineage (default the head)."""

    model_config = ConfigDict(extra="forbid")

    at: int | None = Field(
        default=None,
        ge=1,
        description="A position (a message's `position` keeps that message); absent forks the head.",
    )


class ForkResponse(Wire):
    """The new conversation."""

    conversation_id: str
    forked_from: str


class ConversationOut(Wire):
    """A conversation: its head and where it came from."""

    id: str
    head: Position = Field(
        description="The head: a branch and a position on it (positions count events)."
    )
    created_at: datetime
    metadata: dict[str, Any]
    forked_from: ForkPoint | None = None
    key: str | None = Field(default=None, description="The caller's own name for it.")
    state: dict[str, Any] = Field(default_factory=dict)
    subject: str | None = Field(
        default=None, description="Its erasure subject when its content is sealed."
    )
    erased_at: datetime | None = None

    @classmethod
    def of(cls, conversation: Conversation) -> ConversationOut:
        return cls.model_validate(conversation, from_attributes=True)


class ConversationsOut(Wire):
    """A page of the tenant's conversations, newest first."""

    conversations: list[ConversationOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class PositionedMessage(Message):
    """A message of a history, with the position of the event that recorded it."""

    position: int | None = Field(
        default=None,
        description=(
            "The position of the event that recorded the message, on the history's "
            "lineage. Positions count events, not messages (a run records more than its "
            "messages); fork `at` a message's position to keep the history up to and "
            "including it. Absent on a result the repair synthesized for an unanswered call."
        ),
    )


class MessagesOut(Wire):
    """A conversation's repaired history, oldest first."""

    conversation_id: str
    messages: list[PositionedMessage]


class RunsOut(Wire):
    """A conversation's runs, newest first."""

    runs: list[Run]


class RunOut(Wire):
    """One run and its timeline: every event it recorded, in order."""

    run: Run
    events: list[Event]


class Health(Wire):
    """The service is up."""

    status: str = Field(description="Always `ok`.")


class StartEvent(Wire):
    """The stream's `start` event: sent once the run and its conversation are recorded."""

    run_id: str
    conversation_id: str


class ToolCallEvent(Wire):
    """The stream's `tool_call` event."""

    id: str | None
    name: str
    arguments: str = Field(description="The model's JSON text, verbatim.")


class ToolResultEvent(Wire):
    """The stream's `tool_result` event."""

    call_id: str | None
    name: str | None
    content: str
    failed: bool


class ErrorDetail(Wire):
    """What went wrong, in a sentence, and for a failed run where it stopped."""

    type: str
    message: str
    stage: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    resume: str | None = Field(
        default=None, description="The run id to resume, when the run's partial is kept."
    )


class ErrorBody(Wire):
    """Every error response's body."""

    error: ErrorDetail
