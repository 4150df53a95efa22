"""The OpenAI Agents SDK's session items to chatledger's `Message` and back: pure, no I/O.

A session item (`TResponseInputItem`, openai's `ResponseInputItemParam`) is a
plain JSON dict with a `type`. Consecutive items are grouped into chatledger
messages whose projected fields (`role`, `content`, `parts`, `toolCalls`,
`toolCallId`, `toolName`, `failed`) are what chatledger's repair, audit and
engine read; the SDK itself reads only the native copy:

- **Lossless.** Every message carries the extra field
  `native = {"items": [...]}`: the items it was made of, verbatim (deep
  copies, keys the SDK adds itself such as `provider_data`, `created_by`,
  `_agents_tool_description` or `id: "__fake_id__"` included).
  `from_messages` re-emits them, so an item comes back JSON-equal to what went
  in, and `len(native["items"])` is a message's item count. An item that is
  not plain JSON (a tuple, bytes, a datetime, NaN, a non-string key) is
  refused with `InvalidInputError`: chatledger would store it as something
  else.
- **The model's side.** A maximal run of consecutive assistant-side items is
  ONE `assistant` message, so the calls of one model response sit in one
  message and chatledger's repair has nothing to do on a well-formed history.
  Assistant-side are: `reasoning` (one `ThinkingPart` per item: its
  `reasoning_text` content, else its summary, joined by newlines; none when
  both are empty), a `message` with role `assistant` (its `output_text`, or
  its string content, goes to `content`: pieces of one item joined as they
  are, items by newlines; a `refusal` is an
  `UnknownPart(kind="openai.refusal", text=...)`), the calls a client answers
  (a `ToolCall` each, `id` the `call_id`: `function_call` with its `name` and
  `arguments` verbatim, `custom_tool_call` with its `input` verbatim;
  `computer_call`, `local_shell_call`, `shell_call`, `apply_patch_call` and a
  client-executed `tool_search_call` named by their type with the compact
  JSON of their `action` (`actions`), `operation` or `arguments`;
  `mcp_approval_request` with its `name` and `arguments`, `id` the request's
  id), and what the server ran or produced on its own, each an
  `UnknownPart(kind="openai.<type>")`: `file_search_call`, `web_search_call`,
  `code_interpreter_call`, `image_generation_call`, `mcp_call`,
  `mcp_list_tools`, a server-executed `tool_search_call` and
  `tool_search_output`, `program`, `program_output` and `compaction`.
- **Results.** Each item that answers a client call is one `tool` message:
  `function_call_output`, `custom_tool_call_output`, `computer_call_output`,
  `local_shell_call_output` (its `call_id`, or its `id`, which the API
  documents as the call's id), `shell_call_output`, `apply_patch_call_output`
  (`failed` when its status is `failed`), `mcp_approval_response` (answering
  its `approval_request_id`) and a client-executed `tool_search_output`.
  `toolName` is the item's `name`, else the name of the call it answers
  earlier in the same `to_messages` input, else the call's item type.
  `content` is a string output as it is, any other output but a list of
  content parts as compact JSON; a list of `input_text` / `input_image` /
  `input_file` parts (and a computer screenshot) becomes `parts`.
- **Inputs.** A `message` with role `user` is a `user` message, with role
  `system` or `developer` a `system` message (the difference kept in
  `native`): string content as `content`; `input_text` a `TextPart`,
  `input_image` and `file_url` a `UrlPart`, `file_data` a `DataPart`, a
  `file_id` an `UnknownPart(kind="openai.file")`. Client bookkeeping
  (`item_reference`, `additional_tools`, `configuration_update`,
  `compaction_trigger`) is a `system` message with one `UnknownPart`: not
  something a person or the model said. Each input item is its own message.
- **Items without a `type`.** The SDK's easy input messages
  (`{"role": ..., "content": ...}`) have none, and neither may an item
  reference (`{"id": ...}`): an item with a `role` is read as a `message`, one
  with only an `id` as an `item_reference`. Anything else without a `type`,
  a `message` with no known role, and any type this module does not know (a
  newer openai's) are treated as assistant-side, an `UnknownPart(kind=
  "openai.<type>")` (`openai.unknown` when there is no type): new item types
  are overwhelmingly model output, and a part with no call in it can never
  separate a call from its result.
- **Messages without `native`** (written by chatledger's engine, or a tool
  result synthesized by repair) are converted from the projected fields, a
  best-effort reverse, at least one item each: `user` and `system` are easy
  input messages `{"role", "content"}` (a string, or a content list when the
  message has URL or data parts); `assistant` is an easy input message
  `{"role": "assistant", "content"}` holding its text (not an output message,
  which needs an `id` chatledger has none to give; left out when the message
  has calls and no text) followed by one `function_call` per tool call, its
  thinking dropped (a `reasoning` item needs the provider's id); `tool` is a
  `function_call_output`. Each of them validates as a `ResponseInputItemParam`.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

from chatledger.store import InvalidInputError
from chatledger.store._checks import json_text
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

__all__ = ["from_messages", "item_count", "to_messages"]

NATIVE = "native"
"""The extra field of every message written here: `{"items": [...]}`."""
UNKNOWN_PREFIX = "openai."
"""`UnknownPart.kind` of an item or part chatledger has no field for: `openai.<type>`."""

Item: TypeAlias = dict[str, Any]
_Side: TypeAlias = Literal["assistant", "tool", "user", "system"]

# Calls a client executes and answers with an output item: the key of their payload.
_CLIENT_CALLS: dict[str, tuple[str, ...]] = {
    "computer_call": ("action", "actions"),
    "local_shell_call": ("action",),
    "shell_call": ("action",),
    "apply_patch_call": ("operation",),
    "tool_search_call": ("arguments",),
}
# Output items: the call type each answers (its `toolName` when nothing better is known).
_OUTPUTS: dict[str, str] = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "computer_call_output": "computer_call",
    "local_shell_call_output": "local_shell_call",
    "shell_call_output": "shell_call",
    "apply_patch_call_output": "apply_patch_call",
    "mcp_approval_response": "mcp_approval_request",
    "tool_search_output": "tool_search_call",
}
_BOOKKEEPING = frozenset(
    {"item_reference", "additional_tools", "configuration_update", "compaction_trigger"}
)
_CALLS = frozenset({"function_call", "custom_tool_call", "mcp_approval_request", *_CLIENT_CALLS})


# -- to chatledger ----------------------------------------------------------------------


def to_messages(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """The chatledger messages the session `items` make, in order.

    A maximal run of assistant-side items is one `assistant` message; every
    other item is a message of its own (see the module docstring). Every
    message carries the items it was made of in `native["items"]`. Raises
    `InvalidInputError` for an item that is not a JSON object.
    """
    copies = [_plain(item, index) for index, item in enumerate(items)]
    names: dict[str, str] = {}  # tool names by call id, for results that lack one
    out: list[Message] = []
    run: list[Item] = []
    for item in copies:
        side = _side(item)
        if side == "assistant":
            run.append(item)
            continue
        if run:
            out.append(_assistant(run, names))
            run = []
        if side == "tool":
            out.append(_tool(item, names))
        else:
            out.append(_input(item, side))
    if run:
        out.append(_assistant(run, names))
    return out


def _plain(item: Mapping[str, Any], index: int) -> Item:
    """A deep copy of `item`, refused unless it is a plain JSON object."""
    if not isinstance(item, Mapping):
        raise InvalidInputError(
            f"Session item {index} is a {type(item).__name__}, not a mapping; the Agents SDK's "
            f"items (TResponseInputItem) are JSON objects. Pass the item as a dict."
        )
    text = json_text(dict(item), f"Session item {index}", sort_keys=False)
    copy: Item = json.loads(text)
    return copy


def _type(item: Item) -> str | None:
    """The item's type; an absent one read as the SDK's easy forms (see the module docstring)."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    if kind is None:
        if "role" in item:
            return "message"
        if isinstance(item.get("id"), str) and set(item) <= {"id", "type"}:
            return "item_reference"
    return None


def _side(item: Item) -> _Side:
    kind = _type(item)
    if kind == "message":
        role = item.get("role")
        if role == "user":
            return "user"
        if role in ("system", "developer"):
            return "system"
        return "assistant"
    if kind in _BOOKKEEPING:
        return "system"
    if kind in _OUTPUTS and (kind != "tool_search_output" or _client_executed(item)):
        return "tool"
    return "assistant"


def _client_executed(item: Item) -> bool:
    # A tool search runs on the server unless the item says otherwise; its call and
    # output then both belong to the model's response.
    return item.get("execution") == "client"


def _native(items: list[Item]) -> dict[str, Any]:
    return {"items": items}


def _assistant(run: list[Item], names: dict[str, str]) -> Message:
    texts: list[str] = []
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for item in run:
        kind = _type(item)
        if kind == "message" and item.get("role") == "assistant":
            text, refusals = _output_text(item.get("content"))
            if text is not None:
                texts.append(text)
            parts.extend(refusals)
        elif kind == "reasoning":
            thinking = _reasoning_text(item)
            if thinking:
                parts.append(ThinkingPart(text=thinking))
        elif kind in _CALLS and (kind != "tool_search_call" or _client_executed(item)):
            call = _call(item, kind)
            calls.append(call)
            if call.id:
                names[call.id] = call.name
        else:
            parts.append(_unknown(kind))
    return Message.model_validate(
        {
            "role": "assistant",
            "content": "\n".join(texts),
            "parts": parts,
            "toolCalls": calls,
            NATIVE: _native(run),
        }
    )


def _output_text(content: Any) -> tuple[str | None, list[Part]]:
    """An assistant message's text (None when it has none) and its refusals."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return None, []
    texts: list[str] = []
    refusals: list[Part] = []
    for piece in content:
        if not isinstance(piece, dict):
            continue
        if piece.get("type") == "refusal":
            refusals.append(
                UnknownPart(kind=UNKNOWN_PREFIX + "refusal", text=_str(piece.get("refusal")))
            )
        elif isinstance(piece.get("text"), str):  # output_text, or input_text in an easy message
            texts.append(piece["text"])
    return ("".join(texts) if texts else None), refusals


def _reasoning_text(item: Item) -> str:
    for key in ("content", "summary"):
        pieces = item.get(key)
        if isinstance(pieces, list):
            texts = [
                p["text"] for p in pieces if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
            if any(texts):
                return "\n".join(texts)
    return ""


def _call(item: Item, kind: str) -> ToolCall:
    if kind in _CLIENT_CALLS:
        payload: Any = next((item[key] for key in _CLIENT_CALLS[kind] if key in item), {})
        return ToolCall(id=_id(item.get("call_id")), name=kind, arguments=_compact(payload))
    if kind == "mcp_approval_request":
        call_id, arguments = item.get("id"), item.get("arguments")
    else:
        call_id = item.get("call_id")
        arguments = item.get("input") if kind == "custom_tool_call" else item.get("arguments")
    return ToolCall(
        id=_id(call_id),
        name=_str(item.get("name")),
        arguments=arguments if isinstance(arguments, str) else _compact(arguments),
    )


def _tool(item: Item, names: dict[str, str]) -> Message:
    kind = _type(item) or ""
    if kind == "mcp_approval_response":
        call_id = _id(item.get("approval_request_id"))
        output: Any = {key: item[key] for key in ("approve", "reason") if key in item}
    elif kind == "tool_search_output":
        call_id = _id(item.get("call_id"))
        output = item.get("tools")
    else:
        call_id = _id(
            item.get("call_id", item.get("id") if kind == "local_shell_call_output" else None)
        )
        output = item.get("output")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        name = names.get(call_id or "", _OUTPUTS.get(kind, kind))
    fields: dict[str, Any] = {"role": "tool", "toolCallId": call_id, "toolName": name}
    if isinstance(output, str):
        fields["content"] = output
    elif isinstance(output, list) and kind in ("function_call_output", "custom_tool_call_output"):
        fields["parts"] = _content_parts(output)
    elif isinstance(output, dict) and output.get("type") == "computer_screenshot":
        fields["parts"] = _content_parts([output])
    elif output is not None:
        fields["content"] = _compact(output)
    if kind == "apply_patch_call_output" and item.get("status") == "failed":
        fields["failed"] = True
    fields[NATIVE] = _native([item])
    return Message.model_validate(fields)


def _input(item: Item, role: Literal["user", "system"]) -> Message:
    fields: dict[str, Any] = {"role": role, NATIVE: _native([item])}
    if _type(item) in _BOOKKEEPING:
        fields["parts"] = [_unknown(_type(item))]
        return Message.model_validate(fields)
    content = item.get("content")
    if isinstance(content, str):
        fields["content"] = content
    elif isinstance(content, list):
        fields["parts"] = _content_parts(content)
    return Message.model_validate(fields)


def _content_parts(content: list[Any]) -> list[Part]:
    parts: list[Part] = []
    for piece in content:
        if not isinstance(piece, dict):
            parts.append(_unknown(None))
            continue
        kind = piece.get("type")
        if kind in ("input_text", "output_text") and isinstance(piece.get("text"), str):
            parts.append(TextPart(text=piece["text"]))
        elif kind in ("input_image", "computer_screenshot") and isinstance(
            piece.get("image_url"), str
        ):
            parts.append(
                UrlPart(url=piece["image_url"], media_type=_media_type(piece["image_url"]))
            )
        elif kind == "input_file" and isinstance(piece.get("file_data"), str):
            parts.append(_file_data(piece["file_data"], piece.get("filename")))
        elif kind == "input_file" and isinstance(piece.get("file_url"), str):
            url = piece["file_url"]
            parts.append(UrlPart(url=url, media_type=_guess(piece.get("filename")) or _guess(url)))
        elif kind in ("input_image", "input_file", "computer_screenshot"):
            parts.append(UnknownPart(kind=UNKNOWN_PREFIX + "file"))  # a provider's file id
        else:
            parts.append(_unknown(kind if isinstance(kind, str) else None))
    return parts


def _file_data(data: str, filename: Any) -> DataPart:
    # `file_data` is a data URL (`data:application/pdf;base64,...`) or bare base64.
    if data.startswith("data:") and ";base64," in data:
        header, _, payload = data.partition(",")
        media_type = header[len("data:") : -len(";base64")] or "application/octet-stream"
        return DataPart(media_type=media_type, data=payload)
    return DataPart(media_type=_guess(filename) or "application/octet-stream", data=data)


def _media_type(url: str) -> str | None:
    if url.startswith("data:"):
        return url[len("data:") :].partition(";")[0].partition(",")[0] or None
    return _guess(url)


def _guess(filename: Any) -> str | None:
    return mimetypes.guess_type(filename)[0] if isinstance(filename, str) else None


def _unknown(kind: str | None) -> UnknownPart:
    return UnknownPart(kind=UNKNOWN_PREFIX + (kind or "unknown"))


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _compact(value: Any) -> str:
    # The items were checked to be plain JSON, so this cannot fail.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- back to the Agents SDK -------------------------------------------------------------


def from_messages(messages: Sequence[Message]) -> list[Item]:
    """The session items the chatledger `messages` hold, in order.

    A message written by `to_messages` gives back its `native["items"]` (deep
    copies: mutating a returned item changes nothing held elsewhere); any
    other message is converted from its projected fields (see the module
    docstring). Raises `InvalidInputError` for a `native` field that is not
    `{"items": [objects]}`.
    """
    out: list[Item] = []
    for index, message in enumerate(messages):
        native = _native_items(message, index)
        if native is None:
            out.extend(_converted(message))
        else:
            out.extend(json.loads(json.dumps(native)))
    return out


def item_count(message: Message) -> int:
    """How many items `from_messages([message])` yields: at least one."""
    native = _native_items(message, 0)
    return len(native) if native is not None else len(_converted(message))


def _native_items(message: Message, index: int) -> list[Item] | None:
    extra = message.model_extra or {}
    if NATIVE not in extra:
        return None
    native = extra[NATIVE]
    items = native.get("items") if isinstance(native, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InvalidInputError(
            f'Message {index} has a `{NATIVE}` field that is not {{"items": [...]}} of Agents '
            f"SDK session items, so its items cannot be rebuilt. It was written by another "
            f"adapter (pydantic-ai's, say); read it with that one."
        )
    return items


def _converted(message: Message) -> list[Item]:
    if message.role == "assistant":
        items: list[Item] = []
        if message.text or not message.tool_calls:
            # An easy input message: an output message needs an `id`, which chatledger
            # has none to give, and an invented one the API would look up.
            items.append({"role": "assistant", "content": message.text})
        items.extend(
            {
                "type": "function_call",
                "call_id": call.id or "",
                "name": call.name,
                "arguments": call.arguments,
            }
            for call in message.tool_calls
        )
        return items
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id or "",
                "output": _input_content(message) or message.text,
            }
        ]
    return [{"role": message.role, "content": _input_content(message) or message.text}]


def _input_content(message: Message) -> list[Item] | None:
    """A content list when the message has URL or data parts, else None (its text will do)."""
    if not any(isinstance(p, UrlPart | DataPart) for p in message.parts):
        return None
    content: list[Item] = (
        [{"type": "input_text", "text": message.content}] if message.content else []
    )
    for part in message.parts:
        if isinstance(part, TextPart):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, UrlPart):
            if (part.media_type or "image/").startswith("image/"):
                content.append({"type": "input_image", "image_url": part.url, "detail": "auto"})
            else:
                content.append({"type": "input_file", "file_url": part.url})
        elif isinstance(part, DataPart):
            url = f"data:{part.media_type};base64,{part.data}"
            if part.media_type.startswith("image/"):
                content.append({"type": "input_image", "image_url": url, "detail": "auto"})
            else:
                content.append({"type": "input_file", "file_data": url})
    return content
