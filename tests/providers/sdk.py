"""Validate wire bodies against the official SDKs' request types.

The SDK types are TypedDicts, which pydantic validates leniently (unknown keys
are dropped, iterables are validated lazily). `validate` therefore consumes
every lazy iterable and then requires the validated value to equal the body:
an unknown or misspelled key makes them differ.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import TypeAdapter


def _force(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, Iterator)):
        return [_force(v) for v in value]
    return value


@functools.cache
def _adapter(api: str, stream: bool) -> TypeAdapter[Any]:
    if api == "openai":
        params = pytest.importorskip("openai.types.chat.completion_create_params")
        kind = (
            params.CompletionCreateParamsStreaming
            if stream
            else params.CompletionCreateParamsNonStreaming
        )
    else:
        params = pytest.importorskip("anthropic.types.message_create_params")
        kind = (
            params.MessageCreateParamsStreaming
            if stream
            else params.MessageCreateParamsNonStreaming
        )
    return TypeAdapter(kind)


def validate(api: str, body: bytes) -> dict[str, Any]:
    """Assert `body` is a valid request of `api` (`openai` or `anthropic`); return it parsed."""
    data = json.loads(body)
    validated = _force(_adapter(api, bool(data.get("stream"))).validate_python(data))
    assert validated == data, f"the {api} SDK types do not know every field of {data!r}"
    return data
