"""LangChain's messages to chatledger's `Message` and back: pure, no I/O.

A LangGraph `messages` channel holds LangChain messages (`BaseMessage`). Each
becomes one chatledger message whose projected fields (`role`, `content`,
`parts`, `toolCalls`, `toolCallId`, `toolName`, `failed`) are what chatledger's
repair, audit, engine and `history` read; LangGraph reads only the native copy:

- **Lossless.** Every message carries the extra field
  `native = {"serde": type, "data": base64}`: the message as the saver's own
  serializer (`BaseCheckpointSaver.serde`) writes it, so `from_message` gives
  back what a LangGraph saver would, an encrypting serializer's output included.
  A string `content` is stored once, as the projected `content`: the native copy
  is of the message with an empty one, and `"content": true` says to put it back.
- **Roles.** `human` is `user`, `ai` (and its chunks) `assistant`, `system`
  `system`, `tool` `tool` (`toolCallId`, `toolName` its `name`, `failed` when its
  `status` is `error`), `function` a `tool` without a call id, and a
  `ChatMessage` the role its `role` names (`user` for one chatledger has not).
- **Content.** A string is `content`. A list of content blocks becomes `parts`:
  text blocks `TextPart`s; images, files, audio and video by URL `UrlPart`s and
  inline (base64, or a `data:` URL) `DataPart`s; `thinking` and `reasoning`
  blocks `ThinkingPart`s; anything else an `UnknownPart(kind="langchain.<type>")`.
- **Calls.** An AI message's `tool_calls` are its `toolCalls` (the arguments as
  compact JSON), its `invalid_tool_calls` too (their arguments verbatim), in one
  assistant message: one model response, so repair has nothing to do on a
  well-formed history.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from chatledger.store import (
    DataPart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
)

__all__ = ["from_message", "to_message"]

_ROLES = {"human": "user", "ai": "assistant", "AIMessageChunk": "assistant", "system": "system"}
_CHAT_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
}


def to_message(message: BaseMessage, serde: SerializerProtocol) -> Message:
    """`message` as a chatledger message, its serialized form in `native`."""
    content = message.content
    once = isinstance(content, str) and content != ""
    kind, data = serde.dumps_typed(message.model_copy(update={"content": ""}) if once else message)
    native: dict[str, Any] = {"serde": kind, "data": base64.b64encode(data).decode("ascii")}
    if once:
        native["content"] = True
    fields: dict[str, Any] = (
        {"content": content} if isinstance(content, str) else {"parts": _parts(content)}
    )
    if message.type == "tool":
        status = getattr(message, "status", "success")
        return Message(
            role="tool",
            tool_call_id=getattr(message, "tool_call_id", None),
            tool_name=message.name,
            failed=status == "error",
            native=native,
            **fields,
        )
    if message.type == "function":
        return Message(role="tool", tool_name=message.name, native=native, **fields)
    if message.type == "chat":
        role = _CHAT_ROLES.get(str(getattr(message, "role", "")), "user")
        return Message(role=role, native=native, **fields)
    role = _ROLES.get(message.type, "user")
    if role == "assistant":
        fields["tool_calls"] = _calls(message)
    return Message(role=role, native=native, **fields)


def from_message(message: Message, serde: SerializerProtocol) -> BaseMessage:
    """The LangChain message a chatledger message was made from (`to_message`)."""
    native = (message.model_extra or {}).get("native")
    if not isinstance(native, dict) or "serde" not in native:
        raise ValueError("the message carries no LangChain message in native")
    value = serde.loads_typed((native["serde"], base64.b64decode(native["data"])))
    if not isinstance(value, BaseMessage):
        raise ValueError(f"native holds a {type(value).__name__}, not a LangChain message")
    if native.get("content"):
        return value.model_copy(update={"content": message.content})
    return value


def _calls(message: BaseMessage) -> list[ToolCall]:
    calls = [
        ToolCall(id=c.get("id"), name=c.get("name") or "", arguments=_compact(c.get("args", {})))
        for c in getattr(message, "tool_calls", [])
    ]
    calls += [
        ToolCall(id=c.get("id"), name=c.get("name") or "", arguments=c.get("args") or "")
        for c in getattr(message, "invalid_tool_calls", [])
    ]
    return calls


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)


def _parts(blocks: list[Any]) -> list[Any]:
    return [_part(b) for b in blocks]


def _part(block: Any) -> Any:
    if isinstance(block, str):
        return TextPart(text=block)
    if not isinstance(block, dict):
        return UnknownPart(kind="langchain.unknown", value=repr(block))
    kind = str(block.get("type", "unknown"))
    if kind == "text":
        return TextPart(text=str(block.get("text", "")))
    if kind in ("thinking", "reasoning"):
        text = block.get("thinking", block.get("reasoning", ""))
        return ThinkingPart(text=str(text or ""), signature=block.get("signature"))
    if kind == "image_url":
        url = block.get("image_url")
        return _located(url.get("url") if isinstance(url, dict) else url, None)
    if kind in ("image", "file", "audio", "video"):
        media = block.get("mime_type")
        if block.get("url"):
            return _located(block["url"], media)
        inline = block.get("base64", block.get("data"))
        if isinstance(inline, str):
            return DataPart(media_type=media or "application/octet-stream", data=inline)
    return UnknownPart(kind=f"langchain.{kind}")


def _located(url: Any, media: str | None) -> Any:
    """A part for a URL: inline data for a `data:` URL, else the URL."""
    text = str(url or "")
    if text.startswith("data:") and ";base64," in text:
        head, data = text[5:].split(";base64,", 1)
        return DataPart(media_type=head or media or "application/octet-stream", data=data)
    return UrlPart(url=text, media_type=media)
