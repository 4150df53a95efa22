"""The ask service: an ASGI application over an agent and a store.

    POST /v1/ask                            answer a question (JSON)
    POST /v1/ask/stream                     answer it as Server-Sent Events
    GET  /v1/conversations                  the tenant's conversations, newest first
    GET  /v1/conversations/{id}             a conversation
    GET  /v1/conversations/{id}/messages    its head history (or at a position)
    GET  /v1/conversations/{id}/runs        its runs, newest first
    POST /v1/conversations/{id}/forks       fork it at a position
    GET  /v1/runs/{id}                      one run and its timeline of events
    GET  /healthz, /openapi.json, /docs     open, without a key

Every `/v1` request carries one API key, which chooses its tenant
(`service._boundary`); no route takes a tenant from the request. Every
response is a model of `service._models`, camelCase, so `/openapi.json`
describes what comes back; `/docs` is Swagger UI from the installed
`fastapi-offline`, with nothing loaded from elsewhere. Content
classified RESTRICTED leaves neither for the model (the agent's
`context_filter`) nor for the caller: every answer's sources, streamed or
not, lose their RESTRICTED hits before an application's own `source_filter`
sees them, unless `unsafe_return_restricted_sources` opens that exit.
"""

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request, Security
from fastapi.security import HTTPBearer
from fastapi.types import DecoratedCallable
from pydantic import BaseModel
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from chatledger.engine import Agent, Result, RunError, Source
from chatledger.service._boundary import TENANT_SCOPE_KEY, Boundary
from chatledger.service._docs import install_docs
from chatledger.service._errors import (
    error_response,
    install_error_handlers,
    refusal_detail,
    run_failure,
)
from chatledger.service._keys import ApiKeys
from chatledger.service._models import (
    AskRequest,
    AskResponse,
    ConversationOut,
    ConversationsOut,
    ErrorBody,
    ErrorDetail,
    ForkRequest,
    ForkResponse,
    Health,
    Id,
    MessagesOut,
    PositionedMessage,
    RunOut,
    RunsOut,
)
from chatledger.service._stream import RunStream, cancel_once, drive
from chatledger.service._ui import ui_router
from chatledger.store import (
    AsyncLedger,
    AsyncStore,
    ChatledgerError,
    InvalidInputError,
    NotFoundError,
    __version__,
    new_id,
)
from chatledger.store.history import normalize_history

__all__ = ["SourceFilter", "create_app", "drop_restricted_sources"]

SourceFilter = Callable[[Sequence[Source]], Iterable[Source]]
"""Chooses which of a run's sources (RESTRICTED hits already dropped) reach the caller."""

DEFAULT_MAX_BODY_BYTES = 1 << 20


def drop_restricted_sources(sources: Sequence[Source]) -> list[Source]:
    """The sources that are not hits classified RESTRICTED: the caller's exit, which runs
    before any `source_filter`."""
    return [s for s in sources if not s.restricted]


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in {
        400: "The body is not JSON, or the request carries more than one Authorization header.",
        401: "No valid API key.",
        404: "No such conversation or run for the key's tenant.",
        409: "Another run or writer holds the conversation; retry, or ask again.",
        413: "The body is over the service's limit.",
        422: "The request is malformed, or the guard refused the question.",
        500: "The run failed; `resume` names the run to resume.",
        502: "The model failed; `resume` names the run to resume.",
        503: (
            "The database is not migrated to this version, or the service lacks the key "
            "its sealed content needs."
        ),
    }.items()
}


def create_app(
    agent: Agent,
    store: AsyncStore | str,
    *,
    keys: ApiKeys,
    source_filter: SourceFilter | None = None,
    unsafe_return_restricted_sources: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    new_run_id: Callable[[], str] = new_id,
    replicas: Sequence[str] = (),
) -> FastAPI:
    """The ask service's ASGI application.

    Args:
        agent: the agent every question runs on.
        store: an open `AsyncStore` (the caller closes it), or a database URL
            the application opens at startup and closes at shutdown.
        keys: the API keys and the tenant each opens.
        source_filter: chooses which sources an answer returns (a top-k, a
            finer classification), from sources whose RESTRICTED hits are
            already dropped (`drop_restricted_sources`): it cannot let them
            back in. `None` returns them all.
        unsafe_return_restricted_sources: opens the caller's exit on purpose:
            RESTRICTED hits the run used (an agent with `context_filter=None`)
            are returned with the answers, to whoever holds a key.
        max_body_bytes: the largest request body read (413 beyond).
        new_run_id: mints each run's id.
        replicas: with a database URL, the read replicas the store opens
            with it (`AsyncStore.open(replicas=)`): audit reads and old
            positions go there, the rest to the primary.
    """
    if replicas and not isinstance(store, str):
        raise InvalidInputError(
            "replicas= goes with a database URL; an open AsyncStore was given, so open it "
            "with its replicas instead: AsyncStore.open(url, replicas=[...])."
        )
    if not isinstance(unsafe_return_restricted_sources, bool):
        raise InvalidInputError(
            f"unsafe_return_restricted_sources must be True or False, not "
            f"{unsafe_return_restricted_sources!r}."
        )
    service = _Service(
        agent, store, source_filter, unsafe_return_restricted_sources, new_run_id, replicas
    )
    app = FastAPI(
        title="chatledger ask service",
        version=__version__,
        description=(
            "Questions answered by an agent over chatledger's event log, with the "
            "conversation's history, its runs and their timelines. Every /v1 request "
            "carries `Authorization: Bearer <key>`; the key chooses the tenant. Every "
            "body is camelCase; requests may spell a field in snake_case instead."
        ),
        lifespan=service.lifespan,
        docs_url=None,  # served by install_docs, from an installed package
        redoc_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(Boundary, keys=keys, max_body_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description="An API key of the service's key file.")
    install_docs(app)

    async def ledger(
        request: Request, _key: Annotated[Any, Security(bearer)] = None
    ) -> AsyncLedger:
        return service.store.tenant(request.scope[TENANT_SCOPE_KEY])

    Ledger_ = Annotated[AsyncLedger, Depends(ledger)]
    app.include_router(
        ui_router(lambda request: service.store.tenant(request.scope[TENANT_SCOPE_KEY]))
    )

    def read(path: str, model: type[BaseModel]) -> Callable[[DecoratedCallable], DecoratedCallable]:
        """A GET route of the `read` tag, answering `model` or one of the errors."""
        return app.get(path, response_model=model, tags=["read"], responses=_ERRORS)

    @app.get("/healthz", response_model=Health, tags=["service"])
    async def healthz() -> Response:
        """Whether the service is up: open, without a key, and it reads no database."""
        return _json(Health(status="ok"))

    @app.post("/v1/ask", response_model=AskResponse, responses=_ERRORS, tags=["ask"])
    async def ask(request: AskRequest, ledger: Ledger_) -> Response:
        """Answer a question; the run is recorded before the answer is returned."""
        run_id = service.new_run_id()
        try:
            result = await agent.run_async(
                ledger,
                request.question,
                request.conversation_id,
                history=request.history,
                run_id=run_id,
                owner="serve",
            )
        except RunError as error:
            status, detail = await service.failure(ledger, error)
            return error_response(status, detail)
        return _json(service.answer(result))

    @app.post(
        "/v1/ask/stream",
        responses={
            200: {
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
                "description": (
                    "The run's events, each `event:` a name and `data:` one JSON object: "
                    "`start` (StartEvent), `delta` ({text}), `tool_call` (ToolCallEvent), "
                    "`tool_result` (ToolResultEvent), then `answer` (AskResponse) or "
                    "`error` (ErrorDetail)."
                ),
            },
            **_ERRORS,
        },
        response_class=EventSourceResponse,
        tags=["ask"],
    )
    async def ask_stream(request: AskRequest, ledger: Ledger_) -> EventSourceResponse:
        """Answer a question as Server-Sent Events: start (once the run is recorded),
        delta, tool_call, tool_result, then answer or error. Closing the connection
        cancels the run; its partial is kept and can be resumed."""
        if request.conversation_id is not None:
            await ledger.conversation(request.conversation_id)  # 404 before the stream
        stream = RunStream(service.new_run_id())
        task = service.spawn(
            drive(
                stream,
                agent,
                ledger,
                request.question,
                request.conversation_id,
                request.history,
                answer=lambda result: service.answer(result).model_dump(mode="json"),
                failure=functools.partial(service.failure_detail, ledger),
                refusal=refusal_detail,
            )
        )
        # A client that stops reading but keeps its connection is treated as
        # gone after a minute: its run is cancelled, its partial kept.
        return EventSourceResponse(stream.events(task), ping=15, send_timeout=60)

    @read("/v1/conversations", ConversationsOut)
    async def conversations(
        ledger: Ledger_,
        limit: Annotated[int, Query(ge=1, le=1000, description="The page's size.")] = 50,
        cursor: Annotated[
            Id | None,
            Query(min_length=1, description="The `nextCursor` of the previous page."),
        ] = None,
    ) -> Response:
        """The tenant's conversations, newest first, a page at a time."""
        try:
            # One more than the page, so the last page says it is the last.
            found = await ledger.conversations(limit=limit + 1, before=cursor)
        except (NotFoundError, InvalidInputError) as error:
            # The cursor is a conversation of the key's tenant, which the store checks:
            # another tenant's, or a made-up one, reads as no cursor this listing gave.
            raise InvalidInputError(
                f"The cursor {cursor!r:.80} is not one this listing gave out for your API "
                f"key: pass the `nextCursor` of the previous page unchanged, or start again "
                f"without `cursor`."
            ) from error
        page = found[:limit]
        return _json(
            ConversationsOut(
                conversations=[ConversationOut.of(c) for c in page],
                next_cursor=page[-1].id if len(found) > limit else None,
            )
        )

    @read("/v1/conversations/{conversation_id}", ConversationOut)
    async def conversation(conversation_id: Id, ledger: Ledger_) -> Response:
        """A conversation: its head and where it came from."""
        return _json(ConversationOut.of(await ledger.conversation(conversation_id)))

    @read("/v1/conversations/{conversation_id}/messages", MessagesOut)
    async def messages(
        conversation_id: Id,
        ledger: Ledger_,
        at: Annotated[int | None, Query(ge=1, description="A position; default the head.")] = None,
    ) -> Response:
        """The conversation's history at its head (or at a position of the head's lineage),
        repaired, each message with its position."""
        entries = await ledger.entries(conversation_id, at=at)
        # The repair reuses the stored messages as they are (only the results it
        # synthesizes are new), so each keeps its entry's position.
        positions = {id(e.message): e.position.position for e in entries}
        history, _ = normalize_history([e.message for e in entries])
        return _json(
            MessagesOut(
                conversation_id=conversation_id,
                messages=[
                    PositionedMessage.model_validate(
                        {**m.model_dump(exclude_defaults=True), "position": positions.get(id(m))}
                    )
                    for m in history
                ],
            ),
            exclude_defaults=True,
        )

    @read("/v1/conversations/{conversation_id}/runs", RunsOut)
    async def runs(
        conversation_id: Id,
        ledger: Ledger_,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        """The conversation's runs, newest first."""
        await ledger.conversation(conversation_id)  # a missing one is a 404, not an empty list
        return _json(RunsOut(runs=await ledger.runs.recent(conversation_id=conversation_id, limit=limit)))

    @app.post(
        "/v1/conversations/{conversation_id}/forks",
        status_code=201,
        response_model=ForkResponse,
        tags=["read"],
        responses=_ERRORS,
    )
    async def fork(
        conversation_id: Id,
        ledger: Ledger_,
        body: Annotated[ForkRequest | None, Body()] = None,
    ) -> Response:
        """Fork the conversation at a position (default its head): a new conversation
        that shares the history up to there, without copying it."""
        forked = await ledger.fork(conversation_id, at=body.at if body else None)
        return _json(ForkResponse(conversation_id=forked.id, forked_from=conversation_id), 201)

    @read("/v1/runs/{run_id}", RunOut)
    async def run(run_id: Id, ledger: Ledger_) -> Response:
        """One run and its timeline: every event it recorded, in order."""
        found = await ledger.runs.get(run_id)
        return _json(RunOut(run=found, events=await ledger.events(run_id=run_id)))

    return app


def _json(body: BaseModel, status: int = 200, **options: Any) -> Response:
    """`body` as the response: the route's `response_model`, serialized as it declares."""
    return Response(body.model_dump_json(**options), status, media_type="application/json")


class _Service:
    """What the routes share: the store, the runs in flight, the exit filter."""

    def __init__(
        self,
        agent: Agent,
        store: AsyncStore | str,
        source_filter: SourceFilter | None,
        return_restricted: bool,
        new_run_id: Callable[[], str],
        replicas: Sequence[str],
    ) -> None:
        self.agent = agent
        self.replicas = list(replicas)
        self.url = store if isinstance(store, str) else None
        self._store = store if isinstance(store, AsyncStore) else None
        self.source_filter = source_filter
        self.return_restricted = return_restricted
        self.new_run_id = new_run_id
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> AsyncStore:
        if self._store is None:
            raise RuntimeError("The service's store opens at startup; run the app's lifespan.")
        return self._store

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        if self.url is not None:
            self._store = AsyncStore.open(self.url, replicas=self.replicas)
            await self._store.check_schema()
        try:
            yield
        finally:
            # Runs whose clients went away finish recording before the store closes.
            for task in list(self.tasks):
                cancel_once(task)
            await asyncio.gather(*self.tasks, return_exceptions=True)
            if self.url is not None and self._store is not None:
                await self._store.close()
                self._store = None

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def answer(self, result: Result) -> AskResponse:
        """The response of a completed run: its sources through the caller's exit.

        RESTRICTED hits are dropped before the application's `source_filter`
        sees any source, so no filter of its own can let them back in.
        """
        sources = result.sources
        if not self.return_restricted:
            sources = drop_restricted_sources(sources)
        if self.source_filter is not None:
            sources = list(self.source_filter(sources))
        return AskResponse.of(result, sources)

    async def failure(self, ledger: AsyncLedger, error: RunError) -> tuple[int, ErrorDetail]:
        """The status and error fields of a failed run; `resume` only if the log holds a
        run to resume."""
        try:
            recorded = await ledger.runs.get(error.run_id)
            resumable = recorded.status in ("failed", "canceled")
        except ChatledgerError:
            resumable = False
        return run_failure(error, resumable)

    async def failure_detail(self, ledger: AsyncLedger, error: RunError) -> dict[str, Any]:
        """The error fields of a failed run, as a stream's `error` event sends them."""
        _, detail = await self.failure(ledger, error)
        return detail.model_dump(mode="json", exclude_none=True)
