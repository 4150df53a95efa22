"""Audit queries: what happened, answered from the log.

```python
audit = store.tenant("acme").audit
page = audit.run_timeline(run_id)                    # every event of a run, with stage and timing
request = audit.model_request(run_id, 2, instructions="Be brief.")   # what the model saw
page = audit.tool_executions(tool_name="refund", since=day, until=day + timedelta(days=1))
page = audit.supplied_and_repaired(conversation_id=conv_id)          # client and repair messages
tree = audit.lineage(conv_id)                        # branches, forks in and out, resumes
page = audit.events(run_id=run_id, kinds=["tool.finished"], failed=True)
```

Every query is scoped to the handle's tenant: a conversation or run of
another tenant is reported exactly as a missing one (`NotFoundError`). Lists
come in keyset pages in commit order (`Page`, `store._sql.pages`): pass a page's
`next_after` as `after` to read on, and no event is ever returned twice or
skipped, even while other processes append.

Each query here is a function over one open transaction; `store._audit`
wraps them in the `Op`s that `Store.execute` / `AsyncStore.execute` run, and
holds `Audit` and `AsyncAudit`, the thin faces `ledger.audit` returns.
docs/audit.md shows the plain SQL behind each query and the index it uses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, assert_never, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from chatledger.store._errors import InvalidInputError, NotFoundError
from chatledger.store._sql import log as _log
from chatledger.store._sql import projector
from chatledger.store._sql import runs as _runs
from chatledger.store._sql.dialect import db_now, json_text, json_true, time_value
from chatledger.store._sql.pages import Page, read_page
from chatledger.store._values import (
    Event,
    EventKind,
    Lineage,
    LineageBranch,
    LineageResume,
    Position,
    RecordedRequest,
    Stage,
    TimelineEntry,
    ToolExecution,
    ToolStatus,
)
from chatledger.store.history import HistoryProcessor, instructions_digest, model_view
from chatledger.store.messages import Message, load_messages
from chatledger.store.schema import branches, conversations, events, runs

__all__ = [
    "Filter",
    "RequestParts",
    "lineage",
    "list_events",
    "model_request",
    "recorded_request",
    "run_timeline",
    "stage_of",
    "tool_executions",
]

_KINDS: frozenset[str] = frozenset(get_args(EventKind))
# Literal SQL, not bound parameters: the planners can then match the partial
# index `... WHERE kind = 'tool.started'` (docs/audit.md).
_TOOL_STARTED: sa.ColumnClause[str] = sa.literal_column("'tool.started'", sa.Text)
_TOOL_FINISHED: sa.ColumnClause[str] = sa.literal_column("'tool.finished'", sa.Text)


@dataclass(frozen=True)
class Filter:
    """Validated filters (built by `store._audit` before any transaction begins)."""

    conversation_id: str | None = None
    run_id: str | None = None
    kinds: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    tool_name: str | None = None
    failed: bool | None = None
    since: datetime | None = None
    until: datetime | None = None


# -- queries ----------------------------------------------------------------------------


def stage_of(kind: EventKind) -> Stage:
    """The stage of a run an event kind belongs to; `other` for kinds unknown to this version."""
    if kind not in _KINDS:
        return "other"  # recorded by a newer version, or by a custom loop through record()
    match kind:
        case "conversation.created" | "head.moved" | "state.changed" | "conversation.erased":
            return "conversation"
        case "branch.created" | "run.started" | "run.completed" | "run.failed" | "run.canceled":
            return "run"
        case "model.requested" | "model.responded":
            return "model"
        case "tool.started" | "tool.finished":
            return "tool"
        case "message.recorded":
            return "message"
        case _:
            assert_never(kind)


def list_events(
    conn: Connection, tenant: str, f: Filter, *, after: str | None, limit: int
) -> Page[Event]:
    """The tenant's events matching `f`, in commit order."""
    query = _matching(conn, tenant, f)
    return read_page(conn, query, events, after=after, limit=limit, build=_log.event_from_row)


def run_timeline(
    conn: Connection,
    tenant: str,
    run_id: str,
    *,
    kinds: Sequence[str],
    after: str | None,
    limit: int,
) -> Page[TimelineEntry]:
    """Every event of the run, in order, with its stage and time since `run.started`."""
    run = _runs.get_run(conn, tenant, run_id)
    started = conn.execute(
        sa.select(events.c.recorded_at)
        .where(_runs.events_of_run(run), events.c.kind == "run.started")
        .order_by(events.c.seq)
        .limit(1)
    ).scalar()
    began = run.started_at if started is None else _log.utc(started)
    query = sa.select(events).where(_runs.events_of_run(run))
    if kinds:
        query = query.where(events.c.kind.in_(kinds))

    def entry(row: Row[Any]) -> TimelineEntry:
        event = _log.event_from_row(row)
        return TimelineEntry(
            event, stage_of(event.kind), max(event.recorded_at - began, timedelta(0))
        )

    return read_page(conn, query, events, after=after, limit=limit, build=entry)


@dataclass(frozen=True)
class RequestParts:
    """What the log holds of a model request: `recorded_request` rebuilds it.

    Two steps, so that the messages are opened (when sealed) between them:
    the history processor and the engine's view must see what the run saw.
    """

    run_id: str
    conversation_id: str
    request: int
    digest: str
    model: str | None
    recorded_at: datetime
    replayed: list[Message]
    turns: list[Message]


def model_request(
    conn: Connection,
    tenant: str,
    run_id: str,
    number: int,
    *,
    instructions: str,
) -> RequestParts:
    """The recorded parts of model request `number` of the run (see `RequestParts`)."""
    run = _runs.get_run(conn, tenant, run_id)
    rows = conn.execute(
        sa.select(events)
        .where(_runs.events_of_run(run), events.c.kind.in_(["run.started", "model.requested"]))
        .order_by(events.c.seq)
    ).all()
    logged = [_log.event_from_row(r) for r in rows]
    requested = [e for e in logged if e.kind == "model.requested"]
    wanted = next((e for e in requested if e.payload.get("request") == number), None)
    started = next((e for e in logged if e.kind == "run.started"), None)
    if wanted is None or started is None:
        raise NotFoundError("model request", f"{run.id} #{number}", tenant)
    _check_instructions(run.id, started.payload.get("instructionsDigest"), instructions)
    first = requested[0].position
    # The engine's view: the lineage up to just before its first request (the
    # history at the base and the prompt), then the turns the run recorded
    # between its first request and this one.
    segments = projector.lineage(conn, tenant, Position(wanted.branch_id, wanted.position))
    return RequestParts(
        run_id=run.id,
        conversation_id=run.conversation_id,
        request=number,
        digest=str(wanted.payload.get("digest")),
        model=started.payload.get("model"),
        recorded_at=wanted.recorded_at,
        replayed=load_messages(
            projector.message_payloads(conn, tenant, _clip(segments, 1, first - 1))
        ),
        turns=load_messages(
            projector.message_payloads(
                conn, tenant, _clip(segments, first + 1, wanted.position - 1)
            )
        ),
    )


def recorded_request(
    parts: RequestParts,
    *,
    instructions: str,
    context: str,
    history_processor: HistoryProcessor | None,
) -> RecordedRequest:
    """Model request `parts` as the engine built it (see `RecordedRequest`)."""
    # The engine's own rule, so the rebuild fails where the run failed.
    view = model_view(
        parts.replayed, instructions=instructions, context=context, processor=history_processor
    )
    return RecordedRequest(
        run_id=parts.run_id,
        conversation_id=parts.conversation_id,
        request=parts.request,
        digest=parts.digest,
        model=parts.model,
        recorded_at=parts.recorded_at,
        messages=view.messages(parts.turns),
        repair=view.repair,
    )


def tool_executions(
    conn: Connection,
    tenant: str,
    f: Filter,
    statuses: Sequence[ToolStatus],
    *,
    after: str | None,
    limit: int,
) -> Page[ToolExecution]:
    """The tool calls matching `f` (by their `tool.started`), with how each ended."""
    s, fin, later = events.alias("s"), events.alias("fin"), events.alias("later")
    # A call's result is the first `tool.finished` with its call id after it,
    # on the run's own branch (a run appends only there).
    finish = (
        sa.select(sa.func.min(later.c.seq))
        .where(
            later.c.conversation_id == s.c.conversation_id,
            later.c.tenant == s.c.tenant,
            later.c.branch_id == s.c.branch_id,
            later.c.position > s.c.position,
            later.c.kind == _TOOL_FINISHED,
            json_text(conn, later.c.payload, "callId") == json_text(conn, s.c.payload, "callId"),
        )
        .scalar_subquery()
    )
    failed = json_true(conn, fin.c.payload, "failed")
    live = sa.and_(runs.c.status == "running", runs.c.lease_expires_at > db_now(conn))
    status_of: dict[ToolStatus, sa.ColumnElement[bool]] = {
        "finished": sa.and_(fin.c.seq.is_not(None), sa.not_(failed)),
        "failed": sa.and_(fin.c.seq.is_not(None), failed),
        "running": sa.and_(fin.c.seq.is_(None), live),
        "uncertain": sa.and_(fin.c.seq.is_(None), sa.not_(sa.func.coalesce(live, sa.false()))),
    }
    columns: list[sa.ColumnElement[Any]] = [
        s.c.seq,
        s.c.conversation_id,
        s.c.branch_id,
        s.c.run_id,
        s.c.recorded_at,
        s.c.payload,
        fin.c.recorded_at.label("finished_at"),
        sa.case(*((cond, name) for name, cond in status_of.items())).label("status"),
    ]
    query = (
        sa.select(*columns)
        .select_from(
            s.join(
                conversations,
                sa.and_(
                    conversations.c.id == s.c.conversation_id,
                    conversations.c.tenant == s.c.tenant,
                ),
            )
            .outerjoin(
                fin,
                sa.and_(
                    fin.c.conversation_id == s.c.conversation_id,
                    fin.c.tenant == s.c.tenant,
                    fin.c.seq == finish,
                ),
            )
            .outerjoin(
                runs,
                sa.and_(
                    runs.c.conversation_id == s.c.conversation_id,
                    runs.c.tenant == s.c.tenant,
                    runs.c.id == s.c.run_id,
                ),
            )
        )
        .where(conversations.c.tenant == tenant, s.c.kind == _TOOL_STARTED)
    )
    query = _filtered(conn, tenant, query, s, f)
    if f.tool_name is not None:
        query = query.where(json_text(conn, s.c.payload, "name") == f.tool_name)
    if statuses:
        query = query.where(sa.or_(*(status_of[name] for name in statuses)))
    return read_page(conn, query, s, after=after, limit=limit, build=_execution)


def lineage(conn: Connection, tenant: str, conversation_id: str) -> Lineage:
    """The conversation's branches, forks in and out, and resumes."""
    conv = _log.get_conversation(conn, tenant, conversation_id)
    tips = dict(
        conn.execute(
            sa.select(events.c.branch_id, sa.func.max(events.c.position))
            .where(events.c.conversation_id == conv.id)
            .group_by(events.c.branch_id)
        ).all()
    )
    rows = conn.execute(
        sa.select(branches).where(branches.c.conversation_id == conv.id).order_by(branches.c.id)
    ).all()
    found = []
    for row in rows:
        m = row._mapping
        parent = None
        if m["parent_branch_id"] is not None:
            parent = Position(m["parent_branch_id"], m["parent_position"])
        found.append(
            LineageBranch(
                id=m["id"],
                reason=m["reason"],
                parent=parent,
                run_id=m["run_id"],
                resumes_run_id=m["resumes_run_id"],
                created_at=_log.utc(m["created_at"]),
                first_position=(m["parent_position"] or 0) + 1,
                tip=int(tips.get(m["id"], 0)),
                holds_head=m["id"] == conv.head.branch_id,
            )
        )
    fork_ids = conn.execute(
        sa.select(conversations.c.id)
        .where(
            conversations.c.forked_from_conversation_id == conv.id,
            conversations.c.tenant == tenant,
        )
        .order_by(conversations.c.id)
    ).scalars()
    forks = [_log.get_conversation(conn, tenant, i) for i in fork_ids]
    resumed = conn.execute(
        sa.select(runs.c.id, runs.c.resumes, runs.c.branch_id, runs.c.status)
        .where(
            runs.c.conversation_id == conv.id,
            runs.c.tenant == tenant,
            runs.c.resumes.is_not(None),
        )
        .order_by(runs.c.id)
    ).all()
    resumes = [LineageResume(*r) for r in resumed]
    return Lineage(conv, found, forks, resumes)


# -- helpers ----------------------------------------------------------------------------


def _matching(conn: Connection, tenant: str, f: Filter) -> sa.Select[Any]:
    query = (
        sa.select(events)
        .join(
            conversations,
            sa.and_(
                conversations.c.id == events.c.conversation_id,
                conversations.c.tenant == events.c.tenant,
            ),
        )
        .where(conversations.c.tenant == tenant)
    )
    query = _filtered(conn, tenant, query, events, f)
    if f.kinds:
        query = query.where(events.c.kind.in_(f.kinds))
    if f.origins:
        query = query.where(events.c.origin.in_(f.origins))
    if f.tool_name is not None:
        query = query.where(
            sa.or_(
                sa.and_(
                    events.c.kind == _TOOL_STARTED,
                    json_text(conn, events.c.payload, "name") == f.tool_name,
                ),
                sa.and_(
                    events.c.kind == "message.recorded",
                    json_text(conn, events.c.payload, "toolName") == f.tool_name,
                ),
            )
        )
    if f.failed is not None:
        failure = sa.or_(
            sa.and_(
                events.c.kind.in_(["tool.finished", "message.recorded"]),
                json_true(conn, events.c.payload, "failed"),
            ),
            events.c.kind == "run.failed",
        )
        query = query.where(failure if f.failed else sa.not_(failure))
    return query


def _filtered(
    conn: Connection, tenant: str, query: sa.Select[Any], e: sa.FromClause, f: Filter
) -> sa.Select[Any]:
    """Apply the filters every query shares; refuse another tenant's ids."""
    if f.conversation_id is not None:
        _log.get_conversation(conn, tenant, f.conversation_id)
        query = query.where(e.c.conversation_id == f.conversation_id)
    if f.run_id is not None:
        _runs.get_run(conn, tenant, f.run_id)
        query = query.where(e.c.run_id == f.run_id)
    if f.since is not None:
        query = query.where(e.c.recorded_at >= time_value(conn, f.since))
    if f.until is not None:
        query = query.where(e.c.recorded_at < time_value(conn, f.until))
    return query


def _execution(row: Row[Any]) -> ToolExecution:
    m = row._mapping
    payload = json.loads(m["payload"])
    call_id = payload.get("callId")
    finished = m["finished_at"]
    return ToolExecution(
        call_id=None if call_id is None else str(call_id),
        name=str(payload.get("name", "")),
        run_id=m["run_id"],
        conversation_id=m["conversation_id"],
        branch_id=m["branch_id"],
        started_seq=m["seq"],
        started_at=_log.utc(m["recorded_at"]),
        finished_at=None if finished is None else _log.utc(finished),
        status=m["status"],
    )


def _clip(segments: Sequence[projector.Segment], first: int, last: int) -> list[projector.Segment]:
    """The parts of a lineage's segments between two positions."""
    clipped = []
    for conversation_id, branch_id, lo, hi in segments:
        lo, hi = max(lo, first), min(hi, last)
        if lo <= hi:
            clipped.append((conversation_id, branch_id, lo, hi))
    return clipped


def _check_instructions(run_id: str, recorded: Any, instructions: str) -> None:
    if not isinstance(instructions, str):
        raise InvalidInputError(
            f"instructions must be the text of the run's instructions, not "
            f"{type(instructions).__name__}."
        )
    digest = instructions_digest(instructions)
    if recorded is None and instructions:
        raise InvalidInputError(
            f"Run '{run_id}' recorded no instructions digest (it was not started by the "
            f"engine), so instructions cannot be checked against it. Pass instructions=''."
        )
    if recorded is not None and digest != recorded:
        raise InvalidInputError(
            f"The instructions given do not match those of run '{run_id}': their sha256 is "
            f"{digest}, but the run recorded {recorded}. Pass the instructions the run "
            f"resolved: the agent's static text, then its dynamic part after a blank line."
        )
