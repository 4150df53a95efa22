"""A run as Server-Sent Events: what `/v1/ask/stream` sends, in order.

    start        {runId, conversationId}        the run's ids, once the log has the run
    delta        {text}                         a fragment of the model's text
    tool_call    {id, name, arguments}          a call the model made (once recorded)
    tool_result  {callId, name, content, failed} a tool's result (once recorded)
    answer       {AskResponse}                  the completed run, sources filtered
    error        {ErrorDetail}                  where the run stopped and what to resume

`start` comes once the run and its conversation (a new one too) are
recorded, so a client that disconnects after it knows both ids; a request
refused before the run began (the guard, a live run beside it) gets only
`error`. Every event's data is camelCase, like every response's.

The run works in its own task, apart from the response: a client that goes
away cancels it (the run records `run.canceled` at stage `disconnect`, its
partial kept and resumable), and nothing the run has recorded is lost
because a socket closed. Tool calls and results are sent only once the log
has them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from sse_starlette import ServerSentEvent

from chatledger.engine import Agent, Result, RunError
from chatledger.engine.providers import Delta
from chatledger.service._models import StartEvent, ToolCallEvent, ToolResultEvent, Wire
from chatledger.store import AsyncLedger, ChatledgerError, Message, RunCursor

__all__ = ["RunStream", "cancel_once", "drive"]

_log = logging.getLogger("chatledger.service")

_END = object()


class RunStream:
    """The events of one streamed run, fed by the run's callbacks, read by the response."""

    def __init__(self, run_id: str) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.run_id = run_id

    def put(self, event: str, data: dict[str, Any] | Wire) -> None:
        if isinstance(data, Wire):
            data = data.model_dump(mode="json")
        self.queue.put_nowait((event, data))

    def on_start(self, cursor: RunCursor) -> None:
        self.put("start", StartEvent(run_id=cursor.run_id, conversation_id=cursor.conversation_id))

    def on_delta(self, delta: Delta) -> None:
        if delta.kind == "text" and delta.text:
            self.put("delta", {"text": delta.text})

    def on_message(self, message: Message) -> None:
        if message.role == "assistant":
            for call in message.tool_calls:
                self.put(
                    "tool_call", ToolCallEvent(id=call.id, name=call.name, arguments=call.arguments)
                )
        elif message.role == "tool":
            self.put(
                "tool_result",
                ToolResultEvent(
                    call_id=message.tool_call_id,
                    name=message.tool_name,
                    content=message.text,
                    failed=bool(message.failed),
                ),
            )

    def close(self) -> None:
        self.queue.put_nowait(_END)

    async def events(self, task: asyncio.Task[None]) -> AsyncIterator[ServerSentEvent]:
        """The events until the run ends; leaving early (a disconnect) cancels the run."""
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    return
                event, data = item
                yield ServerSentEvent(data=json.dumps(data, ensure_ascii=False), event=event)
        finally:
            cancel_once(task)


async def drive(
    stream: RunStream,
    agent: Agent,
    ledger: AsyncLedger,
    question: str,
    conversation_id: str | None,
    history: list[tuple[str, str]] | None,
    *,
    answer: Callable[[Result], dict[str, Any]],
    failure: Callable[[RunError], Coroutine[Any, Any, dict[str, Any]]],
    refusal: Callable[[ChatledgerError], dict[str, Any]],
) -> None:
    """Run the agent, feeding `stream`; end it with an `answer` or an `error` event."""
    event: tuple[str, dict[str, Any]]
    try:
        result = await agent.run_stream_async(
            ledger,
            question,
            conversation_id,
            on_delta=stream.on_delta,
            on_message=stream.on_message,
            on_start=stream.on_start,
            history=history,
            run_id=stream.run_id,
            owner="serve",
        )
        event = ("answer", answer(result))
    except RunError as error:
        event = ("error", await failure(error))
    except ChatledgerError as error:  # refused before the run began
        event = ("error", refusal(error))
    except Exception as error:
        # A defect of ours (a filter that raised, say): the client still
        # gets an end to its stream, and the log gets the traceback.
        _log.exception("The stream of run %s failed", stream.run_id)
        event = (
            "error",
            {
                "type": "internal_error",
                "message": f"The service failed on this run ({type(error).__name__}). "
                f"/v1/runs/{stream.run_id} shows what the run recorded.",
                "runId": stream.run_id,
            },
        )
    try:
        stream.put(*event)
    finally:
        stream.close()


def cancel_once(task: asyncio.Task[None]) -> None:
    """Cancel `task` unless it is done or already cancelled.

    A run records its cancellation after the first cancel; a second one (a
    stream torn down, then a server shutting down) must not interrupt that.
    """
    if not task.done() and not task.cancelling():
        task.cancel()
