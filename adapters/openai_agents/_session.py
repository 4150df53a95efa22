"""`ChatledgerSession`: the OpenAI Agents SDK's `Session` over a chatledger ledger.

- A session is the chatledger conversation whose key is its `session_id`
  (`create_conversation(key=...)`), created by its first `add_items`.
- Items become chatledger messages (`adapters.openai_agents._translate`): one
  model response's items one assistant message, each tool output one tool
  message, each input message one message, every item kept verbatim in its
  message's `native` field. `get_items(limit)` counts items, not messages.
- `add_items` is one `append_messages` at the head: concurrent writers land
  one after the other, never interleaved within a call.
- `pop_item` and `clear_session` are head moves, by compare-and-set on the
  head (retried when another writer moved it first): nothing is deleted, and
  what they removed stays readable on its branch. Popping one item of a
  message that holds several re-appends the rest in the same transaction.
- `fork` and `rewind` do what the SDK has no verb for.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chatledger.adapters._handles import require_async_ledger
from chatledger.adapters.openai_agents._translate import from_messages, item_count, to_messages
from chatledger.store import AsyncLedger, ConflictError, Entry, NotFoundError, Position

if TYPE_CHECKING:
    from agents.memory.session_settings import SessionSettings
    from agents.run_context import RunContextWrapper

__all__ = ["ChatledgerSession"]

Item = dict[str, Any]

_RETRIES = 32


class ChatledgerSession:
    """The OpenAI Agents SDK's `Session`, kept in a chatledger tenant's log.

    ```python
    store = AsyncStore.open("sqlite:///chat.db")
    session = ChatledgerSession("user-7", store.tenant("acme"))
    result = await Runner.run(agent, "Hello", session=session)
    ```

    With `tenant=`, a function of the run context, the SDK's runner passes
    each call its run context and the session works in the ledger that
    function returns (say `lambda wrapper: store.tenant(wrapper.context.org)`);
    without a run context (a call outside a run) it uses `ledger`.
    """

    def __init__(
        self,
        session_id: str,
        ledger: AsyncLedger,
        *,
        session_settings: SessionSettings | None = None,
        tenant: Callable[[RunContextWrapper[Any]], AsyncLedger] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.ledger = require_async_ledger(ledger, type(self).__name__)
        self._tenant = tenant
        self._ids: dict[str, str] = {}  # tenant -> chatledger conversation id
        # (tenant, run) -> the head position this run last saw or left: a run's
        # writes are compared with it, so two runs on one session never
        # interleave (see `add_items`).
        self._runs: dict[tuple[str, int], Position | int] = {}

    # -- the Session protocol ---------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[Item]:
        """The session's items, oldest first; only the latest `limit` with it."""
        ledger = self._ledger(wrapper)
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        conversation_id = await self._conversation(ledger)
        if wrapper is not None:  # a run reads the session: what its writes build on
            # (position 1, `conversation.created`, for a session not created yet)
            head: Position | int = 1
            if conversation_id is not None:
                head = (await ledger.conversation(conversation_id)).head
            self._saw(wrapper, ledger, head)
        if conversation_id is None or limit == 0:
            return []
        # Every message holds at least one item: the last `limit` messages
        # hold the last `limit` items.
        entries = await ledger.entries(conversation_id, last=limit)
        items = from_messages([e.message for e in entries])
        return items if limit is None else items[-limit:]

    async def add_items(
        self, items: list[Item], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append `items` at the head, in one transaction.

        Within a run (the runner passes its `wrapper`), the append expects the
        head where this run's last read or write left it: when another run
        wrote to the session meanwhile, this run's items are refused with a
        `ConflictError` and nothing of them is stored, so two runs on one
        session land one after the other or one of them fails; never
        interleaved.
        """
        if not items:
            return
        ledger = self._ledger(wrapper)
        messages = to_messages(items)
        conversation_id = await self._conversation(ledger, create=True)
        assert conversation_id is not None
        expected = None if wrapper is None else self._runs.get(_run(ledger, wrapper))
        try:
            appended = await ledger.append_messages(conversation_id, messages, expected=expected)
        except ConflictError as error:
            if expected is None or error.expected is None:
                raise
            raise ConflictError(
                f"Session {self.session_id!r} changed since this run read it: another run or "
                f"writer added to it or moved its head since this run left it at "
                f"{_where(expected)}. This run's new items were not stored; run it again to continue "
                f"from the session as it is now.",
                conversation_id=conversation_id,
                expected=error.expected,
                actual=error.actual,
            ) from error
        if wrapper is not None:
            self._saw(wrapper, ledger, appended.head)

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> Item | None:
        """Remove the latest item and return it; None when the session is empty."""
        ledger = self._ledger(wrapper)
        conversation_id = await self._conversation(ledger)
        if conversation_id is None:
            return None
        for _ in range(_RETRIES):
            conv = await ledger.conversation(conversation_id)
            last = await ledger.entries(conversation_id, last=1)
            if not last:
                return None
            items = from_messages([last[0].message])
            before = last[0].position.position - 1
            try:
                if len(items) == 1:
                    head = (
                        await ledger.move_head(conversation_id, before, expected=conv.head)
                    ).head
                else:
                    head = (
                        await ledger.append_messages(
                            conversation_id,
                            to_messages(items[:-1]),
                            after=before,
                            expected=conv.head,
                        )
                    ).head
            except ConflictError:
                continue  # another writer moved the head first: pop from where it is now
            if wrapper is not None:
                self._saw(wrapper, ledger, head)
            return items[-1]
        raise ConflictError(
            f"Session {self.session_id!r} kept changing while an item was popped "
            f"({_RETRIES} tries). Retry when its writers are quieter.",
            conversation_id=conversation_id,
        )

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Empty the session's history (its log keeps what it held, on its branch)."""
        ledger = self._ledger(wrapper)
        conversation_id = await self._conversation(ledger)
        if conversation_id is None:
            return
        if await ledger.entries(conversation_id, last=1):
            cleared = await ledger.move_head(conversation_id, 1)
            if wrapper is not None:
                self._saw(wrapper, ledger, cleared.head)

    # -- what the SDK has no verb for -------------------------------------------------

    async def rewind(self, keep: int, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Keep only the first `keep` items; the rest stay in the log, on their branch."""
        ledger = self._ledger(wrapper)
        conversation_id = await self._conversation(ledger)
        if conversation_id is None:
            return
        conv = await ledger.conversation(conversation_id)
        entries = await ledger.entries(conversation_id)
        at, rest = _cut(entries, keep)
        if rest:
            head = (
                await ledger.append_messages(
                    conversation_id, to_messages(rest), after=at, expected=conv.head
                )
            ).head
        else:
            head = (await ledger.move_head(conversation_id, at, expected=conv.head)).head
        if wrapper is not None:
            self._saw(wrapper, ledger, head)

    async def fork(
        self,
        session_id: str,
        *,
        keep: int | None = None,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> ChatledgerSession:
        """A new session `session_id` holding this one's first `keep` items (all by
        default), sharing them in the log rather than copying them."""
        ledger = self._ledger(wrapper)
        conversation_id = await self._conversation(ledger)
        forked = ChatledgerSession(
            session_id, ledger, session_settings=self.session_settings, tenant=self._tenant
        )
        if conversation_id is None:  # nothing to share: the new session starts empty
            try:
                await ledger.conversation_by_key(session_id)
            except NotFoundError:
                return forked
            raise ConflictError(
                f"Session {session_id!r} exists already. Fork to a new session id.",
                conversation_id="",
            )
        entries = await ledger.entries(conversation_id)
        at, rest = _cut(
            entries, len(from_messages([e.message for e in entries])) if keep is None else keep
        )
        conv = await ledger.fork(conversation_id, at=at, key=session_id)
        if rest:
            await ledger.append_messages(conv.id, to_messages(rest))
        return forked

    # -- plumbing ----------------------------------------------------------------------

    def _saw(
        self, wrapper: RunContextWrapper[Any], ledger: AsyncLedger, head: Position | int
    ) -> None:
        """Remember where `wrapper`'s run last saw the head, until the run is gone."""
        key = _run(ledger, wrapper)
        if key not in self._runs:
            weakref.finalize(wrapper, self._runs.pop, key, None)
        self._runs[key] = head

    def _ledger(self, wrapper: RunContextWrapper[Any] | None) -> AsyncLedger:
        if wrapper is not None and self._tenant is not None:
            return self._tenant(wrapper)
        return self.ledger

    async def _conversation(self, ledger: AsyncLedger, *, create: bool = False) -> str | None:
        """The chatledger conversation of this session in `ledger`'s tenant."""
        known = self._ids.get(ledger.tenant)
        if known is not None:
            return known
        try:
            found = (await ledger.conversation_by_key(self.session_id)).id
        except NotFoundError:
            if not create:
                return None
            try:
                found = (await ledger.create_conversation(key=self.session_id)).id
            except ConflictError:  # created by a concurrent first add
                found = (await ledger.conversation_by_key(self.session_id)).id
        self._ids[ledger.tenant] = found
        return found


def _where(head: Position | int | None) -> str:
    return f"{head.branch_id}:{head.position}" if isinstance(head, Position) else str(head)


def _run(ledger: AsyncLedger, wrapper: RunContextWrapper[Any]) -> tuple[str, int]:
    """A run of a tenant: its context wrapper lives as long as the run."""
    return ledger.tenant, id(wrapper)


def _cut(entries: list[Entry], keep: int) -> tuple[int, list[Item]]:
    """Where a history of `entries` cut after `keep` items ends, and the items of a
    message the cut splits (to append after that point)."""
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}.")
    held = 0
    for i, entry in enumerate(entries):
        count = item_count(entry.message)
        if held + count > keep:
            # Positions on the head's lineage, as ints: a fork's first entries
            # are its source's, on branches of the source.
            return (entries[i - 1].position.position if i else 1), from_messages([entry.message])[
                : keep - held
            ]
        held += count
    return (entries[-1].position.position if entries else 1), []
