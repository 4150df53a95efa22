"""The read-only page under `/ui/`: conversations, their branches and runs (ADR 0041).

Server-rendered Jinja2 templates with autoescape on, one stylesheet from the
installed package, no JavaScript. Every view reads through the tenant's
`AsyncLedger`, so another tenant's ids fail exactly as missing ones do (404).
"""

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import FileResponse, HTMLResponse, Response

from chatledger import __version__
from chatledger.service._boundary import TENANT_SCOPE_KEY, Boundary
from chatledger.service._errors import install_error_handlers
from chatledger.service._keys import ApiKeys
from chatledger.service._models import Id
from chatledger.store import (
    AsyncLedger,
    AsyncStore,
    Conversation,
    Entry,
    InvalidInputError,
    Message,
    NotFoundError,
    Position,
)
from chatledger.store.history import normalize_history

__all__ = ["LOOPBACK", "PAGE", "create_ui_app", "ui_router"]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
"""The host names `chatledger ui` serves without a key."""

PAGE = 100
"""Messages per page of a conversation's timeline, newest page first."""

VERIFY_INLINE = 2_000
"""Conversations up to this many positions are verified as their page opens; longer
ones on demand, from the badge's link."""

SCAN = 2_000
"""The most conversations one filtered listing page looks through."""

CSP = "default-src 'self'; img-src 'self'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

_HERE = Path(__file__).parent / "ui"
_templates = Environment(
    loader=FileSystemLoader(_HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["when"] = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else ""


def _page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(version=__version__, **context)
    return HTMLResponse(html, status, headers={"Content-Security-Policy": CSP})


@dataclass
class Row:
    """One line of the timeline: a message, or an assistant's calls beside their results."""

    message: Message
    position: int | None
    synthesized: bool = False
    calls: list[tuple[Any, Message | None, bool]] = field(default_factory=list)


def _timeline(entries: list[Entry]) -> tuple[list[Row], list[Entry]]:
    """The page's repaired history as rows, and the entries repair dropped.

    Repair puts each call's result in the block of tool messages right after
    its assistant message, so a row pairs its calls with that block alone (ids
    may repeat across turns)."""
    history, repair = normalize_history([e.message for e in entries])
    positions = {id(e.message): e.position.position for e in entries}
    rows: list[Row] = []
    i = 0
    while i < len(history):
        message = history[i]
        row = Row(message, positions.get(id(message)), synthesized=id(message) not in positions)
        i += 1
        rows.append(row)
        if message.tool_calls:
            block: list[Message] = []
            while i < len(history) and history[i].role == "tool":
                block.append(history[i])
                i += 1
            for call in message.tool_calls:
                result = next((m for m in block if call.id and m.tool_call_id == call.id), None)
                if result is not None:
                    block.remove(result)
                # Synthesized: a result repair made (it has no entry), not one whose
                # id a later turn's synthesized result happens to share.
                row.calls.append((call, result, result is not None and id(result) not in positions))
            # A result no call of the row claims is shown on its own, not hidden.
            rows += [Row(m, positions.get(id(m)), id(m) not in positions) for m in block]
    return rows, [entries[i] for i in repair.dropped]


def ui_router(ledger_of: Callable[[Request], AsyncLedger]) -> APIRouter:
    """The `/ui/` routes, reading through `ledger_of(request)`."""
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def ledger(request: Request) -> AsyncLedger:
        return ledger_of(request)

    Ledger_ = Annotated[AsyncLedger, Depends(ledger)]

    @router.get("/ui.css")
    async def stylesheet() -> Response:
        return FileResponse(
            _HERE / "ui.css", media_type="text/css", headers={"Content-Security-Policy": CSP}
        )

    @router.get("/")
    async def conversations(
        ledger: Ledger_,
        key: str = "",
        title: str = "",
        since: str = "",
        before: Annotated[Id | None, Query(min_length=1)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> Response:
        day = _day(since)
        if key:
            try:
                found = [await ledger.conversation_by_key(key)]
            except NotFoundError:
                found = []
            page, cursor = [c for c in found if _matches(c, title, day)], None
        else:
            page, cursor = await _filtered(ledger, limit, before, title, day)
        return _page(
            "conversations.html",
            conversations=page,
            cursor=cursor,
            key=key,
            title=title,
            since=since,
            limit=limit,
        )

    @router.get("/conversations/{conversation_id}")
    async def conversation(
        conversation_id: Id,
        ledger: Ledger_,
        at: Annotated[int | None, Query(ge=1)] = None,
        branch: Annotated[str | None, Query(min_length=1)] = None,
        raw: bool = False,
        after: Annotated[int | None, Query(ge=0)] = None,
    ) -> Response:
        found = await ledger.conversation(conversation_id)
        lineage = await ledger.audit.lineage(conversation_id)
        point: int | Position | None = at
        if branch is not None:
            if at is None:
                tip = next((b.tip for b in lineage.branches if b.id == branch), None)
                if tip is None:
                    raise NotFoundError("branch", branch, ledger.tenant)
                at = tip
            point = Position(branch, at)  # the store checks it is one of the conversation's
        # One more than the page: the entry before it, if any, is where "older" goes,
        # on its own branch (a parent's, or a fork's source's, for an early position).
        entries = await ledger.entries(conversation_id, at=point, last=PAGE + 1)
        older: Position | None = None
        if len(entries) > PAGE:
            # A page never opens on a tool result: it goes to the older page,
            # with its call, so the two are repaired together.
            cut = 1
            while cut < len(entries) - 1 and entries[cut].message.role == "tool":
                cut += 1
            older = entries[cut - 1].position
            entries = entries[cut:]
        rows, dropped = _timeline(entries)
        events = None
        if raw:
            events = await ledger.events(
                conversation_id=conversation_id, after_seq=after, limit=PAGE
            )
        verification = None
        if found.head.position <= VERIFY_INLINE and not raw:
            verification = await ledger.verify(conversation_id)
        return _page(
            "conversation.html",
            conversation=found,
            lineage=lineage,
            rows=rows,
            dropped=dropped,
            older=older,
            branch=branch or found.head.branch_id,
            page_size=PAGE,
            events=events,
            raw=raw,
            verification=verification,
            runs=await ledger.runs.recent(conversation_id=conversation_id, limit=PAGE),
        )

    @router.get("/conversations/{conversation_id}/verify")
    async def verify(conversation_id: Id, ledger: Ledger_) -> Response:
        found = await ledger.conversation(conversation_id)
        return _page(
            "verify.html", conversation=found, verification=await ledger.verify(conversation_id)
        )

    @router.get("/conversations/{conversation_id}/branches")
    async def branches(conversation_id: Id, ledger: Ledger_) -> Response:
        lineage = await ledger.audit.lineage(conversation_id)
        return _page("branches.html", conversation=lineage.conversation, lineage=lineage)

    @router.get("/conversations/{conversation_id}/compare")
    async def compare(
        conversation_id: Id,
        ledger: Ledger_,
        a: Annotated[str, Query(min_length=1)],
        b: Annotated[str, Query(min_length=1)],
    ) -> Response:
        lineage = await ledger.audit.lineage(conversation_id)
        tips = {x.id: x.tip for x in lineage.branches}
        for name in (a, b):
            if name not in tips:
                raise NotFoundError("branch", name, ledger.tenant)
        left = await ledger.entries(conversation_id, at=Position(a, tips[a]))
        right = await ledger.entries(conversation_id, at=Position(b, tips[b]))
        shared = 0
        while (
            shared < min(len(left), len(right)) and left[shared].event_id == right[shared].event_id
        ):
            shared += 1
        fork = left[shared - 1].position.position if shared else 0
        return _page(
            "compare.html",
            conversation=lineage.conversation,
            a=a,
            b=b,
            shared=shared,
            fork_position=fork,
            # Each branch repaired whole, as a run sees it, then shown after the fork
            # point: a result past it keeps the call it answers.
            left=_after(left, fork),
            right=_after(right, fork),
        )

    @router.get("/runs/{run_id}")
    async def run(run_id: Id, ledger: Ledger_) -> Response:
        found = await ledger.runs.get(run_id)
        steps = (await ledger.audit.run_timeline(run_id, limit=1000)).items
        tools = (await ledger.audit.tool_executions(run_id=run_id, limit=1000)).items
        lineage = await ledger.audit.lineage(found.conversation_id)
        resumed_by = [r for r in lineage.resumes if r.resumes == run_id]
        return _page(
            "run.html",
            run=found,
            steps=steps,
            tools=tools,
            resumed_by=resumed_by,
            duration=_duration,
        )

    return router


def _after(entries: list[Entry], fork: int) -> list[Row]:
    rows = _timeline(entries)[0]
    first = next(
        (i for i, r in enumerate(rows) if r.position is not None and r.position > fork), len(rows)
    )
    return rows[first:]


def _duration(start: datetime, end: datetime | None) -> str:
    return f"{(end - start).total_seconds():.3f} s" if end else "—"


def _day(since: str) -> date | None:
    if not since:
        return None
    try:
        return date.fromisoformat(since)
    except ValueError as error:
        raise InvalidInputError(
            f"since={since!r:.40} is not a date: give one as YYYY-MM-DD, or leave it empty."
        ) from error


def _matches(c: Conversation, title: str, day: date | None) -> bool:
    shown = str(c.metadata.get("title", ""))
    return (not title or title.casefold() in shown.casefold()) and (
        day is None or c.created_at.date() >= day
    )


async def _filtered(
    ledger: AsyncLedger, limit: int, before: str | None, title: str, day: date | None
) -> tuple[list[Conversation], str | None]:
    """Up to `limit` matching conversations, newest first, looking through at most
    `SCAN`; and the cursor to go on from, when there may be more."""
    page: list[Conversation] = []
    cursor = before
    for _ in range(SCAN // _BATCH):
        batch = await ledger.conversations(limit=_BATCH, before=cursor)
        for c in batch:
            if len(page) == limit:
                return page, page[-1].id
            cursor = c.id
            if _matches(c, title, day):
                page.append(c)
        if len(batch) < _BATCH:
            return page, None
    return page, cursor


_BATCH = 100


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class _OneTenant:
    """Serve every request as `tenant` (`chatledger ui` on loopback, without keys)."""

    def __init__(self, app: ASGIApp, *, tenant: str) -> None:
        self.app = app
        self.tenant = tenant

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        scope[TENANT_SCOPE_KEY] = self.tenant
        await self.app(scope, receive, send)


def create_ui_app(store: str, *, tenant: str | None = None, keys: ApiKeys | None = None) -> FastAPI:
    """The page alone, over the database at `store`: for `tenant` without keys, or for
    the tenant of each request's key (exactly one of the two)."""
    if (tenant is None) == (keys is None):
        raise InvalidInputError("create_ui_app takes tenant= or keys=, exactly one of them.")
    opened: list[AsyncStore] = []

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        opened.append(AsyncStore.open(store))
        try:
            yield
        finally:
            await opened.pop().close()

    app = FastAPI(
        title="chatledger ui",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    if keys is not None:
        app.add_middleware(Boundary, keys=keys, max_body_bytes=0)
    elif tenant is not None:
        app.add_middleware(_OneTenant, tenant=tenant)
        # Without a key, a page of another site whose name it points at 127.0.0.1
        # (DNS rebinding) could read the tenant: only loopback's names are served.
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK))
    app.include_router(ui_router(lambda request: opened[0].tenant(request.scope[TENANT_SCOPE_KEY])))
    return app
