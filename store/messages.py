"""The message contract: `Message`, its parts, `ToolCall` and `Usage`.

These models are the durable format of everything chatledger stores. The JSON
form uses camelCase names (`toolCalls`, `toolCallId`, `mediaType`, ...); Python
uses snake_case. The contract is **additive only**: fields are added, never
renamed or removed, and fields this version does not know (written by a newer
one) are kept on a load/dump round trip, so an old reader never destroys new
data. Part kinds this version does not know are kept the same way, as
`UnknownPart`.

Models are immutable: a recorded message is a fact. Use `model_copy(update=...)`
to derive a changed one.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from chatledger.store._checks import check_finite, json_text
from chatledger.store._errors import InvalidInputError

__all__ = [
    "DataPart",
    "Message",
    "Part",
    "Role",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "UnknownPart",
    "UrlPart",
    "Usage",
    "dump_message",
    "load_message",
    "load_messages",
]

Role = Literal["system", "user", "assistant", "tool"]


class _Contract(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
        frozen=True,
        # Message text is rarely repeated: interning it costs more than it saves
        # when a whole history is parsed at once.
        cache_strings="keys",
    )


class _PartBase(_Contract):
    kind: str

    @model_serializer(mode="wrap")
    def _keep_kind(self, handler: SerializerFunctionWrapHandler) -> Any:
        # `kind` is the discriminator: it stays in every dump, also one that
        # leaves defaults out.
        data = handler(self)
        if isinstance(data, dict) and "kind" not in data:
            data = {"kind": self.kind, **data}
        return data


class TextPart(_PartBase):
    """Plain text."""

    kind: Literal["text"] = "text"
    text: str


class UrlPart(_PartBase):
    """A reference to content by URL (an image, a document)."""

    kind: Literal["url"] = "url"
    url: str
    media_type: str | None = None


class DataPart(_PartBase):
    """Inline binary content, base64-encoded."""

    kind: Literal["data"] = "data"
    media_type: str
    data: str


class ThinkingPart(_PartBase):
    """A model's reasoning text, with the provider's signature where it gives one."""

    kind: Literal["thinking"] = "thinking"
    text: str
    signature: str | None = None


class UnknownPart(_PartBase):
    """A part of a kind this version does not know; kept verbatim on round trip."""


_KNOWN_KINDS = frozenset({"text", "url", "data", "thinking"})


def _part_tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in _KNOWN_KINDS else "unknown"


Part = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[UrlPart, Tag("url")]
    | Annotated[DataPart, Tag("data")]
    | Annotated[ThinkingPart, Tag("thinking")]
    | Annotated[UnknownPart, Tag("unknown")],
    Discriminator(_part_tag),
]
"""One part of a message, discriminated on `kind`."""


class ToolCall(_Contract):
    """A tool call requested by an assistant message.

    `arguments` is the verbatim string the model produced. It may be invalid
    JSON (a stream that died midway); it is never rewritten. A mapping given
    here is serialized to compact JSON once, at construction.
    """

    id: str | None = None
    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _serialize_mapping(cls, value: Any) -> Any:
        if isinstance(value, dict):
            # Strict: a value JSON cannot hold (a set, bytes, NaN, a non-string
            # key, ...) is refused here, naming where it is, instead of being
            # written as a token no provider's parser reads.
            return json_text(value, "arguments", sort_keys=False)
        return value

    def arguments_object(self) -> dict[str, Any] | None:
        """The arguments as a JSON object, or None when they are not one.

        The parse is strict JSON, as Go's and the providers' parsers read it:
        `NaN`, `Infinity` and `-Infinity`, which Python's `json` accepts, make
        the arguments not JSON.
        """
        try:
            value = json.loads(self.arguments, parse_constant=_not_json)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class Usage(_Contract):
    """Token usage of one or more model requests."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        def _sum(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=_sum(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens=_sum(self.cache_write_tokens, other.cache_write_tokens),
        )


class Message(_Contract):
    """One message of a conversation.

    Attributes:
        role: `system`, `user`, `assistant` or `tool`.
        content: plain text.
        parts: text, url, data and thinking parts.
        tool_calls: assistant only: the calls this turn requests.
        tool_call_id: tool only: the id of the call this message answers.
        tool_name: tool only: the name of the tool that ran.
        failed: tool only: the tool failed definitively.
        run_id: stamped on messages a run adds, never on received history.
        conversation_id: likewise.
    """

    role: Role
    content: str = ""
    # Factories, not `[]`: pydantic deep-copies a mutable default for every
    # message it builds, which was most of the cost of loading a history.
    parts: list[Part] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    failed: bool = False
    run_id: str | None = None
    conversation_id: str | None = None

    @model_validator(mode="after")
    def _role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(
                f"a {self.role} message cannot carry toolCalls; only assistant messages request tools"
            )
        if self.role != "tool" and (
            self.tool_call_id is not None or self.tool_name is not None or self.failed
        ):
            raise ValueError(
                f"toolCallId, toolName and failed belong on tool messages, not on a {self.role} message"
            )
        return self

    @property
    def text(self) -> str:
        """The content followed by the text of any text parts, joined by newlines."""
        texts = [self.content] if self.content else []
        texts.extend(p.text for p in self.parts if isinstance(p, TextPart))
        return "\n".join(texts)


_MESSAGE_LIST = TypeAdapter(list[Message])


def dump_message(message: Message) -> str:
    """Serialize one message to its canonical, compact JSON text.

    Defaults are left out (they are restored on load), which keeps stored
    payloads small. Raises `InvalidInputError` for text that cannot be stored
    as UTF-8 (lone surrogates), and for a NaN or an infinity in a field this
    version does not know (which pydantic would write as null).
    """
    _check_extras(message)
    try:
        return message.model_dump_json(exclude_defaults=True)
    except (ValueError, UnicodeError) as exc:
        raise InvalidInputError(
            f"A {message.role} message cannot be serialized: {exc}. Messages must be valid "
            f"Unicode text (no lone surrogates); decode the text with errors='replace' first."
        ) from exc


def _check_extras(message: Message) -> None:
    """The fields this version does not know (kept on round trip) hold no NaN or infinity.

    The known fields cannot hold one: they are texts, booleans and integers, and
    a call's arguments are checked as they are serialized (`ToolCall`)."""
    role = message.role
    _check_fields(message.model_extra, f"The {role} message's field")
    for i, part in enumerate(message.parts):
        _check_fields(part.model_extra, f"The {role} message's parts[{i}] field")
    for i, call in enumerate(message.tool_calls):
        _check_fields(call.model_extra, f"The {role} message's toolCalls[{i}] field")


def _check_fields(extra: dict[str, Any] | None, where: str) -> None:
    for name, value in (extra or {}).items():
        check_finite(value, f"{where} {name}")


def load_message(data: str | bytes | dict[str, Any]) -> Message:
    """Validate one message from JSON text or a mapping; `InvalidInputError` if malformed."""
    try:
        if isinstance(data, dict):
            return Message.model_validate(data)
        return Message.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidInputError(
            f"The message is not valid: {_describe(exc)}. Fix the message and try again."
        ) from exc


_PAUSE_AT = 64
"""How many messages a parse takes before it pauses the cyclic garbage collector."""


def load_messages(texts: Sequence[str] | Iterable[str]) -> list[Message]:
    """Validate many JSON message texts in one pass (the fast path for reads).

    A parse of many messages runs with the cyclic garbage collector paused
    (ADR 0028): the objects it builds are all alive until it returns, and the
    collections their allocation would set off cost more than the parse (a
    1,000-message history parses two to three times as fast). The collector
    is turned back on only if it was on.
    """
    texts = texts if isinstance(texts, Sequence) else list(texts)
    joined = "[" + ",".join(texts) + "]"
    paused = len(texts) >= _PAUSE_AT and gc.isenabled()
    try:
        if paused:
            gc.disable()
        return _MESSAGE_LIST.validate_json(joined)
    except ValidationError as exc:
        raise InvalidInputError(f"Stored messages are not valid: {_describe(exc)}.") from exc
    finally:
        if paused:
            gc.enable()


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "message"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"
