"""pydantic-ai's `ModelMessage` to chatledger's `Message` and back: pure, no I/O.

One `ModelRequest` becomes N chatledger messages, one `ModelResponse` becomes
one assistant message. The projected fields (`role`, `content`, `parts`,
`toolCalls`, `toolCallId`, `toolName`, `failed`) are what chatledger's repair,
audit and engine read; pydantic-ai itself reads only the native copy:

- **Lossless.** The whole serialized `ModelMessage`
  (`ModelMessagesTypeAdapter.dump_python([m], mode="json")[0]`) travels verbatim
  in the extra field `native` of the LAST message of its group, and every
  message of the group carries `nativeGroup: {"index": i, "count": n}`.
  `from_messages` rebuilds each `ModelMessage` from `native` alone, so the
  projection may drop what chatledger has no field for. pydantic-ai's own
  `run_id` and `conversation_id` stay inside `native`: chatledger's
  `Message.run_id` names a chatledger run.
- **Projection of a request**, one message per part, in part order, except
  that the tool results (`ToolReturnPart`, and the deprecated
  `RetryPromptPart` with a tool name) come first, as pydantic-ai itself sorts
  them for providers: chatledger's repair expects the results of a turn's
  calls right after it. `SystemPromptPart` is `system`; `UserPromptPart` is
  `user` (text, URL and binary content as `TextPart`, `UrlPart`, `DataPart`;
  `CachePoint`, `UploadedFile` and the like only in `native`); a tool return
  is `tool` (`content` the string, or the compact JSON of any other value,
  `failed` when `outcome == "failed"`); retry feedback that answers no call is
  `user`, with the text pydantic-ai renders for the model; a `SpeechPart` is a
  `user` message holding its transcript. Every other part kind (the deltas,
  the instruction baseline, compaction) is an
  `UnknownPart(kind="pydantic-ai.<part_kind>")` on one `system` message of the
  group: framework bookkeeping, not something a person said, and a system
  message is what chatledger's model view leaves out of the history.
- **An empty projection** (a request of no parts, as an interrupted one is, or
  only of bookkeeping parts) is that one `system` message, with no content and
  one `UnknownPart` per bookkeeping part. So every `ModelMessage` is at least
  one chatledger message and has somewhere to keep its `native`.
- **A response** is one `assistant` message: `content` is
  `ModelResponse.text` (pydantic-ai's own joining of the text parts),
  `ThinkingPart` is a chatledger `ThinkingPart(text, signature)`, `FilePart`
  a `DataPart`, each `ToolCallPart` (and its typed subclasses) a `ToolCall`
  (`arguments` the string as the model wrote it, a dict as compact JSON,
  `None` as `"{}"`); every other part kind (the provider's built-in tool calls
  and returns, compaction, speech) is an `UnknownPart`.
- **Messages without `native`** (written by chatledger's engine, or a tool
  result repair synthesized) are converted from the projected fields, a
  best-effort reverse: an `assistant` message is a `ModelResponse`, and each
  run of consecutive `system`, `user` and `tool` messages is one
  `ModelRequest`. Such a `ModelMessage` is not byte-stable (pydantic-ai's
  defaults fill in timestamps and missing tool call ids).
- **A group cut short.** A history window that starts inside a group (its
  first messages missing) cannot be rebuilt: `from_messages` raises
  `InvalidInputError`; `group_start` says how many leading messages to drop
  to begin at a group boundary. A group missing its end, or interleaved with
  another, is refused the same way.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import pydantic
import pydantic_core
from pydantic_ai import messages as pai

from chatledger.store import InvalidInputError
from chatledger.store.messages import (
    DataPart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
)

__all__ = ["from_messages", "group_sizes", "group_start", "to_messages"]

NATIVE = "native"
"""The extra field of a group's last message that holds the serialized `ModelMessage`."""
NATIVE_GROUP = "nativeGroup"
"""The extra field of every message of a group: `{"index": i, "count": n}`."""
UNKNOWN_PREFIX = "pydantic-ai."
"""`UnknownPart.kind` of a part kind chatledger has no field for: `pydantic-ai.<part_kind>`."""

_Fields: TypeAlias = dict[str, Any]

# The deprecated `RetryPromptPart` is matched, never built: an instance a caller still holds
# is projected like the part it stands for; a stored one loads as that part.
_RetryPromptPart = pai.RetryPromptPart  # pyright: ignore[reportDeprecated]


# -- to chatledger ----------------------------------------------------------------------


def to_messages(message: pai.ModelMessage) -> list[Message]:
    """One pydantic-ai message as the chatledger messages of its group (at least one).

    The last of them carries the whole serialized `message` in `native`; every
    one carries `nativeGroup`. See the module docstring for the projection.
    """
    fields = (
        [_response_fields(message)]
        if isinstance(message, pai.ModelResponse)
        else _request_fields(message)
    )
    count = len(fields)
    out: list[Message] = []
    for index, item in enumerate(fields):
        item[NATIVE_GROUP] = {"index": index, "count": count}
        if index == count - 1:
            item[NATIVE] = pai.ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
        out.append(Message.model_validate(item))
    return out


def _request_fields(request: pai.ModelRequest) -> list[_Fields]:
    results: list[_Fields] = []
    others: list[_Fields] = []
    bookkeeping: _Fields | None = None
    for part in request.parts:
        if isinstance(part, pai.SystemPromptPart):
            others.append({"role": "system", "content": part.content})
        elif isinstance(part, pai.UserPromptPart):
            others.append(_user_prompt(part))
        elif isinstance(part, pai.ToolReturnPart):
            results.append(_tool_return(part))
        elif isinstance(part, _RetryPromptPart):
            if part.tool_name is None:
                others.append({"role": "user", "content": part.model_response()})
            else:
                results.append(_tool(part.tool_call_id, part.tool_name, part.model_response()))
        elif isinstance(part, pai.RetryFeedbackPart):
            others.append({"role": "user", "content": part.model_response()})
        elif isinstance(part, pai.SpeechPart):
            others.append({"role": "user", "content": part.content, "parts": [_unknown(part)]})
        else:
            if bookkeeping is None:
                bookkeeping = {"role": "system", "parts": []}
                others.append(bookkeeping)
            bookkeeping["parts"].append(_unknown(part))
    fields = results + others
    return fields or [{"role": "system"}]


def _user_prompt(part: pai.UserPromptPart) -> _Fields:
    if isinstance(part.content, str):
        return {"role": "user", "content": part.content}
    parts: list[Part] = []
    for item in part.content:
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, pai.TextContent):  # and StructuredContent, a TextContent
            parts.append(TextPart(text=item.content))
        elif isinstance(item, pai.FileUrl):
            parts.append(UrlPart(url=item.url, media_type=_media_type(item)))
        elif isinstance(item, pai.BinaryContent):
            parts.append(_data(item))
        # CachePoint, UploadedFile: a marker and a provider's file id, kept only in `native`.
    return {"role": "user", "parts": parts}


def _media_type(url: pai.FileUrl) -> str | None:
    try:
        return url.media_type
    except ValueError:  # not given, and the URL has no extension to infer it from
        return None


def _tool_return(part: pai.ToolReturnPart[Any]) -> _Fields:
    fields = _tool(part.tool_call_id, part.tool_name, _json_or_str(part.content))
    if part.outcome == "failed":
        fields["failed"] = True
    return fields


def _tool(call_id: str, name: str, content: str) -> _Fields:
    return {"role": "tool", "toolCallId": call_id, "toolName": name, "content": content}


def _response_fields(response: pai.ModelResponse) -> _Fields:
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for part in response.parts:
        if isinstance(part, pai.TextPart):
            continue  # in `content`
        if isinstance(part, pai.ThinkingPart):
            parts.append(ThinkingPart(text=part.content, signature=part.signature))
        elif isinstance(part, pai.ToolCallPart):
            calls.append(ToolCall(id=part.tool_call_id, name=part.tool_name, arguments=_args(part)))
        elif isinstance(part, pai.FilePart):
            parts.append(_data(part.content))
        else:
            parts.append(_unknown(part))
    return {
        "role": "assistant",
        "content": response.text or "",
        "parts": parts,
        "toolCalls": calls,
    }


def _args(part: pai.ToolCallPart[Any]) -> str:
    args = part.args
    if args is None:
        return "{}"
    if isinstance(args, str):
        return args  # verbatim, as the model wrote it, even when it is not JSON
    return _json(args)


def _data(content: pai.BinaryContent) -> DataPart:
    return DataPart(media_type=content.media_type, data=base64.b64encode(content.data).decode())


def _unknown(part: Any) -> UnknownPart:
    return UnknownPart(kind=UNKNOWN_PREFIX + str(part.part_kind))


def _json_or_str(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    # pydantic's serializer knows the dataclasses, datetimes and bytes a tool may return;
    # `fallback=str` keeps a projection from failing on a value only `native` can hold.
    return pydantic_core.to_json(value, bytes_mode="base64", fallback=str).decode()


# -- back to pydantic-ai ----------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """Consecutive chatledger messages that make one `ModelMessage`."""

    messages: Sequence[Message]
    native: Any  # the serialized ModelMessage, or None for messages written without one


def from_messages(messages: Sequence[Message]) -> list[pai.ModelMessage]:
    """The pydantic-ai messages the chatledger `messages` hold, one per group.

    A group written by `to_messages` is rebuilt from its `native` copy and
    dumps as the original did; messages without one are converted from their
    projected fields (see the module docstring). Raises `InvalidInputError`
    for a group cut short or interleaved, or a `native` that is not a
    pydantic-ai message; drop `group_start(messages)` leading messages first
    when the window may begin mid-group.
    """
    groups = _groups(messages)
    natives = [g.native for g in groups if g.native is not None]
    try:
        rebuilt = iter(pai.ModelMessagesTypeAdapter.validate_python(natives))
    except pydantic.ValidationError as exc:
        raise InvalidInputError(
            f"A chatledger message's `{NATIVE}` field is not a pydantic-ai message: "
            f"{exc.error_count()} problems, the first at "
            f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}. "
            f"It was written by another adapter or a newer pydantic-ai; read it with that."
        ) from exc
    out: list[pai.ModelMessage] = []
    for group in groups:
        out.append(next(rebuilt) if group.native is not None else _converted(group.messages, out))
    return out


def group_sizes(messages: Sequence[Message]) -> list[int]:
    """How many chatledger messages make each `ModelMessage` `from_messages` returns.

    In order; they sum to `len(messages)`. A store keys a pydantic-ai entry by
    the last message of its group. Raises as `from_messages` does for a group
    cut short.
    """
    return [len(g.messages) for g in _groups(messages)]


def group_start(messages: Sequence[Message]) -> int:
    """How many leading messages to drop so that `messages` begins at a group boundary.

    0 unless the first message is inside a group (a history window that began
    mid-group); then the number of that group's members present, at most
    `len(messages)`.
    """
    if not messages:
        return 0
    first = _group_of(messages[0])
    if first is None or first[0] == 0:
        return 0
    return min(first[1] - first[0], len(messages))


def _groups(messages: Sequence[Message]) -> list[_Group]:
    groups: list[_Group] = []
    at = 0
    while at < len(messages):
        member = _group_of(messages[at])
        if member is None:
            end = at + 1
            if messages[at].role != "assistant":
                while (
                    end < len(messages)
                    and messages[end].role != "assistant"
                    and _group_of(messages[end]) is None
                ):
                    end += 1
            groups.append(_Group(messages[at:end], None))
            at = end
            continue
        index, count = member
        if index != 0:
            raise InvalidInputError(
                f"Message {at} is member {index} of a group of {count} chatledger messages that "
                f"make one pydantic-ai message, but the members before it are missing: the "
                f"history window starts inside a group. Drop the first group_start(messages) "
                f"messages, or read from an earlier position."
            )
        end = at + count
        if end > len(messages) or any(
            _group_of(messages[at + i]) != (i, count) for i in range(count)
        ):
            raise InvalidInputError(
                f"The group of {count} chatledger messages that starts at message {at} is cut "
                f"short or interleaved with other messages, so the pydantic-ai message it holds "
                f"cannot be rebuilt. Read the whole group (its last member holds `{NATIVE}`)."
            )
        native = (messages[end - 1].model_extra or {}).get(NATIVE)
        if not isinstance(native, dict):
            raise InvalidInputError(
                f"The last message of the group that starts at message {at} has no `{NATIVE}` "
                f"object, so the pydantic-ai message it holds cannot be rebuilt."
            )
        groups.append(_Group(messages[at:end], native))
        at = end
    return groups


def _group_of(message: Message) -> tuple[int, int] | None:
    """`(index, count)` of a message written by `to_messages`, None for any other."""
    extra = message.model_extra or {}
    group = extra.get(NATIVE_GROUP)
    if group is None:
        return None
    index = group.get("index") if isinstance(group, dict) else None
    count = group.get("count") if isinstance(group, dict) else None
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise InvalidInputError(
            f'A chatledger message has `{NATIVE_GROUP}` {group!r}; expected {{"index": i, '
            f'"count": n}} with 0 <= i < n, as `to_messages` writes it.'
        )
    return index, count


def _converted(group: Sequence[Message], before: Sequence[pai.ModelMessage]) -> pai.ModelMessage:
    if group[0].role == "assistant":
        return _response(group[0])
    names = _call_names(before)
    parts: list[pai.ModelRequestPart] = []
    for message in group:
        if message.role == "system":
            parts.append(pai.SystemPromptPart(message.text))
        elif message.role == "tool":
            call_id = message.tool_call_id or ""
            outcome: Literal["success", "failed"] = "failed" if message.failed else "success"
            parts.append(
                pai.ToolReturnPart(
                    tool_name=message.tool_name or names.get(call_id, ""),
                    content=message.content,
                    tool_call_id=call_id,
                    outcome=outcome,
                )
            )
        else:
            parts.append(pai.UserPromptPart(_user_content(message)))
    return pai.ModelRequest(parts=parts)


def _response(message: Message) -> pai.ModelResponse:
    parts: list[pai.ModelResponsePart] = []
    for part in message.parts:
        if isinstance(part, ThinkingPart):
            parts.append(pai.ThinkingPart(part.text, signature=part.signature))
        elif isinstance(part, TextPart):
            parts.append(pai.TextPart(part.text))
        elif isinstance(part, DataPart):
            parts.append(pai.FilePart(_binary(part)))
    if message.content:
        parts.append(pai.TextPart(message.content))
    for call in message.tool_calls:
        if call.id:
            parts.append(pai.ToolCallPart(call.name, call.arguments, tool_call_id=call.id))
        else:
            parts.append(pai.ToolCallPart(call.name, call.arguments))
    return pai.ModelResponse(parts=parts)


def _user_content(message: Message) -> str | list[pai.UserContent]:
    if not message.parts:
        return message.content
    content: list[pai.UserContent] = [message.content] if message.content else []
    for part in message.parts:
        if isinstance(part, TextPart):
            content.append(part.text)
        elif isinstance(part, UrlPart):
            content.append(_url(part))
        elif isinstance(part, DataPart):
            content.append(_binary(part))
        # thinking and unknown parts have no place in a user prompt
    return content


def _url(part: UrlPart) -> pai.ImageUrl | pai.AudioUrl | pai.VideoUrl | pai.DocumentUrl:
    kind = (part.media_type or "").partition("/")[0]
    if kind == "image":
        return pai.ImageUrl(part.url, media_type=part.media_type)
    if kind == "audio":
        return pai.AudioUrl(part.url, media_type=part.media_type)
    if kind == "video":
        return pai.VideoUrl(part.url, media_type=part.media_type)
    return pai.DocumentUrl(part.url, media_type=part.media_type)


def _binary(part: DataPart) -> pai.BinaryContent:
    return pai.BinaryContent(base64.b64decode(part.data), media_type=part.media_type)


def _call_names(before: Sequence[pai.ModelMessage]) -> dict[str, str]:
    """Tool names by call id in the last response: a chatledger tool message may lack its name."""
    for message in reversed(before):
        if isinstance(message, pai.ModelResponse):
            return {
                p.tool_call_id: p.tool_name
                for p in message.parts
                if isinstance(p, pai.ToolCallPart)
            }
    return {}
