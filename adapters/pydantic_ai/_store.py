"""`LedgerConversationStore`: pydantic-ai's `ConversationStore` over a chatledger ledger.

pydantic-ai keeps a conversation as entries linked by parent ids, a record
that points at the newest, and a revision that changes on every save. Here:

- a pydantic-ai conversation is a chatledger conversation whose key is its
  `conversation_id` (`create_conversation(key=...)`); a fork is a chatledger
  fork, nothing copied;
- an entry is the group of chatledger messages its `ModelMessage` becomes
  (`adapters.pydantic_ai._translate`), and its id, minted by pydantic-ai, is
  the event id of the group's last message (`append_messages(ids=...)`), so
  `read_entry` finds it by that id alone;
- the record (usage, deferred tool requests, scope, branches, revision, the
  head entry) is the conversation's chatledger state, and every write is one
  chatledger transaction that compare-and-sets its revision
  (`Expected(state=...)`) with the messages it appends: a save appends at the head,
  or after an earlier entry when the history was rewritten (the old tail stays
  in the log, on its branch); `branch` is a head move; a save with no new
  message changes the state alone;
- `delete_record` hides the conversation (its record becomes null) and keeps
  its log: chatledger's log is append-only, and erasure is a separate
  capability.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic_ai.conversation import Conversation as PydanticConversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.run import AgentRunResult

from chatledger.adapters._handles import require_async_ledger
from chatledger.adapters.pydantic_ai._translate import (
    from_messages,
    group_sizes,
    group_start,
    to_messages,
)
from chatledger.store import (
    AsyncLedger,
    ConflictError,
    Conversation,
    Entry,
    Expected,
    NotFoundError,
    Position,
    new_id,
)

__all__ = ["LedgerConversationStore"]

REVISION = "pydanticAiRevision"
"""The state field holding the record's revision (null once the record is deleted)."""
RECORD = "pydanticAiRecord"
"""The state field holding the record itself, as JSON (null once deleted)."""

_RECORD = pydantic.TypeAdapter(ConversationRecord)
_PAGE = 200
_SEEN = 1024
"""How many conversations' last seen records a store keeps (see `save`)."""

_SAVING: ContextVar[tuple[str, str | None] | None] = ContextVar("_SAVING", default=None)
"""The conversation a `save` in this task saves, and the revision it saves from."""


@dataclass(frozen=True)
class _Seen:
    """A conversation as this store last read or wrote it."""

    ledger_id: str | None
    """The chatledger conversation (None: there is none)."""
    revision: Any
    """The state's revision field as stored: what the next write compares and sets."""
    record: ConversationRecord | None
    """The record (None: never saved, or deleted)."""
    head: Position | None = None
    """The chatledger head as this store's last write left it (None: not known to
    be this store's: another writer may have written since)."""


class LedgerConversationStore(ConversationStore):
    """pydantic-ai's `ConversationStore`, kept in a chatledger tenant's log.

    ```python
    store = AsyncStore.open("sqlite:///chat.db")
    conversations = LedgerConversationStore(store.tenant("acme"))
    conversation = await conversations.load(cid) or Conversation(conversation_id=cid)
    result = await agent.run("Hello", conversation=conversation)
    await conversations.save(result)
    ```

    Messages appended to the same conversation through chatledger itself (its
    engine, `append_messages`) are not part of the record's history: the
    next save goes after the store's own last entry, on a branch of its own.
    """

    def __init__(self, ledger: AsyncLedger) -> None:
        self.ledger = require_async_ledger(ledger, type(self).__name__)
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    async def save(
        self,
        conversation: PydanticConversation | AgentRunResult[Any],
        *,
        scope: str | None = None,
    ) -> list[ConversationEntry]:
        """pydantic-ai's `save`, one database round trip for a conversation this store
        last read or wrote at the revision it is saved from.

        The base class reads the record to compare revisions, then writes. A
        record at a revision is the same record wherever it is read (every
        write mints a new revision), so the one this store last saw at that
        revision stands in for the read; if the stored revision has moved on
        since, the write's own compare-and-set fails, as the read would have.
        """
        target = (
            conversation.conversation if isinstance(conversation, AgentRunResult) else conversation
        )
        token = _SAVING.set((target.conversation_id, target.revision))
        try:
            return await super().save(conversation, scope=scope)
        finally:
            _SAVING.reset(token)

    # -- records -----------------------------------------------------------------------

    async def _unsaved_after_history(
        self,
        record: ConversationRecord | None,
        conversation_id: str,
        messages: list[ModelMessage],
        branches: list[str],
        *,
        window: int | None,
    ) -> tuple[str | None, list[ModelMessage], list[str]]:
        """pydantic-ai's comparison of a save without a boundary with the stored history,
        made on the messages as this store keeps them: as JSON gives them back.

        The stored history is read back from JSON, so a message an app kept (a
        tool's result that was a tuple, `bytes`, a dataclass) is not `==` to
        its stored copy, though storing it again would store the same thing.
        Compared in the stored form, messages the store already has are
        recognised whichever way the caller holds them (a serialized copy or
        the objects it kept), and only what differs once stored is a rewrite.
        The messages stored are the caller's own.
        """
        as_kept = ModelMessagesTypeAdapter.validate_json(
            ModelMessagesTypeAdapter.dump_json(messages)
        )
        parent_id, unsaved, left = await super()._unsaved_after_history(
            record, conversation_id, as_kept, branches, window=window
        )
        return parent_id, messages[len(messages) - len(unsaved) :], left

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        seen = self._seen.get(conversation_id)
        saving = _SAVING.get()
        if (
            seen is not None
            and seen.record is not None
            and saving == (conversation_id, seen.record.revision)
        ):
            return seen.record
        return self._remember(conversation_id, await self._conversation(conversation_id)).record

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        records: list[ConversationRecord] = []
        before: str | None = None
        while True:
            page = await self.ledger.conversations(limit=_PAGE, before=before)
            for conv in page:
                record = _record(conv)
                if record is not None and (scope is None or record.scope == scope):
                    records.append(record)
            if len(page) < _PAGE:
                break
            before = page[-1].id
        records.sort(key=lambda r: r.updated_at, reverse=True)
        return records if limit is None else records[:limit]

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        cid = record.conversation_id
        seen = self._seen.get(cid)
        if seen is None or (seen.record.revision if seen.record else None) != expected_revision:
            seen = self._remember(cid, await self._conversation(cid))
        stored = seen.record
        if (stored.revision if stored is not None else None) != expected_revision:
            raise ConversationConflict(cid)
        # The compare-and-set: the revision field as read (absent for a new
        # conversation, set but with no record after a delete), checked in
        # the transaction that writes.
        expected = {REVISION: seen.revision}
        state = {
            REVISION: record.revision,
            RECORD: _RECORD.dump_python(record, mode="json", exclude_defaults=True),
        }
        self._seen.pop(cid, None)  # known again only once the write succeeds
        if seen.ledger_id is not None and stored is None and record.forked_from is not None:
            # A fork onto the id of a deleted conversation: chatledger keeps the
            # deleted one's log under that key, and a fork is a new conversation.
            raise ConversationConflict(cid)
        try:
            if seen.ledger_id is None and record.forked_from is not None and not new_entries:
                ledger_id, head = await self._fork(record, state)
            else:
                ledger_id = seen.ledger_id or (await self._create(cid)).id
                if new_entries:
                    head = await self._append(ledger_id, seen, new_entries, state, expected)
                elif record.head_id != (stored.head_id if stored is not None else None):
                    to = await self._after(record.head_id)
                    moved = await self.ledger.move_head(
                        ledger_id, to, state=state, expected=Expected(state=expected)
                    )
                    head = moved.head
                else:
                    changed = await self.ledger.append_messages(
                        ledger_id, [], state=state, expected=Expected(state=expected)
                    )
                    head = changed.head
        except ConflictError as error:
            raise ConversationConflict(cid) from error
        except NotFoundError as error:  # the head names an entry the store does not have
            raise ConversationConflict(cid) from error
        self._keep(cid, _Seen(ledger_id, record.revision, record, head))

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        self._seen.pop(conversation_id, None)
        conv = await self._conversation(conversation_id)
        stored = None if conv is None else _record(conv)
        if conv is None or stored is None or stored.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        try:
            await self.ledger.append_messages(
                conv.id,
                [],
                state={REVISION: new_id(), RECORD: None},
                expected=Expected(state={REVISION: expected_revision}),
            )
        except ConflictError as error:
            raise ConversationConflict(conversation_id) from error

    # -- entries -----------------------------------------------------------------------

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        history = await self.read_history(entry_id, limit=1)
        return history[-1]

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        if head_id is None or limit == 0:
            return []
        # A missing entry is a NotFoundError, a LookupError, as pydantic-ai expects.
        head = await self.ledger.entry(head_id)
        if limit is None:
            found = await self.ledger.entries(head.conversation_id, at=head.position)
            return _entries(found, None)
        # The last `limit` entries are groups of messages: read a window of
        # messages (and the one before it, the parent of its first entry),
        # widening it until it holds `limit` whole groups or the whole history.
        window = 4 * limit + 8
        while True:
            found = await self.ledger.entries(
                head.conversation_id, at=head.position, last=window + 1
            )
            if len(found) <= window:
                return _entries(found, None)[-limit:]
            messages = found[1:]
            drop = group_start([e.message for e in messages])
            entries = _entries(messages[drop:], messages[drop - 1] if drop else found[0])
            if len(entries) >= limit:
                return entries[-limit:]
            window *= 4

    # -- the writes ----------------------------------------------------------------------

    def _remember(self, conversation_id: str, conv: Conversation | None) -> _Seen:
        seen = (
            _Seen(None, None, None)
            if conv is None
            else _Seen(conv.id, conv.state.get(REVISION), _record(conv))
        )
        self._keep(conversation_id, seen)
        return seen

    def _keep(self, conversation_id: str, seen: _Seen) -> None:
        self._seen[conversation_id] = seen
        self._seen.move_to_end(conversation_id)
        while len(self._seen) > _SEEN:
            self._seen.popitem(last=False)

    async def _conversation(self, conversation_id: str) -> Conversation | None:
        try:
            return await self.ledger.conversation_by_key(conversation_id)
        except NotFoundError:
            return None

    async def _create(self, conversation_id: str) -> Conversation:
        try:
            return await self.ledger.create_conversation(key=conversation_id)
        except ConflictError:
            # Created by a concurrent first save: the revision check decides.
            return await self.ledger.conversation_by_key(conversation_id)

    async def _fork(
        self, record: ConversationRecord, state: dict[str, Any]
    ) -> tuple[str, Position]:
        """A fork's first record: a chatledger fork at its head entry, then its state."""
        if record.head_id is None:
            conv = await self._create(record.conversation_id)
        else:
            # The conversation whose log holds the entry: its position is one of its own.
            at = await self.ledger.entry(record.head_id)
            conv = await self.ledger.fork(
                at.conversation_id, at=at.position, key=record.conversation_id
            )
        changed = await self.ledger.append_messages(
            conv.id, [], state=state, expected=Expected(state={REVISION: None})
        )
        return conv.id, changed.head

    async def _append(
        self,
        ledger_id: str,
        seen: _Seen,
        new_entries: Sequence[ConversationEntry],
        state: dict[str, Any],
        expected: dict[str, Any],
    ) -> Position:
        """Append the new entries, and return where the head is then.

        Entries that extend the stored history go at the chatledger head only
        while that head is still where this store's history ends: a message
        another writer appended through chatledger meanwhile is not part of
        this history, so the entries then go after their parent entry (on a
        branch of their own), and the other writer's messages stay in the log.
        """
        messages, ids = [], []
        for entry in new_entries:
            group = to_messages(entry.message)
            messages += group
            ids += [new_id() for _ in group[:-1]] + [entry.id]
        parent = new_entries[0].parent_id
        stored = seen.record
        head = None
        if stored is not None and parent is not None and parent == stored.head_id:
            head = seen.head if seen.head is not None else await self._ours(ledger_id, parent)
        if head is not None:
            try:
                appended = await self.ledger.append_messages(
                    ledger_id,
                    messages,
                    ids=ids,
                    expected=Expected(head=head, state=expected),
                    state=state,
                )
                return appended.head
            except ConflictError as error:
                if error.expected is None:  # the revision: another save came first
                    raise
                # Another writer moved the head: go after the parent entry instead.
        after = await self._after(parent)
        appended = await self.ledger.append_messages(
            ledger_id,
            messages,
            ids=ids,
            after=after,
            state=state,
            expected=Expected(state=expected),
        )
        return appended.head

    async def _ours(self, ledger_id: str, head_entry: str) -> Position | None:
        """The head's position when the last message at the head is `head_entry`."""
        conv = await self.ledger.conversation(ledger_id)
        last = await self.ledger.entries(ledger_id, last=1)
        return conv.head if last and last[0].event_id == head_entry else None

    async def _after(self, entry_id: str | None) -> int | Position:
        """Where the history that ends at `entry_id` (None: empty) ends, as a position
        of the conversation's log."""
        if entry_id is None:
            return 1  # position 1 of the head's lineage: the first conversation's creation
        # Its own position, also for an entry of a fork's source: chatledger
        # takes a position a fork shares with its source as one of the fork's.
        return (await self.ledger.entry(entry_id)).position


def _record(conv: Conversation) -> ConversationRecord | None:
    data = conv.state.get(RECORD)
    return None if data is None else _RECORD.validate_python(data)


def _entries(found: Sequence[Entry], before: Entry | None) -> list[ConversationEntry]:
    """The pydantic-ai entries that the chatledger entries `found` (whole groups) hold."""
    messages = from_messages([e.message for e in found])
    entries: list[ConversationEntry] = []
    parent = None if before is None else before.event_id
    end = 0
    for size, message in zip(group_sizes([e.message for e in found]), messages, strict=True):
        end += size
        entry = ConversationEntry(id=found[end - 1].event_id, parent_id=parent, message=message)
        entries.append(entry)
        parent = entry.id
    return entries
