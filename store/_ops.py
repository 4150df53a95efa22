"""Every operation as an `Op`: its input checks, then a function of `store._sql`.

`Operations` builds a tenant's (for `Ledger` and `AsyncLedger`),
`StoreOperations` those over the whole database (for `Store` and
`AsyncStore`). Both faces run the very same `Op`s (one through a connection,
one through SQLAlchemy's `run_sync`), so there is one implementation of every
rule and each face method is one call: the faces differ only in `await`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TextIO, TypeVar, get_args

from sqlalchemy.engine import Connection

from chatledger.store import _repair, _tails
from chatledger.store._cache import HeadCache, MessageCache, TailCache
from chatledger.store._checks import (
    MAX_INT32,
    check_choice,
    check_id,
    check_int,
    check_long_text,
    check_new_id,
)
from chatledger.store._crypto import (
    PLAIN,
    KeyEncryptionKey,
    Seal,
    Sealer,
    is_sealed,
    kek_for,
    key_ids_of,
    open_text,
    refuse_sealed,
)
from chatledger.store._errors import ConflictError, EncryptionError, InvalidInputError, SchemaError
from chatledger.store._retention import RetentionReport, SubjectOutcome, run_retention
from chatledger.store._sealing import Program, then
from chatledger.store._sql import append as _append
from chatledger.store._sql import citus as _citus
from chatledger.store._sql import entries as _entries
from chatledger.store._sql import erasure as _erasure
from chatledger.store._sql import importer as _importer
from chatledger.store._sql import keys as _keys
from chatledger.store._sql import log as _log
from chatledger.store._sql import migrate as _migrate
from chatledger.store._sql import partitions as _partitions
from chatledger.store._sql import projector
from chatledger.store._sql import retention as _retention
from chatledger.store._sql import runs as _runs
from chatledger.store._sql import transfer as _transfer
from chatledger.store._sql import verify as _verify
from chatledger.store._sql.erasure import Erasure
from chatledger.store._sql.ops import Op, Sealing
from chatledger.store._sql.pages import DEFAULT_LIMIT
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
    NewConversation,
    NewEvent,
    Origin,
    Position,
    Run,
    RunCursor,
    RunStatus,
)
from chatledger.store.ids import new_id
from chatledger.store.messages import Message, Usage, load_message, load_messages

__all__ = ["Operations", "StoreOperations"]

T = TypeVar("T")
_ORIGINS: frozenset[str] = frozenset(get_args(Origin))


@dataclass(frozen=True)
class Unseal:
    """How one operation opens the sealed payloads it reads: the store's sealer, and
    `fetch`, which reads the wrapped keys on the operation's own connection."""

    sealer: Sealer
    fetch: Callable[[set[str]], Mapping[str, bytes]]

    def texts(self, texts: list[str]) -> list[str]:
        """`texts` with each sealed one opened (or its erased marker)."""
        return self.sealer.open_texts(texts, self.fetch)


def _load(
    rows: Sequence[tuple[Any, ...]], cache: MessageCache, unseal: Unseal | None
) -> list[Message]:
    """Messages from (seq, payload, ...) rows, through the cache.

    Sealed rows are opened with keys read in this operation, and an opened
    message is served from the cache only while its key exists: an erasure
    shows at once, and a message whose key is gone is never kept.
    """
    texts = [row[1] for row in rows]
    if unseal is None:
        refuse_sealed(texts)
        return cache.load(rows)
    key_ids = key_ids_of(texts)
    wanted = {i for i in key_ids if i is not None}
    if not wanted:
        return cache.load(rows)
    keys = unseal.sealer.data_keys(wanted, unseal.fetch(wanted))

    def parse(texts: list[str]) -> list[Message]:
        return load_messages([open_text(t, keys) if is_sealed(t) else t for t in texts])

    servable = [i is None or keys[i] is not None for i in key_ids]
    return cache.load(rows, parse, servable)


def _refusing_sealed(texts: list[str]) -> list[str]:
    refuse_sealed(texts)
    return texts


def _head_messages(
    rows: Sequence[tuple[Any, ...]] | None,
    repaired: bool,
    cache: MessageCache,
    unseal: Unseal | None = None,
) -> list[Message] | None:
    """The head history from its (seq, payload) rows (None: empty or missing; `_history` decides)."""
    if rows is None:
        return None
    messages = _load(rows, cache, unseal)
    return _repair.repaired(messages) if repaired else messages


def _history(
    conn: Connection,
    tenant: str,
    conversation_id: str,
    at: int | Position | datetime | None,
    repaired: bool,
    cache: MessageCache,
    unseal: Unseal | None = None,
) -> list[Message]:
    conv = _log.get_conversation(conn, tenant, conversation_id)
    if at is None:
        texts = projector.view_payloads(conn, tenant, conv.id, conv.forked_from is not None)
        if unseal is None:
            refuse_sealed(texts)
        messages = load_messages(texts if unseal is None else unseal.texts(texts))
    else:
        if isinstance(at, datetime):
            point = projector.head_at(conn, tenant, conv.id, at)
            if point is None:
                return []
        else:
            point = _log.resolve_position(conn, conv, at)
        rows = projector.message_rows(conn, tenant, projector.lineage(conn, tenant, point))
        messages = _as_stored(rows, cache)
    return _repair.repaired(messages) if repaired else messages


def _as_stored(rows: Sequence[tuple[Any, ...]], cache: MessageCache) -> list[Message]:
    """Messages from (seq, payload, ...) rows with sealed content left sealed (the face
    opens it, `store._sealing.opening`); those never go through the cache, which
    holds opened messages only."""
    if any(is_sealed(row[1]) for row in rows):
        return load_messages([row[1] for row in rows])
    return cache.load(rows)


class Operations:
    """Builds the tenant-scoped operations that `Ledger` and `AsyncLedger` run."""

    def __init__(
        self,
        tenant: str,
        cache: MessageCache,
        sealer: Sealer | None = None,
        heads: HeadCache | None = None,
        tails: TailCache | None = None,
    ) -> None:
        self.tenant = _log.check_text(tenant, "tenant")
        self.cache = cache
        self.sealer = sealer
        self._tails = tails
        # In-place appends keep the heads they leave, for the next append to
        # the conversation to chain on (`HeadCache`); every other
        # write that moves a head forgets it, so that append need not miss first.
        self._heads = heads

    def _op(self, action: str, **fields: Any) -> Op[Any]:
        """An `Op` of this tenant: sealed content in its result opens only with this
        tenant's keys (`store._sealing.opening`)."""
        return Op(action, tenant=self.tenant, **fields)

    def _opening(self, c: Connection) -> _entries.Opening:
        """How a read on `c` opens the payloads it parses: with this tenant's keys, or,
        on a store without a key, by refusing sealed ones (`Op.opens`)."""
        unseal = self._unseal(lambda ids: _keys.keys_by_id(c, ids, self.tenant))
        return _refusing_sealed if unseal is None else unseal.texts

    def _moving_head(self, conversation_id: str) -> None:
        """Forget the head kept for `conversation_id`: a write about to move it."""
        if self._heads is not None:
            self._heads.forget(self.tenant, conversation_id)

    def _unseal(self, fetch: Callable[[set[str]], Mapping[str, bytes]]) -> Unseal | None:
        """How a read opens sealed payloads, with `fetch` reading the keys (None: no key)."""
        return None if self.sealer is None else Unseal(self.sealer, fetch)

    def create_conversation(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        conversation_id: str | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Op[Conversation]:
        """Create a conversation (its id a new UUIDv7 unless given).

        `subject`: on a store with a key-encryption key, the erasure subject
        whose data key seals it (default: its own id); `erase(subject)`
        erases every conversation of the subject at once.
        """
        # Every input is checked here, before either path, as `fn` checks
        # them (in the same order): the fast forms write without passing
        # through `_log.create_conversation`.
        check_new_id(conversation_id, "conversation")
        tenant = self.tenant
        meta_text, payload = _log.encode_root(tenant, metadata)
        if key is not None:
            _log.check_key(key)
        if subject is not None:
            _keys.check_subject(subject)
        # Minted here, so that a sealed conversation's subject (by default
        # its id) is known before it is written.
        cid = conversation_id or new_id()

        def build(seal: Seal) -> Op[Conversation]:
            create = self._op(
                "creating a conversation",
                write=True,
                fn=lambda c: _log.create_conversation(
                    c,
                    tenant,
                    metadata,
                    conversation_id=cid,
                    key=key,
                    seal=_subject_needs(subject, seal),
                ),
            )
            # A sealed creation (or one that names a subject): the general path.
            if seal.sealed or subject is not None:
                return create
            return replace(
                create,
                postgres=lambda cursor: _append.create_conversation_postgres(
                    cursor, tenant, cid, meta_text, payload, key
                ),
                sqlite=lambda cursor: _append.create_conversation_sqlite(
                    cursor, tenant, cid, meta_text, payload, key
                ),
            )

        return replace(
            build(PLAIN), sealing=Sealing(tenant, cid, build, create=True, subject=subject)
        )

    def conversation_by_key(self, key: str) -> Op[Conversation]:
        """The conversation created with `key`; `NotFoundError` when the tenant has none."""
        _log.check_key(key)
        tenant = self.tenant
        return self._op(
            "reading a conversation by its key",
            write=False,
            postgres=lambda cursor: _log.conversation_by_key_postgres(cursor, tenant, key),
            sqlite=lambda cursor: _log.conversation_by_key_sqlite(cursor, tenant, key),
            fn=lambda c: _log.get_conversation_by_key(c, tenant, key),
        )

    def entries(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        last: int | None = None,
    ) -> Op[list[Entry]]:
        """The messages of the history at the head (or `at`), each with its event id and position, oldest first; only the last `last` with it, in one query. Unrepaired: each entry is a message as stored."""
        check_id(conversation_id, "conversation")
        if last is not None:
            check_int(last, "last", minimum=0, maximum=MAX_INT32)

        def read(c: Connection) -> list[Entry]:
            conv = _log.get_conversation(c, self.tenant, conversation_id)
            if at is None:
                return _entries.entries(c, conv, None, last, self._opening(c))
            return _entries.entries(c, conv, _log.resolve_position(c, conv, at), last)

        # At an explicit position the answer may lag (a replica's); at the head it may
        # not. The head's entries open their own content (`_opening`) and are not looked
        # through afterwards; those read at a position, maybe on a replica, are opened
        # with keys read on the primary, where an erasure shows at once.
        return self._op(
            f"reading the entries of conversation '{conversation_id}'",
            write=False,
            replica=at is not None,
            opens=at is None,
            fn=read,
        )

    def state_changes(
        self, conversation_id: str | None = None, *, run_id: str | None = None
    ) -> Op[list[Event]]:
        """The `state.changed` events, oldest first, their payloads opened: those a
        conversation's log holds (every branch, and the lineage a fork continues from
        its source), or those stamped with `run_id` in any of the tenant's
        conversations, or with both, those of the conversation stamped with the run."""
        if conversation_id is None and run_id is None:
            raise InvalidInputError(
                "state_changes needs a conversation id, a run id, or both: pass "
                "conversation_id=... or run_id=...."
            )
        if conversation_id is not None:
            check_id(conversation_id, "conversation")
        if run_id is not None:
            check_id(run_id, "run")
        return self._op(
            "reading state changes",
            write=False,
            opens=True,
            fn=lambda c: _entries.state_changes(
                c, self.tenant, conversation_id, run_id, self._opening(c)
            ),
        )

    def entry(self, event_id: str) -> Op[Entry]:
        """The message with this event id, which its caller minted (`append_messages(ids=...)`)."""
        check_id(event_id, "event")
        return self._op(
            f"reading entry '{event_id}'",
            write=False,
            opens=True,
            fn=lambda c: _entries.entry(c, self.tenant, event_id, self._opening(c)),
        )

    def conversation(self, conversation_id: str) -> Op[Conversation]:
        """The conversation: metadata, head, and where it was forked from."""
        check_id(conversation_id, "conversation")
        tenant = self.tenant
        return self._op(
            f"reading conversation '{conversation_id}'",
            write=False,
            postgres=lambda cursor: _log.conversation_postgres(cursor, tenant, conversation_id),
            sqlite=lambda cursor: _log.conversation_sqlite(cursor, tenant, conversation_id),
            fn=lambda c: _log.get_conversation(c, tenant, conversation_id),
        )

    def conversations(self, limit: int = 50, before: str | None = None) -> Op[list[Conversation]]:
        """The tenant's conversations, newest first, at most `limit` of them.

        Newest by id: minted ids are UUIDv7, so they sort in creation order. For
        the next page pass the last conversation's id as `before`; the list is
        short of `limit` only on the last page. A `before` that is no
        conversation of this tenant (another tenant's id, a made-up one) is a
        `NotFoundError` (`InvalidInputError` when it is not an id), so a cursor
        never reaches another tenant's rows. Keyset pagination on the `(tenant,
        id)` index: a deep page costs what the first does.
        """
        return self._op(
            "listing conversations",
            write=False,
            fn=lambda c: _log.list_conversations(c, self.tenant, limit=limit, before=before),
        )

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        expected: int | Position | Expected | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        origin: str = "client",
        create: bool | NewConversation = False,
        after: int | Position | None = None,
        ids: Sequence[str] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Program[Appended]:
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
        if isinstance(messages, Message | dict | str | bytes) or not isinstance(messages, Sequence):
            raise InvalidInputError(
                f"append_messages takes a list of messages, not {type(messages).__name__}."
            )
        check_choice(origin, "origin", _ORIGINS)
        # Every option is checked here, before either path: the fast paths
        # write without passing through `_append.append_messages`.
        check_id(conversation_id, "conversation")
        expected = _expected(expected)
        expected_state = expected.state
        _append.check_append_options(expected.head, run_id, idempotency_key)
        new = _new_conversation(create)
        create = new is not None
        metadata, subject = (None, None) if new is None else (new.metadata, new.subject)
        root = None if new is None else _log.encode_root(self.tenant, metadata)
        if subject is not None:
            _keys.check_subject(subject)
        clear = _log.encode_events(
            [NewEvent.of_message(_as_message(m), origin=origin) for m in messages]  # type: ignore[arg-type]
        )
        minted = _entries.check_ids(ids, len(clear))
        if after is not None:
            _check_position(after, "after")
        state_text = None if state is None else _entries.encode_state(state)
        if state is not None and state_text is not None:  # the last event (or the only one)
            clear.append(_entries.state_changed(state, state_text))
        tenant, head = self.tenant, expected.head
        if after is not None:
            self._moving_head(conversation_id)  # the general path appends after a position

        def build(seal: Seal, sealing: Sealing[Appended] | None = None) -> Op[Appended]:
            # Refused on every form alike (a form would write without a key).
            seal = _subject_needs(subject, seal)
            turn = _append.Turn(
                tenant,
                conversation_id,
                seal.events(clear),
                run_id=run_id,
                key=idempotency_key,
                named=minted,
                state=None if state_text is None else seal.state(state_text),
                expected=head.position if isinstance(head, Position) else head,
                expected_branch=head.branch_id if isinstance(head, Position) else None,
                expected_state=expected_state,
                sealed=seal.sealed,
                # A sealed creation goes through the general path (its key is
                # written there), so only a clear root is ever written in place.
                root=None if seal.sealed else root,
                seal=seal,
            )
            # A key minted for a new subject is written by the general path,
            # which also refuses the append when another writer created the
            # conversation (and its key) first; and so is a turn after a position.
            minting = seal.new_key is not None
            general = not _append.in_place_at_all(turn, after=after is not None, minting=minting)

            def forms(
                dialect: _append.Dialect, heads: HeadCache | None
            ) -> Callable[[Any], Appended | None] | None:
                if general:
                    return None

                def attempt(cursor: Any) -> Appended | None:
                    done = _append.in_place(cursor, dialect, turn, heads=heads)
                    # The result carries the clear payloads (the caller's own, as
                    # opening the sealed ones would give), so it needs no opening.
                    return None if done is None else _append.appended(turn, done, texts=clear)

                return attempt

            return self._op(
                f"appending to conversation '{conversation_id}'",
                write=True,
                postgres=forms(_append.POSTGRES, self._heads),
                sqlite=forms(_append.SQLITE, self._heads),
                fn=lambda c: _append.append_messages(
                    c, turn, create=create, metadata=metadata, after=after, seal=seal
                ),
                sealing=sealing,
            )

        sealing = Sealing(tenant, conversation_id, build, create=create, subject=subject)
        return self._reported(build(PLAIN, sealing), messages)

    def _reported(self, op: Op[Appended], messages: Sequence[Message]) -> Program[Appended]:
        """`op`, the append, then its repair report (`report`), reading the history
        only when the report needs it."""
        done = yield op
        found = self.report(done, messages)
        if isinstance(found, Op):
            found = self.report(done, messages, (yield found))
        assert isinstance(found, Appended)
        return found

    def report(
        self,
        done: Appended,
        messages: Sequence[Message | dict[str, Any]],
        history: list[Message] | None = None,
    ) -> Appended | Op[list[Message]]:
        """`done`, the result of `append_messages(messages)`, with its repair report; or,
        when that needs the history the append followed, the read of it, whose result
        to pass back as `history`.

        The report comes from the tail of that history, as the last append through
        this store to the conversation left it (`TailCache`): the chat loop reads
        nothing more. Only when the tail is not known and a result answers a call
        made before the append is the history read, after the commit: the history
        at a committed position never changes, so the report is that of the append.
        """
        cid, events = done.conversation_id, done.events
        first = events[0]  # an append writes at least one event: a message or the state
        # The point the messages follow: before the append's first event, or the
        # creation of the conversation or branch it opens with (no message).
        branch_id = first.branch_id
        position = first.position
        if first.kind != "conversation.created" and first.kind != "branch.created":
            position -= 1
        if not messages:
            # A state change alone: the tail is the one it follows, one event on.
            if self._tails is not None:
                kept = self._tails.get(self.tenant, cid)
                if kept is not None and kept[:2] == (branch_id, position):
                    self._tails.put(self.tenant, cid, (branch_id, events[-1].position, kept[2]))
            return done
        appended = [m if isinstance(m, Message) else load_message(m) for m in messages]
        tail: _tails.Tail | None = None
        if history is not None:
            tail = _tails.tail_of(history)
        elif position == 1:
            # Position 1 holds a conversation's creation (a fork's positions continue
            # its source's): no message comes before it.
            tail = _tails.EMPTY_TAIL
        elif self._tails is not None:
            kept = self._tails.get(self.tenant, cid)
            if kept is not None and kept[0] == branch_id and kept[1] == position:
                tail = kept[2]
        found = _tails.extend(tail, appended)
        if found is None:
            read = self.history(cid, at=Position(branch_id, position), repaired=False)
            return replace(read, replica=False)  # it must see the append's own commit
        repair, after = found
        if after is not None and self._tails is not None:
            # Where the append ended (a replay's head may have moved on since).
            end = events[-1]
            self._tails.put(self.tenant, cid, (end.branch_id, end.position, after))
        return done if repair is None else replace(done, repair=repair)

    def history(
        self,
        conversation_id: str,
        *,
        at: int | Position | datetime | None = None,
        repaired: bool = True,
    ) -> Op[list[Message]]:
        """The history at the head, or `at` a position or moment; repaired by default."""
        read = self._op(
            f"reading the history of conversation '{conversation_id}'",
            write=False,
            # At an explicit position or time the answer may lag (a replica's);
            # at the head it may not: a caller reads what it just appended.
            replica=at is not None,
            # The head's forms open (or refuse) what they read: `_load`, `_history`.
            # A read at a position, maybe on a replica, leaves its sealed content as
            # stored, for the face to open with keys read on the primary, where an
            # erasure shows at once.
            opens=at is None,
            fn=lambda c: _history(
                c,
                self.tenant,
                conversation_id,
                at,
                repaired,
                self.cache,
                self._unseal(lambda ids: _keys.keys_by_id(c, ids, self.tenant)),
            ),
        )
        if at is not None:
            return read
        check_id(conversation_id, "conversation")
        tenant, cache = self.tenant, self.cache
        return replace(
            read,
            postgres=lambda c: _head_messages(
                projector.head_payloads_postgres(c, tenant, conversation_id),
                repaired,
                cache,
                self._unseal(lambda ids: _keys.keys_on_postgres(c, ids, tenant)),
            ),
            sqlite=lambda cursor: _head_messages(
                projector.head_payloads_sqlite(cursor, tenant, conversation_id),
                repaired,
                cache,
                self._unseal(lambda ids: _keys.keys_on_sqlite(cursor, ids, tenant)),
            ),
        )

    def fork(
        self,
        conversation_id: str,
        *,
        at: int | Position | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> Op[Conversation]:
        """A new conversation that continues this one at `at` (default: the head).

        Sealed, it belongs to its source's erasure subject unless `subject`
        names another: then erasing the source's subject leaves the fork its
        own messages and erases only the prefix they share.
        """
        if key is not None:
            _log.check_key(key)
        if subject is not None:
            _keys.check_subject(subject)
        tenant, fork_id = self.tenant, new_id()

        def build(seal: Seal) -> Op[Conversation]:
            return self._op(
                f"forking conversation '{conversation_id}'",
                write=True,
                fn=lambda c: _log.fork(
                    c,
                    tenant,
                    conversation_id,
                    at,
                    metadata,
                    key=key,
                    fork_id=fork_id,
                    seal=_subject_needs(subject, seal),
                ),
            )

        sealing = Sealing(
            tenant, fork_id, build, create=True, subject=subject, source=conversation_id
        )
        return replace(build(PLAIN), sealing=sealing)

    def move_head(
        self,
        conversation_id: str,
        to: int | Position,
        *,
        expected: Position | Expected | None = None,
        state: dict[str, Any] | None = None,
    ) -> Op[Conversation]:
        """Move the head to `to`: compare-and-set against `expected` when given (the
        head `Position` the caller last saw, or an `Expected` with it and the state
        fields that must hold), and set the state to `state` when given."""
        expected = _expected(expected)
        head, expected_state = expected.head, expected.state
        if head is not None and not isinstance(head, Position):
            raise InvalidInputError(
                f"move_head's expected head is the Position the caller last saw, not {head!r}."
            )
        _append.check_append_options(head, None, None)
        state_text = None if state is None else _entries.encode_state(state)
        self._moving_head(conversation_id)

        def build(seal: Seal) -> Op[Conversation]:
            return self._op(
                f"moving the head of conversation '{conversation_id}'",
                write=True,
                fn=lambda c: _entries.move_head(
                    c,
                    self.tenant,
                    conversation_id,
                    to,
                    expected=head,
                    state=state_text,
                    expected_state=expected_state,
                    seal=seal,
                ),
            )

        if state_text is None and expected_state is None:
            return build(PLAIN)  # nothing sealed written or opened
        sealing = Sealing(self.tenant, conversation_id, build)
        return replace(build(PLAIN), sealing=sealing)

    def events(
        self,
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> Op[list[Event]]:
        """The raw log, in order."""
        return self._op(
            "reading events",
            write=False,
            fn=lambda c: _log.list_events(
                c,
                self.tenant,
                conversation_id=conversation_id,
                run_id=run_id,
                after_seq=after_seq,
                limit=limit,
            ),
        )

    def start_run(
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
    ) -> Op[RunCursor]:
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
        for name, flag in (("create", create), ("exclusive", exclusive)):
            if not isinstance(flag, bool):
                raise InvalidInputError(f"{name} must be True or False, not {flag!r}.")
        if create:
            check_new_id(conversation_id, "conversation")
        initial = _log.encode_events(events)
        self._moving_head(conversation_id)

        def build(seal: Seal) -> Op[RunCursor]:
            return self._op(
                f"starting a run on conversation '{conversation_id}'",
                write=True,
                fn=lambda c: _runs.start_run(
                    c,
                    self.tenant,
                    conversation_id,
                    initial=seal.events(initial),
                    create=create,
                    exclusive=exclusive,
                    seal=seal,
                    run_id=run_id,
                    base=base,
                    resumes=resumes,
                    model=model,
                    instructions_digest=instructions_digest,
                    owner=owner,
                    lease_seconds=lease_seconds,
                ),
            )

        return replace(
            build(PLAIN), sealing=Sealing(self.tenant, conversation_id, build, create=create)
        )

    def record(
        self,
        cursor: RunCursor,
        events: Sequence[NewEvent],
        *,
        idempotency_key: str | None = None,
    ) -> Op[tuple[list[Event], RunCursor]]:
        """Append a run's events, fenced by its lease; return them and the new cursor."""
        encoded = _log.encode_events(events)
        self._moving_head(cursor.conversation_id)

        def build(seal: Seal) -> Op[tuple[list[Event], RunCursor]]:
            return self._op(
                f"recording events of run '{cursor.run_id}'",
                write=True,
                fn=lambda c: _runs.record(
                    c,
                    self.tenant,
                    cursor,
                    seal.events(encoded),
                    idempotency_key=idempotency_key,
                    seal=seal,
                ),
            )

        return replace(build(PLAIN), sealing=Sealing(self.tenant, cursor.conversation_id, build))

    def set_retention(self, idle_days: int, action: RetentionAction) -> Op[RetentionPolicy]:
        """Set the tenant's retention policy: conversations idle for `idle_days` are
        erased (`erase`), or exported and then erased (`export-erase`), by
        `Store.run_retention` (docs/erasure.md, "Retention")."""
        days, chosen = _retention.check_policy(idle_days, action)
        return self._op(
            f"setting the retention policy of tenant '{self.tenant}'",
            write=True,
            fn=lambda c: _retention.set_policy(c, self.tenant, days, chosen),
        )

    def retention(self) -> Op[RetentionPolicy | None]:
        """The tenant's retention policy, None when it has none."""
        return self._op(
            f"reading the retention policy of tenant '{self.tenant}'",
            write=False,
            fn=lambda c: _retention.get_policy(c, self.tenant),
        )

    def clear_retention(self) -> Op[bool]:
        """Remove the tenant's retention policy; whether it had one."""
        return self._op(
            f"clearing the retention policy of tenant '{self.tenant}'",
            write=True,
            fn=lambda c: _retention.clear_policy(c, self.tenant),
        )

    def erase(self, subject: str, *, reason: str) -> Program[Erasure]:
        """Erase an erasure subject: destroy its data key, in one transaction.

        Every conversation of the subject (a sealed conversation's subject is
        its own id unless it was given one; forks inherit their source's)
        gets a `conversation.erased` event naming the subject and `reason`,
        and reads as erased markers from then on, in every process; it takes
        no more writes. The log and its hash chain stay whole, so `verify`
        passes. Erasing a subject again changes nothing and says so
        (`Erasure.already`). docs/erasure.md says what it guarantees.
        """
        _keys.check_subject(subject)
        check_long_text(reason, "reason", max_chars=1000)
        op = self._op(
            f"erasing subject '{subject}'",
            write=True,
            fn=lambda c: _erasure.erase(c, self.tenant, subject, reason),
        )
        return then(op, self._forgetting)

    def _forgetting(self, erasure: Erasure) -> Erasure:
        # Opened messages leave this process's memory too (no read would serve
        # them: each checks its keys).
        self.cache.clear()
        return erasure

    def complete_run(
        self,
        cursor: RunCursor,
        *,
        usage: Usage | None = None,
        request_count: int | None = None,
        tool_count: int | None = None,
    ) -> Program[Conversation]:
        """Complete a run and move the head to its end by compare-and-set.

        Raises `ConflictError` (after recording the run as failed at stage
        `conflict`) when the head moved while the run ran.
        """
        op = self._end_run(
            cursor,
            "completed",
            usage=usage,
            request_count=request_count,
            tool_count=tool_count,
        )
        return then(op, completed)

    def fail_run(
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
    ) -> Program[None]:
        """Record a run as failed (or canceled) at `stage`; the head does not move.

        `attention` marks it as needing a person (listed by `runs.recent(attention=True)`).
        """
        op = self._end_run(
            cursor,
            "canceled" if canceled else "failed",
            stage=stage,
            error=error,
            usage=usage,
            request_count=request_count,
            tool_count=tool_count,
            attention=attention,
        )
        return then(op, lambda _: None)

    def _end_run(
        self, cursor: RunCursor, status: RunStatus, **options: Any
    ) -> Op[tuple[Conversation | None, ConflictError | None]]:
        self._moving_head(cursor.conversation_id)

        def build(seal: Seal) -> Op[tuple[Conversation | None, ConflictError | None]]:
            return self._op(
                f"ending run '{cursor.run_id}'",
                write=True,
                fn=lambda c: _runs.end_run(c, self.tenant, cursor, status, seal=seal, **options),
            )

        sealing = Sealing(self.tenant, cursor.conversation_id, build, ends=True)
        return replace(build(PLAIN), sealing=sealing)

    def renew_lease(self, cursor: RunCursor, seconds: float = 60.0) -> Op[None]:
        """Extend the run's lease by `seconds` of the database's clock."""
        return self._op(
            f"renewing the lease of run '{cursor.run_id}'",
            write=True,
            fn=lambda c: _runs.renew_lease(c, self.tenant, cursor, seconds),
        )

    def run(self, run_id: str) -> Op[Run]:
        """The run's projection row."""
        return self._op(
            f"reading run '{run_id}'",
            write=False,
            fn=lambda c: _runs.get_run(c, self.tenant, run_id),
        )

    def runs(
        self,
        *,
        conversation_id: str | None = None,
        status: RunStatus | None = None,
        attention: bool | None = None,
        limit: int = 100,
    ) -> Op[list[Run]]:
        """The tenant's runs, newest first."""
        return self._op(
            "listing runs",
            write=False,
            fn=lambda c: _runs.list_runs(
                c,
                self.tenant,
                conversation_id=conversation_id,
                status=status,
                attention=attention,
                limit=limit,
            ),
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
    ) -> TailSettings:
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
        return TailSettings(
            after=after,
            conversation_id=conversation_id,
            limit=limit,
            follow=follow,
            idle_seconds=idle_seconds,
            poll_seconds=poll_seconds,
            stop=stop,
        )

    def verify(self, conversation_id: str, *, recompute: Recompute = "auto") -> Op[Verification]:
        """Recompute one conversation's hash chain; say where it first breaks.

        `recompute`: see `Store.verify`.
        """
        check_id(conversation_id, "conversation")

        def verify_one(conn: Connection) -> Verification:
            found = _verify.verify_many(conn, self.tenant, [conversation_id], recompute=recompute)
            if not found:
                _log.get_conversation(conn, self.tenant, conversation_id)  # raises NotFoundError
            return found[0]

        return self._op(
            f"verifying the hash chain of conversation '{conversation_id}'",
            write=False,
            replica=True,  # the chain as of a moment ago (docs/adr/0023-read-replicas.md)
            fn=verify_one,
        )

    def verify_all(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = "auto",
    ) -> Op[list[Verification]]:
        """Recompute the hash chain of every conversation of this tenant; `progress` is
        called with each conversation's result as it comes."""
        return _verify_op(self.tenant, progress, recompute)

    def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> Op[list[tuple[Run, RunCursor]]]:
        """Claim runs whose lease expired (each claim a new attempt); only the run
        `run_id` when given, none while its lease is live."""
        return _claim_op(self.tenant, owner, limit, lease_seconds, max_attempts, run_id)

    def export(
        self,
        out: TextIO,
        *,
        conversation_id: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Op[ExportReport]:
        """Write the tenant's conversations, or one with the conversations it was forked
        from, to `out` as JSON Lines (docs/export.md), streaming from one snapshot.

        The log as stored, byte for byte: sealed content stays sealed (a store
        that imports it needs the same key-encryption key to read it).
        `progress` is called with the running count of events written.
        """
        if conversation_id is not None:
            check_id(conversation_id, "conversation")
        what = f"conversation '{conversation_id}'" if conversation_id else f"tenant '{self.tenant}'"
        # A read of one snapshot, on the primary: a replica's copy would do, but the
        # export streams for as long as it writes, and a replica may cancel a long read.
        return self._op(
            f"exporting {what}",
            write=False,
            fn=lambda c: _transfer.export(c, self.tenant, out, conversation_id, progress),
        )

    def import_file(
        self, source: TextIO, *, progress: Callable[[int], None] | None = None
    ) -> Op[ImportReport]:
        """Read an export of this tenant from `source` into the store, in one transaction.

        Every line is checked (order, fields, every hash, the end record) before
        anything commits: a file refused raises `ImportFileError` naming its
        line, and nothing is written. Conversations the store already holds,
        identical, are left as they are (`ImportReport.already_present`), so an
        import can be repeated; one that differs is refused. `progress` is
        called with the running count of events read.
        """
        # One transaction: a file refused at any line writes nothing.
        return self._op(
            f"importing into tenant '{self.tenant}'",
            write=True,
            fn=lambda c: _importer.import_file(c, self.tenant, source, progress),
        )


class StoreOperations:
    """Builds the operations over the whole database that `Store` and `AsyncStore` run."""

    def __init__(self, sealer: Sealer | None, tenant_ops: Callable[[str], Operations]) -> None:
        self.sealer = sealer
        self._tenant_ops = tenant_ops

    def migrate(
        self,
        *,
        partitions: int | None = None,
        citus: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> Op[None]:
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
        if citus and partitions is not None:
            raise InvalidInputError(
                "Pass `partitions` or `citus`, not both: on Citus the log is split into "
                "shards, not partitions."
            )

        def migrate(conn: Connection) -> None:
            if partitions is not None:
                _partitions.refuse_sqlite(conn)
            _migrate.upgrade(conn, progress=progress)
            if partitions is not None:
                _partitions.partition(conn, partitions)
            if citus:
                _citus.distribute(conn)

        return Op("migrating the schema", write=True, fn=migrate)

    def run_retention(
        self,
        *,
        tenant: str | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        progress: Callable[[SubjectOutcome], None] | None = None,
    ) -> Program[RetentionReport]:
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
        return run_retention(
            self._tenant_ops,
            tenant=tenant,
            export_dir=export_dir,
            dry_run=dry_run,
            now=now,
            progress=progress,
        )

    def rotate_kek(self, new: KeyEncryptionKey | bytes) -> Program[int]:
        """Re-wrap every data key under the key-encryption key `new` (32 bytes or a
        `KeyEncryptionKey`), in one transaction; returns how many were re-wrapped.

        The store must hold the current key. Afterwards, open every store with
        `new`; once no backup you keep holds a key row wrapped by the old one,
        destroying the old key makes erased content unreadable in those
        backups too (docs/erasure.md, "Rotating the key-encryption key").
        Keys already under `new` are left as they are, so a repeat is a no-op.
        """
        target = kek_for(new)
        sealer = self.sealer
        if sealer is None:
            raise EncryptionError(
                "Rotating the key-encryption key needs the current one: open the store with "
                "it (Store.open(kek=...) or CHATLEDGER_KEK), and pass the new one."
            )
        op = Op(
            "re-wrapping the data keys under a new key-encryption key",
            write=True,
            fn=lambda c: _keys.rewrap(c, sealer.unwrap_under, target),
        )

        def rekeyed(count: int) -> int:
            sealer.rekey(target)  # this store (and its ledgers) seals under `new` now
            return count

        return then(op, rekeyed)

    def check_schema(self) -> Op[None]:
        """Raise `SchemaError` unless the database is at this package's head revision."""
        return Op(
            "reading the schema version",
            write=False,
            fn=lambda c: _at_head(_migrate.current_revision(c)),
        )

    def rebuild(
        self, progress: Callable[[int, int], None] | None = None, *, tenant: str | None = None
    ) -> Op[int]:
        """Recompute every materialized view from the events; return the view count.

        It runs in one transaction: readers see the old views until it commits.
        `progress(done, total)` is called as it goes; `tenant` rebuilds only the
        views of that tenant's conversations.
        """
        if tenant is not None:
            _log.check_text(tenant, "tenant")
        return Op(
            "rebuilding views" if tenant is None else f"rebuilding the views of tenant '{tenant}'",
            write=True,
            fn=lambda c: projector.rebuild_views(c, progress=progress, tenant=tenant),
        )

    def claim_stale_runs(
        self,
        *,
        owner: str,
        limit: int = 10,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        run_id: str | None = None,
    ) -> Op[list[tuple[Run, RunCursor]]]:
        """Claim stale runs of every tenant (for a resume worker serving them all); only
        the run `run_id` when given (`chatledger resume RUN_ID`)."""
        return _claim_op(None, owner, limit, lease_seconds, max_attempts, run_id)

    def verify(
        self,
        progress: Callable[[Verification], None] | None = None,
        *,
        recompute: Recompute = "auto",
    ) -> Op[list[Verification]]:
        """Recompute the hash chain of every conversation of every tenant.

        `recompute` says where the hashes are computed: `"auto"` (in SQL on
        Postgres, fastest; here on SQLite), `"database"`, or `"client"` (in
        this process, independent of the server's own functions).
        """
        return _verify_op(None, progress, recompute)


def _verify_op(
    tenant: str | None, progress: Callable[[Verification], None] | None, recompute: Recompute
) -> Op[list[Verification]]:
    """Verify every conversation of `tenant` (None: of every tenant)."""
    return Op(
        "verifying hash chains",
        write=False,
        replica=True,  # the chains as of a moment ago (docs/adr/0023-read-replicas.md)
        fn=lambda c: _verify.verify_many(c, tenant, None, progress, recompute),
    )


def _claim_op(
    tenant: str | None,
    owner: str,
    limit: int,
    lease_seconds: float,
    max_attempts: int,
    run_id: str | None,
) -> Op[list[tuple[Run, RunCursor]]]:
    """Claim stale runs of `tenant` (None: of every tenant); only `run_id` when given."""
    return Op(
        "claiming stale runs",
        write=True,
        fn=lambda c: _runs.claim_stale_runs(
            c,
            tenant,
            owner=owner,
            limit=limit,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            run_id=run_id,
        ),
    )


def _at_head(current: str | None) -> None:
    head = _migrate.HEAD
    if current != head:
        raise SchemaError(
            f"The database is at schema revision {current or 'none'}, but this chatledger "
            f"needs {head}. Run `store.migrate()` or `chatledger migrate`."
        )


def _check_position(value: object, what: str) -> None:
    if isinstance(value, Position):
        check_id(value.branch_id, "branch")
        check_int(value.position, f"{what} position", minimum=0, maximum=MAX_INT32)
    elif not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInputError(f"{what} must be a position (an int or a Position), not {value!r}.")
    else:
        check_int(value, what, minimum=0, maximum=MAX_INT32)


def _expected(expected: int | Position | Expected | None) -> Expected:
    """An operation's `expected`, as an `Expected` (a bare head is one), its state checked."""
    if not isinstance(expected, Expected):
        return Expected(head=expected)
    if expected.state is not None:
        if not isinstance(expected.state, Mapping):
            raise InvalidInputError(
                f"Expected's state must be a dict of the state fields to compare, not "
                f"{type(expected.state).__name__}."
            )
        _entries.encode_state(dict(expected.state), "expected state")
    return expected


def _subject_needs(subject: str | None, seal: Seal) -> Seal:
    """`seal`, refusing a `subject` that nothing will seal under (no key-encryption key)."""
    if subject is not None and not seal.sealed:
        raise EncryptionError(
            f"Subject '{subject}' groups sealed conversations, and this store seals nothing: "
            f"open it with a key-encryption key (Store.open(kek=...) or CHATLEDGER_KEK)."
        )
    return seal


def _new_conversation(create: object) -> NewConversation | None:
    """`append_messages`'s `create`, checked: the conversation to create, if any."""
    if create is True:
        return NewConversation()
    if create is False:
        return None
    if not isinstance(create, NewConversation):
        raise InvalidInputError(
            f"create is True, False or a NewConversation(metadata=..., subject=...), "
            f"not {create!r}."
        )
    return create


def _as_message(value: Message | dict[str, Any]) -> Message:
    return value if isinstance(value, Message) else load_message(value)


def completed(result: tuple[Conversation | None, ConflictError | None]) -> Conversation:
    """The conversation a completed run moved the head of, or the run's conflict, raised.

    Raised here, after the transaction committed, because the transaction
    that finds the conflict also records the run as failed at stage `conflict`.
    """
    conversation, conflict = result
    if conflict is not None:
        raise conflict
    assert conversation is not None
    return conversation
