"""The service's wire values: what a request may hold and what a response says.

The models are the OpenAPI schema too (`/openapi.json`). Field names are
snake_case on the wire, as request bodies of HTTP APIs usually are; messages,
runs and events keep the camelCase of chatledger's own JSON (`Message` and
the store's values), so a client reads them with the contract's names.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chatledger.engine import Result, Source

__all__ = [
    "AskRequest",
    "AskResponse",
    "ErrorBody",
    "ErrorDetail",
    "ForkRequest",
    "ForkResponse",
    "UsageOut",
]


class AskRequest(BaseModel):
    """A question for the agent, with an optional conversation and flat history."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, description="The current prompt.")
    conversation_id: str | None = Field(
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


class UsageOut(BaseModel):
    """The run's token usage."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


class AskResponse(BaseModel):
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
        usage = result.usage
        return cls(
            conversation_id=result.conversation_id,
            run_id=result.run_id,
            answer=result.output,
            sources=list(sources),
            usage=UsageOut(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            ),
            request_count=result.request_count,
            tool_count=result.tool_count,
        )


class ForkRequest(BaseModel):
    """Where to fork: a position on the head's lineage (default the head)."""

    model_config = ConfigDict(extra="forbid")

    at: int | None = Field(default=None, ge=1, description="A position; absent forks the head.")


class ForkResponse(BaseModel):
    """The new conversation."""

    conversation_id: str
    forked_from: str


class ErrorDetail(BaseModel):
    """What went wrong, in a sentence, and for a failed run where it stopped."""

    type: str
    message: str
    stage: str | None = None
    run_id: str | None = None
    conversation_id: str | None = None
    resume: str | None = Field(
        default=None, description="The run id to resume, when the run's partial is kept."
    )


class ErrorBody(BaseModel):
    """Every error response's body."""

    error: ErrorDetail
