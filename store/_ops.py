"""Every operation of a tenant as an `Op`: its input checks, then a function of `store._sql`.

`Ledger` and `AsyncLedger` run the very same `Op`s (one through a connection,
one through SQLAlchemy's `run_sync`), so there is one implementation of every
rule and the two faces differ only in `await`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar, get_args

from sqlalchemy.engine import Connection

from store import _repair
from store._cache import MessageCache
from store._checks import check_choice, check_id
from store._errors import ConflictError, InvalidInputError
from store._sql import append as _append
from store._sql import log as _log
from store._sql import projector
from store._sql import runs as _runs
from store._sql import verify as _verify
from store._sql.ops import Op
from store._sql.verify import Recompute, Verification
from store._values import (
    Appended,
    Conversation,
    Event,
    NewEvent,
    Origin,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from store.messages import Message, load_message, load_messages

__all__ = ["Operations", "ended"]

T = TypeVar("T")
_ORIGINS: frozenset[str] = frozenset(get_args(Origin))


def _head_messages(
    rows: list[tuple[int, str]] | None, repaired: bool, cache: MessageCache
) -> list[Message] | None:
    """The head history from its (seq, payload) rows (None: empty or missing; `_history` decides)."""
    if rows is None:
        return None
    messages = cache.load(rows)
    return _repair.repaired(messages) if repaired else messages


def _history(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    at: int | Position | datetime | None,
    repaired: bool,
    cache: MessageCache,
) -> list[Message]:
    conv = _log.get_conversation(conn, tenant, conversation_id)
    if at is None:
        messages = load_messages(projector.view_payloads(conn, conv.id))
    else:
        if isinstance(at, datetime):
            point = projector.head_at(conn, conv.id, at)
            if point is None:
                return []
        else:
            point = _log.resolve_position(conn, conv, at)
        messages = cache.load(projector.message_rows(conn, projector.lineage(conn, point)))
    return _repair.repaired(messages) if repaired else messages


class Operations:
    """Builds the tenant-scoped operations that `Ledger` and `AsyncLedger` run."""

    def __init__(self, tenant: str, cache: MessageCache) -> None:
        self.tenant = _log.check_text(tenant, "tenant")
        self.cache = cache

    def create_conversation(
        self, metadata: dict[str, Any] | None, conversation_id: str | None
    ) -> Op[Conversation]:
        return Op(
            "creating a conversation",
            True,
            lambda c: _log.create_conversation(
                c, self.tenant, metadata, conversation_id=conversation_id
            ),
        )

    def conversation(self, conversation_id: str) -> Op[Conversation]:
        return Op(
            f"reading conversation '{conversation_id}'",
            False,
            lambda c: _log.get_conversation(c, self.tenant, conversation_id),
        )

    def conversations(self, limit: int, before: str | None) -> Op[list[Conversation]]:
        return Op(
            "listing conversations",
            False,
            lambda c: _log.list_conversations(c, self.tenant, limit=limit, before=before),
        )

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        expected: int | None,
        run_id: str | None,
        idempotency_key: str | None,
        origin: str,
    ) -> Op[Appended]:
        if isinstance(messages, Message | dict | str | bytes) or not isinstance(messages, Sequence):
            raise InvalidInputError(
                f"append_messages takes a list of messages, not {type(messages).__name__}."
            )
        check_choice(origin, "origin", _ORIGINS)
        # Every option is checked here, before either path: the fast paths
        # write without passing through `_log.append_messages`.
        check_id(conversation_id, "conversation")
        _append.check_append_options(expected, run_id, idempotency_key)
        encoded = _log.encode_events(
            [NewEvent.of_message(_as_message(m), origin=origin) for m in messages]  # type: ignore[arg-type]
        )
        tenant = self.tenant

        def in_place(append: _append.Append) -> Callable[[Any], Appended | None] | None:
            if not encoded:
                return None
            return lambda handle: _append.appended_in_place(
                conversation_id,
                append(
                    handle,
                    tenant,
                    conversation_id,
                    encoded,
                    expected=expected,
                    run_id=run_id,
                    idempotency_key=idempotency_key,
                ),
                encoded,
                run_id,
                idempotency_key,
            )

        return Op(
            f"appending to conversation '{conversation_id}'",
            True,
            postgres=in_place(_append.append_postgres),
            sqlite=in_place(_append.append_sqlite),
            fn=lambda c: _append.append_messages(
                c,
                self.tenant,
                conversation_id,
                encoded,
                expected=expected,
                run_id=run_id,
                idempotency_key=idempotency_key,
            ),
        )

    def history(
        self, conversation_id: str, at: int | Position | datetime | None, repaired: bool
    ) -> Op[list[Message]]:
        read = Op(
            f"reading the history of conversation '{conversation_id}'",
            False,
            lambda c: _history(c, self.tenant, conversation_id, at, repaired, self.cache),
        )
        if at is not None:
            return read
        _log._check_id(conversation_id, "conversation")
        tenant, cache = self.tenant, self.cache
        return replace(
            read,
            postgres=lambda c: _head_messages(
                projector.head_payloads_postgres(c, tenant, conversation_id), repaired, cache
            ),
            sqlite=lambda cursor: _head_messages(
                projector.head_payloads_sqlite(cursor, tenant, conversation_id), repaired, cache
            ),
        )

    def fork(
        self, conversation_id: str, at: int | Position | None, metadata: dict[str, Any] | None
    ) -> Op[Conversation]:
        return Op(
            f"forking conversation '{conversation_id}'",
            True,
            lambda c: _log.fork(c, self.tenant, conversation_id, at, metadata),
        )

    def move_head(
        self, conversation_id: str, to: int | Position, expected: Position | None
    ) -> Op[Conversation]:
        return Op(
            f"moving the head of conversation '{conversation_id}'",
            True,
            lambda c: _log.move_head(c, self.tenant, conversation_id, to, expected=expected),
        )

    def events(
        self,
        conversation_id: str | None,
        run_id: str | None,
        after_seq: int | None,
        limit: int | None,
    ) -> Op[list[Event]]:
        return Op(
            "reading events",
            False,
            lambda c: _log.list_events(
                c,
                self.tenant,
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            ),
        )

    def start_run(
        self, conversation_id: str, events: Sequence[NewEvent], **options: Any
    ) -> Op[RunCursor]:
        initial = _log.encode_events(events)
        return Op(
            f"starting a run on conversation '{conversation_id}'",
            True,
            lambda c: _runs.start_run(c, self.tenant, conversation_id, initial=initial, **options),
        )

    def record(
        self, cursor: RunCursor, new_events: Sequence[NewEvent], idempotency_key: str | None
    ) -> Op[tuple[list[Event], RunCursor]]:
        encoded = _log.encode_events(new_events)
        return Op(
            f"recording events of run '{cursor.run_id}'",
            True,
            lambda c: _runs.record(
                c, self.tenant, cursor, encoded, idempotency_key=idempotency_key
            ),
        )

    def end_run(
        self, cursor: RunCursor, status: RunStatus, **options: Any
    ) -> Op[tuple[Conversation | None, ConflictError | None]]:
        return Op(
            f"ending run '{cursor.run_id}'",
            True,
            lambda c: _runs.end_run(c, self.tenant, cursor, status, **options),
        )

    def renew_lease(self, cursor: RunCursor, seconds: float) -> Op[None]:
        return Op(
            f"renewing the lease of run '{cursor.run_id}'",
            True,
            lambda c: _runs.renew_lease(c, self.tenant, cursor, seconds),
        )

    def run(self, run_id: str) -> Op[Run]:
        return Op(f"reading run '{run_id}'", False, lambda c: _runs.get_run(c, self.tenant, run_id))

    def runs(
        self,
        conversation_id: str | None,
        status: RunStatus | None,
        attention: bool | None,
        limit: int,
    ) -> Op[list[Run]]:
        return Op(
            "listing runs",
            False,
            lambda c: _runs.list_runs(
                c,
                self.tenant,
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            ),
        )

    def verify(
        self, conversation_ids: list[str] | None, recompute: Recompute
    ) -> Op[list[Verification]]:
        for conversation_id in conversation_ids or ():
            _log._check_id(conversation_id, "conversation")
        return Op(
            "verifying hash chains",
            False,
            lambda c: _verify.verify_many(c, self.tenant, conversation_ids, recompute=recompute),
        )

    def claim_stale_runs(
        self, owner: str, limit: int, lease_seconds: float, max_attempts: int
    ) -> Op[list[tuple[Run, RunCursor]]]:
        return Op(
            "claiming stale runs",
            True,
            lambda c: _runs.claim_stale_runs(
                c,
                self.tenant,
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
            ),
        )


def _as_message(value: Message | dict[str, Any]) -> Message:
    return value if isinstance(value, Message) else load_message(value)


def ended(result: tuple[Conversation | None, ConflictError | None]) -> Conversation | None:
    conversation, conflict = result
    if conflict is not None:
        raise conflict
    return conversation
