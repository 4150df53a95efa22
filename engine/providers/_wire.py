"""Small helpers the adapters share: body encoding, settings, keys, deltas."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chatledger.engine.providers._base import Delta, DeltaCallback, ToolChoice, ToolSpec
from chatledger.engine.providers._errors import ModelConfigError, ModelRequestError
from chatledger.store.messages import ToolCall

__all__ = [
    "checked_tool_choice",
    "emit",
    "encode_body",
    "merge_settings",
    "request_body",
    "resolve_api_key",
    "tool_arguments",
    "tool_arguments_text",
]


def encode_body(body: Mapping[str, Any], *, provider: str) -> bytes:
    """The exact wire bytes: compact UTF-8 JSON in the mapping's own key order.

    Key order is the adapter's construction order, which is deterministic, so
    the same request always yields the same bytes (and digest).
    """
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
            "utf-8"
        )
    except (TypeError, ValueError, UnicodeError) as exc:
        raise ModelRequestError(
            f"The {provider} request cannot be encoded as JSON: {exc}. Settings and tool "
            f"schemas must hold plain JSON values, and text must be valid Unicode.",
            provider=provider,
        ) from exc


def request_body(
    head: Mapping[str, Any],
    *,
    tools: list[dict[str, Any]],
    tool_choice: Any,
    settings: Mapping[str, Any],
    stream: Mapping[str, Any],
    provider: str,
) -> bytes:
    """`encode_body` of a request in the order both APIs take it: `head` (the model
    and the messages), the tools and the tool choice when there are any, the
    settings, then the `stream` fields (empty for a request that is not streamed)."""
    body = dict(head)
    if tools:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    body.update(settings)
    body.update(stream)
    return encode_body(body, provider=provider)


def tool_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as an object; non-object arguments wrapped verbatim.

    A stream that died midway leaves arguments that are not a JSON object.
    Providers reject those, so they go on the wire as
    `{"truncated_args": "<verbatim>"}`: the model sees exactly what it produced.
    """
    value = call.arguments_object()
    return value if value is not None else {"truncated_args": call.arguments}


def tool_arguments_text(call: ToolCall) -> str:
    """`tool_arguments` as a JSON string; valid object arguments are sent verbatim."""
    if call.arguments_object() is not None:
        return call.arguments
    return json.dumps({"truncated_args": call.arguments}, ensure_ascii=False, separators=(",", ":"))


def checked_tool_choice(
    choice: ToolChoice | None, tools: Sequence[ToolSpec], *, provider: str
) -> ToolChoice | None:
    """`choice` checked against the request's tools, or None when nothing should be sent:
    no choice, or `auto`/`none` without tools (servers reject a tool_choice without tools).

    Raises `ModelRequestError` for `required` or a name when the request declares no
    tools, and for a name that is not among its tools.
    """
    if choice is None:
        return None
    if not tools:
        if choice in ("auto", "none"):
            return None
        raise ModelRequestError(
            f"tool_choice is {choice!r}, but the request declares no tools. Declare the tool, "
            f"or use 'auto'.",
            provider=provider,
        )
    if choice not in ("auto", "none", "required") and choice not in {t.name for t in tools}:
        raise ModelRequestError(
            f"tool_choice names {choice!r}, which is not among the request's tools "
            f"({', '.join(t.name for t in tools)}). Name a declared tool.",
            provider=provider,
        )
    return choice


def merge_settings(
    *layers: Mapping[str, Any] | None, reserved: Iterable[str], provider: str
) -> dict[str, Any]:
    """Merge setting layers (later wins), refusing keys the adapter itself writes."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer:
            merged.update(layer)
    clashes = sorted(set(merged) & set(reserved))
    if clashes:
        raise ModelRequestError(
            f"The {provider} settings set {', '.join(map(repr, clashes))}, which the adapter "
            f"writes itself from the request. Remove them from the settings; pass messages, "
            f"tools and tool_choice through the ModelRequest, and streaming through prepare().",
            provider=provider,
        )
    return merged


def resolve_api_key(
    api_key: str | None,
    *,
    env: str,
    base_url: str,
    default_base_url: str,
    provider: str,
) -> str | None:
    """The explicit key, else the environment's; required only for the provider's own endpoint.

    Local OpenAI-compatible servers (vLLM, llama.cpp, Ollama) usually need no
    key, so a custom base URL without a key sends no credentials.
    """
    key = api_key if api_key is not None else os.environ.get(env)
    if key:
        return key
    if base_url.rstrip("/") == default_base_url.rstrip("/"):
        raise ModelConfigError(
            f"No API key for {provider} at {default_base_url}: set the {env} environment "
            f"variable or pass api_key=... to the model.",
            provider=provider,
        )
    return None


async def emit(on_delta: DeltaCallback | None, delta: Delta) -> None:
    """Pass `delta` to a sync or async callback."""
    if on_delta is None:
        return
    result = on_delta(delta)
    if inspect.isawaitable(result):
        await result
