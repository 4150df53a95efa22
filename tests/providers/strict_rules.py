"""The request rules the real providers enforce, as the strict test server checks them.

Each check returns None for an acceptable body, or a `Rejection` with the
status and the message the provider answers with (their wording, where known).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    kind: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class _Reject(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.rejection = Rejection(400, message, param=param)


def _require(condition: bool, message: str, param: str | None = None) -> None:
    if not condition:
        raise _Reject(message, param)


# --- OpenAI Chat Completions ------------------------------------------------------------


def check_openai(headers: dict[str, str], body: Any, api_key: str) -> Rejection | None:
    auth = headers.get("authorization", "")
    if not auth.startswith("Bearer ") or not auth[7:]:
        return Rejection(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    if auth[7:] != api_key:
        return Rejection(401, "Incorrect API key provided.", code="invalid_api_key")
    try:
        _openai_body(body)
    except _Reject as exc:
        return exc.rejection
    return None


def _openai_body(body: Any) -> None:
    _require(isinstance(body, dict), "The request body must be a JSON object.")
    _require(
        isinstance(body.get("model"), str) and body["model"],
        "you must provide a model parameter",
        "model",
    )
    messages = body.get("messages")
    _require(isinstance(messages, list), "Missing required parameter: 'messages'.", "messages")
    _require(
        len(messages) > 0,
        "Invalid 'messages': empty array. Expected an array with minimum length 1.",
        "messages",
    )
    for i, message in enumerate(messages):
        _openai_message(i, message)
    _openai_pairing(messages)
    tools = body.get("tools")
    names: set[str] = set()
    if tools is not None:
        _require(
            isinstance(tools, list) and len(tools) > 0,
            "Invalid 'tools': expected a non-empty array.",
            "tools",
        )
        for j, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            _require(
                isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict),
                f"Invalid 'tools[{j}]': expected a function tool.",
                f"tools[{j}]",
            )
            name = fn.get("name")
            _require(
                isinstance(name, str) and bool(_TOOL_NAME.match(name)),
                f"Invalid 'tools[{j}].function.name': string does not match pattern.",
                f"tools[{j}].function.name",
            )
            params = fn.get("parameters", {})
            _require(
                isinstance(params, dict),
                f"Invalid 'tools[{j}].function.parameters'.",
                f"tools[{j}].function.parameters",
            )
            names.add(name)
    _openai_tool_choice(body.get("tool_choice"), tools, names)
    stream = body.get("stream", False)
    _require(isinstance(stream, bool), "Invalid type for 'stream': expected a boolean.", "stream")
    if "stream_options" in body:
        _require(
            stream is True,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )


def _openai_tool_choice(choice: Any, tools: Any, names: set[str]) -> None:
    if choice is None:
        return
    _require(
        tools is not None,
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        "tool_choice",
    )
    if isinstance(choice, str):
        _require(
            choice in ("none", "auto", "required"), f"Invalid value: '{choice}'.", "tool_choice"
        )
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    _require(
        isinstance(choice, dict) and choice.get("type") == "function" and isinstance(fn, dict),
        "Invalid 'tool_choice'.",
        "tool_choice",
    )
    _require(
        fn.get("name") in names,
        f"Invalid 'tool_choice': function '{fn.get('name')}' is not among the declared tools.",
        "tool_choice",
    )


_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")
_OPENAI_PARTS = {
    "text": "text",
    "image_url": "image_url",
    "input_audio": "input_audio",
    "file": "file",
}


def _openai_message(i: int, message: Any) -> None:
    where = f"messages[{i}]"
    _require(isinstance(message, dict), f"Invalid '{where}': expected an object.", where)
    role = message.get("role")
    _require(
        role in _OPENAI_ROLES,
        f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'tool', 'function', and 'developer'.",
        f"{where}.role",
    )
    content = message.get("content")
    if role in ("system", "developer", "user", "tool"):
        _require(
            "content" in message,
            f"Missing required parameter: '{where}.content'.",
            f"{where}.content",
        )
    if role == "tool":
        _require(
            isinstance(message.get("tool_call_id"), str),
            f"Missing required parameter: '{where}.tool_call_id'.",
            f"{where}.tool_call_id",
        )
    if role == "assistant":
        calls = message.get("tool_calls")
        _require(
            content is not None or bool(calls),
            f"Invalid '{where}': content is required unless tool_calls is given.",
            f"{where}.content",
        )
        if calls is not None:
            _require(
                isinstance(calls, list) and len(calls) > 0,
                f"Invalid '{where}.tool_calls': empty array.",
                f"{where}.tool_calls",
            )
            for j, call in enumerate(calls):
                _openai_call(f"{where}.tool_calls[{j}]", call)
    if isinstance(content, list):
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            _require(
                kind in _OPENAI_PARTS and isinstance(part.get(kind), (str, dict)),
                f"Invalid '{where}.content[{k}]'.",
                f"{where}.content[{k}]",
            )
            _require(
                role == "user" or kind == "text",
                f"Invalid '{where}.content[{k}]': only text for role '{role}'.",
                f"{where}.content[{k}]",
            )
    else:
        _require(
            content is None or isinstance(content, str),
            f"Invalid type for '{where}.content'.",
            f"{where}.content",
        )


def _openai_call(where: str, call: Any) -> None:
    fn = call.get("function") if isinstance(call, dict) else None
    _require(
        isinstance(call, dict)
        and isinstance(call.get("id"), str)
        and call.get("type") == "function"
        and isinstance(fn, dict),
        f"Missing required parameter: '{where}.id'.",
        where,
    )
    _require(
        isinstance(fn.get("name"), str),
        f"Missing required parameter: '{where}.function.name'.",
        f"{where}.function.name",
    )
    args = fn.get("arguments")
    _require(
        isinstance(args, str),
        f"Missing required parameter: '{where}.function.arguments'.",
        f"{where}.function.arguments",
    )
    try:
        json.loads(args)
    except ValueError:
        raise _Reject(
            f"Invalid '{where}.function.arguments': the function arguments must be valid JSON.",
            f"{where}.function.arguments",
        ) from None


def _openai_pairing(messages: list[dict[str, Any]]) -> None:
    """Tool messages must directly follow their assistant turn and answer each id."""
    open_ids: list[str] | None = None
    opened_at = -1
    for i, message in enumerate([*messages, {"role": "<end>"}]):
        role = message["role"]
        if role == "tool":
            _require(
                open_ids is not None,
                "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                f"messages.[{i}].role",
            )
            call_id = message["tool_call_id"]
            _require(
                call_id in open_ids,
                f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous message.",
                f"messages.[{i}].tool_call_id",
            )
            open_ids.remove(call_id)
            continue
        if open_ids:
            _require(
                False,
                "An assistant message with 'tool_calls' must be followed by tool messages responding "
                "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                + ", ".join(open_ids),
                f"messages.[{opened_at}].role",
            )
        open_ids = None
        if role == "assistant" and message.get("tool_calls"):
            open_ids = [c["id"] for c in message["tool_calls"]]
            opened_at = i


# --- Anthropic Messages -----------------------------------------------------------------


def check_anthropic(headers: dict[str, str], body: Any, api_key: str) -> Rejection | None:
    key = headers.get("x-api-key")
    if not key:
        return Rejection(401, "x-api-key header is required", kind="authentication_error")
    if key != api_key:
        return Rejection(401, "invalid x-api-key", kind="authentication_error")
    if not headers.get("anthropic-version"):
        return Rejection(400, "anthropic-version: header is required")
    try:
        _anthropic_body(body)
    except _Reject as exc:
        return exc.rejection
    return None


def _anthropic_body(body: Any) -> None:
    _require(isinstance(body, dict), "The request body must be a JSON object.")
    _require(isinstance(body.get("model"), str) and body["model"], "model: Field required")
    _require(
        isinstance(body.get("max_tokens"), int) and body["max_tokens"] >= 1,
        "max_tokens: Field required",
    )
    messages = body.get("messages")
    _require(isinstance(messages, list), "messages: Field required")
    _require(len(messages) > 0, "messages: at least one message is required")
    system = body.get("system")
    if system is not None:
        _require(
            isinstance(system, str)
            or (isinstance(system, list) and all(_is_text(b) for b in system)),
            "system: Input should be a valid string or a list of text blocks",
        )
    for i, message in enumerate(messages):
        _anthropic_message(i, message, last=i == len(messages) - 1)
    _require(messages[0]["role"] == "user", 'messages: first message must use the "user" role')
    for i in range(1, len(messages)):
        role = messages[i]["role"]
        _require(
            role != messages[i - 1]["role"],
            f'messages: roles must alternate between "user" and "assistant", but found multiple "{role}" roles in a row',
        )
    _anthropic_pairing(messages)
    names = _anthropic_tools(body.get("tools"))
    _anthropic_tool_choice(body.get("tool_choice"), names)
    _require(isinstance(body.get("stream", False), bool), "stream: Input should be a valid boolean")


def _is_text(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _anthropic_message(i: int, message: Any, *, last: bool) -> None:
    where = f"messages.{i}"
    _require(isinstance(message, dict), f"{where}: Input should be a valid dictionary")
    role = message.get("role")
    _require(role in ("user", "assistant"), f"{where}.role: Input should be 'user' or 'assistant'")
    content = message.get("content")
    _require(isinstance(content, (str, list)), f"{where}.content: Field required")
    if not content:
        _require(
            last and role == "assistant",
            f"{where}: all messages must have non-empty content except for the optional final assistant message",
        )
        return
    for k, block in enumerate(_blocks(message)):
        _anthropic_block(f"{where}.content.{k}", role, block)


def _anthropic_block(where: str, role: str, block: Any) -> None:
    _require(isinstance(block, dict), f"{where}: Input should be a valid dictionary")
    kind = block.get("type")
    if kind == "text":
        _require(
            isinstance(block.get("text"), str) and block["text"] != "",
            "messages: text content blocks must be non-empty",
        )
    elif kind in ("image", "document"):
        _require(role == "user", f"{where}: {kind} blocks are only allowed in user messages")
        source = block.get("source")
        _require(isinstance(source, dict), f"{where}.source: Field required")
        if source.get("type") == "url":
            _require(isinstance(source.get("url"), str), f"{where}.source.url: Field required")
        else:
            _require(
                source.get("type") == "base64",
                f"{where}.source.type: Input should be 'base64' or 'url'",
            )
            allowed = _IMAGE_TYPES if kind == "image" else {"application/pdf"}
            _require(
                source.get("media_type") in allowed,
                f"{where}.source.media_type: unsupported media type",
            )
            _require(isinstance(source.get("data"), str), f"{where}.source.data: Field required")
    elif kind == "tool_use":
        _require(
            role == "assistant", f"{where}: tool_use blocks are only allowed in assistant messages"
        )
        _require(isinstance(block.get("id"), str), f"{where}.id: Field required")
        _require(isinstance(block.get("name"), str), f"{where}.name: Field required")
        _require(
            isinstance(block.get("input"), dict),
            f"{where}.input: Input should be a valid dictionary",
        )
    elif kind == "tool_result":
        _require(role == "user", f"{where}: tool_result blocks are only allowed in user messages")
        _require(isinstance(block.get("tool_use_id"), str), f"{where}.tool_use_id: Field required")
        content = block.get("content", "")
        _require(
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(c, dict) for c in content)),
            f"{where}.content: Input should be a valid string or list",
        )
        _require(
            isinstance(block.get("is_error", False), bool),
            f"{where}.is_error: Input should be a valid boolean",
        )
    elif kind == "thinking":
        _require(
            role == "assistant", f"{where}: thinking blocks are only allowed in assistant messages"
        )
        _require(
            isinstance(block.get("signature"), str) and block["signature"],
            f"{where}.signature: Field required",
        )
        _require(isinstance(block.get("thinking"), str), f"{where}.thinking: Field required")
    elif kind == "redacted_thinking":
        _require(isinstance(block.get("data"), str), f"{where}.data: Field required")
    else:
        raise _Reject(
            f"{where}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags"
        )


def _anthropic_pairing(messages: list[dict[str, Any]]) -> None:
    """Each tool_use is answered at the start of the next user message, and only there."""
    previous_ids: list[str] = []
    for i, message in enumerate(messages):
        blocks = _blocks(message)
        if message["role"] == "user":
            results = [b for b in blocks if b.get("type") == "tool_result"]
            leading = 0
            while leading < len(blocks) and blocks[leading].get("type") == "tool_result":
                leading += 1
            for k, block in enumerate(blocks):
                if block.get("type") == "tool_result" and block["tool_use_id"] not in previous_ids:
                    raise _Reject(
                        f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                        f"`tool_use` block in the previous message."
                    )
            if previous_ids:
                answered = {b["tool_use_id"] for b in results}
                missing = [x for x in previous_ids if x not in answered]
                _require(
                    not missing,
                    f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                    f"`tool_result` block in the next message.",
                )
                _require(
                    leading >= len(previous_ids),
                    f"messages.{i}: Did not find {len(previous_ids)} `tool_result` block(s) at the beginning "
                    f"of this message. Messages following `tool_use` blocks must begin with a matching "
                    f"number of `tool_result` blocks.",
                )
            previous_ids = []
        else:
            previous_ids = [b["id"] for b in blocks if b.get("type") == "tool_use"]
    _require(
        not previous_ids,
        f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(previous_ids)}. Each `tool_use` block must have a corresponding "
        f"`tool_result` block in the next message.",
    )


def _anthropic_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    _require(isinstance(tools, list), "tools: Input should be a valid list")
    names = set()
    for j, tool in enumerate(tools):
        _require(
            isinstance(tool, dict) and isinstance(tool.get("name"), str),
            f"tools.{j}.name: Field required",
        )
        _require(
            bool(_TOOL_NAME.match(tool["name"])), f"tools.{j}.name: String should match pattern"
        )
        schema = tool.get("input_schema")
        _require(
            isinstance(schema, dict) and schema.get("type") == "object",
            f"tools.{j}.input_schema: Field required (a JSON schema of type object)",
        )
        names.add(tool["name"])
    return names


def _anthropic_tool_choice(choice: Any, names: set[str]) -> None:
    if choice is None:
        return
    _require(isinstance(choice, dict), "tool_choice: Input should be a valid dictionary")
    kind = choice.get("type")
    _require(
        kind in ("auto", "any", "tool", "none"),
        f"tool_choice.type: Input tag '{kind}' is not expected",
    )
    _require(
        kind in ("auto", "none") or bool(names),
        "tool_choice: tool_choice may only be specified while providing tools",
    )
    if kind == "tool":
        _require(
            choice.get("name") in names,
            f"tool_choice.name: tool '{choice.get('name')}' not found in tools",
        )
