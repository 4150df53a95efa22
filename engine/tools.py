"""Tools: plain Python functions the model may call.

A tool is declared from a function's signature: its type hints become the
JSON schema the model sees, and pydantic validates the model's arguments
against the same schema before the function runs. Sync functions run in a
worker thread; async ones on the loop. The calls of one model response run
concurrently.

How a tool ends, and what the run does with it:

- returns a value: a tool result (a `ToolResult` for parts or evidence);
- raises `ToolFailed`: a definitive failure the model is told about (`failed`);
- arguments fail validation: a correction goes back to the model, which may
  call again, up to the agent's bound;
- exceeds its timeout: a failed result saying so;
- raises `Canceled`: the run stops (results already recorded stay, unanswered
  calls are closed);
- raises anything else: the run fails at stage `tool`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from chatledger.engine.providers import ToolSpec
from chatledger.store.messages import Message, Part, ToolCall

__all__ = ["Canceled", "Tool", "ToolFailed", "ToolResult", "tool"]


class Canceled(Exception):
    """Raised by a tool to stop the run it belongs to."""


class ToolFailed(Exception):
    """Raised by a tool for a definitive failure the model should know about."""


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer with parts (evidence such as documents or images)."""

    content: str = ""
    parts: list[Part] = field(default_factory=list)
    failed: bool = False


@dataclass(frozen=True)
class Outcome:
    """What executing one call produced: its result message and how it ended."""

    message: Message
    invalid: bool = False


class Tool:
    """A function the model may call, with its schema and validator."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        rerun: bool = True,
    ) -> None:
        self.function = function
        self.name = name or function.__name__
        self.description = description or inspect.getdoc(function) or ""
        self.timeout = timeout
        # False for a tool with side effects that must not happen twice: a
        # crashed run that started it without recording its result is not
        # resumed automatically (see engine.resume).
        self.rerun = rerun
        self._model = _arguments_model(function, self.name)

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(self.name, self.description, self._model.model_json_schema())

    async def execute(self, call: ToolCall) -> Outcome:
        """Validate the call's arguments and run the function."""
        try:
            arguments = self._model.model_validate_json(call.arguments or "{}")
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in error.errors(include_url=False)
            )
            text = (
                f"The arguments for {self.name} are invalid ({problems}). Call {self.name} "
                f"again with arguments that match its schema."
            )
            return Outcome(self._message(call, text), invalid=True)
        kwargs = {k: getattr(arguments, k) for k in type(arguments).model_fields}
        try:
            value = await asyncio.wait_for(self._call(kwargs), timeout=self.timeout)
        except TimeoutError:
            text = f"{self.name} did not finish within {self.timeout} seconds and was stopped."
            return Outcome(self._message(call, text, failed=True))
        except ToolFailed as failure:
            return Outcome(self._message(call, str(failure), failed=True))
        if isinstance(value, ToolResult):
            return Outcome(self._message(call, value.content, value.failed, value.parts))
        if not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False, default=str)
        return Outcome(self._message(call, value))

    async def _call(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self.function(**kwargs)
        result = await asyncio.to_thread(self.function, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result

    def _message(
        self, call: ToolCall, content: str, failed: bool = False, parts: list[Part] | None = None
    ) -> Message:
        return Message(
            role="tool",
            content=content,
            parts=parts or [],
            tool_call_id=call.id,
            tool_name=self.name,
            failed=failed,
        )


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    rerun: bool = True,
) -> Any:
    """Declare a tool; usable as `@tool` or `@tool(timeout=5, rerun=False)`.

    `rerun=False` marks a tool whose side effects must not happen twice: a
    crashed run that started it but recorded no result needs a person.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, timeout=timeout, rerun=rerun)

    return wrap(function) if function is not None else wrap


def _arguments_model(function: Callable[..., Any], name: str) -> type[BaseModel]:
    hints = get_type_hints(function)
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    model: type[BaseModel] = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model
