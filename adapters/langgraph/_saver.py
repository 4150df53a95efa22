"""`Saver`: LangGraph's checkpointer (`BaseCheckpointSaver`) over a chatledger tenant.

- Each `(thread_id, checkpoint_ns)` is the chatledger conversation whose key is
  `langgraph:["<thread_id>","<checkpoint_ns>"]`, created by its first write.
  Its log holds the messages of the `messages` channel, each once, projected
  into chatledger messages (`_translate`), and one record per checkpoint
  (`_records`), each a conversation state change.
- A `put` is one `append_messages`: the messages the checkpoint adds, then its
  record, by compare-and-set on the state's `tip` (the checkpoint the head's line
  ends with) when its parent is there; otherwise after its parent's record, which
  opens a branch (time travel, `update_state` from an old checkpoint). So every
  checkpoint's history is its parent's plus what it added. A `put` reads nothing
  when the saver knows the parent's messages (it put or loaded that checkpoint).
- A `put_writes` is a record naming its checkpoint, in the conversation keyed
  `langgraph-writes:["<thread_id>","<checkpoint_ns>"]`: LangGraph saves a step's
  writes in the background while it puts the next checkpoint, which so waits
  for no write. (A thread written before keeps its earlier writes as records of
  its own conversation; reads take both.)
- Reads (`get_tuple`, `list`) read the two conversations' state changes and the
  messages of the checkpoint's history, and rebuild each checkpoint from them;
  a saver keeps the records while the conversations' heads stand, and the
  messages (which never change but for an erasure) while it keeps the records
  of their conversation (ADR 0049, 0052).
- `delete_thread`, `delete_for_runs` and `prune` hide checkpoints (the log is
  append-only; `delete_thread` their writes too); `copy_thread` forks each
  namespace's two conversations, sharing the log. Erasing the thread's subject
  (`Ledger.erase`) erases its messages, and the thread reads as absent.

One program per operation, written once: a generator that yields the ledger
calls it makes, driven by `_drive` for a `Ledger` and `_adrive` for an
`AsyncLedger`.
"""

from __future__ import annotations

import json
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from chatledger.adapters._handles import require_ledger
from chatledger.adapters.langgraph._records import (
    NO_MESSAGES,
    Memo,
    Messages,
    Thread,
    encode_put,
    encode_writes,
    read_thread,
)
from chatledger.adapters.langgraph._translate import from_message, to_message
from chatledger.store import (
    Appended,
    AsyncLedger,
    ConflictError,
    ErasedError,
    Event,
    Expected,
    InvalidInputError,
    Ledger,
    Message,
    NotFoundError,
    Position,
)
from chatledger.store.ids import is_id

__all__ = ["Saver"]

T = TypeVar("T")
List = list  # `Saver.list` is LangGraph's method: inside the class, the builtin by this name
_PREFIX = "langgraph:"
_WRITES = "langgraph-writes:"  # a thread's pending writes: a conversation beside its own
_RETRIES = 32
_KEPT = 256  # messages lists remembered, for puts that follow a checkpoint this saver saw
_THREADS_KEPT = 128  # conversations whose records are kept (two a thread), the last used
_MESSAGES_KEPT = 20_000  # stored messages kept across reads, of those conversations
_UNSEEN: Any = object()  # a checkpoint whose messages list the saver does not know


@dataclass(frozen=True)
class _Call:
    """One ledger call a program makes: the method's name and its arguments."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Program = Generator[_Call, Any, T]


def _call(name: str, *args: Any, **kwargs: Any) -> Program[Any]:
    return (yield _Call(name, args, kwargs))


def _drive(ledger: Ledger, program: Program[T]) -> T:
    """Run `program` on a sync ledger: each call's result (or error) is sent back in."""
    try:
        call = next(program)
        while True:
            try:
                result = getattr(ledger, call.name)(*call.args, **call.kwargs)
            except Exception as error:
                call = program.throw(error)
            else:
                call = program.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _adrive(ledger: AsyncLedger, program: Program[T]) -> T:
    """`_drive` for an async ledger."""
    try:
        call = next(program)
        while True:
            try:
                result = await getattr(ledger, call.name)(*call.args, **call.kwargs)
            except Exception as error:
                call = program.throw(error)
            else:
                call = program.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Kept:
    """A conversation's records as of its `head`, and the state changes this saver
    appended after them (taken in by the next read)."""

    head: Position
    thread: Thread
    later: tuple[Event, ...] = ()


class _Erased(Exception):
    """A thread whose messages read as erased markers: its subject was erased."""


class _Unread(Exception):
    """A message the saver has not kept: the history is read from the log."""


def _key(thread_id: str, namespace: str, prefix: str = _PREFIX) -> str:
    return prefix + json.dumps([thread_id, namespace], ensure_ascii=False, separators=(",", ":"))


def _unkey(key: str | None) -> tuple[str, str] | None:
    if key is None or not key.startswith(_PREFIX):
        return None
    try:
        thread_id, namespace = json.loads(key[len(_PREFIX) :])
    except ValueError:
        return None
    return str(thread_id), str(namespace)


def _thread_of(config: RunnableConfig) -> tuple[str, str]:
    """The `(thread_id, checkpoint_ns)` a config names."""
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))


def _config(thread_id: str, namespace: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": namespace,
            "checkpoint_id": checkpoint_id,
        }
    }


class Saver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer, kept in a chatledger tenant's log.

    ```python
    store = AsyncStore.open("postgresql+psycopg://...")
    graph = builder.compile(checkpointer=Saver(store.tenant("acme")))
    await graph.ainvoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}})
    ```

    Built from an `AsyncLedger` it serves the async methods (`ainvoke`,
    `astream`); from a `Ledger`, the sync ones (`invoke`, `stream`).

    Args:
        ledger: the tenant's handle; every thread lives in its tenant.
        serde: LangGraph's serializer for channel values and the messages' native
            copies (default: `JsonPlusSerializer`).
        messages: the channel whose messages are stored once each (the
            `add_messages` channel of `MessagesState`).
        subject: on a store with a key-encryption key, the erasure subject of a
            thread's conversations, as a function of its thread id
            (`lambda thread_id: thread_id`, or the user the thread belongs to):
            `ledger.erase(subject)` then erases every namespace of the thread.
            By default each conversation is a subject of its own.
    """

    def __init__(
        self,
        ledger: Ledger | AsyncLedger,
        *,
        serde: SerializerProtocol | None = None,
        messages: str = "messages",
        subject: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.ledger = require_ledger(ledger, type(self).__name__)
        self.channel = messages
        self._subject = subject
        self._ids: dict[str, str] = {}  # conversation key -> id
        self._tips: dict[str, str | None] = {}  # conversation id -> its head's tip, last seen
        # conversation id -> its records as of a head (reads skip them while it stands)
        self._threads: OrderedDict[str, _Kept] = OrderedDict()
        self._keeping = threading.Lock()  # over what is kept: `_threads`, `_stored`, `_lists`
        # conversation id -> its stored messages by (branch, position), while its records
        # are kept: a position's message never changes, but for an erasure, which the
        # records' head check sees (ADR 0052)
        self._stored: OrderedDict[str, dict[tuple[str, int], Message]] = OrderedDict()
        self._stored_count = 0
        self._turns = [threading.Lock() for _ in range(64)]  # a thread's writes take turns
        # (conversation id, checkpoint id) -> its messages list, as the graph holds it
        # (None: its channel holds something else)
        self._lists: OrderedDict[tuple[str, str], Messages | None] = OrderedDict()

    # -- the faces -----------------------------------------------------------------------

    def _sync(self, program: Program[T], method: str, writes_to: str | None = None) -> T:
        if not isinstance(self.ledger, Ledger):
            raise TypeError(
                f"This Saver was built from an AsyncLedger, which serves the async methods; "
                f"{method} is sync. Call a{method} (graph.ainvoke, astream), or build the "
                f"saver from a Ledger (Store.open(...).tenant(name)) for sync graphs."
            )
        if writes_to is None:
            return _drive(self.ledger, program)
        # A graph saves its tasks' writes from several threads at once. Appends to one
        # conversation take turns in the database anyway; taking them here, a losing
        # append does not find the head moved and go the store's slower way.
        with self._turns[hash(writes_to) % len(self._turns)]:
            return _drive(self.ledger, program)

    async def _async(self, program: Program[T], method: str) -> T:
        if not isinstance(self.ledger, AsyncLedger):
            raise TypeError(
                f"This Saver was built from a Ledger, which serves the sync methods; "
                f"a{method} is async. Call {method} (graph.invoke, stream), or build the "
                f"saver from an AsyncLedger (AsyncStore.open(...).tenant(name)) for async graphs."
            )
        return await _adrive(self.ledger, program)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self._get_tuple(config), "get_tuple")

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._async(self._get_tuple(config), "get_tuple")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return iter(self._sync(self._list(config, filter, before, limit), "list"))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._async(self._list(config, filter, before, limit), "list"):
            yield found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        program = self._put(config, checkpoint, metadata, new_versions)
        return self._sync(program, "put", _key(*_thread_of(config)))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._async(self._put(config, checkpoint, metadata, new_versions), "put")

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        program = self._put_writes(config, writes, task_id, task_path)
        self._sync(program, "put_writes", _key(*_thread_of(config), _WRITES))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._async(self._put_writes(config, writes, task_id, task_path), "put_writes")

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self._delete_thread(str(thread_id)), "delete_thread")

    async def adelete_thread(self, thread_id: str) -> None:
        await self._async(self._delete_thread(str(thread_id)), "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self._delete_for_runs(run_ids), "delete_for_runs")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._async(self._delete_for_runs(run_ids), "delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self._copy_thread(str(source_thread_id), str(target_thread_id)), "copy_thread")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._async(
            self._copy_thread(str(source_thread_id), str(target_thread_id)), "copy_thread"
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self._prune(thread_ids, strategy), "prune")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._async(self._prune(thread_ids, strategy), "prune")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A counter and a random suffix, as LangGraph's own savers make versions: two
        branches never write the same version of a channel."""
        counter = 0 if current is None else int(str(current).split(".")[0])
        return f"{counter + 1:032}.{random.random():016}"

    # -- reading -------------------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig) -> Program[CheckpointTuple | None]:
        thread_id, namespace = _thread_of(config)
        conversation_id = yield from self._conversation(thread_id, namespace)
        if conversation_id is None:
            return None
        thread = yield from self._thread(conversation_id)
        checkpoint_id = get_checkpoint_id(config) or thread.latest()
        if checkpoint_id is None or checkpoint_id not in thread.visible:
            return None
        try:
            (found,) = yield from self._tuples(
                conversation_id, thread, thread_id, namespace, [checkpoint_id]
            )
        except _Erased:
            return None
        return found

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Program[List[CheckpointTuple]]:
        if config is None:
            keys = yield from self._every_thread()
        else:
            configurable = config["configurable"]
            thread_id = str(configurable["thread_id"])
            namespace = configurable.get("checkpoint_ns")
            if namespace is None:
                keys = yield from self._namespaces(thread_id)
            else:
                keys = [(thread_id, str(namespace))]
        wanted = None if config is None else get_checkpoint_id(config)
        below = None if before is None else get_checkpoint_id(before)
        # Every thread's matching checkpoints, newest first (by id, as LangGraph's savers
        # order them); then only as many rebuilt as `limit` asks for.
        matches: List[tuple[str, str, str, str, Thread]] = []
        for thread_id, namespace in keys:
            conversation_id = yield from self._conversation(thread_id, namespace)
            if conversation_id is None:
                continue
            thread = yield from self._thread(conversation_id)
            for checkpoint_id in thread.visible:
                if wanted is not None and checkpoint_id != wanted:
                    continue
                if below is not None and not checkpoint_id < below:
                    continue
                if filter and not _matches(thread.puts[checkpoint_id].metadata(self.serde), filter):
                    continue
                matches.append((checkpoint_id, thread_id, namespace, conversation_id, thread))
        matches.sort(key=lambda m: m[0], reverse=True)
        if limit is not None:
            matches = matches[:limit]
        found: List[CheckpointTuple] = []
        # Rebuilt per conversation (one read of its messages), listed in order.
        by_conversation: dict[str, List[str]] = {}
        for checkpoint_id, _, _, conversation_id, _ in matches:
            by_conversation.setdefault(conversation_id, []).append(checkpoint_id)
        built: dict[tuple[str, str], CheckpointTuple | None] = {}
        for checkpoint_id, thread_id, namespace, conversation_id, thread in matches:
            if (conversation_id, checkpoint_id) not in built:
                ids = by_conversation[conversation_id]
                try:
                    tuples = yield from self._tuples(
                        conversation_id, thread, thread_id, namespace, ids
                    )
                except _Erased:  # the thread's subject was erased: it reads as absent
                    built.update({(conversation_id, i): None for i in ids})
                else:
                    built.update({(conversation_id, t.checkpoint["id"]): t for t in tuples})
            listed = built[(conversation_id, checkpoint_id)]
            if listed is not None:
                found.append(listed)
        return found

    def _tuples(
        self,
        conversation_id: str,
        thread: Thread,
        thread_id: str,
        namespace: str,
        checkpoint_ids: List[str],
    ) -> Program[List[CheckpointTuple]]:
        """The checkpoints rebuilt, from the messages kept or with one read of those
        of each history they need (the histories of the newest of them that no
        other continues)."""
        writes = yield from self._writes(thread_id, namespace)

        def rebuilt(message_at: Callable[[Position], BaseMessage]) -> List[Checkpoint]:
            memo: Memo = {}
            return [
                thread.checkpoint(checkpoint_id, self.serde, self.channel, message_at, memo)
                for checkpoint_id in checkpoint_ids
            ]

        checkpoints = yield from self._with_messages(
            conversation_id, thread, checkpoint_ids, rebuilt
        )
        tuples = []
        for checkpoint_id, checkpoint in zip(checkpoint_ids, checkpoints, strict=True):
            put = thread.puts[checkpoint_id]
            if len(checkpoint_ids) == 1:  # what a graph that loads it puts after it
                messages = checkpoint["channel_values"].get(self.channel)
                known = NO_MESSAGES if messages is None else Messages.of(messages)
                self._remember(conversation_id, checkpoint_id, known)
            tuples.append(
                CheckpointTuple(
                    config=_config(thread_id, namespace, checkpoint_id),
                    checkpoint=checkpoint,
                    metadata=put.metadata(self.serde),
                    parent_config=None
                    if put.parent is None
                    else _config(thread_id, namespace, put.parent),
                    pending_writes=thread.pending_writes(checkpoint_id, self.serde, writes),
                )
            )
        return tuples

    def _with_messages(
        self,
        conversation_id: str,
        thread: Thread,
        checkpoint_ids: List[str],
        build: Callable[[Callable[[Position], BaseMessage]], T],
    ) -> Program[T]:
        """`build(message_at)`: from the messages kept for the conversation when they
        hold every one it reads (a thread this saver wrote or read), else from the
        log, with one read of each history `checkpoint_ids` need."""
        kept = self._kept_messages(conversation_id)
        if kept is not None:
            try:
                return build(self._message_at(kept))
            except _Unread:
                pass
        message_at = yield from self._message_reader(conversation_id, thread, checkpoint_ids)
        return build(message_at)

    def _message_at(
        self, stored: dict[tuple[str, int], Message]
    ) -> Callable[[Position], BaseMessage]:
        """The LangChain message at a position, each made anew from its stored form
        (the graph may change what it is handed); `_Unread` for one not there."""
        loaded: dict[tuple[str, int], BaseMessage] = {}

        def message_at(at: Position) -> BaseMessage:
            where = (at.branch_id, at.position)
            if where not in loaded:
                found = stored.get(where)
                if found is None:
                    raise _Unread
                loaded[where] = from_message(found, self.serde)
            return loaded[where]

        return message_at

    def _message_reader(
        self, conversation_id: str, thread: Thread, checkpoint_ids: List[str]
    ) -> Program[Callable[[Position], BaseMessage]]:
        """The LangChain message at each position of the histories of `checkpoint_ids`."""
        needed = [c for c in checkpoint_ids if thread.needs_messages(c, self.channel, self.serde)]
        # A checkpoint on the chain of another needs no read of its own.
        covered = {p.id for c in needed for p in thread.chain(c)[1:]}
        stored: dict[tuple[str, int], Message] = {}
        for checkpoint_id in needed:
            if checkpoint_id in covered:
                continue
            entries = yield from _call(
                "entries", conversation_id, at=thread.puts[checkpoint_id].position
            )
            if any((e.message.model_extra or {}).get("erased") for e in entries):
                raise _Erased
            stored.update({(e.position.branch_id, e.position.position): e.message for e in entries})
        self._keep_messages(conversation_id, stored)
        return self._message_at(stored)

    def _writes(self, thread_id: str, namespace: str) -> Program[Thread | None]:
        """The records of the thread's writes conversation; None before its first write.
        (A thread written before writes had one of their own keeps them in its records.)"""
        conversation_id = yield from self._conversation(thread_id, namespace, writes=True)
        if conversation_id is None:
            return None
        return (yield from self._thread(conversation_id))

    def _thread(self, conversation_id: str) -> Program[Thread]:
        """The conversation's records: those kept, when its head is still where they
        end (every append moves the head), else read anew."""
        conversation = yield from _call("conversation", conversation_id)
        kept = self._threads.get(conversation_id)
        if kept is not None and kept.head == conversation.head and conversation.erased_at is None:
            if kept.later:  # this saver's own appends since: taken in now, once
                thread = kept.thread.copy()  # a reader may hold the one kept
                for event in kept.later:
                    if event.seq > thread.seq:  # not read with the records already
                        thread.add(event)
                kept = _Kept(kept.head, thread)
            self._keep(conversation_id, kept)
            return kept.thread
        thread = read_thread((yield from _call("state_changes", conversation_id)))
        # Nor are a fork's records kept: those it continues from its source
        # are erased with the source's subject, which moves no head of the fork's.
        if conversation.erased_at is None and conversation.forked_from is None:
            # Read after the head: an append in between is read again next time.
            self._keep(conversation_id, _Kept(conversation.head, thread))
        else:
            self._forget(conversation_id)
        return thread

    def _keep(self, conversation_id: str, kept: _Kept) -> None:
        with self._keeping:  # a graph's threads save at once
            self._threads[conversation_id] = kept
            self._threads.move_to_end(conversation_id)
            while len(self._threads) > _THREADS_KEPT:
                self._drop(self._threads.popitem(last=False)[0])

    def _forget(self, conversation_id: str) -> None:
        """Keep nothing of the conversation: its records and its messages."""
        with self._keeping:
            self._threads.pop(conversation_id, None)
            self._drop(conversation_id)

    def _drop(self, conversation_id: str) -> None:
        dropped = self._stored.pop(conversation_id, None)
        if dropped is not None:
            self._stored_count -= len(dropped)

    def _kept_messages(self, conversation_id: str) -> dict[tuple[str, int], Message] | None:
        """The stored messages kept for the conversation, while its records are."""
        with self._keeping:
            found = self._stored.get(conversation_id)
            if found is None or conversation_id not in self._threads:
                return None
            self._stored.move_to_end(conversation_id)
            return found

    def _keep_messages(self, conversation_id: str, found: dict[tuple[str, int], Message]) -> None:
        """Keep `found`, stored messages of the conversation, while its records are kept
        (a read or an append of this saver's), the last used first out."""
        if not found:
            return
        with self._keeping:
            if conversation_id not in self._threads:
                return
            kept = self._stored.setdefault(conversation_id, {})
            self._stored.move_to_end(conversation_id)
            before = len(kept)
            kept.update(found)
            self._stored_count += len(kept) - before
            if len(kept) > _MESSAGES_KEPT // 2:  # a thread that would push out all others
                self._drop(conversation_id)
            while self._stored_count > _MESSAGES_KEPT:
                self._drop(next(iter(self._stored)))

    def _learn(self, conversation_id: str, done: Appended) -> None:
        """The records kept, with the append's own when it followed their head
        (else forgotten: another writer's records may stand between)."""
        kept = self._threads.get(conversation_id)
        if kept is None:
            return
        first = done.events[0] if done.events else None
        if first is None or (first.branch_id, first.position) != (
            kept.head.branch_id,
            kept.head.position + 1,
        ):
            self._forget(conversation_id)
            return
        changes = tuple(e for e in done.events if e.kind == "state.changed")
        self._keep(conversation_id, _Kept(done.head, kept.thread, kept.later + changes))

    def _conversation(
        self, thread_id: str, namespace: str, *, create: bool = False, writes: bool = False
    ) -> Program[str | None]:
        """The id of the conversation of `(thread_id, namespace)`, or with `writes` of
        its pending writes; created with `create`."""
        key = _key(thread_id, namespace, _WRITES if writes else _PREFIX)
        known = self._ids.get(key)
        if known is not None:
            return known
        found: str
        try:
            found = (yield from _call("conversation_by_key", key)).id
        except NotFoundError:
            if not create:
                return None
            if namespace and not writes:  # the root lists the others (`delete_thread`)
                root = yield from self._conversation(thread_id, "", create=True)
                assert root is not None
                yield from self._record(root, {"namespaces": [namespace]})
            if writes:  # sealed and erased with the thread: its subject, whatever it is
                thread = yield from self._conversation(thread_id, namespace, create=True)
                subject = (yield from _call("conversation", thread)).subject
            else:
                subject = None if self._subject is None else self._subject(thread_id)
            try:
                created = yield from _call("create_conversation", key=key, subject=subject)
            except ConflictError:  # created by a concurrent first write
                found = (yield from _call("conversation_by_key", key)).id
            else:
                found = created.id
                self._keep(found, _Kept(created.head, Thread()))  # no records yet
        self._ids[key] = found
        return found

    def _namespaces(self, thread_id: str) -> Program[List[tuple[str, str]]]:
        """The thread's namespaces: the root's and those it lists."""
        root = yield from self._conversation(thread_id, "")
        if root is None:
            return []
        thread = yield from self._thread(root)
        return [(thread_id, ""), *((thread_id, n) for n in thread.namespaces)]

    def _every_thread(self) -> Program[List[tuple[str, str]]]:
        """Every namespace of every thread of the tenant (`list(None)`): a scan."""
        keys: List[tuple[str, str]] = []
        before = None
        while True:
            page = yield from _call("conversations", limit=500, before=before)
            for conv in page:
                found = _unkey(conv.key)
                if found is not None:
                    keys.append(found)
                    self._ids.setdefault(conv.key, conv.id)
            if len(page) < 500:
                return keys
            before = page[-1].id

    # -- writing -------------------------------------------------------------------------

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Program[RunnableConfig]:
        thread_id, namespace = _thread_of(config)
        parent = config["configurable"].get("checkpoint_id")
        conversation_id = yield from self._conversation(thread_id, namespace, create=True)
        assert conversation_id is not None
        thread: Thread | None = None
        parent_messages = (
            NO_MESSAGES if parent is None else self._lists.get((conversation_id, parent), _UNSEEN)
        )
        if parent is not None and parent_messages is _UNSEEN and self.channel in new_versions:
            # A parent this saver has not seen: read its list from the log.
            thread = yield from self._thread(conversation_id)
            parent_messages = yield from self._messages(conversation_id, thread, parent)
        record, added, known = encode_put(
            self.serde,
            checkpoint,
            get_serializable_checkpoint_metadata(config, metadata),
            new_versions,
            parent,
            self.channel,
            None if parent_messages is _UNSEEN else parent_messages,
        )
        messages = [to_message(m, self.serde) for m in added]
        run_id = metadata.get("run_id")
        stamp = str(run_id) if is_id(str(run_id)) else None
        state = {"tip": checkpoint["id"], "put": record}
        try:
            yield from self._append(conversation_id, messages, state, parent, thread, run_id=stamp)
        except InvalidInputError as error:
            raise InvalidInputError(
                f"Checkpoint '{checkpoint['id']}' of thread '{thread_id}' could not be stored: "
                f"{error} A checkpoint's channels other than '{self.channel}' are kept in its "
                f"record, which holds at most a mebibyte of JSON; keep large values out of "
                f"the graph's state (in a store, or as messages)."
            ) from error
        # What the next checkpoint's messages follow from: this one's list, known
        # without looking through it when it is its parent's or was just compared.
        values = checkpoint["channel_values"].get(self.channel)
        if known is None:
            if values is None:  # no list: an empty one, as a read of the log gives
                known = NO_MESSAGES
            elif isinstance(parent_messages, Messages) and values is parent_messages.items:
                known = parent_messages
            else:
                known = Messages.of(values)
        self._remember(conversation_id, checkpoint["id"], known)
        return _config(thread_id, namespace, checkpoint["id"])

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Program[None]:
        thread_id, namespace = _thread_of(config)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        conversation_id = yield from self._conversation(
            thread_id, namespace, create=True, writes=True
        )
        assert conversation_id is not None
        record = encode_writes(self.serde, checkpoint_id, writes, task_id, task_path)
        # In a conversation of their own, which the checkpoints' line does not go
        # through: a `put` does not wait for the writes LangGraph saves beside it.
        yield from self._note(conversation_id, {"writes": record})

    def _append(
        self,
        conversation_id: str,
        messages: List[Any],
        state: dict[str, Any],
        after: str | None,
        thread: Thread | None,
        *,
        run_id: str | None = None,
    ) -> Program[None]:
        """Append `messages` and the record `state` where checkpoint `after`'s line ends:
        at the head when its line is there (the state's `tip`), else right after
        `after`'s record (or, for no checkpoint, after the conversation's creation),
        which opens a branch."""
        try:
            done: Appended = yield from _call(
                "append_messages",
                conversation_id,
                messages,
                state=state,
                expected=Expected(state={"tip": after}),
                run_id=run_id,
            )
        except ConflictError:  # the head's line continues another checkpoint
            if thread is None:
                thread = yield from self._thread(conversation_id)
            put = None if after is None else thread.puts.get(after)
            yield from _call(
                "append_messages",
                conversation_id,
                messages,
                state=state,
                after=1 if put is None else put.position,
                run_id=run_id,
            )
            # Written after a position, not at the head: what stood at the head since
            # the records kept is unknown (another writer's), so they are read again.
            self._forget(conversation_id)
        else:
            self._learn(conversation_id, done)
            recorded = (e for e in done.events if e.kind == "message.recorded")
            self._keep_messages(
                conversation_id,
                {(e.branch_id, e.position): m for e, m in zip(recorded, messages, strict=True)},
            )
        self._tips[conversation_id] = state["tip"]

    def _record(self, conversation_id: str, record: dict[str, Any]) -> Program[None]:
        """Append a record that is not a checkpoint (what the saver notes itself) at
        the head, keeping the head's `tip`: it never decides where a line goes."""
        for attempt in range(_RETRIES):
            if attempt == 0 and conversation_id in self._tips:  # the tip this saver left
                tip = self._tips[conversation_id]
            else:
                tip = (yield from _call("conversation", conversation_id)).state.get("tip")
            try:
                done = yield from _call(
                    "append_messages",
                    conversation_id,
                    [],
                    state={"tip": tip, **record},
                    expected=Expected(state={"tip": tip}),
                )
            except ConflictError:  # the line ends with another checkpoint
                continue
            self._learn(conversation_id, done)
            self._tips[conversation_id] = tip
            return
        raise ConflictError(
            f"Conversation '{conversation_id}' kept changing while a record was added "
            f"({_RETRIES} tries). Retry when its writers are quieter.",
            conversation_id=conversation_id,
        )

    def _note(self, conversation_id: str, record: dict[str, Any]) -> Program[None]:
        """Append `record` at the head of a writes conversation, which has no line to keep."""
        done = yield from _call("append_messages", conversation_id, [], state=record)
        self._learn(conversation_id, done)

    def _messages(
        self, conversation_id: str, thread: Thread, checkpoint_id: str
    ) -> Program[Messages | None]:
        """A checkpoint's messages list, kept or read from the log (None: not a
        messages list)."""
        if checkpoint_id not in thread.puts:
            return NO_MESSAGES
        try:
            found = yield from self._with_messages(
                conversation_id,
                thread,
                [checkpoint_id],
                lambda message_at: thread.messages(
                    checkpoint_id, self.serde, self.channel, message_at
                ),
            )
        except _Erased:  # no list to follow; the append is refused as erased
            return None
        return Messages.of(found)

    def _remember(
        self, conversation_id: str, checkpoint_id: str, messages: Messages | None
    ) -> None:
        with self._keeping:
            self._lists[(conversation_id, checkpoint_id)] = messages
            self._lists.move_to_end((conversation_id, checkpoint_id))
            while len(self._lists) > _KEPT:
                self._lists.popitem(last=False)

    # -- deleting and copying ------------------------------------------------------------

    def _delete_thread(self, thread_id: str) -> Program[None]:
        for thread_id_, namespace in (yield from self._namespaces(thread_id)):
            conversation_id = yield from self._conversation(thread_id_, namespace)
            if conversation_id is None:
                continue
            # After the conversation's creation: its head's history is empty, and a
            # checkpoint put afterwards starts a line of its own.
            try:
                yield from _call(
                    "append_messages",
                    conversation_id,
                    [],
                    state={"tip": None, "hide": {"all": True}},
                    after=1,
                )
            except ErasedError:
                continue  # its subject was erased: nothing of it reads any more
            self._tips[conversation_id] = None
            writes = yield from self._conversation(thread_id_, namespace, writes=True)
            if writes is not None:  # and its pending writes, for a checkpoint put again
                yield from self._note(writes, {"hide": {"all": True}})

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Program[None]:
        hidden: dict[str, set[str]] = {}
        for run_id in run_ids:
            if not is_id(str(run_id)):
                continue  # not stamped on the log (LangGraph's run ids are UUIDs)
            for change in (yield from _call("state_changes", run_id=str(run_id))):
                put = change.payload.get("state", {}).get("put")
                if put is not None:
                    hidden.setdefault(change.conversation_id, set()).add(put["id"])
        for conversation_id, ids in hidden.items():
            yield from self._record(conversation_id, {"hide": {"ids": sorted(ids)}})

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> Program[None]:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"prune's strategy is 'keep_latest' or 'delete', not {strategy!r}."
            )
        for thread_id in thread_ids:
            if strategy == "delete":
                yield from self._delete_thread(str(thread_id))
                continue
            for thread_id_, namespace in (yield from self._namespaces(str(thread_id))):
                conversation_id = yield from self._conversation(thread_id_, namespace)
                if conversation_id is None:
                    continue
                thread = yield from self._thread(conversation_id)
                latest = thread.latest()
                if latest is not None and len(thread.visible) > 1:
                    yield from self._record(conversation_id, {"hide": {"except": latest}})

    def _copy_thread(self, source: str, target: str) -> Program[None]:
        namespaces = yield from self._namespaces(source)
        copied: List[str] = []
        for _, namespace in namespaces:
            conversation_id = yield from self._conversation(source, namespace)
            if conversation_id is None:
                continue
            thread = yield from self._thread(conversation_id)
            conv = yield from _call("conversation", conversation_id)
            latest = thread.latest()
            # The head, unless a late write left it off the newest checkpoint's line.
            at = (
                None
                if latest is None or conv.state.get("tip") == latest
                else thread.puts[latest].position
            )
            subject = None if self._subject is None else self._subject(target)
            fork = yield from _call(
                "fork", conversation_id, at=at, key=_key(target, namespace), subject=subject
            )
            self._ids[_key(target, namespace)] = fork.id
            writes = yield from self._conversation(source, namespace, writes=True)
            if writes is not None:  # the checkpoints' pending writes go with them
                key = _key(target, namespace, _WRITES)
                copy = yield from _call("fork", writes, key=key, subject=fork.subject)
                self._ids[key] = copy.id
            if namespace:
                copied.append(namespace)
        if copied:
            root = self._ids[_key(target, "")]
            yield from self._record(root, {"namespaces": copied})


def _matches(metadata: CheckpointMetadata, filter: dict[str, Any]) -> bool:
    return all(key in metadata and metadata[key] == value for key, value in filter.items())  # type: ignore[literal-required]
