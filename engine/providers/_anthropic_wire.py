"""Anthropic Messages wire format: messages and tools out, responses and events in.

Pure translation, no I/O. The Messages API differs from the neutral history
in three ways this module absorbs: system text is a top-level field; roles
must alternate, so consecutive same-role messages merge into one; and tool
results are `tool_result` blocks of a user message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, assert_never

from chatledger.engine.providers._base import Delta, ModelResponse, ToolChoice, ToolSpec
from chatledger.engine.providers._errors import (
    ModelRequestError,
    ModelResponseError,
    ModelStreamError,
)
from chatledger.engine.providers._wire import checked_tool_choice, tool_arguments
from chatledger.store.messages import (
    DataPart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
    Usage,
)

__all__ = [
    "AnthropicStream",
    "messages_to_wire",
    "parse_response",
    "tool_choice_to_wire",
    "tools_to_wire",
]

PROVIDER = "anthropic"
LABEL = "the Anthropic API"
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_REDACTED = "redacted_thinking"


def _request_error(message: str) -> ModelRequestError:
    return ModelRequestError(message, provider=PROVIDER)


def _url_block(part: UrlPart, index: int) -> dict[str, Any]:
    media = part.media_type
    if media is None or media.startswith("image/"):
        return {"type": "image", "source": {"type": "url", "url": part.url}}
    if media == "application/pdf":
        return {"type": "document", "source": {"type": "url", "url": part.url}}
    raise _request_error(
        f"Message {index} has a url part of media type {media!r}; Anthropic reads only "
        f"images and PDFs by URL. Inline the content as text, or leave it out."
    )


def _data_block(part: DataPart, index: int) -> dict[str, Any]:
    media = part.media_type
    source = {"type": "base64", "media_type": media, "data": part.data}
    if media in _IMAGE_TYPES:
        return {"type": "image", "source": source}
    if media == "application/pdf":
        return {"type": "document", "source": source}
    raise _request_error(
        f"Message {index} has a data part of media type {media!r}; Anthropic accepts JPEG, "
        f"PNG, GIF and WebP images and PDF documents. Convert it, or leave it out."
    )


def _text_blocks(message: Message) -> list[dict[str, Any]]:
    # Anthropic rejects empty text blocks, so empty text is not sent at all.
    texts = [message.content] + [p.text for p in message.parts if isinstance(p, TextPart)]
    return [{"type": "text", "text": t} for t in texts if t]


def _user_blocks(message: Message, index: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": message.content}] if message.content else []
    )
    for part in message.parts:
        if isinstance(part, TextPart) and part.text:
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, UrlPart):
            blocks.append(_url_block(part, index))
        elif isinstance(part, DataPart):
            blocks.append(_data_block(part, index))
    return blocks


def _thinking_block(part: Part) -> dict[str, Any] | None:
    # Unsigned thinking (from another provider) cannot be replayed: Anthropic
    # verifies the signature. Redacted thinking round-trips as an UnknownPart.
    if isinstance(part, ThinkingPart) and part.signature:
        return {"type": "thinking", "thinking": part.text, "signature": part.signature}
    if isinstance(part, UnknownPart) and part.kind == _REDACTED:
        return {"type": _REDACTED, "data": getattr(part, "data", "")}
    return None


def _assistant_blocks(message: Message, index: int) -> list[dict[str, Any]]:
    blocks = [b for b in map(_thinking_block, message.parts) if b is not None]
    blocks.extend(_text_blocks(message))
    for call in message.tool_calls:
        if not call.id:
            raise _request_error(
                f"Message {index} has a call to {call.name!r} without an id; Anthropic needs "
                f"an id to pair each tool_use with its tool_result. Give the call an id, or "
                f"drop it from the history."
            )
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_arguments(call)}
        )
    return blocks


def _tool_result(message: Message, index: int) -> dict[str, Any]:
    if not message.tool_call_id:
        raise _request_error(
            f"Message {index} is a tool result without a toolCallId; Anthropic cannot place "
            f"it. Repair the history (store.normalize_history) before sending it."
        )
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    if message.text:
        block["content"] = message.text
    block["is_error"] = message.failed
    return block


def messages_to_wire(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Return the top-level system text and the alternating user/assistant messages.

    System messages, wherever they stand, are joined (blank line between) into
    the top-level `system`. A message with nothing Anthropic accepts (no text,
    no media, no calls) has no wire form and is left out.
    """
    system: list[str] = []
    wire: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        match message.role:
            case "system":
                if message.text:
                    system.append(message.text)
                continue
            case "user":
                role, blocks = "user", _user_blocks(message, index)
            case "assistant":
                role, blocks = "assistant", _assistant_blocks(message, index)
            case "tool":
                role, blocks = "user", [_tool_result(message, index)]
            case _:
                assert_never(message.role)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return "\n\n".join(system), wire


def tools_to_wire(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Each tool as `{name, description, input_schema}`."""
    wire = []
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name}
        if tool.description:
            entry["description"] = tool.description
        entry["input_schema"] = tool.parameters
        wire.append(entry)
    return wire


def tool_choice_to_wire(choice: ToolChoice | None, tools: Sequence[ToolSpec]) -> Any:
    """`auto`, `none`, `required` (Anthropic: `any`) or a tool name (`tool`)."""
    choice = checked_tool_choice(choice, tools, provider=PROVIDER)
    if choice is None:
        return None
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def parse_usage(data: Any) -> Usage:
    """Anthropic usage, with `input_tokens` normalized to include cache reads and writes.

    Anthropic's `input_tokens` counts only uncached input; OpenAI's
    `prompt_tokens` counts all of it. `Usage.input_tokens` means all of it.
    """
    if not isinstance(data, dict):
        return Usage()
    read = data.get("cache_read_input_tokens")
    write = data.get("cache_creation_input_tokens")
    return Usage(
        input_tokens=int(data.get("input_tokens") or 0) + int(read or 0) + int(write or 0),
        output_tokens=int(data.get("output_tokens") or 0),
        cache_read_tokens=int(read) if read is not None else None,
        cache_write_tokens=int(write) if write is not None else None,
    )


def _canonical_input(raw: Any) -> str:
    """Tool input as compact JSON; streamed text that is not an object stays verbatim."""
    if isinstance(raw, str):
        if not raw:
            return "{}"
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
        if not isinstance(value, dict):
            return raw
        raw = value
    return json.dumps(raw, ensure_ascii=False, separators=(",", ":"))


def _message(blocks: Sequence[dict[str, Any]]) -> Message:
    texts: list[str] = []
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "thinking":
            parts.append(
                ThinkingPart(
                    text=block.get("thinking") or "", signature=block.get("signature") or None
                )
            )
        elif kind == _REDACTED:
            parts.append(UnknownPart(kind=_REDACTED, data=block.get("data") or ""))
        elif kind == "tool_use":
            calls.append(
                ToolCall(
                    id=block["id"],
                    name=block["name"],
                    arguments=_canonical_input(block.get("input")),
                )
            )
        # Server-side tool blocks (web search, code execution) are not kept.
    return Message(role="assistant", content="".join(texts), parts=parts, tool_calls=calls)


def parse_response(data: Any) -> ModelResponse:
    """A non-streamed `message` object as a `ModelResponse`."""
    try:
        return ModelResponse(
            message=_message(data["content"]),
            usage=parse_usage(data.get("usage")),
            finish_reason=data.get("stop_reason"),
            model_name=data.get("model"),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"The Anthropic response is not a message ({type(exc).__name__}: {exc}). The "
            f"server may not implement the Messages API; check the base URL.",
            provider=PROVIDER,
            body=str(data)[:2000],
        ) from exc


@dataclass
class AnthropicStream:
    """Accumulates Messages stream events into the response they spell out."""

    item: ClassVar[str] = "stream event"
    end: ClassVar[str | None] = None  # `message_stop` ends the stream: `done`
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    model_name: str | None = None
    done: bool = False

    def feed(self, event: str, data: Any) -> list[Delta]:
        """Take one event; return the deltas it carries."""
        if not isinstance(data, dict):
            raise self._broken(f"a {event!r} event whose data is not a JSON object")
        kind = data.get("type", event)
        if kind == "error":
            error = data.get("error") or {}
            raise ModelStreamError(
                f"Anthropic reported an error midway through the stream: "
                f"{error.get('type', 'error')}: {error.get('message', '')}. Send the request again.",
                provider=PROVIDER,
                body=json.dumps(data)[:2000],
            )
        if kind == "message_start":
            message = data.get("message") or {}
            self.model_name = message.get("model")
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            return self._start(int(data["index"]), dict(data["content_block"]))
        elif kind == "content_block_delta":
            return self._delta(int(data["index"]), data["delta"])
        elif kind == "message_delta":
            self.stop_reason = (data.get("delta") or {}).get("stop_reason") or self.stop_reason
            self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.done = True
        return []

    def _call_index(self, index: int) -> int:
        return sum(1 for i, b in self.blocks.items() if b["type"] == "tool_use" and i < index)

    def _start(self, index: int, block: dict[str, Any]) -> list[Delta]:
        if block.get("type") == "tool_use":
            block["input"] = ""
        self.blocks[index] = block
        kind = block.get("type")
        if kind == "tool_use":
            return [
                Delta(
                    kind="tool_call",
                    index=self._call_index(index),
                    tool_call_id=block.get("id"),
                    tool_name=block.get("name"),
                )
            ]
        if kind == "text" and block.get("text"):
            return [Delta(kind="text", text=block["text"])]
        if kind == "thinking" and block.get("thinking"):
            return [Delta(kind="thinking", text=block["thinking"])]
        return []

    def _delta(self, index: int, delta: dict[str, Any]) -> list[Delta]:
        block = self.blocks.get(index)
        if block is None:
            raise self._broken(f"a delta for content block {index}, which never started")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
            return [Delta(kind="text", text=delta["text"])]
        if kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            return [Delta(kind="thinking", text=delta["thinking"])]
        if kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta":
            block["input"] += delta["partial_json"]
            return [
                Delta(
                    kind="tool_call", index=self._call_index(index), arguments=delta["partial_json"]
                )
            ]
        return []

    def result(self) -> ModelResponse:
        """The assembled response; `ModelStreamError` if `message_stop` never came."""
        if not self.done:
            raise self._broken("no message_stop: the connection was probably cut")
        return ModelResponse(
            message=_message([self.blocks[i] for i in sorted(self.blocks)]),
            usage=parse_usage(self.usage),
            finish_reason=self.stop_reason,
            model_name=self.model_name,
        )

    @staticmethod
    def _broken(what: str) -> ModelStreamError:
        return ModelStreamError(
            f"The Anthropic stream ended before the response was complete ({what}). Send the "
            f"request again.",
            provider=PROVIDER,
        )
