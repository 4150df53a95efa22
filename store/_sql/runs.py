"""Runs: their lifecycle, leases and the fencing check.

A run appends its events as it goes and moves the head only when it
completes, by compare-and-set against the head it started from. Every append
names the run's cursor (owner, attempt, position); one conditional UPDATE of
the run row checks, in the same transaction as the insert and against the
database's clock, that the run is still running, leased to that owner and
attempt, and at that position. A zombie worker that lost its lease matches no
row, gets `LeaseError`, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from chatledger.store._checks import (
    MAX_INT32,
    check_choice,
    check_id,
    check_int,
    check_limit,
    check_long_text,
    check_new_id,
    check_seconds,
    check_text,
)
from chatledger.store._crypto import ERASED_CONTENT, PLAIN, Seal
from chatledger.store._errors import (
    ConflictError,
    EncryptionError,
    InvalidInputError,
    LeaseError,
    NotFoundError,
    ResumeConflictError,
    RunStateError,
)
from chatledger.store._sql import append as _append
from chatledger.store._sql import log as _log
from chatledger.store._sql import projector
from chatledger.store._sql.dialect import db_now, db_now_plus, hold_name, is_sqlite
from chatledger.store._sql.translate import unique_violation
from chatledger.store._values import (
    BranchReason,
    Conversation,
    Event,
    EventKind,
    NewEvent,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from chatledger.store.ids import new_id
from chatledger.store.messages import Usage
from chatledger.store.schema import branches, conversations, events, runs

__all__ = [
    "claim_stale_runs",
    "end_run",
    "events_of_run",
    "get_run",
    "list_runs",
    "record",
    "renew_lease",
    "start_run",
]

_RESUMABLE = ("failed", "canceled")
_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))
_ENDS: dict[str, EventKind] = {
    "completed": "run.completed",
    "failed": "run.failed",
    "canceled": "run.canceled",
}
MAX_TEXT = 1_000_000
"""The longest error or attention text a run end records (characters)."""


def _run(row: Row[Any]) -> Run:
    m = row._mapping
    expires = m["lease_expires_at"]
    ended = m["ended_at"]
    return Run(
        id=m["id"],
        tenant=m["tenant"],
        conversation_id=m["conversation_id"],
        branch_id=m["branch_id"],
        position=m["position"],
        base=Position(m["base_branch_id"], m["base_position"]),
        head_at_start=Position(m["head_branch_id"], m["head_position"]),
        status=m["status"],
        stage=m["stage"],
        error=m["error"],
        request_count=m["request_count"],
        tool_count=m["tool_count"],
        usage=Usage.model_validate_json(m["usage"]),
        model=m["model"],
        resumes=m["resumes"],
        lease_owner=m["lease_owner"],
        lease_expires_at=None if expires is None else _log.utc(expires),
        attempt=m["attempt"],
        attention=m["attention"],
        started_at=_log.utc(m["started_at"]),
        ended_at=None if ended is None else _log.utc(ended),
    )


def get_run(conn: Connection, tenant: str, run_id: str) -> Run:
    """The tenant's run; `NotFoundError` for a missing or foreign one."""
    check_id(run_id, "run")
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id, runs.c.tenant == tenant)).first()
    if row is None:
        raise NotFoundError("run", run_id, tenant)
    return _run(row)


def list_runs(
    conn: Connection,
    tenant: str,
    *,
    conversation_id: str | None,
    status: RunStatus | None,
    attention: bool | None,
    limit: int,
) -> list[Run]:
    """The tenant's runs, newest first."""
    check_limit(limit)
    query = sa.select(runs).where(runs.c.tenant == tenant)
    if conversation_id is not None:
        # Another tenant's conversation reads as a missing one, as it does everywhere.
        _log.get_conversation(conn, tenant, conversation_id)
        query = query.where(runs.c.conversation_id == conversation_id)
    if status is not None:
        query = query.where(runs.c.status == check_choice(status, "status", _STATUSES))
    if attention is not None:
        if not isinstance(attention, bool):
            raise InvalidInputError(f"attention must be True, False or None, not {attention!r}.")
        query = query.where(
            runs.c.attention.is_not(None) if attention else runs.c.attention.is_(None)
        )
    rows = conn.execute(query.order_by(runs.c.id.desc()).limit(limit)).all()
    return [_run(r) for r in rows]


def start_run(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    *,
    run_id: str | None,
    base: int | Position | None,
    resumes: str | None,
    model: str | None,
    instructions_digest: str | None,
    owner: str,
    lease_seconds: float,
    initial: Sequence[tuple[NewEvent, str]] = (),
    create: bool = False,
    exclusive: bool = False,
    seal: Seal = PLAIN,
) -> RunCursor:
    """Open a run at `base` (default: the head) and record `run.started`.

    `initial` events (the run's prompt) are recorded right after it, in the
    same transaction: a run never exists without its prompt. With `create`,
    the run opens a new conversation: `conversation_id` is created first, in
    the same transaction (an id that is taken is the `ConflictError` of
    `create_conversation`). With `exclusive`, the run is refused
    (`ConflictError`, nothing written) while another run of the conversation
    is live: running, its lease not expired on the database's clock.

    A base at its branch's tip is appended to directly; any other base opens
    a new branch. A resume always opens a `resume` branch, and the unique key
    on the resumed run id lets only one exist.
    """
    given = check_new_id(run_id, "run")
    run_id = given or new_id()
    check_text(owner, "lease owner")
    check_seconds(lease_seconds, "lease_seconds")
    if model is not None:
        check_text(model, "model name")
    if instructions_digest is not None:
        check_text(instructions_digest, "instructions digest")
    if resumes is not None:
        check_id(resumes, "run")
    if create:
        _log.create_conversation(conn, tenant, None, conversation_id=conversation_id, seal=seal)
    conv = _log.get_conversation(conn, tenant, conversation_id, lock=True)
    if exclusive:
        _refuse_beside_a_live_run(conn, conv)
    if given is not None:
        # The key is (conversation_id, id): a caller's id is checked under a
        # lock on it, so two conversations cannot both take it. (A minted
        # UUIDv7 is unique by its random bits: no read of every tenant's runs,
        # which on Citus is a query of every shard.)
        hold_name(conn, f"chatledger_run:{run_id}")
        if _run_taken(conn, run_id):
            raise ConflictError(
                f"Run id '{run_id}' is taken. Pass another id, or none to have chatledger "
                f"mint one.",
                conversation_id=conv.id,
            )
    head_at_start = conv.head
    resumed = None
    if resumes is not None:
        resumed = get_run(conn, tenant, resumes)
        if resumed.conversation_id != conv.id or resumed.status not in _RESUMABLE:
            raise RunStateError(run_id=resumes, status=resumed.status, wanted="be resumed")
        head_at_start = resumed.head_at_start
        if base is None:
            base = Position(resumed.branch_id, resumed.position)
    point = _log.resolve_position(conn, conv, base)
    written: list[Event] = []
    branch_id, position = point.branch_id, point.position
    if resumed is not None or not projector.head_is_open(conn, conv.tenant, conv.id, point):
        reason: BranchReason = "resume" if resumed is not None else "run"
        try:
            branch_id, created = _log.create_branch(
                conn, conv.tenant, conv.id, point, reason, run_id=run_id, resumes_run_id=resumes
            )
        except sa.exc.IntegrityError as error:
            # The transaction rolls back as this propagates: nothing is written.
            if resumes is not None and unique_violation(
                error, branches, ["conversation_id", "resumes_run_id"]
            ):
                raise ResumeConflictError(conversation_id=conv.id, run_id=resumes) from error
            raise
        written.append(created)
        position += 1
    payload = {
        "base": {"branchId": point.branch_id, "position": point.position},
        "headAtStart": {"branchId": head_at_start.branch_id, "position": head_at_start.position},
        "instructionsDigest": instructions_digest,
        "model": model,
        "resumes": resumes,
    }
    started = _log.insert_events(
        conn,
        conv.tenant,
        conv.id,
        branch_id,
        position + 1,
        [(NewEvent("run.started", payload), _log.canonical_json(payload)), *initial],
        run_id=run_id,
    )
    conn.execute(
        runs.insert().values(
            id=run_id,
            conversation_id=conv.id,
            tenant=tenant,
            branch_id=branch_id,
            position=started[-1].position,
            base_branch_id=point.branch_id,
            base_position=point.position,
            head_branch_id=head_at_start.branch_id,
            head_position=head_at_start.position,
            status="running",
            request_count=0,
            tool_count=0,
            usage=Usage().model_dump_json(),
            model=model,
            resumes=resumes,
            lease_owner=owner,
            lease_expires_at=db_now_plus(conn, lease_seconds),
            attempt=1,
            started_at=db_now(conn),
        )
    )
    if branch_id == conv.head.branch_id:
        # The run now writes the head's branch: appends must branch off it.
        conn.execute(
            conversations.update()
            .where(conversations.c.id == conv.id, conversations.c.tenant == conv.tenant)
            .values(head_open=False)
        )
    return RunCursor(run_id, conv.id, branch_id, started[-1].position, owner, 1)


def _refuse_beside_a_live_run(conn: Connection, conv: Conversation) -> None:
    """`ConflictError` when a run of `conv` is live; under the conversation's row
    lock, so that of two racing exclusive starts one is refused."""
    live = conn.execute(
        sa.select(runs.c.id, runs.c.lease_expires_at)
        .where(
            runs.c.tenant == conv.tenant,
            runs.c.conversation_id == conv.id,
            runs.c.status == "running",
            runs.c.lease_expires_at > db_now(conn),
        )
        .limit(1)
    ).first()
    if live is not None:
        raise ConflictError(
            f"Conversation '{conv.id}' is answering run '{live.id}', and a conversation "
            f"takes one run at a time; nothing was written. Retry once it has ended (its "
            f"lease runs out at {_log.utc(live.lease_expires_at):%Y-%m-%d %H:%M:%S} UTC if its "
            f"process died).",
            conversation_id=conv.id,
        )


def _run_taken(conn: Connection, run_id: str) -> bool:
    """Whether any tenant has a run with this id (ids are unique across tenants)."""
    return conn.execute(sa.select(runs.c.id).where(runs.c.id == run_id)).first() is not None


def own_run(conn: Connection, tenant: str, cursor: RunCursor) -> Run:
    """The run `cursor` names, if the cursor is the run's own; else `NotFoundError`.

    A cursor is a value the caller holds and hands back. Where a run writes
    comes from its row, never from the cursor: a cursor whose conversation or
    branch is not the run's (forged, or of another run) names no run of this
    tenant, and is reported exactly like a missing run.
    """
    check_cursor(cursor)
    run = get_run(conn, tenant, cursor.run_id)
    if (run.conversation_id, run.branch_id) != (cursor.conversation_id, cursor.branch_id):
        raise NotFoundError("run", cursor.run_id, tenant)
    return run


def check_cursor(cursor: RunCursor) -> None:
    """The cursor's fields are well-formed (no database read: see `own_run`)."""
    if not isinstance(cursor, RunCursor):
        raise InvalidInputError(
            f"A run cursor is the RunCursor that start_run, record or claim_stale_runs "
            f"returned, not {type(cursor).__name__}."
        )
    check_id(cursor.run_id, "run")
    check_id(cursor.conversation_id, "conversation")
    check_id(cursor.branch_id, "branch")
    check_int(cursor.position, "A run cursor's position", minimum=0, maximum=MAX_INT32)
    check_int(cursor.attempt, "A run cursor's attempt", minimum=1, maximum=MAX_INT32)
    check_text(cursor.owner, "lease owner")


def _leased(conn: Connection, tenant: str, cursor: RunCursor) -> list[sa.ColumnElement[bool]]:
    """The run row `cursor` names, still running and leased to its owner and attempt:
    matched on the cursor's conversation and branch too, so a cursor that names
    another conversation than its run's matches nothing."""
    return [
        runs.c.id == cursor.run_id,
        runs.c.tenant == tenant,
        runs.c.conversation_id == cursor.conversation_id,
        runs.c.branch_id == cursor.branch_id,
        runs.c.lease_owner == cursor.owner,
        runs.c.attempt == cursor.attempt,
        runs.c.status == "running",
        runs.c.lease_expires_at > db_now(conn),
    ]


def _fence(
    conn: Connection, tenant: str, cursor: RunCursor, advance: int, values: dict[str, Any]
) -> None:
    """Check the lease (`_leased`) and advance the run's position, or raise and
    write nothing."""
    result = conn.execute(
        runs.update()
        .where(*_leased(conn, tenant, cursor), runs.c.position == cursor.position)
        .values(position=cursor.position + advance, **values)
    )
    if result.rowcount == 1:
        return
    run = own_run(conn, tenant, cursor)
    if run.attempt != cursor.attempt:
        # A zombie: another claim took the run over (and may have ended it).
        holder = f"worker '{run.lease_owner}'" if run.lease_owner else "no worker (it has ended)"
        reason = f"it is at attempt {run.attempt}, {run.status}, held by {holder}"
    elif run.status != "running":
        raise RunStateError(run_id=run.id, status=run.status, wanted="record events or end")
    elif run.lease_owner != cursor.owner:
        reason = f"worker '{run.lease_owner}' holds it"
    elif run.position != cursor.position:
        raise ConflictError(
            f"Run '{run.id}' is at position {run.position}, but the append expected "
            f"{cursor.position}. Another append of this run got there first; reload the run.",
            conversation_id=run.conversation_id,
            branch_id=run.branch_id,
            expected=cursor.position,
            actual=run.position,
        )
    else:
        reason = "its lease expired"
    raise LeaseError(run_id=run.id, owner=cursor.owner, attempt=cursor.attempt, reason=reason)


def record(
    conn: Connection,
    tenant: str,
    cursor: RunCursor,
    encoded: Sequence[tuple[NewEvent, str]],
    *,
    idempotency_key: str | None = None,
    counts: dict[str, Any] | None = None,
    seal: Seal = PLAIN,
) -> tuple[list[Event], RunCursor]:
    """Append a run's events after the fencing check; return them and the new cursor.

    The events go where the run row says the run writes (the fence matches
    the cursor against it), never merely where the cursor says.
    """
    check_cursor(cursor)
    if idempotency_key is not None:
        check_text(idempotency_key, "idempotency key")
        run = own_run(conn, tenant, cursor)
        replayed = _replayed_record(conn, run, cursor, idempotency_key, encoded, seal)
        if replayed is not None:
            return replayed, _advanced(cursor, replayed[-1].position)
    # The fence matched the cursor's conversation and branch against the run
    # row, so from here on they are the row's: no read needed on this hot path.
    _fence(conn, tenant, cursor, len(encoded), counts or {})
    written = _log.insert_events(
        conn,
        tenant,
        cursor.conversation_id,
        cursor.branch_id,
        cursor.position + 1,
        encoded,
        run_id=cursor.run_id,
        idempotency_key=idempotency_key,
    )
    return written, _advanced(cursor, cursor.position + len(encoded))


def _replayed_record(
    conn: Connection,
    run: Run,
    cursor: RunCursor,
    key: str,
    encoded: Sequence[tuple[NewEvent, str]],
    seal: Seal = PLAIN,
) -> list[Event] | None:
    """The original `record` of an idempotency key, if the key was used.

    A retry carries the cursor the original carried, so the original starts
    right after the cursor and is the run's latest record: the run row stands
    just past it. Anything else (the key used elsewhere, other or more or
    fewer events, later records since) is the caller's mistake, an
    `InvalidInputError`, never a partial replay.
    """
    first = _append.keyed_event(conn, run.tenant, run.conversation_id, key)
    if first is None:
        return None
    end = cursor.position + len(encoded)
    if (first.branch_id, first.position, first.run_id) != (
        run.branch_id,
        cursor.position + 1,
        run.id,
    ) or run.position != end:
        raise _append.key_conflict(run.conversation_id, key)
    rows = conn.execute(
        sa.select(events)
        .where(
            events.c.tenant == run.tenant,
            events.c.conversation_id == run.conversation_id,
            events.c.branch_id == run.branch_id,
            events.c.position > cursor.position,
            events.c.position <= end,
        )
        .order_by(events.c.position)
    ).all()
    original = [_log.event_from_row(r) for r in rows]
    if not _append.same_content(original, encoded, run.id, seal):
        raise _append.key_conflict(run.conversation_id, key)
    return original


def _advanced(cursor: RunCursor, position: int) -> RunCursor:
    return replace(cursor, position=position)


def end_run(
    conn: Connection,
    tenant: str,
    cursor: RunCursor,
    status: RunStatus,
    *,
    stage: str | None = None,
    error: str | None = None,
    usage: Usage | None = None,
    request_count: int | None = None,
    tool_count: int | None = None,
    attention: str | None = None,
    seal: Seal = PLAIN,
) -> tuple[Conversation | None, ConflictError | None]:
    """End a run: completed (moving the head by compare-and-set), failed or canceled.

    A completed run whose head moved meanwhile is recorded as failed at stage
    `conflict`; its events stay where they are and the conflict is returned,
    for the caller to raise after the commit. In a sealed conversation the
    error is sealed under `seal` (`_stored_end`).
    """
    if status not in _ENDS:
        raise InvalidInputError(f"A run ends completed, failed or canceled, not {status!r}.")
    if stage is not None:
        check_text(stage, "stage", max_chars=32)
    for what, text in (("error", error), ("attention", attention)):
        if text is not None:
            check_long_text(text, what, max_chars=MAX_TEXT)
    if request_count is not None:
        check_int(request_count, "request_count", minimum=0, maximum=MAX_INT32)
    if tool_count is not None:
        check_int(tool_count, "tool_count", minimum=0, maximum=MAX_INT32)
    if usage is not None and not isinstance(usage, Usage):
        raise InvalidInputError(f"usage must be a Usage, not {type(usage).__name__}.")
    run = own_run(conn, tenant, cursor)
    conv = _log.get_conversation(conn, tenant, run.conversation_id, lock=True)
    conflict = None
    if status == "completed" and conv.head != run.head_at_start:
        conflict = ConflictError(
            f"Run '{run.id}' completed, but the head of conversation '{conv.id}' moved from "
            f"{run.head_at_start.branch_id}:{run.head_at_start.position} to "
            f"{conv.head.branch_id}:{conv.head.position} while it ran. Its events are kept on "
            f"branch '{run.branch_id}'; move the head there or start a new run.",
            conversation_id=conv.id,
            branch_id=run.branch_id,
            expected=run.head_at_start.position,
            actual=conv.head.position,
        )
        status, stage, error = "failed", "conflict", str(conflict)
    usage = usage or run.usage
    if request_count is None or tool_count is None:
        logged = _logged_counts(conn, run)
        request_count = logged[0] if request_count is None else request_count
        tool_count = logged[1] if tool_count is None else tool_count
    counts = {"requestCount": request_count, "toolCount": tool_count}
    payload: dict[str, Any] = {"usage": usage.model_dump(mode="json"), **counts}
    if status != "completed":
        payload |= {"stage": stage, "error": error}
    error, ending = _stored_end(conv, run.id, seal, NewEvent(_ENDS[status], payload))
    _fence(
        conn,
        tenant,
        cursor,
        1,
        {
            "status": status,
            "stage": stage,
            "error": error,
            "usage": usage.model_dump_json(),
            "request_count": counts["requestCount"],
            "tool_count": counts["toolCount"],
            "ended_at": db_now(conn),
            "lease_owner": None,
            "lease_expires_at": None,
            "attention": attention,
        },
    )
    (ended,) = _log.insert_events(
        conn,
        conv.tenant,
        conv.id,
        run.branch_id,
        cursor.position + 1,
        [ending],
        run_id=run.id,
        head=status == "completed",
    )
    if status != "completed":
        return None, conflict
    appended = _appended_messages(conn, conv, run)
    _log.set_head(conn, conv, Position(run.branch_id, ended.position), appended, ended.hash)
    return _log.get_conversation(conn, tenant, conv.id), None


def _stored_end(
    conv: Conversation, run_id: str, seal: Seal, end: NewEvent
) -> tuple[str | None, tuple[NewEvent, str]]:
    """A run end's error and event as stored. The error may quote what the run was
    given (a tool's exception naming its argument): in a sealed conversation it is
    sealed like a message, and once the conversation is erased it is the erased
    marker, as a read of a sealed one would show it."""
    error = end.payload.get("error")
    if error is None or conv.subject is None:
        return error, (end, _log.canonical_json(end.payload))
    if conv.erased_at is not None:
        marked = replace(end, payload={**end.payload, "error": ERASED_CONTENT, "erased": True})
        return ERASED_CONTENT, (marked, _log.canonical_json(marked.payload))
    if seal.key is None:
        raise EncryptionError(
            f"Run '{run_id}' is of conversation '{conv.id}', which is sealed: its error is "
            f"sealed too. Open the store with its key-encryption key (Store.open(kek=...) or "
            f"CHATLEDGER_KEK) to end it with an error. Nothing was written."
        )
    (ending,) = seal.events([(end, _log.canonical_json(end.payload))])
    return seal.key.seal(error, {}), ending


def events_of_run(run: Run) -> sa.ColumnElement[bool]:
    """The condition for the run's own events: in the run's conversation, not just
    stamped with its id, since `append_messages(run_id=)` lets anyone stamp any run
    id on their own events."""
    return sa.and_(
        events.c.run_id == run.id,
        events.c.conversation_id == run.conversation_id,
        events.c.tenant == run.tenant,
    )


def _logged_counts(conn: Connection, run: Run) -> tuple[int, int]:
    """Model requests answered and tools finished, as the run's events record them."""
    rows = conn.execute(
        sa.select(events.c.kind, sa.func.count())
        .where(events_of_run(run), events.c.kind.in_(["model.responded", "tool.finished"]))
        .group_by(events.c.kind)
    ).all()
    found = {kind: count for kind, count in rows}
    return found.get("model.responded", 0), found.get("tool.finished", 0)


def _appended_messages(conn: Connection, conv: Conversation, run: Run) -> list[Event]:
    # A run on the head's own branch advances the view in place; any other
    # run moves it (set_head decides), so only the in-place case needs rows.
    if run.branch_id != conv.head.branch_id:
        return []
    rows = conn.execute(
        sa.select(events)
        .where(
            events.c.tenant == conv.tenant,
            events.c.conversation_id == conv.id,
            events.c.branch_id == run.branch_id,
            events.c.position > conv.head.position,
            events.c.kind == "message.recorded",
        )
        .order_by(events.c.position)
    ).all()
    return [_log.event_from_row(r) for r in rows]


def renew_lease(conn: Connection, tenant: str, cursor: RunCursor, seconds: float) -> None:
    """Extend the lease, measured on the database's clock; `LeaseError` if lost."""
    check_seconds(seconds, "seconds")
    check_cursor(cursor)
    result = conn.execute(
        runs.update()
        .where(*_leased(conn, tenant, cursor))
        .values(lease_expires_at=db_now_plus(conn, seconds))
    )
    if result.rowcount != 1:
        run = own_run(conn, tenant, cursor)
        raise LeaseError(
            run_id=run.id,
            owner=cursor.owner,
            attempt=cursor.attempt,
            reason=f"the run is {run.status} at attempt {run.attempt}",
        )


def claim_stale_runs(
    conn: Connection,
    tenant: str | None,
    *,
    owner: str,
    limit: int,
    lease_seconds: float,
    max_attempts: int,
    run_id: str | None = None,
) -> list[tuple[Run, RunCursor]]:
    """Claim running runs whose lease expired (only `run_id`, when given); each claim
    is a new attempt.

    Postgres skips rows another claimer has locked (`FOR UPDATE SKIP
    LOCKED`); on SQLite the writer lock already makes this one claimer at a
    time. A run that reached `max_attempts` is given up instead: recorded as
    failed at stage `gave_up`, without an error, and marked as needing
    attention (the reason).
    """
    check_text(owner, "lease owner")
    check_limit(limit)
    check_seconds(lease_seconds, "lease_seconds")
    check_int(max_attempts, "max_attempts", minimum=1, maximum=MAX_INT32)
    if run_id is not None:
        check_id(run_id, "run")
    stale = sa.and_(runs.c.status == "running", runs.c.lease_expires_at <= db_now(conn))
    query = sa.select(runs.c.tenant, runs.c.id).where(stale)
    if tenant is not None:
        query = query.where(runs.c.tenant == tenant)
    if run_id is not None:
        query = query.where(runs.c.id == run_id)
    candidates = conn.execute(query.order_by(runs.c.lease_expires_at).limit(limit)).all()
    claimed = []
    # Each candidate is locked on its own, by its tenant and id, and skipped when
    # another claimer holds it or took it since: on Citus a row lock is taken
    # within one shard, and the candidates span tenants.
    for owner_tenant, candidate in candidates:
        lock = sa.select(runs).where(runs.c.tenant == owner_tenant, runs.c.id == candidate, stale)
        if not is_sqlite(conn):
            lock = lock.with_for_update(skip_locked=True)
        row = conn.execute(lock).first()
        if row is None:
            continue
        run = _run(row)
        if run.attempt >= max_attempts:
            _give_up(conn, run, max_attempts)
            continue
        conn.execute(
            runs.update()
            .where(runs.c.id == run.id, runs.c.tenant == run.tenant)
            .values(
                attempt=run.attempt + 1,
                lease_owner=owner,
                lease_expires_at=db_now_plus(conn, lease_seconds),
            )
        )
        fresh = get_run(conn, row.tenant, run.id)
        claimed.append(
            (
                fresh,
                RunCursor(
                    run.id, run.conversation_id, run.branch_id, run.position, owner, fresh.attempt
                ),
            )
        )
    return claimed


def live_leases(conn: Connection) -> tuple[int, datetime | None]:
    """How many runs of every tenant are running under a live lease, and when the
    earliest of those leases runs out (the database's clock)."""
    count, earliest = conn.execute(
        sa.select(sa.func.count(), sa.func.min(runs.c.lease_expires_at)).where(
            runs.c.status == "running", runs.c.lease_expires_at > db_now(conn)
        )
    ).one()
    return int(count), None if earliest is None else _log.utc(earliest)


def _give_up(conn: Connection, run: Run, max_attempts: int) -> None:
    # The reason is the attention mark, not an error: an error is sealed in a
    # sealed conversation, and a claim, which spans conversations, holds no key.
    reason = (
        f"crashed on {run.attempt} attempts (the bound is {max_attempts}); a person should "
        f"look at it before it is resumed"
    )
    payload = {
        "stage": "gave_up",
        "error": None,
        "requestCount": run.request_count,
        "toolCount": run.tool_count,
        "usage": run.usage.model_dump(mode="json"),
    }
    _log.insert_events(
        conn,
        run.tenant,
        run.conversation_id,
        run.branch_id,
        run.position + 1,
        [(NewEvent("run.failed", payload), _log.canonical_json(payload))],
        run_id=run.id,
    )
    conn.execute(
        runs.update()
        .where(runs.c.id == run.id, runs.c.tenant == run.tenant)
        .values(
            status="failed",
            stage="gave_up",
            attention=reason,
            position=run.position + 1,
            ended_at=db_now(conn),
            lease_owner=None,
            lease_expires_at=None,
        )
    )
