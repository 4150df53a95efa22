"""One run of an agent: the loop that records every step before moving on.

The order of events a run appends (each line one atomic append):

    [branch.created]  run.started                  start_run
    message.recorded (the prompt, origin client)
    model.requested {request, digest}              before the request is sent
    model.responded {usage} + message.recorded     a completed model turn
    tool.started ...                               all calls of the turn, before any runs
    tool.finished + message.recorded               each result, as it finishes
    ... more requests ...
    run.completed (moves the head)  |  run.failed / run.canceled

So a process killed at any point leaves a log from which the partial is
exact: the completed model turns and the results recorded before the kill.

The run, each model request and each tool call are also OpenTelemetry spans
(`engine._telemetry`), a no-op without an SDK.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from chatledger.engine._errors import FailureStage, Partial, RunError
from chatledger.engine._telemetry import RunSpans, record_outcome, record_response, record_result
from chatledger.engine._values import (
    Guard,
    Hit,
    HitFilter,
    MessageCallback,
    RequestOptions,
    Result,
    Retriever,
    RunContext,
    Source,
    context_block,
    given_hits,
    model_request,
)
from chatledger.engine.providers import DeltaCallback, Model, ModelError
from chatledger.engine.tools import Canceled, Outcome
from chatledger.store import (
    ChatledgerError,
    ConflictError,
    HistoryError,
    HistoryProcessor,
    InvalidInputError,
    Message,
    NewEvent,
    NotFoundError,
    Position,
    RunCursor,
    RunStateError,
    SchemaError,
    ToolCall,
    Usage,
    from_pairs,
    normalize_history,
    sanitize_history,
)
from chatledger.store._sealing import Program
from chatledger.store._sql.ops import Op
from chatledger.store._steps import Steps
from chatledger.store.history import ModelView, instructions_digest, model_view, no_result
from chatledger.store.ids import is_id, new_id

__all__ = ["Run", "RunAgent"]

T = TypeVar("T")

_CANCELED: tuple[FailureStage, ...] = ("canceled", "disconnect")
# What the ledger refuses outright, writing nothing: the caller's request (an
# unknown conversation, bad input, a live run beside it, a run already resumed)
# or a database without chatledger's tables. Before the run began, the caller
# gets the ledger's own error: there is no run to resume.
_REFUSALS = (NotFoundError, InvalidInputError, ConflictError, RunStateError, SchemaError)


class _StoreFailed(Exception):
    """The ledger refused or failed a write; carries the original error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(str(error))


class _ToolsExhausted(Exception):
    """The model kept making invalid calls past the agent's bound."""


class _RequestsExhausted(RuntimeError):
    """The run reached the agent's bound on model requests."""


class RunAgent(RequestOptions, Protocol):
    """What a run reads of its agent (an `engine.Agent` is one).

    A Protocol, so that the run loop never imports `engine.agent`, which
    imports it.
    """

    @property
    def model(self) -> Model: ...

    @property
    def history_processor(self) -> HistoryProcessor | None: ...

    @property
    def guard(self) -> Guard | None: ...

    @property
    def retriever(self) -> Retriever | None: ...

    @property
    def context_filter(self) -> HitFilter | None: ...

    @property
    def max_requests(self) -> int: ...

    @property
    def max_invalid_calls(self) -> int: ...

    async def resolve_instructions(self, context: RunContext) -> str: ...


class Run:
    """The state of one run while it executes.

    `steps` runs the tenant's store operations (`steps.ops`): one raises what
    the store raises, for the failure path to handle. The run's own steps go
    through `_store_step`, which turns a store failure into a failure at
    stage `store`.
    """

    def __init__(
        self,
        agent: RunAgent,
        steps: Steps,
        prompt: str,
        conversation_id: str | None,
        history: Sequence[tuple[str, str]] | Sequence[Message] | None,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
        *,
        on_delta: DeltaCallback | None = None,
        on_message: MessageCallback | None = None,
        on_start: Callable[[RunCursor], Awaitable[None] | None] | None = None,
        resumes: str | None = None,
    ) -> None:
        self.agent = agent
        self.resumes = resumes
        self.steps = steps
        self.ops = steps.ops
        self.prompt = prompt
        self.explicit_conversation_id = conversation_id
        self.supplied = _supplied(history)
        # An empty id is refused by the store like any malformed one, never
        # replaced: a caller that passes "" has lost an id somewhere.
        self.run_id = new_id() if run_id is None else run_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.on_delta = on_delta
        self.on_message = on_message
        self.on_start = on_start
        self.conversation_id = ""
        self.creates = False  # whether the run opens a new conversation
        self.cursor: RunCursor | None = None
        self.lock = asyncio.Lock()
        self.stage: FailureStage = "store"
        self.instructions = ""
        self.turns: list[Message] = []
        self.sources: list[Source] = []
        self.usage = Usage()
        self.requests = 0
        self.tools_run = 0
        self.invalid_calls = 0
        self.spans = RunSpans(agent.model.name, self.run_id)

    # -- the loop ---------------------------------------------------------------------

    async def execute(self) -> Result:
        """Run to completion, or raise `RunError` with the exact partial."""
        with self.spans.run() as span:
            result = await self._execute()
            record_result(span, result)
            return result

    async def _execute(self) -> Result:
        heartbeat: asyncio.Task[None] | None = None
        try:
            await self._open()
            heartbeat = asyncio.create_task(self._heartbeat())
            if self.on_start is not None:
                assert self.cursor is not None
                await _maybe_await(self.on_start(self.cursor))
            view = await self._view()
            await self._loop(view)
            return await self._complete()
        except RunError:
            raise
        except (Exception, asyncio.CancelledError) as error:
            if self.cursor is None and isinstance(error, _REFUSALS):
                raise  # refused before the run began: nothing to record
            stage, cause = self._classify(error)
            # Recording the failure is finished even if the run is cancelled
            # again meanwhile (a client gone, then a server shutting down):
            # a run left `running` would wait for its lease to expire.
            recording = asyncio.ensure_future(self._fail(stage, cause, canceled=stage in _CANCELED))
            try:
                try:
                    failure = await asyncio.shield(recording)
                except asyncio.CancelledError:
                    failure = await recording
            except _Completed:
                return await self._result()
            raise failure from cause
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Renew the run's lease (on the database's clock) while the run works."""
        interval = max(self.lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            assert self.cursor is not None
            try:
                await self.steps.run(self.ops.renew_lease(self.cursor, self.lease_seconds))
            except ChatledgerError:
                return  # lost: the run's next append is refused and reports it

    def _classify(self, error: BaseException) -> tuple[FailureStage, BaseException]:
        """The stage a failure belongs to, and the error to report."""
        if isinstance(error, Canceled):
            return "canceled", error
        if isinstance(error, asyncio.CancelledError):
            return "disconnect", error
        if isinstance(error, ConflictError):
            return "conflict", error  # the head moved while the run worked
        if isinstance(error, _StoreFailed):
            return "store", error.error
        if isinstance(error, SchemaError):
            return "store", error
        if isinstance(error, ModelError):
            return "model", error
        if isinstance(error, HistoryError):
            return "processor", error
        if isinstance(error, _ToolsExhausted):
            return "tool", error
        if isinstance(error, _RequestsExhausted):
            return "limit", error
        return self.stage, error

    async def _guard(self) -> None:
        """Let the agent's guard screen the current prompt; nothing is written before."""
        if self.agent.guard is None:
            return
        try:
            await _maybe_await(self.agent.guard(self.prompt))
        except Exception as error:
            raise RunError(
                f"The guard rejected the prompt: {error}",
                stage="guard",
                partial=None,
                run_id=self.run_id,
                conversation_id=self.conversation_id or self.explicit_conversation_id or "",
            ) from error

    async def _open(self) -> None:
        if self.resumes is not None:
            await self._open_resume()
            return
        if not is_id(self.run_id):
            # Checked before the conversation is created: nothing is written.
            raise InvalidInputError(
                f"Run id {self.run_id!r} is not a UUID in canonical form (lowercase, "
                f"hyphenated). Pass none to have a new one minted."
            )
        await self._guard()
        # Identity (ADR 0033): the explicit id, else the one the supplied
        # history donates, else a new conversation, whose id is minted here
        # and which start_run creates. An explicit id must name a
        # conversation of this tenant: an id that was never used and an id of
        # another tenant both make start_run raise the store's NotFoundError,
        # writing nothing.
        explicit = self.explicit_conversation_id
        continued = explicit if explicit is not None else await self._donated()
        self.conversation_id = new_id() if continued is None else continued
        self.creates = continued is None
        base: int | None = None
        supplied: list[Message] = []
        if self.supplied is not None:
            supplied, _ = sanitize_history(self.supplied)
            if continued is not None:
                # The history is the truth for this run: the run opens a
                # branch at the conversation's start, and the history is its
                # first record.
                base = 1
        self.instructions = await self.agent.resolve_instructions(
            RunContext(self.run_id, self.conversation_id, self.prompt)
        )
        self.prompt_message = self._stamp(Message(role="user", content=self.prompt))
        # One write opens the run: the conversation (when new), the supplied
        # history and the prompt go in the transaction of run.started, so a
        # refused request writes nothing and a run never exists without the
        # prompt it answers. Exclusive: beside a live run of the conversation
        # this one could only conflict when it completes, so it is refused
        # before it writes.
        self.cursor = await self._store_step(
            self.ops.start_run(
                self.conversation_id,
                owner=self.owner,
                run_id=self.run_id,
                base=base,
                model=self.agent.model.name,
                instructions_digest=instructions_digest(self.instructions),
                lease_seconds=self.lease_seconds,
                events=[
                    NewEvent.of_message(m, origin="client")
                    for m in [*supplied, self.prompt_message]
                ],
                create=self.creates,
                exclusive=True,
            )
        )

    async def _donated(self) -> str | None:
        """The conversation the supplied history donates, if it is one of this tenant's.

        The most recent message that carries a `conversation_id` names it
        (golem's rule, so that runs on their own results chain). A name that
        is no conversation of this tenant (another tenant's, unknown,
        malformed) donates nothing: the run opens a new conversation, as for
        a history that names none.
        """
        named = next(
            (m.conversation_id for m in reversed(self.supplied or []) if m.conversation_id), None
        )
        if named is None or not is_id(named):
            return None
        try:
            # Position 1 of the head's lineage: a read that costs nothing, and
            # raises NotFoundError alike for a missing and a foreign id.
            await self._store_step(self.ops.history(named, at=1, repaired=False))
        except NotFoundError:
            return None
        return named

    async def _open_resume(self) -> None:
        """Continue a failed run on a resume branch at its partial's cut."""
        assert self.resumes is not None
        failed = await self._store_step(self.ops.run(self.resumes))
        self.conversation_id = failed.conversation_id
        at = Position(failed.branch_id, failed.position)
        partial = await self._store_step(
            self.ops.history(self.conversation_id, at=at, repaired=False)
        )
        prompt = next((m for m in reversed(partial) if m.role == "user"), None)
        if prompt is None:
            raise HistoryError(
                f"Run '{failed.id}' recorded no prompt, so there is nothing to resume."
            )
        self.prompt = prompt.text
        # The guard screens the resumed prompt as it screens any prompt: the
        # resume may run under another agent, or another guard, than the
        # failed run did. A rejection writes nothing: no resume branch exists,
        # so the failed run can still be resumed.
        await self._guard()
        self.instructions = await self.agent.resolve_instructions(
            RunContext(self.run_id, self.conversation_id, self.prompt)
        )
        self.cursor = await self._store_step(
            self.ops.start_run(
                self.conversation_id,
                owner=self.owner,
                run_id=self.run_id,
                resumes=failed.id,
                model=self.agent.model.name,
                instructions_digest=instructions_digest(self.instructions),
                lease_seconds=self.lease_seconds,
            )
        )

    async def _view(self) -> ModelView:
        """The model's view: instructions and context, then the processed, repaired history."""
        assert self.cursor is not None
        at = Position(self.cursor.branch_id, self.cursor.position)
        replayed = await self._store_step(
            self.ops.history(self.conversation_id, at=at, repaired=False)
        )
        # The prompt is the last user message of the run's own lineage: the one
        # recorded with run.started, or for a resume the failed run's (whose
        # dangling calls repair answers, so the model may call again).
        prompt = next(m for m in reversed(replayed) if m.role == "user")
        self.prompt_message = prompt
        hits: list[Hit] = []
        if self.agent.retriever is not None:
            self.stage = "retrieval"
            hits = list(await _maybe_await(self.agent.retriever(self.prompt)))
            hits = given_hits(self.agent.context_filter, hits)
            self.sources += [
                Source("retrieval", h.id, text=h.text, classification=h.classification)
                for h in hits
            ]
        self.stage = "processor"
        return model_view(
            replayed,
            instructions=self.instructions,
            context=context_block(hits),
            processor=self.agent.history_processor,
        )

    async def _loop(self, view: ModelView) -> None:
        model = self.agent.model
        while True:
            if self.requests >= self.agent.max_requests:
                raise _RequestsExhausted(
                    f"The run made {self.requests} model requests, the agent's bound; "
                    f"raise max_requests if the task needs more."
                )
            number = self.requests + 1
            request = model_request(self.agent, view.messages(self.turns))
            self.stage = "model"
            prepared = model.prepare(request, stream=self.on_delta is not None)
            await self._record(
                [
                    NewEvent(
                        "model.requested",
                        {"request": number, "digest": prepared.digest, "stream": prepared.stream},
                    )
                ]
            )
            with self.spans.request(self.conversation_id) as span:
                response = await model.send(prepared, on_delta=self.on_delta)
                record_response(span, response)
            message = self._stamp(response.message)
            await self._record(
                [
                    NewEvent(
                        "model.responded",
                        {
                            "request": number,
                            "usage": response.usage.model_dump(mode="json"),
                            "finishReason": response.finish_reason,
                        },
                    ),
                    NewEvent.of_message(message),
                ]
            )
            self.requests += 1
            self.usage = self.usage + response.usage
            calls = [c for c in message.tool_calls if c.id]
            if not calls:
                return
            self.stage = "tool"
            await self._run_tools(calls)

    async def _run_tools(self, calls: list[ToolCall]) -> None:
        await self._record(
            [NewEvent("tool.started", {"callId": c.id, "name": c.name}) for c in calls]
        )
        tasks = [asyncio.create_task(self._one_tool(c)) for c in calls]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _one_tool(self, call: ToolCall) -> None:
        with self.spans.tool(call, self.conversation_id) as span:
            tool = self.agent.tools.get(call.name)
            if tool is None:
                known = ", ".join(sorted(self.agent.tools)) or "none"
                text = f"There is no tool named {call.name!r}. The tools are: {known}."
                msg = Message(role="tool", content=text, tool_call_id=call.id, tool_name=call.name)
                outcome = Outcome(msg, invalid=True)
            else:
                outcome = await tool.execute(call)
            record_outcome(span, outcome)
        message = self._stamp(outcome.message)
        await self._record(
            [
                NewEvent("tool.finished", {"callId": call.id, "failed": message.failed}),
                NewEvent.of_message(message),
            ]
        )
        self.tools_run += 1
        if outcome.invalid:
            self.invalid_calls += 1
            if self.invalid_calls > self.agent.max_invalid_calls:
                raise _ToolsExhausted(
                    f"The model made {self.invalid_calls} invalid tool calls, over the "
                    f"bound of {self.agent.max_invalid_calls}. Last: {message.content}"
                )
        else:
            self.sources.append(Source("tool", call.id or "", call.name, message.failed))

    async def _complete(self) -> Result:
        assert self.cursor is not None
        self.stage = "store"
        await self._store_step(
            self.ops.complete_run(
                self.cursor,
                usage=self.usage,
                request_count=self.requests,
                tool_count=self.tools_run,
            )
        )
        return await self._result()

    async def _result(self) -> Result:
        messages = await self._store_step(self.ops.history(self.conversation_id))
        output = next((m.text for m in reversed(self.turns) if m.role == "assistant"), "")
        return Result(
            run_id=self.run_id,
            conversation_id=self.conversation_id,
            messages=messages,
            new_messages=self.turns if self.resumes else [self.prompt_message, *self.turns],
            output=output,
            usage=self.usage,
            sources=list(self.sources),
            request_count=self.requests,
            tool_count=self.tools_run,
        )

    # -- recording ----------------------------------------------------------------------

    async def _store_step(self, step: Op[T] | Program[T]) -> T:
        """Run a store operation that is a step of the run; its failure is the run's, at
        stage `store`.

        A refusal of the caller's request (an unknown conversation, a run
        already resumed, ...) passes through as the store raised it, and
        the failure path (`_fail`) runs its operations directly, since it
        handles the store's errors itself.
        """
        try:
            return await self.steps.run(step)
        except _REFUSALS:
            raise
        except ChatledgerError as error:
            raise _StoreFailed(error) from error

    async def _record(self, events: list[NewEvent], *, turns: bool = True) -> None:
        """Append events at the run's cursor; appends of one run are serialized.

        The messages recorded become turns of the run (unless `turns` is
        false), in the same step, so memory and log never disagree.
        """
        async with self.lock:
            assert self.cursor is not None
            append = asyncio.ensure_future(self._store_step(self.ops.record(self.cursor, events)))
            try:
                _, self.cursor = await asyncio.shield(append)
            except asyncio.CancelledError:
                # An append in flight is finished, not abandoned: the cursor
                # must match the log before anyone records the failure.
                _, self.cursor = await append
                raise
            finally:
                if (
                    append.done()
                    and not append.cancelled()
                    and append.exception() is None
                    and turns
                ):
                    self.turns += [e.message for e in events if e.message is not None]
        if turns and self.on_message is not None and not _repairs(events):
            # Only what the log acknowledged is announced.
            for event in events:
                if event.message is not None:
                    await _maybe_await(self.on_message(event.message))

    def _stamp(self, message: Message) -> Message:
        return message.model_copy(
            update={"run_id": self.run_id, "conversation_id": self.conversation_id}
        )

    # -- failure --------------------------------------------------------------------------

    async def _fail(
        self, stage: FailureStage, error: BaseException, canceled: bool = False
    ) -> RunError:
        """Record the failure and build the RunError with the partial read from the log."""
        text = str(error) or type(error).__name__
        if self.cursor is None:
            try:
                # start_run may have committed although its answer was lost.
                run = await self.steps.run(self.ops.run(self.run_id))
            except ChatledgerError:
                return self._error(stage, text, None, recorded=False)
            if run.lease_owner != self.owner:
                return self._error(stage, text, None, recorded=False)
            self.cursor = RunCursor(
                run.id, run.conversation_id, run.branch_id, run.position, self.owner, run.attempt
            )
        try:
            if canceled:
                await self._close_unanswered()
            run = await self.steps.run(self.ops.run(self.run_id))
            if run.status == "completed":
                # The completion committed although its acknowledgement was lost.
                raise _Completed()
            events = await self.steps.run(self.ops.events(run_id=self.run_id))
            responded = [e for e in events if e.kind == "model.responded"]
            usage = sum((Usage.model_validate(e.payload["usage"]) for e in responded), Usage())
            tools = sum(1 for e in events if e.kind == "tool.finished")
            position = run.position
            if run.status == "running":
                cursor = replace(self.cursor, position=run.position)
                await self.steps.run(
                    self.ops.fail_run(
                        cursor,
                        stage=stage,
                        # An exception's text may hold a NUL, which no text column takes.
                        error=text[:4000].replace("\x00", "\ufffd"),
                        usage=usage,
                        request_count=len(responded),
                        tool_count=tools,
                        canceled=canceled,
                    )
                )
                position += 1
            partial = None
            if responded:
                at = Position(self.cursor.branch_id, position)
                messages = await self.steps.run(self.ops.history(self.conversation_id, at=at))
                partial = Partial(messages, usage, len(responded), tools)
        except _Completed:
            raise
        except ChatledgerError:
            partial = self._partial_in_memory()
        return self._error(stage, text, partial)

    async def _close_unanswered(self) -> None:
        """Answer every open call of the last turn with the neutral result, at once."""
        answered = {m.tool_call_id for m in self.turns if m.role == "tool"}
        last = next((m for m in reversed(self.turns) if m.role == "assistant"), None)
        if last is None:
            return
        closing = [
            self._stamp(no_result(c)) for c in last.tool_calls if c.id and c.id not in answered
        ]
        if closing:
            await self._record([NewEvent.of_message(m, origin="repair") for m in closing])

    def _partial_in_memory(self) -> Partial | None:
        if not self.requests:
            return None
        messages, _ = normalize_history([self.prompt_message, *self.turns])
        return Partial(messages, self.usage, self.requests, self.tools_run)

    def _error(
        self, stage: FailureStage, text: str, partial: Partial | None, *, recorded: bool = True
    ) -> RunError:
        """The run's `RunError`, whose advice is what works for how it stopped.

        `recorded`: whether the log holds the run (a run that never began has
        nothing to resume, and a conversation it was to create does not exist).
        """
        if not recorded:
            advice = "Nothing was recorded; start a new run."
        elif stage == "conflict":
            advice = (
                "Its events are kept beyond the head, and a resume would meet the same moved "
                "head. Ask again: a new run answers on the head as it is now."
            )
        else:
            kept = "its partial is kept beyond the head" if partial else "no model turn completed"
            advice = (
                f"The conversation's head did not move; {kept}. Resume the run, or start a new one."
            )
        conversation_id = self.conversation_id
        if not recorded and self.creates:
            conversation_id = ""  # the conversation the run was to open was never created
        of = f" of conversation '{conversation_id}'" if conversation_id else ""
        return RunError(
            f"Run '{self.run_id}'{of} stopped at stage {stage!r}: {text} {advice}",
            stage=stage,
            partial=partial,
            run_id=self.run_id,
            conversation_id=conversation_id,
        )


def _repairs(events: list[NewEvent]) -> bool:
    """Whether `events` are messages repair synthesized (announced to no one)."""
    return any(e.origin == "repair" for e in events)


class _Completed(Exception):
    """The run turned out to be completed after all."""


def _supplied(
    history: Sequence[tuple[str, str]] | Sequence[Message] | None,
) -> list[Message] | None:
    if history is None:
        return None
    items = list(history)
    if all(isinstance(m, Message) for m in items):
        return items  # type: ignore[return-value]
    return from_pairs(items)  # type: ignore[arg-type]


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value
