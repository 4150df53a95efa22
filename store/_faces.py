"""The operations of the store's faces, written by scripts/faces.py from their
declarations (`store/_ops.py`, `store/_audit.py`): edit those, then run it.

Each class here is the base of one face, `Store`, `Ledger`, `Runs`, `Retention`,
`Audit` and their async twins, each of which adds only what is its own:
construction, `execute`, properties, the tail's waiter
(docs/adr/0043-one-declaration-per-operation.md). An async face's method points
to the sync face's, which documents both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from chatledger.store._sealing import adrive, drive
from chatledger.store._sql.pages import DEFAULT_LIMIT

if TYPE_CHECKING:
    import os
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence
    from datetime import datetime
    from typing import Any, Literal, TextIO

    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from chatledger.store._audit import AuditOperations
    from chatledger.store._crypto import KeyEncryptionKey
    from chatledger.store._ops import Operations, StoreOperations
    from chatledger.store._retention import RetentionReport, SubjectOutcome
    from chatledger.store._sql.erasure import Erasure
    from chatledger.store._sql.ops import AsyncExecutor, Executor, Op
    from chatledger.store._sql.pages import Page
    from chatledger.store._sql.retention import RetentionAction, RetentionPolicy
    from chatledger.store._sql.transfer import ExportReport, ImportReport
    from chatledger.store._sql.verify import Recompute, Verification
    from chatledger.store._tail import Stop, TailSettings
    from chatledger.store._values import (
        Appended,
        Conversation,
        Entry,
        Event,
        Expected,
        Lineage,
        NewConversation,
        NewEvent,
        Origin,
        Position,
        RecordedRequest,
        Run,
        RunCursor,
        RunStatus,
        TimelineEntry,
        ToolExecution,
        ToolStatus,
    )
    from chatledger.store.history import HistoryProcessor
    from chatledger.store.messages import Message, Usage

__all__ = [
    "AsyncAuditFace",
    "AsyncLedgerFace",
    "AsyncRetentionFace",
    "AsyncRunsFace",
    "AsyncStoreFace",
    "AuditFace",
    "LedgerFace",
    "RetentionFace",
    "RunsFace",
    "StoreFace",
]

T = TypeVar("T")


class StoreFace:
    """The operations of `Store`."""

    if TYPE_CHECKING:
        _ops: StoreOperations

        def execute(self, op: Op[T], connection: Connection | None = None) -> T: ...

    def migrate(
        self,
        connection: Connection | None = None,
        *,
        partitions: int | None = None,
        citus: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Upgrade the schema to this package's head revision.

        With `connection`, run inside the caller's transaction on it. With
        `partitions` (Postgres only), also make the events and head-view
        tables hash-partitioned by conversation into that many partitions,
        copying their rows, if they are not partitioned yet; a different
        count on a partitioned database is refused
        (docs/scaling.md). With `citus`, on a Citus coordinator, also
        distribute every table by tenant, if it is not yet (docs/scaling.md,
        "Citus"). `progress(done, total)` is called after each revision
        applied.
        """
        return self.execute(
            self._ops.migrate(partitions=partitions, citus=citus, progress=progress),
            connection,
        )

    def run_retention(
        self,
        *,
        tenant: str | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        progress: Callable[[SubjectOutcome], None] | None = None,
    ) -> RetentionReport:
        """Apply retention policies: for `tenant`, or every tenant that has one.

        Each subject whose conversations are all idle past its tenant's
        cutoff is exported (for `export-erase`: one file per conversation
        under `export_dir/tenant-<tenant, percent-encoded>/`, written whole or not at all) and then
        erased; a subject with an active conversation is kept, and idle
        conversations stored in the clear are reported, never touched. Run it
        from a scheduler: a pass killed halfway finishes when run again.
        `dry_run` writes nothing and reports what would be done; `now` (default
        the database's clock) is the moment idleness is measured from.
        `progress` is called with each subject's outcome as it comes.
        """
        return drive(
            self._ops.run_retention(
                tenant=tenant,
                export_dir=export_dir,
                dry_run=dry_run,
                now=now,
                progress=progress,
            ),
            self.execute,
        )

    def rebuild(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        tenant: str | None = None,
    ) -> int:
        """Recompute every materialized view from the events; return the view count.

        It runs in one transaction: readers see the old views until it commits.
        `progress(done, total)` is called as it goes; `tenant` rebuilds only the
        views of that tenant's conversations.
        """
        return self.execute(self._ops.rebuild(progress, tenant=tenant))

    def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim stale runs of every tenant (for a resume worker serving them all); only
        the run `run_id` when given (`chatledger resume RUN_ID`)."""
        return self.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of every tenant.

        `recompute` says where the hashes are computed: `"auto"` (in SQL on
        Postgres, fastest; here on SQLite), `"database"`, or `"client"` (in
        this process, independent of the server's own functions).
        """
        return self.execute(self._ops.verify(progress, recompute=recompute))

    def rotate_kek(self, new: KeyEncryptionKey | bytes) -> int:
        """Re-wrap every data key under the key-encryption key `new` (32 bytes or a
        `KeyEncryptionKey`), in one transaction; returns how many were re-wrapped.

        The store must hold the current key. Afterwards, open every store with
        `new`; once no backup you keep holds a key row wrapped by the old one,
        destroying the old key makes erased content unreadable in those
        backups too (docs/erasure.md, "Rotating the key-encryption key").
        Keys already under `new` are left as they are, so a repeat is a no-op.
        """
        return drive(self._ops.rotate_kek(new), self.execute)

    def check_schema(self) -> None:
        """Raise `SchemaError` unless the database is at this package's head revision."""
        return self.execute(self._ops.check_schema())


class LedgerFace:
    """The operations of `Ledger`."""

    if TYPE_CHECKING:
        _ops: Operations
        _store: Executor

        def _tail(self, settings: TailSettings) -> Iterator[Page[Event]]: ...

    def create_conversation(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        conversation_id: str | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """Create a conversation (its id a new UUIDv7 unless given).

        `subject`: on a store with a key-encryption key, the erasure subject
        whose data key seals it (default: its own id); `erase(subject)`
        erases every conversation of the subject at once.
        """
        return self._store.execute(
            self._ops.create_conversation(
                metadata,
                conversation_id=conversation_id,
                key=key,
                subject=subject,
            )
        )

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation: metadata, head, and where it was forked from."""
        return self._store.execute(self._ops.conversation(conversation_id))

    def conversation_by_key(self, key: str) -> Conversation:
        """The conversation created with `key`; `NotFoundError` when the tenant has none."""
        return self._store.execute(self._ops.conversation_by_key(key))

    def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """The tenant's conversations, newest first, at most `limit` of them.

        Newest by id: minted ids are UUIDv7, so they sort in creation order. For
        the next page pass the last conversation's id as `before`; the list is
        short of `limit` only on the last page. A `before` that is no
        conversation of this tenant (another tenant's id, a made-up one) is a
        `NotFoundError` (`InvalidInputError` when it is not an id), so a cursor
        never reaches another tenant's rows. Keyset pagination on the `(tenant,
        id)` index: a deep page costs what the first does.
        """
        return self._store.execute(self._ops.conversations(limit, before))

    def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> list[Entry]:
        """The messages of the history at the head (or `at`), each with its event id and position, oldest first; only the last `last` with it, in one query. Unrepaired: each entry is a message as stored."""
        return self._store.execute(self._ops.entries(conversation_id, at=at, last=last))

    def entry(self, event_id: str) -> Entry:
        """The message with this event id, which its caller minted (`append_messages(ids=...)`)."""
        return self._store.execute(self._ops.entry(event_id))

    def state_changes(
        self,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> list[Event]:
        """The `state.changed` events, oldest first, their payloads opened: those a
        conversation's log holds (every branch, and the lineage a fork continues from
        its source), or those stamped with `run_id` in any of the tenant's
        conversations, or with both, those of the conversation stamped with the run."""
        return self._store.execute(self._ops.state_changes(conversation_id, run_id=run_id))

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | Position | Expected | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = 'client',
        create: bool | NewConversation = False,
        after: int | Position | None = None,
        ids: Sequence[str] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Appended:
        """Append one turn at the head, atomically, and move the head past it.

        Everything is checked before anything is written: a refused append
        writes nothing, and a successful one writes the whole turn (its
        messages, then the `state.changed` event of `state`) in one
        transaction.

        Args:
            conversation_id: the conversation, which must exist in this
                tenant (`NotFoundError` otherwise, as for another tenant's),
                unless `create` is set.
            messages: the turn's messages, in order (`Message`s or dicts in
                the durable JSON form). May be empty when `state` is given:
                the `state.changed` event is then appended alone.
            expected: what the caller expects to find, else `ConflictError`
                and nothing is written: the head position it last saw (an
                `int` or a `Position`), or an `Expected(head=..., state=...)`
                whose `state` is a compare-and-set on the conversation's
                state (each field given must hold that value now; a field
                given as `None` must be absent). Without it, the append goes
                after whatever the head is.
            run_id: a run id to stamp on the events.
            idempotency_key: a retried append with the same key and content
                writes nothing and returns the original; the key with other
                content is an `InvalidInputError` (the caller's mistake: do
                not retry it).
            origin: who produced the messages, as the log records it:
                `"client"` (the default: the caller), `"run"` (a model run)
                or `"repair"`.
            create: create the conversation with the id `conversation_id`
                when the tenant has none by that id, in the same transaction
                as the append (one round trip on the fast path): for a
                backend that mints its own conversation ids. `True`, or a
                `NewConversation(metadata=..., subject=...)` with the new
                conversation's metadata and, on a store with a key-encryption
                key, its erasure subject (docs/erasure.md).
                `Appended.created` says whether it did. Pass it for a
                conversation you expect to be new: on an existing one the
                append costs one more statement. An id another tenant holds
                is the `ConflictError` of `create_conversation`.
            after: append after this position of the head's history instead
                of at the head, replacing what followed it there (it stays in
                the log, on its branch): a framework rewriting the tail of a
                history. An `int` counts events on the head's lineage, as
                `Entry.position` does.
            ids: the event ids of the messages, one per message, minted by
                the caller (canonical UUIDs, none twice); `ledger.entry(id)`
                reads a message back by its id. A taken id is a
                `ConflictError`.
            state: the conversation's new state (a JSON object), recorded as
                a `state.changed` event after the messages and returned by
                `conversation(...).state`.

        Returns:
            The events written, the new head, whether the conversation was
            created, and `repair`: what the repaired history does with the
            messages added (results dropped or moved, calls still waiting
            for a result).

        Raises:
            InvalidInputError: an option is malformed (the message names it).
            NotFoundError: no such conversation in this tenant.
            ConflictError: `expected` or an id no longer holds; reload and
                retry.
        """
        return drive(
            self._ops.append_messages(
                conversation_id,
                messages,
                expected=expected,
                run_id=run_id,
                idempotency_key=idempotency_key,
                origin=origin,
                create=create,
                after=after,
                ids=ids,
                state=state,
            ),
            self._store.execute,
        )

    def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """The history at the head, or `at` a position or moment; repaired by default."""
        return self._store.execute(self._ops.history(conversation_id, at=at, repaired=repaired))

    def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """A new conversation that continues this one at `at` (default: the head).

        Sealed, it belongs to its source's erasure subject unless `subject`
        names another: then erasing the source's subject leaves the fork its
        own messages and erases only the prefix they share.
        """
        return self._store.execute(
            self._ops.fork(conversation_id, at=at, metadata=metadata, key=key, subject=subject)
        )

    def move_head(
        self,
        conversation_id: str,
        to: int | Position,
        *,
        expected: Position | Expected | None = None,
        state: dict[str, Any] | None = None,
    ) -> Conversation:
        """Move the head to `to`: compare-and-set against `expected` when given (the
        head `Position` the caller last saw, or an `Expected` with it and the state
        fields that must hold), and set the state to `state` when given."""
        return self._store.execute(
            self._ops.move_head(conversation_id, to, expected=expected, state=state)
        )

    def erase(self, subject: str, *, reason: str) -> Erasure:
        """Erase an erasure subject: destroy its data key, in one transaction.

        Every conversation of the subject (a sealed conversation's subject is
        its own id unless it was given one; forks inherit their source's)
        gets a `conversation.erased` event naming the subject and `reason`,
        and reads as erased markers from then on, in every process; it takes
        no more writes. The log and its hash chain stay whole, so `verify`
        passes. Erasing a subject again changes nothing and says so
        (`Erasure.already`). docs/erasure.md says what it guarantees.
        """
        return drive(self._ops.erase(subject, reason=reason), self._store.execute)

    def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The raw log, in order."""
        return self._store.execute(
            self._ops.events(
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            )
        )

    def tail(
        self,
        after: str | None = None,
        *,
        conversation_id: str | None = None,
        follow: bool = False,
        limit: int = DEFAULT_LIMIT,
        idle_seconds: float = 5.0,
        poll_seconds: float = 0.05,
        stop: Stop | None = None,
    ) -> Iterator[Page[Event]]:
        """Pages of the tenant's events (or one conversation's) in commit order, after `after`.

        Every event committed after the cursor comes exactly once, and never
        one that rolled back, in an order consistent with commit order: a
        transaction that committed before another began comes first, and a
        transaction's events come together in `seq` order. On Postgres,
        transactions that overlapped come in transaction-id order, and a
        commit that becomes visible late (its transaction took its `seq`
        early) is never passed (docs/adr/0005-audit-pagination.md). Store each page's `next_after`
        once its events are handled, and pass it back as `after` to resume:
        in the same transaction as what handling them wrote, for
        exactly-once; after it, for at-least-once (docs/tail.md).

        Args:
            after: a `next_after` from an earlier page (or an audit page of
                `events`); None starts at the beginning of the log.
            conversation_id: follow one conversation of the tenant only.
            follow: False stops once caught up (a page with `pending` may
                hold newer events back); True waits for new commits: on
                Postgres woken by `LISTEN chatledger_events` (which stores
                send after their writes, `Store.open(notify=)`), and reading
                again after `idle_seconds` in any case; on SQLite checking
                the file's data version every `poll_seconds`.
            limit: the most events per page.
            idle_seconds: when following, read again after this long with no
                wake-up (writes that sent no notification are found then).
            poll_seconds: SQLite: how often to check for a commit.
            stop: when following, set it to end the iteration within a
                fraction of a second: a `threading.Event` set from another
                thread, or on `AsyncLedger` an `asyncio.Event` (or cancel the
                task that iterates).

        Only pages with events are yielded, except, when not following, a
        last empty page with `pending` set if events are held back behind an
        open transaction (Postgres). Inputs are checked here, before the
        first page is read, `after` against the log's end with one read: a
        cursor past it raises `InvalidInputError`. A database that cannot be
        reached, or a connection that breaks, raises `StorageError` (a
        follower's too): start again from the stored cursor.
        """
        return self._tail(self._ops.tail(
            after,
            conversation_id=conversation_id,
            follow=follow,
            limit=limit,
            idle_seconds=idle_seconds,
            poll_seconds=poll_seconds,
            stop=stop,
        ))

    def verify(self, conversation_id: str, *, recompute: Recompute = 'auto') -> Verification:
        """Recompute one conversation's hash chain; say where it first breaks.

        `recompute`: see `Store.verify`.
        """
        return self._store.execute(self._ops.verify(conversation_id, recompute=recompute))

    def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """Recompute the hash chain of every conversation of this tenant; `progress` is
        called with each conversation's result as it comes."""
        return self._store.execute(self._ops.verify_all(progress, recompute=recompute))

    def export(
        self,
        out: TextIO,
        *,
        conversation_id: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ExportReport:
        """Write the tenant's conversations, or one with the conversations it was forked
        from, to `out` as JSON Lines (docs/export.md), streaming from one snapshot.

        The log as stored, byte for byte: sealed content stays sealed (a store
        that imports it needs the same key-encryption key to read it).
        `progress` is called with the running count of events written.
        """
        return self._store.execute(
            self._ops.export(out, conversation_id=conversation_id, progress=progress)
        )

    def import_file(
        self,
        source: TextIO,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Read an export of this tenant from `source` into the store, in one transaction.

        Every line is checked (order, fields, every hash, the end record) before
        anything commits: a file refused raises `ImportFileError` naming its
        line, and nothing is written. Conversations the store already holds,
        identical, are left as they are (`ImportReport.already_present`), so an
        import can be repeated; one that differs is refused. `progress` is
        called with the running count of events read.
        """
        return self._store.execute(self._ops.import_file(source, progress=progress))


class RunsFace:
    """The operations of `Runs`."""

    def __init__(self, store: Executor, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    def start(
        self,
        conversation_id: str,
        *,
        owner: str,
        run_id: str | None = None,
        base: int | Position | None = None,
        resumes: str | None = None,
        model: str | None = None,
        instructions_digest: str | None = None,
        lease_seconds: float = 60.0,
        events: Sequence[NewEvent] = (),
        create: bool = False,
        exclusive: bool = False,
    ) -> RunCursor:
        """Start a run at `base` (default the head), leased to `owner`.

        `events` (the run's prompt) are recorded with `run.started`, atomically.

        Args:
            create: the run opens a new conversation: `conversation_id` (a
                new id) is created in the same transaction, so a refused
                start leaves no conversation behind.
            exclusive: refuse the start with `ConflictError`, writing nothing,
                while another run of the conversation is live (running, its
                lease not expired): one run at a time, where a second one's
                completion could only conflict.
        """
        return self._store.execute(
            self._ops.start_run(
                conversation_id,
                owner=owner,
                run_id=run_id,
                base=base,
                resumes=resumes,
                model=model,
                instructions_digest=instructions_digest,
                lease_seconds=lease_seconds,
                events=events,
                create=create,
                exclusive=exclusive,
            )
        )

    def record(
        self,
        cursor: RunCursor,
        events: Sequence[NewEvent],
        *,
        idempotency_key: str | None = None,
    ) -> tuple[list[Event], RunCursor]:
        """Append a run's events, fenced by its lease; return them and the new cursor."""
        return self._store.execute(
            self._ops.record(cursor, events, idempotency_key=idempotency_key)
        )

    def complete(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation:
        """Complete a run and move the head to its end by compare-and-set.

        Raises `ConflictError` (after recording the run as failed at stage
        `conflict`) when the head moved while the run ran.
        """
        return drive(
            self._ops.complete_run(
                cursor,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
            ),
            self._store.execute,
        )

    def fail(
        self,
        cursor: RunCursor,
        *,
        stage: str,
        error: str,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
        canceled: bool = False,
        attention: str | None = None,
    ) -> None:
        """Record a run as failed (or canceled) at `stage`; the head does not move.

        `attention` marks it as needing a person (listed by `runs.recent(attention=True)`).
        """
        return drive(
            self._ops.fail_run(
                cursor,
                stage=stage,
                error=error,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
                canceled=canceled,
                attention=attention,
            ),
            self._store.execute,
        )

    def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """Extend the run's lease by `seconds` of the database's clock."""
        return self._store.execute(self._ops.renew_lease(cursor, seconds))

    def get(self, run_id: str) -> Run:
        """The run's projection row."""
        return self._store.execute(self._ops.run(run_id))

    def claim_stale(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """Claim runs whose lease expired (each claim a new attempt); only the run
        `run_id` when given, none while its lease is live."""
        return self._store.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    def recent(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """The tenant's runs, newest first."""
        return self._store.execute(
            self._ops.runs(
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            )
        )


class RetentionFace:
    """The operations of `Retention`."""

    def __init__(self, store: Executor, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    def set(self, idle_days: int, action: RetentionAction) -> RetentionPolicy:
        """Set the tenant's retention policy: conversations idle for `idle_days` are
        erased (`erase`), or exported and then erased (`export-erase`), by
        `Store.run_retention` (docs/erasure.md, "Retention")."""
        return self._store.execute(self._ops.set_retention(idle_days, action))

    def get(self) -> RetentionPolicy | None:
        """The tenant's retention policy, None when it has none."""
        return self._store.execute(self._ops.retention())

    def clear(self) -> bool:
        """Remove the tenant's retention policy; whether it had one."""
        return self._store.execute(self._ops.clear_retention())


class AuditFace:
    """The operations of `Audit`."""

    if TYPE_CHECKING:
        _ops: AuditOperations
        _store: Executor

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
    ) -> Page[Event]:
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
        return self._store.execute(
            self._ops.events(
                conversation_id=conversation_id,
                run_id=run_id,
                kinds=kinds,
                tool_name=tool_name,
                origin=origin,
                failed=failed,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    def run_timeline(
        self,
        run_id: str,
        *,
        kinds: str | Sequence[str] | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[TimelineEntry]:
        """Every event of the run, in order, with its stage and time since `run.started`."""
        return self._store.execute(
            self._ops.run_timeline(run_id, kinds=kinds, after=after, limit=limit)
        )

    def model_request(
        self,
        run_id: str,
        request: int,
        *,
        instructions: str,
        context: str = '',
        history_processor: HistoryProcessor | None = None,
    ) -> RecordedRequest:
        """Model request number `request` of the run, rebuilt from the log.

        Args:
            instructions: the instructions the run resolved; the log keeps
                only their sha256, which they must match (`InvalidInputError`).
            context: text the run added to the system message after the
                instructions (the engine's retrieval context block).
            history_processor: the agent's history processor, if it had one.
        """
        return drive(
            self._ops.model_request(
                run_id,
                request,
                instructions=instructions,
                context=context,
                history_processor=history_processor,
            ),
            self._store.execute,
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
    ) -> Page[ToolExecution]:
        """Every tool call started, with how it ended (`ToolExecution.status`).

        `status="uncertain"` lists the calls that started and never finished,
        whose side effects are unknown. `failed=True` is `status="failed"`,
        `failed=False` is `status="finished"`. The time range applies to the
        call's start.
        """
        return self._store.execute(
            self._ops.tool_executions(
                conversation_id=conversation_id,
                run_id=run_id,
                tool_name=tool_name,
                status=status,
                failed=failed,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    def supplied_and_repaired(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        origin: Literal['client', 'repair'] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[Event]:
        """Every message a caller supplied (origin `client`) or repair synthesized (`repair`).

        What a run produced has origin `run`; these are the others, so
        evidence is never confused with content a caller asserted.
        """
        return self._store.execute(
            self._ops.supplied_and_repaired(
                conversation_id=conversation_id,
                run_id=run_id,
                origin=origin,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    def lineage(self, conversation_id: str) -> Lineage:
        """The conversation's branches, forks in and out, and resumes."""
        return self._store.execute(self._ops.lineage(conversation_id))


class AsyncStoreFace:
    """The operations of `AsyncStore`."""

    if TYPE_CHECKING:
        _ops: StoreOperations

        async def execute(self, op: Op[T], connection: AsyncConnection | None = None) -> T: ...

    async def migrate(
        self,
        connection: AsyncConnection | None = None,
        *,
        partitions: int | None = None,
        citus: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """See `Store.migrate`."""
        return await self.execute(
            self._ops.migrate(partitions=partitions, citus=citus, progress=progress),
            connection,
        )

    async def run_retention(
        self,
        *,
        tenant: str | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        progress: Callable[[SubjectOutcome], None] | None = None,
    ) -> RetentionReport:
        """See `Store.run_retention`."""
        return await adrive(
            self._ops.run_retention(
                tenant=tenant,
                export_dir=export_dir,
                dry_run=dry_run,
                now=now,
                progress=progress,
            ),
            self.execute,
        )

    async def rebuild(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        tenant: str | None = None,
    ) -> int:
        """See `Store.rebuild`."""
        return await self.execute(self._ops.rebuild(progress, tenant=tenant))

    async def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """See `Store.claim_stale_runs`."""
        return await self.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    async def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """See `Store.verify`."""
        return await self.execute(self._ops.verify(progress, recompute=recompute))

    async def rotate_kek(self, new: KeyEncryptionKey | bytes) -> int:
        """See `Store.rotate_kek`."""
        return await adrive(self._ops.rotate_kek(new), self.execute)

    async def check_schema(self) -> None:
        """See `Store.check_schema`."""
        return await self.execute(self._ops.check_schema())


class AsyncLedgerFace:
    """The operations of `AsyncLedger`."""

    if TYPE_CHECKING:
        _ops: Operations
        _store: AsyncExecutor

        def _tail(self, settings: TailSettings) -> AsyncIterator[Page[Event]]: ...

    async def create_conversation(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        conversation_id: str | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """See `Ledger.create_conversation`."""
        return await self._store.execute(
            self._ops.create_conversation(
                metadata,
                conversation_id=conversation_id,
                key=key,
                subject=subject,
            )
        )

    async def conversation(self, conversation_id: str) -> Conversation:
        """See `Ledger.conversation`."""
        return await self._store.execute(self._ops.conversation(conversation_id))

    async def conversation_by_key(self, key: str) -> Conversation:
        """See `Ledger.conversation_by_key`."""
        return await self._store.execute(self._ops.conversation_by_key(key))

    async def conversations(self, limit: int = 50, before: str | None = None) -> list[Conversation]:
        """See `Ledger.conversations`."""
        return await self._store.execute(self._ops.conversations(limit, before))

    async def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> list[Entry]:
        """See `Ledger.entries`."""
        return await self._store.execute(self._ops.entries(conversation_id, at=at, last=last))

    async def entry(self, event_id: str) -> Entry:
        """See `Ledger.entry`."""
        return await self._store.execute(self._ops.entry(event_id))

    async def state_changes(
        self,
        conversation_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> list[Event]:
        """See `Ledger.state_changes`."""
        return await self._store.execute(self._ops.state_changes(conversation_id, run_id=run_id))

    async def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | Position | Expected | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = 'client',
        create: bool | NewConversation = False,
        after: int | Position | None = None,
        ids: Sequence[str] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Appended:
        """See `Ledger.append_messages`."""
        return await adrive(
            self._ops.append_messages(
                conversation_id,
                messages,
                expected=expected,
                run_id=run_id,
                idempotency_key=idempotency_key,
                origin=origin,
                create=create,
                after=after,
                ids=ids,
                state=state,
            ),
            self._store.execute,
        )

    async def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> list[Message]:
        """See `Ledger.history`."""
        return await self._store.execute(
            self._ops.history(conversation_id, at=at, repaired=repaired)
        )

    async def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Conversation:
        """See `Ledger.fork`."""
        return await self._store.execute(
            self._ops.fork(conversation_id, at=at, metadata=metadata, key=key, subject=subject)
        )

    async def move_head(
        self,
        conversation_id: str,
        to: int | Position,
        *,
        expected: Position | Expected | None = None,
        state: dict[str, Any] | None = None,
    ) -> Conversation:
        """See `Ledger.move_head`."""
        return await self._store.execute(
            self._ops.move_head(conversation_id, to, expected=expected, state=state)
        )

    async def erase(self, subject: str, *, reason: str) -> Erasure:
        """See `Ledger.erase`."""
        return await adrive(self._ops.erase(subject, reason=reason), self._store.execute)

    async def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """See `Ledger.events`."""
        return await self._store.execute(
            self._ops.events(
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            )
        )

    def tail(
        self,
        after: str | None = None,
        *,
        conversation_id: str | None = None,
        follow: bool = False,
        limit: int = DEFAULT_LIMIT,
        idle_seconds: float = 5.0,
        poll_seconds: float = 0.05,
        stop: Stop | None = None,
    ) -> AsyncIterator[Page[Event]]:
        """See `Ledger.tail`."""
        return self._tail(self._ops.tail(
            after,
            conversation_id=conversation_id,
            follow=follow,
            limit=limit,
            idle_seconds=idle_seconds,
            poll_seconds=poll_seconds,
            stop=stop,
        ))

    async def verify(self, conversation_id: str, *, recompute: Recompute = 'auto') -> Verification:
        """See `Ledger.verify`."""
        return await self._store.execute(self._ops.verify(conversation_id, recompute=recompute))

    async def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = 'auto',
    ) -> list[Verification]:
        """See `Ledger.verify_all`."""
        return await self._store.execute(self._ops.verify_all(progress, recompute=recompute))

    async def export(
        self,
        out: TextIO,
        *,
        conversation_id: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ExportReport:
        """See `Ledger.export`."""
        return await self._store.execute(
            self._ops.export(out, conversation_id=conversation_id, progress=progress)
        )

    async def import_file(
        self,
        source: TextIO,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """See `Ledger.import_file`."""
        return await self._store.execute(self._ops.import_file(source, progress=progress))


class AsyncRunsFace:
    """The operations of `AsyncRuns`."""

    def __init__(self, store: AsyncExecutor, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    async def start(
        self,
        conversation_id: str,
        *,
        owner: str,
        run_id: str | None = None,
        base: int | Position | None = None,
        resumes: str | None = None,
        model: str | None = None,
        instructions_digest: str | None = None,
        lease_seconds: float = 60.0,
        events: Sequence[NewEvent] = (),
        create: bool = False,
        exclusive: bool = False,
    ) -> RunCursor:
        """See `Runs.start`."""
        return await self._store.execute(
            self._ops.start_run(
                conversation_id,
                owner=owner,
                run_id=run_id,
                base=base,
                resumes=resumes,
                model=model,
                instructions_digest=instructions_digest,
                lease_seconds=lease_seconds,
                events=events,
                create=create,
                exclusive=exclusive,
            )
        )

    async def record(
        self,
        cursor: RunCursor,
        events: Sequence[NewEvent],
        *,
        idempotency_key: str | None = None,
    ) -> tuple[list[Event], RunCursor]:
        """See `Runs.record`."""
        return await self._store.execute(
            self._ops.record(cursor, events, idempotency_key=idempotency_key)
        )

    async def complete(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Conversation:
        """See `Runs.complete`."""
        return await adrive(
            self._ops.complete_run(
                cursor,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
            ),
            self._store.execute,
        )

    async def fail(
        self,
        cursor: RunCursor,
        *,
        stage: str,
        error: str,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
        canceled: bool = False,
        attention: str | None = None,
    ) -> None:
        """See `Runs.fail`."""
        return await adrive(
            self._ops.fail_run(
                cursor,
                stage=stage,
                error=error,
                usage=usage,
                request_count=request_count,
                tool_count=tool_count,
                canceled=canceled,
                attention=attention,
            ),
            self._store.execute,
        )

    async def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> None:
        """See `Runs.renew_lease`."""
        return await self._store.execute(self._ops.renew_lease(cursor, seconds))

    async def get(self, run_id: str) -> Run:
        """See `Runs.get`."""
        return await self._store.execute(self._ops.run(run_id))

    async def claim_stale(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> list[tuple[Run, RunCursor]]:
        """See `Runs.claim_stale`."""
        return await self._store.execute(
            self._ops.claim_stale_runs(
                owner=owner,
                limit=limit,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                run_id=run_id,
            )
        )

    async def recent(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """See `Runs.recent`."""
        return await self._store.execute(
            self._ops.runs(
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            )
        )


class AsyncRetentionFace:
    """The operations of `AsyncRetention`."""

    def __init__(self, store: AsyncExecutor, ops: Operations) -> None:
        self._store = store
        self._ops = ops

    async def set(self, idle_days: int, action: RetentionAction) -> RetentionPolicy:
        """See `Retention.set`."""
        return await self._store.execute(self._ops.set_retention(idle_days, action))

    async def get(self) -> RetentionPolicy | None:
        """See `Retention.get`."""
        return await self._store.execute(self._ops.retention())

    async def clear(self) -> bool:
        """See `Retention.clear`."""
        return await self._store.execute(self._ops.clear_retention())


class AsyncAuditFace:
    """The operations of `AsyncAudit`."""

    if TYPE_CHECKING:
        _ops: AuditOperations
        _store: AsyncExecutor

    async def events(
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
    ) -> Page[Event]:
        """See `Audit.events`."""
        return await self._store.execute(
            self._ops.events(
                conversation_id=conversation_id,
                run_id=run_id,
                kinds=kinds,
                tool_name=tool_name,
                origin=origin,
                failed=failed,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    async def run_timeline(
        self,
        run_id: str,
        *,
        kinds: str | Sequence[str] | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[TimelineEntry]:
        """See `Audit.run_timeline`."""
        return await self._store.execute(
            self._ops.run_timeline(run_id, kinds=kinds, after=after, limit=limit)
        )

    async def model_request(
        self,
        run_id: str,
        request: int,
        *,
        instructions: str,
        context: str = '',
        history_processor: HistoryProcessor | None = None,
    ) -> RecordedRequest:
        """See `Audit.model_request`."""
        return await adrive(
            self._ops.model_request(
                run_id,
                request,
                instructions=instructions,
                context=context,
                history_processor=history_processor,
            ),
            self._store.execute,
        )

    async def tool_executions(
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
    ) -> Page[ToolExecution]:
        """See `Audit.tool_executions`."""
        return await self._store.execute(
            self._ops.tool_executions(
                conversation_id=conversation_id,
                run_id=run_id,
                tool_name=tool_name,
                status=status,
                failed=failed,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    async def supplied_and_repaired(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        origin: Literal['client', 'repair'] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[Event]:
        """See `Audit.supplied_and_repaired`."""
        return await self._store.execute(
            self._ops.supplied_and_repaired(
                conversation_id=conversation_id,
                run_id=run_id,
                origin=origin,
                since=since,
                until=until,
                after=after,
                limit=limit,
            )
        )

    async def lineage(self, conversation_id: str) -> Lineage:
        """See `Audit.lineage`."""
        return await self._store.execute(self._ops.lineage(conversation_id))
