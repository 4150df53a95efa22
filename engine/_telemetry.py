"""OpenTelemetry spans of a run, through `opentelemetry-api` alone (the `otel` extra).

A run makes three kinds of span, named as the GenAI semantic conventions name
them:

```
invoke_agent                       the run, from its guard to its completion or failure
├── chat {model name}              one per model request (kind CLIENT)
├── execute_tool {tool name}       one per tool call, the model's unknown names too
└── ...
```

The run's span is plain `invoke_agent`: the conventions name it
`invoke_agent {gen_ai.agent.name}`, and plain `invoke_agent` when there is no
agent name. An `Agent` has none, and its model's name is not one (it is on
`gen_ai.request.model`). Each span is the current span while it is open, so
spans made inside it (the request and tool spans, an HTTP client's, a
tool's own) nest under it.

Attributes (the names are defined here, since the upstream constants are
experimental):

- every span: `gen_ai.operation.name` (`invoke_agent`, `chat`,
  `execute_tool`) and `chatledger.run.id`, the run's id in the log;
- run: `gen_ai.request.model`, and once known `gen_ai.conversation.id` and
  the usage of the whole run (of the partial, for a failed run that has one);
- model request: `gen_ai.request.model`, `gen_ai.conversation.id`, the
  response's usage, `gen_ai.response.finish_reasons`, `gen_ai.response.model`;
- tool: `gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.type`
  (`function`), `gen_ai.conversation.id`;
- usage: `gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens`, and
  `gen_ai.usage.cache_read.input_tokens` /
  `gen_ai.usage.cache_creation.input_tokens` when nonzero.

`gen_ai.request.model` is the model's name as `run.started` records it
(`openai:gpt-4o`), so a span and the log agree by value. There is no
`gen_ai.provider.name`: the `Model` protocol does not say its provider, and
reading it from the name would be a provider rule outside `engine/providers`.

A failure sets the span's status to ERROR and `error.type` (the exception's
class name; for a tool, also `tool_failed` or `invalid_call` for a failed or
invalid call, which the run survives); the run's span also gets the failure
stage, `chatledger.run.stage` (`canceled` and `disconnect` included). Spans
never carry content: no prompt, message, tool argument or result, and no
exception text either, since an error's message may quote any of them, so
exceptions are not recorded as span events and a status's description names
only the stage and the class.

Without an SDK the API's no-op tracer makes every span a no-op. Without the
API (the extra not installed), nothing is imported and every span is `None`.
The tracer is looked up for each run (`get_tracer("chatledger", version)`),
so a provider the application sets after importing chatledger is used by the
next run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from chatledger import __version__
from chatledger.engine._errors import RunError

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from chatledger.engine._values import Result
    from chatledger.engine.providers import ModelResponse
    from chatledger.engine.tools import Outcome
    from chatledger.store import ToolCall, Usage

__all__ = ["RunSpans", "record_outcome", "record_response", "record_result"]

INVOKE_AGENT = "invoke_agent"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"

OPERATION_NAME = "gen_ai.operation.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
RUN_ID = "chatledger.run.id"
RUN_STAGE = "chatledger.run.stage"


@functools.cache
def _get_tracer() -> Callable[[str, str], Tracer] | None:
    """The API's `get_tracer`, or None without the API; the import is tried once."""
    try:
        from opentelemetry.trace import get_tracer
    except ImportError:
        return None
    return get_tracer


class RunSpans:
    """The spans of one run: the run's own, and its requests' and tools' as children.

    Each context manager yields the span, or None without the OpenTelemetry
    API; the `record_*` functions take either.
    """

    def __init__(self, model: str, run_id: str) -> None:
        get_tracer = _get_tracer()
        self._tracer = None if get_tracer is None else get_tracer("chatledger", __version__)
        self._model = model
        self._chat = f"{CHAT} {model}"
        self._run_id = run_id

    def run(self) -> AbstractContextManager[Span | None]:
        """The run's span; a `RunError` leaving it sets the stage and what the partial used."""
        return self._span(INVOKE_AGENT, INVOKE_AGENT, {REQUEST_MODEL: self._model})

    def request(self, conversation_id: str) -> AbstractContextManager[Span | None]:
        """The span of one model request."""
        return self._span(
            self._chat, CHAT, {REQUEST_MODEL: self._model, CONVERSATION_ID: conversation_id}
        )

    def tool(self, call: ToolCall, conversation_id: str) -> AbstractContextManager[Span | None]:
        """The span of one tool call."""
        return self._span(
            f"{EXECUTE_TOOL} {call.name}",
            EXECUTE_TOOL,
            {
                TOOL_NAME: call.name,
                TOOL_CALL_ID: call.id or "",
                TOOL_TYPE: "function",
                CONVERSATION_ID: conversation_id,
            },
        )

    @contextmanager
    def _span(
        self, name: str, operation: str, attributes: dict[str, AttributeValue]
    ) -> Iterator[Span | None]:
        if self._tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind, use_span

        attributes[OPERATION_NAME] = operation
        attributes[RUN_ID] = self._run_id
        kind = SpanKind.CLIENT if operation == CHAT else SpanKind.INTERNAL
        span = self._tracer.start_span(name, kind=kind, attributes=attributes)
        if not span.get_span_context().is_valid:
            # The API's no-op tracer (no SDK): nothing to end or make current,
            # and making it current would hide a caller's valid span.
            yield span
            return
        # Not the API's own exception recording: it would put the error's
        # text, which may quote content, on the span.
        with use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                yield span
            except BaseException as error:
                _failed(span, error)
                raise


def record_result(span: Span | None, result: Result) -> None:
    """Put a completed run's conversation and usage on its span."""
    if span is None or not span.is_recording():
        return
    span.set_attribute(CONVERSATION_ID, result.conversation_id)
    _usage(span, result.usage)


def record_response(span: Span | None, response: ModelResponse) -> None:
    """Put a model response's usage, finish reason and model on its request's span."""
    if span is None or not span.is_recording():
        return
    _usage(span, response.usage)
    if response.finish_reason is not None:
        span.set_attribute(RESPONSE_FINISH_REASONS, (response.finish_reason,))
    if response.model_name:
        span.set_attribute(RESPONSE_MODEL, response.model_name)


def record_outcome(span: Span | None, outcome: Outcome) -> None:
    """Mark a tool's span failed when its call was invalid or its result failed."""
    if span is None or not span.is_recording():
        return
    if outcome.invalid:
        _error(span, "invalid_call")
    elif outcome.message.failed:
        _error(span, "tool_failed")


def _usage(span: Span, usage: Usage) -> None:
    span.set_attribute(USAGE_INPUT_TOKENS, usage.input_tokens)
    span.set_attribute(USAGE_OUTPUT_TOKENS, usage.output_tokens)
    if usage.cache_read_tokens:
        span.set_attribute(USAGE_CACHE_READ_INPUT_TOKENS, usage.cache_read_tokens)
    if usage.cache_write_tokens:
        span.set_attribute(USAGE_CACHE_CREATION_INPUT_TOKENS, usage.cache_write_tokens)


def _failed(span: Span, error: BaseException) -> None:
    if not span.is_recording():
        return
    if not isinstance(error, RunError):
        _error(span, type(error).__qualname__)
        return
    # The run's own failure: what stopped it is the error it was raised from.
    name = type(error.__cause__ or error).__qualname__
    span.set_attribute(RUN_STAGE, error.stage)
    if error.conversation_id:
        span.set_attribute(CONVERSATION_ID, error.conversation_id)
    if error.partial is not None:
        _usage(span, error.partial.usage)
    _error(span, name, f"The run stopped at stage {error.stage!r} ({name}).")


def _error(span: Span, error_type: str, description: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, description))
