"""Chat Completions wire format: messages and tools out, responses and chunks in.

Pure translation, no I/O. Only the request fields every OpenAI-compatible
server understands are written, so the same body serves OpenAI, vLLM,
llama.cpp, Ollama and LiteLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, assert_never

from chatledger.engine.providers._base import Delta, ModelResponse, ToolChoice, ToolSpec
from chatledger.engine.providers._errors import (
    ModelRequestError,
    ModelResponseError,
    ModelStreamError,
)
from chatledger.engine.providers._wire import checked_tool_choice, tool_arguments_text
from chatledger.store.messages import (
    DataPart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    UrlPart,
    Usage,
)

__all__ = [
    "OpenAIStream",
    "messages_to_wire",
    "parse_response",
    "tool_choice_to_wire",
    "tools_to_wire",
]

PROVIDER = "openai"
LABEL = "the OpenAI-compatible server"
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def _request_error(message: str) -> ModelRequestError:
    return ModelRequestError(message, provider=PROVIDER)


def _url_part(part: UrlPart, index: int) -> dict[str, Any]:
    media = part.media_type
    if media is None or media.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": part.url}}
    raise _request_error(
        f"Message {index} has a url part of media type {media!r}; Chat Completions accepts "
        f"only images by URL. Inline the content as a data part, or use a provider that "
        f"reads {media} from a URL."
    )


def _data_part(part: DataPart, index: int) -> dict[str, Any]:
    media = part.media_type
    data_url = f"data:{media};base64,{part.data}"
    if media.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": data_url}}
    if media == "application/pdf":
        return {"type": "file", "file": {"filename": "document.pdf", "file_data": data_url}}
    if media in _AUDIO_FORMATS:
        return {
            "type": "input_audio",
            "input_audio": {"data": part.data, "format": _AUDIO_FORMATS[media]},
        }
    raise _request_error(
        f"Message {index} has a data part of media type {media!r}, which Chat Completions "
        f"does not accept (images, PDF, WAV and MP3 only). Convert it, or leave it out."
    )


def _user_content(message: Message, index: int) -> str | list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    has_media = False
    for part in message.parts:
        if isinstance(part, TextPart):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, UrlPart):
            blocks.append(_url_part(part, index))
            has_media = True
        elif isinstance(part, DataPart):
            blocks.append(_data_part(part, index))
            has_media = True
        # Thinking parts and parts of unknown kinds have no Chat Completions form.
    if not has_media:
        return message.text
    if message.content:
        blocks.insert(0, {"type": "text", "text": message.content})
    return blocks


def _tool_call(call: ToolCall, index: int) -> dict[str, Any]:
    if not call.id:
        raise _request_error(
            f"Message {index} has a call to {call.name!r} without an id; Chat Completions "
            f"needs an id to pair each call with its result. Give the call an id, or drop it "
            f"from the history."
        )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": tool_arguments_text(call)},
    }


def messages_to_wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Map a repaired history onto Chat Completions messages, one for one."""
    wire: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        match message.role:
            case "system":
                wire.append({"role": "system", "content": message.text})
            case "user":
                wire.append({"role": "user", "content": _user_content(message, index)})
            case "assistant":
                entry: dict[str, Any] = {"role": "assistant"}
                text = message.text
                if message.tool_calls:
                    entry["content"] = text or None
                    entry["tool_calls"] = [_tool_call(c, index) for c in message.tool_calls]
                else:
                    entry["content"] = text
                wire.append(entry)
            case "tool":
                if not message.tool_call_id:
                    raise _request_error(
                        f"Message {index} is a tool result without a toolCallId; Chat "
                        f"Completions cannot place it. Repair the history "
                        f"(store.normalize_history) before sending it."
                    )
                wire.append(
                    {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
                )
            case _:
                assert_never(message.role)
    return wire


def tools_to_wire(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Each tool as `{"type": "function", "function": {name, description, parameters}}`."""
    wire = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool.parameters
        wire.append({"type": "function", "function": function})
    return wire


def tool_choice_to_wire(choice: ToolChoice | None, tools: Sequence[ToolSpec]) -> Any:
    """`auto`/`none`/`required` as strings, a tool name as a named function choice.

    Returns None when nothing should be sent: no choice, or `auto`/`none`
    without tools (servers reject a tool_choice without tools).
    """
    choice = checked_tool_choice(choice, tools, provider=PROVIDER)
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def parse_usage(data: Any) -> Usage:
    """`prompt_tokens`, `completion_tokens` and `prompt_tokens_details.cached_tokens`."""
    if not isinstance(data, dict):
        return Usage()
    details = data.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        cache_read_tokens=int(cached) if cached is not None else None,
    )


def _assistant(text: str, reasoning: str, calls: list[ToolCall]) -> Message:
    parts = [ThinkingPart(text=reasoning)] if reasoning else []
    return Message(role="assistant", content=text, parts=parts, tool_calls=calls)


def _reasoning(fields: dict[str, Any]) -> str:
    # vLLM, llama.cpp and DeepSeek say `reasoning_content`; Ollama and OpenRouter `reasoning`.
    value = fields.get("reasoning_content") or fields.get("reasoning")
    return value if isinstance(value, str) else ""


def parse_response(data: Any) -> ModelResponse:
    """A non-streamed `chat.completion` object as a `ModelResponse`."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        calls = [
            ToolCall(
                id=c.get("id"),
                name=c["function"]["name"],
                arguments=c["function"].get("arguments") or "",
            )
            for c in message.get("tool_calls") or []
        ]
        text = message.get("content") or message.get("refusal") or ""
        return ModelResponse(
            message=_assistant(text, _reasoning(message), calls),
            usage=parse_usage(data.get("usage")),
            finish_reason=choice.get("finish_reason"),
            model_name=data.get("model"),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"The response of the OpenAI-compatible server has no usable choice ({type(exc).__name__}: {exc}). "
            f"The server may not implement Chat Completions; check the base URL.",
            provider=PROVIDER,
            body=str(data)[:2000],
        ) from exc


@dataclass
class _CallBuffer:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class OpenAIStream:
    """Accumulates `chat.completion.chunk`s into the response they spell out."""

    item: ClassVar[str] = "stream chunk"
    end: ClassVar[str | None] = "[DONE]"
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[Any, _CallBuffer] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    model_name: str | None = None
    done: bool = False

    def feed(self, event: str, chunk: Any) -> list[Delta]:
        """Take one chunk (its `event` name says nothing here); return the deltas it
        carries, in order."""
        if not isinstance(chunk, dict):
            raise self._malformed(chunk)
        if "error" in chunk:
            error = chunk["error"]
            detail = error.get("message") if isinstance(error, dict) else error
            raise ModelStreamError(
                f"The OpenAI-compatible server reported an error midway through the stream: {detail}. "
                f"Send the request again.",
                provider=PROVIDER,
                body=str(chunk)[:2000],
            )
        self.model_name = chunk.get("model") or self.model_name
        if chunk.get("usage"):
            self.usage = parse_usage(chunk["usage"])
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            fields = choice.get("delta") or {}
            deltas.extend(self._feed_delta(fields))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return deltas

    def _feed_delta(self, fields: dict[str, Any]) -> list[Delta]:
        deltas: list[Delta] = []
        reasoning = _reasoning(fields)
        if reasoning:
            self.reasoning.append(reasoning)
            deltas.append(Delta(kind="thinking", text=reasoning))
        content = fields.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            deltas.append(Delta(kind="text", text=content))
        for call in fields.get("tool_calls") or []:
            # Ollama sends whole calls without an index: each is a new call.
            key = call.get("index", f"new-{len(self.calls)}")
            first = key not in self.calls
            buffer = self.calls.setdefault(key, _CallBuffer())
            function = call.get("function") or {}
            if call.get("id"):
                buffer.id = call["id"]
            if function.get("name"):
                buffer.name += function["name"]
            fragment = function.get("arguments") or ""
            buffer.arguments.append(fragment)
            deltas.append(
                Delta(
                    kind="tool_call",
                    index=list(self.calls).index(key),
                    tool_call_id=call.get("id") if first else None,
                    tool_name=function.get("name") if first else None,
                    arguments=fragment,
                )
            )
        return deltas

    def result(self) -> ModelResponse:
        """The assembled response; `ModelStreamError` if the stream never finished."""
        if not self.done and self.finish_reason is None:
            raise ModelStreamError(
                "The OpenAI-compatible server's stream ended before the response was complete (no "
                "finish_reason and no [DONE]). The connection was probably cut; send the "
                "request again.",
                provider=PROVIDER,
            )
        calls = [
            ToolCall(id=b.id, name=b.name, arguments="".join(b.arguments))
            for b in self.calls.values()
        ]
        return ModelResponse(
            message=_assistant("".join(self.text), "".join(self.reasoning), calls),
            usage=self.usage,
            finish_reason=self.finish_reason,
            model_name=self.model_name,
        )

    @staticmethod
    def _malformed(chunk: Any) -> ModelStreamError:
        return ModelStreamError(
            f"The OpenAI-compatible server sent a stream chunk that is not a JSON object: {str(chunk)[:200]}. "
            f"The server may not implement Chat Completions streaming.",
            provider=PROVIDER,
            body=str(chunk)[:2000],
        )
