"""The audit operations, declared once (`AuditOperations`): what `ledger.audit` and
`async_ledger.audit` run.

Arguments are validated when an operation is built, before any transaction
begins; each query is then one `Op` over a function of `store._sql.audit`,
run by whatever executes `Op`s (`Audit` and `AsyncAudit` hold a `Store` or an
`AsyncStore` as the `Executor` and `AsyncExecutor` protocols). Every audit
query reads the log as of a moment ago, so a read replica may answer it
(`_query`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, get_args

from sqlalchemy.engine import Connection

from chatledger.store._errors import InvalidInputError
from chatledger.store._sealing import Program, then
from chatledger.store._sql import log as _log
from chatledger.store._sql.audit import (
    Filter,
    lineage,
    list_events,
    model_request,
    recorded_request,
    run_timeline,
    tool_executions,
)
from chatledger.store._sql.ops import Op
from chatledger.store._sql.pages import DEFAULT_LIMIT, Page
from chatledger.store._values import (
    Event,
    Lineage,
    Origin,
    RecordedRequest,
    TimelineEntry,
    ToolExecution,
    ToolStatus,
)
from chatledger.store.history import HistoryProcessor

__all__ = ["AuditOperations"]

T = TypeVar("T")

_ORIGINS: frozenset[str] = frozenset(get_args(Origin))
_STATUSES: frozenset[str] = frozenset(get_args(ToolStatus))


def _names(
    value: str | Sequence[str] | None, allowed: frozenset[str] | None, what: str
) -> tuple[str, ...]:
    """One name or several, validated; () for None."""
    if value is None:
        return ()
    choices = (
        f"one or more of {', '.join(sorted(allowed))}" if allowed else "a name or a list of names"
    )
    if isinstance(value, str):
        values: tuple[Any, ...] = (value,)
    elif isinstance(value, list | tuple | set | frozenset):
        values = tuple(value)
    else:
        raise InvalidInputError(f"{what} must be {choices}, not {value!r}.")
    for item in values:
        if not isinstance(item, str) or (allowed is not None and item not in allowed):
            raise InvalidInputError(f"{what} must be {choices}, not {value!r}.")
        _log.check_text(item, what)
    if not values:
        raise InvalidInputError(f"{what} must name at least one value; pass None for all.")
    return values


def _supplied_or_repaired(origin: str | None) -> tuple[str, ...]:
    if origin is None:
        return ("client", "repair")
    if origin not in ("client", "repair"):
        raise InvalidInputError(
            f"origin must be 'client' or 'repair' here, not {origin!r}: messages a run produced "
            f"have origin 'run' (list them with events(origin='run'))."
        )
    return (origin,)


def _filter(
    *,
    conversation_id: str | None = None,
    run_id: str | None = None,
    kinds: str | Sequence[str] | None = None,
    origin: str | Sequence[str] | None = None,
    tool_name: str | None = None,
    failed: bool | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Filter:
    if tool_name is not None:
        _log.check_text(tool_name, "tool name")
    for name, value in (("since", since), ("until", until)):
        if value is not None and not isinstance(value, datetime):
            raise InvalidInputError(f"{name} must be a datetime, not {type(value).__name__}.")
    if failed is not None and not isinstance(failed, bool):
        raise InvalidInputError(f"failed must be True, False or None, not {failed!r}.")
    return Filter(
        conversation_id=conversation_id,
        run_id=run_id,
        # Any kind: a newer version or a custom loop may record kinds this one does not know.
        kinds=_names(kinds, None, "kinds"),
        origins=_names(origin, _ORIGINS, "origin"),
        tool_name=tool_name,
        failed=failed,
        since=since,
        until=until,
    )


def _query(action: str, tenant: str, fn: Callable[[Connection], T]) -> Op[T]:
    """An audit query of `tenant`: a read of the log as of a moment ago, which a read
    replica may answer (docs/adr/0023-read-replicas.md)."""
    return Op(action, write=False, replica=True, tenant=tenant, fn=fn)


class AuditOperations:
    """The tenant's audit queries, each declared once: `Audit` and `AsyncAudit` are
    written from these by scripts/faces.py."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        kinds: str | Sequence[str] | None = None,
        tool_name: str | None = None,
        origin: Origin | Sequence[Origin] | None = None,
        failed: bool | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Op[Page[Event]]:
        """The tenant's events, filtered, in commit order.

        Args:
            conversation_id: only events the conversation wrote (a fork's
                inherited events belong to its source).
            run_id: only events stamped with the run.
            kinds: one kind or several.
            tool_name: `tool.started` events and tool results naming the tool.
            origin: `run`, `client` or `repair` (or several).
            failed: True for events recording a failure (`tool.finished` and
                tool results marked failed, `run.failed`); False for the rest.
        """
        f = _filter(
            conversation_id=conversation_id,
            run_id=run_id,
            kinds=kinds,
            origin=origin,
            tool_name=tool_name,
            failed=failed,
            since=since,
            until=until,
        )
        return self._events(f, after, limit)

    def run_timeline(
        self,
        run_id: str,
        *,
        kinds: str | Sequence[str] | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Op[Page[TimelineEntry]]:
        """Every event of the run, in order, with its stage and time since `run.started`."""
        names = _names(kinds, None, "kinds")
        return _query(
            f"reading the timeline of run '{run_id}'",
            self.tenant,
            fn=lambda c: run_timeline(
                c, self.tenant, run_id, kinds=names, after=after, limit=limit
            ),
        )

    def model_request(
        self,
        run_id: str,
        request: int,
        *,
        instructions: str,
        context: str = "",
        history_processor: HistoryProcessor | None = None,
    ) -> Program[RecordedRequest]:
        """Model request number `request` of the run, rebuilt from the log.

        Args:
            instructions: the instructions the run resolved; the log keeps
                only their sha256, which they must match (`InvalidInputError`).
            context: text the run added to the system message after the
                instructions (the engine's retrieval context block).
            history_processor: the agent's history processor, if it had one.
        """
        number = request
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise InvalidInputError(
                f"Model requests are numbered from 1, so {number!r} names none. Pass the "
                f"`request` number that model.requested recorded."
            )
        if not isinstance(context, str):
            raise InvalidInputError(f"context must be text, not {type(context).__name__}.")
        op = _query(
            f"rebuilding model request {number} of run '{run_id}'",
            self.tenant,
            fn=lambda c: model_request(c, self.tenant, run_id, number, instructions=instructions),
        )
        return then(
            op,
            lambda parts: recorded_request(
                parts,
                instructions=instructions,
                context=context,
                history_processor=history_processor,
            ),
        )

    def tool_executions(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        tool_name: str | None = None,
        status: ToolStatus | Sequence[ToolStatus] | None = None,
        failed: bool | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Op[Page[ToolExecution]]:
        """Every tool call started, with how it ended (`ToolExecution.status`).

        `status="uncertain"` lists the calls that started and never finished,
        whose side effects are unknown. `failed=True` is `status="failed"`,
        `failed=False` is `status="finished"`. The time range applies to the
        call's start.
        """
        f = _filter(
            conversation_id=conversation_id,
            run_id=run_id,
            tool_name=tool_name,
            failed=failed,
            since=since,
            until=until,
        )
        statuses: list[ToolStatus] = list(_names(status, _STATUSES, "status"))  # type: ignore[arg-type]
        if f.failed is not None:
            # The failed flag narrows to calls that finished, failed or not.
            flagged: list[ToolStatus] = ["failed"] if f.failed else ["finished"]
            statuses = [s for s in statuses if s in flagged] if statuses else flagged
            if not statuses:
                raise InvalidInputError(f"status {status!r} contradicts failed={f.failed}.")
        return _query(
            "reading tool executions",
            self.tenant,
            fn=lambda c: tool_executions(c, self.tenant, f, statuses, after=after, limit=limit),
        )

    def supplied_and_repaired(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        origin: Literal["client", "repair"] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Op[Page[Event]]:
        """Every message a caller supplied (origin `client`) or repair synthesized (`repair`).

        What a run produced has origin `run`; these are the others, so
        evidence is never confused with content a caller asserted.
        """
        f = _filter(
            conversation_id=conversation_id,
            run_id=run_id,
            kinds="message.recorded",
            origin=_supplied_or_repaired(origin),
            since=since,
            until=until,
        )
        return self._events(f, after, limit)

    def lineage(self, conversation_id: str) -> Op[Lineage]:
        """The conversation's branches, forks in and out, and resumes."""
        return _query(
            f"reading the lineage of conversation '{conversation_id}'",
            self.tenant,
            fn=lambda c: lineage(c, self.tenant, conversation_id),
        )

    def _events(self, f: Filter, after: str | None, limit: int) -> Op[Page[Event]]:
        return _query(
            "reading audit events",
            self.tenant,
            fn=lambda c: list_events(c, self.tenant, f, after=after, limit=limit),
        )
