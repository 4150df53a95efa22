"""What a LangGraph thread's chatledger log holds, and the checkpoints rebuilt from it:
pure, no I/O.

Each `(thread_id, checkpoint_ns)` is one chatledger conversation, and its
pending writes another. Its log holds the messages of its `messages` channel,
each once, and a record per checkpoint and per administrative act, each a
conversation state (`state.changed`) whose field `tip` names the checkpoint
the line of the log ends with at that point; the writes conversation holds a
record per `put_writes` call:

- `{"tip": id, "put": {...}}`: a checkpoint: its `id` and `parent`, the
  checkpoint without its channel values (`checkpoint`) and its `metadata`, each
  as plain JSON (`{"json": value}`) when it is, else as the serializer writes it
  (`{"serde": [type, base64]}`); `blobs`, the value of each channel it gives a new
  version, per version, as LangGraph's own savers store them (`[version, type,
  base64]`, type `empty` for a channel without a value); and for the messages
  channel, when its value is a list of LangChain messages with distinct ids,
  `messages`: `{"channel", "version", "removed": [ids], "added": n}`, the ids it
  drops from its parent's list and the number of messages it appends, which are
  the `n` chatledger messages right before the record on its branch.
- `{"writes": {"checkpoint", "task", "path", "items": [[idx, channel, type,
  base64], ...]}}`: one `put_writes` call, in the thread's writes conversation
  (a thread written before that had one kept them here, with the `tip`).
- `{"tip": ..., "namespaces": [...]}`: in the thread's root namespace, the other
  namespaces it has (each its own conversation).
- `{"tip": ..., "hide": {...}}`: `{"all": true}` (a deleted thread; written after
  the conversation's creation, so the head's history is empty), `{"ids": [...]}`
  (deleted runs) or `{"except": id}` (pruned): the checkpoints recorded before it
  that no read shows any more, with their writes (`all`, in the writes
  conversation: every write before it).

`Thread` reads these back: which checkpoints are visible, their chain of
parents, their pending writes, and each checkpoint's channel values rebuilt:
a messages list from the messages its chain added and removed, every other
channel from the nearest record on the chain that wrote its version.
"""

from __future__ import annotations

import base64
import copy
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from chatledger.store import Event, Position

__all__ = [
    "NO_MESSAGES",
    "Memo",
    "Messages",
    "Put",
    "Thread",
    "encode_put",
    "encode_writes",
    "message_delta",
    "read_thread",
]

Typed = tuple[str, bytes]
MessageAt = Callable[[Position], BaseMessage]
"""The LangChain message stored at a position of the conversation's log."""
Memo = dict[str, tuple[list[BaseMessage], int]]
"""A record's messages list, rebuilt: the first `n` of a list (which later ones extend)."""


def _typed(serde: SerializerProtocol, value: Any) -> list[str]:
    kind, data = serde.dumps_typed(value)
    return [kind, base64.b64encode(data).decode("ascii")]


def _untyped(serde: SerializerProtocol, kind: str, data: str) -> Any:
    return serde.loads_typed((kind, base64.b64decode(data)))


def _pack(serde: SerializerProtocol, value: Any) -> dict[str, Any]:
    """`value` as plain JSON when it survives as JSON, else as the serializer writes it."""
    try:
        if json.loads(json.dumps(value, allow_nan=False)) == value:
            return {"json": value}
    except (TypeError, ValueError):
        pass
    return {"serde": _typed(serde, value)}


def _unpack(serde: SerializerProtocol, packed: Mapping[str, Any]) -> Any:
    """The value `_pack` packed: a copy of its own (the records are kept between reads)."""
    if "json" in packed:
        return copy.deepcopy(packed["json"])
    return _untyped(serde, *packed["serde"])


# -- writing -----------------------------------------------------------------------


@dataclass(frozen=True)
class Messages:
    """A messages list known to hold LangChain messages with distinct ids, and the ids."""

    items: list[BaseMessage]
    ids: frozenset[str]

    @staticmethod
    def of(value: Any) -> Messages | None:
        """`value`, when it is a list of LangChain messages with distinct ids."""
        if not isinstance(value, list) or not all(isinstance(m, BaseMessage) for m in value):
            return None
        ids = [m.id for m in value]
        unique = frozenset(ids)
        if len(unique) != len(ids) or not all(isinstance(i, str) and i for i in ids):
            return None
        return Messages(value, cast(frozenset[str], unique))


NO_MESSAGES = Messages([], frozenset())


def message_delta(
    parent: Messages | None, value: Any
) -> tuple[list[str], list[BaseMessage], Messages] | None:
    """How `value` follows from `parent`: the ids it drops and the messages it appends,
    so that `[m for m in parent if m.id not in dropped] + appended == value`, and
    `value` as `Messages`; None when either is not a list of LangChain messages with
    distinct ids (then the channel is stored whole, per version).

    When `value` begins with the very objects of `parent` (a graph passes them on),
    only what it appends is looked at: a put costs the same on a long thread as on
    a short one. Otherwise the parent's messages are matched in order against
    `value`'s prefix, by identity, else by equality; the first one that does not
    match, and every one after it, is dropped, and the rest of `value` appended:
    `RemoveMessage` drops a message, a replaced one drops and re-appends the tail
    from it.
    """
    if parent is None or not isinstance(value, list):
        return None
    kept = len(parent.items)
    if len(value) >= kept and all(map(operator.is_, parent.items, value)):
        appended = Messages.of(value[kept:])
        if appended is None or not appended.ids.isdisjoint(parent.ids):
            return None
        return [], appended.items, Messages(value, parent.ids | appended.ids)
    current = Messages.of(value)
    if current is None:
        return None
    kept = 0
    dropped: list[str] = []
    for old in parent.items:
        if kept < len(value) and (old is value[kept] or old == value[kept]):
            kept += 1
        else:
            dropped.append(cast(str, old.id))
    return dropped, list(value[kept:]), current


def encode_put(
    serde: SerializerProtocol,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
    parent: str | None,
    channel: str,
    parent_messages: Messages | None,
) -> tuple[dict[str, Any], list[BaseMessage], Messages | None]:
    """The record of a checkpoint, the messages it appends to the log, and its messages
    list when it stored a delta.

    `parent_messages` is the parent's value of the messages `channel`
    (`NO_MESSAGES` without a parent; None when it is not a messages list).
    """
    values = checkpoint["channel_values"]
    rest = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    record: dict[str, Any] = {
        "id": checkpoint["id"],
        "parent": parent,
        "checkpoint": _pack(serde, rest),
        "metadata": _pack(serde, metadata),
    }
    blobs: dict[str, list[Any]] = {}
    added: list[BaseMessage] = []
    known: Messages | None = None
    for name, version in new_versions.items():
        if name == channel and name in values:
            delta = message_delta(parent_messages, values[name])
            if delta is not None:
                dropped, added, known = delta
                record["messages"] = {
                    "channel": name,
                    "version": version,
                    "removed": dropped,
                    "added": len(added),
                }
                continue
        blobs[name] = [version, *(_typed(serde, values[name]) if name in values else ["empty", ""])]
    record["blobs"] = blobs
    return record, added, known


def encode_writes(
    serde: SerializerProtocol,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> dict[str, Any]:
    """The record of one `put_writes` call: each write with its index (`WRITES_IDX_MAP`
    for the special channels), channel and value."""
    return {
        "checkpoint": checkpoint_id,
        "task": task_id,
        "path": task_path,
        "items": [
            [WRITES_IDX_MAP.get(channel, idx), channel, *_typed(serde, value)]
            for idx, (channel, value) in enumerate(writes)
        ],
    }


# -- reading -------------------------------------------------------------------------


@dataclass
class Put:
    """A checkpoint's record, where the log holds it."""

    id: str
    parent: str | None
    position: Position
    seq: int
    record: dict[str, Any]

    _rest: dict[str, Any] | None = field(default=None, repr=False)

    def versions(self, serde: SerializerProtocol) -> ChannelVersions:
        """Its channel versions, to read and not to change."""
        return cast(ChannelVersions, self._decoded(serde).get("channel_versions", {}))

    def rest(self, serde: SerializerProtocol) -> dict[str, Any]:
        """The checkpoint without its channel values: a copy for the caller to keep
        (a graph changes the checkpoints it loads)."""
        return copy.deepcopy(self._decoded(serde))

    def _decoded(self, serde: SerializerProtocol) -> dict[str, Any]:
        if self._rest is None:  # decoded once
            self._rest = cast(dict[str, Any], _unpack(serde, self.record["checkpoint"]))
        return self._rest

    def metadata(self, serde: SerializerProtocol) -> CheckpointMetadata:
        return cast(CheckpointMetadata, _unpack(serde, self.record["metadata"]))

    def delta(self, channel: str, version: Any) -> dict[str, Any] | None:
        """Its messages delta, when it wrote `version` of `channel` as one."""
        delta = self.record.get("messages")
        if delta is not None and delta["channel"] == channel and delta["version"] == version:
            return cast(dict[str, Any], delta)
        return None

    def blob(self, channel: str, version: Any) -> list[Any] | None:
        """Its `[version, type, data]` of `channel`, when it wrote `version` whole."""
        blob = self.record["blobs"].get(channel)
        return cast(list[Any], blob) if blob is not None and blob[0] == version else None


@dataclass
class _Write:
    task: str
    path: str
    items: list[list[Any]]


@dataclass
class Thread:
    """One conversation's records, read back (`read_thread`)."""

    puts: dict[str, Put] = field(default_factory=dict)
    visible: set[str] = field(default_factory=set)
    writes: dict[str, list[_Write]] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    seq: int = 0
    """The greatest `seq` of the events taken in."""

    def add(self, event: Event) -> None:
        """Take in the record of a `state.changed` event that follows those read."""
        self.seq = max(self.seq, event.seq)
        state = event.payload["state"]
        if "put" in state:
            put = state["put"]
            at = Position(event.branch_id, event.position)
            self.puts[put["id"]] = Put(put["id"], put.get("parent"), at, event.seq, put)
            self.visible.add(put["id"])
        elif "writes" in state:
            writes = state["writes"]
            self.writes.setdefault(writes["checkpoint"], []).append(
                _Write(writes["task"], writes.get("path", ""), writes["items"])
            )
        elif "namespaces" in state:
            for namespace in state["namespaces"]:
                if namespace not in self.namespaces:
                    self.namespaces.append(namespace)
        elif "hide" in state:
            _hide(self, state["hide"])

    def copy(self) -> Thread:
        """A copy that `add` changes without changing this one (which a reader may hold)."""
        return Thread(
            dict(self.puts),
            set(self.visible),
            {k: list(v) for k, v in self.writes.items()},
            list(self.namespaces),
            self.seq,
        )

    def latest(self) -> str | None:
        """The newest visible checkpoint: the greatest id, as LangGraph's savers pick it."""
        return max(self.visible, default=None)

    def chain(self, checkpoint_id: str) -> list[Put]:
        """The checkpoint and its ancestors, newest first, as far as the log holds them."""
        chain: list[Put] = []
        seen: set[str] = set()
        at = self.puts.get(checkpoint_id)
        while at is not None and at.id not in seen:
            chain.append(at)
            seen.add(at.id)
            at = self.puts.get(at.parent) if at.parent is not None else None
        return chain

    def pending_writes(
        self, checkpoint_id: str, serde: SerializerProtocol, more: Thread | None = None
    ) -> list[PendingWrite]:
        """The writes recorded against the checkpoint (here, then in `more`: the
        thread's writes conversation), in `writes_sort_key` order: the first of each
        `(task, index)` for ordinary channels, the last for the special ones (an
        error, an interrupt, a resume), as LangGraph's savers keep them."""
        kept: dict[tuple[str, int], tuple[str, str, int, list[Any]]] = {}
        recorded = self.writes.get(checkpoint_id, [])
        if more is not None:
            recorded = recorded + more.writes.get(checkpoint_id, [])
        for write in recorded:
            for idx, channel, kind, data in write.items:
                key = (write.task, idx)
                if idx >= 0 and key in kept:
                    continue
                kept[key] = (write.path, channel, idx, [kind, data])
        ordered = sorted(kept.items(), key=lambda kv: writes_sort_key(kv[1][0], kv[0][0], kv[0][1]))
        return [
            (task, channel, _untyped(serde, *typed))
            for (task, _), (_, channel, _, typed) in ordered
        ]

    def needs_messages(self, checkpoint_id: str, channel: str, serde: SerializerProtocol) -> bool:
        """Whether rebuilding the checkpoint reads messages from the log."""
        chain = self.chain(checkpoint_id)
        if not chain:
            return False
        version = chain[0].versions(serde).get(channel)
        return version is not None and any(p.delta(channel, version) for p in chain)

    def checkpoint(
        self,
        checkpoint_id: str,
        serde: SerializerProtocol,
        channel: str,
        message_at: MessageAt,
        memo: Memo | None = None,
    ) -> Checkpoint:
        """The checkpoint rebuilt: every channel its versions name, from the chain.

        `memo` keeps messages lists across calls (a listing rebuilds many
        checkpoints of one chain).
        """
        chain = self.chain(checkpoint_id)
        rest = chain[0].rest(serde)
        values: dict[str, Any] = {}
        for name, version in rest.get("channel_versions", {}).items():
            found, value = self._value(chain, name, version, serde, channel, message_at, memo)
            if found:
                values[name] = value
        return cast(Checkpoint, {**rest, "channel_values": values})

    def messages(
        self,
        checkpoint_id: str,
        serde: SerializerProtocol,
        channel: str,
        message_at: MessageAt,
    ) -> list[BaseMessage] | None:
        """The checkpoint's messages list; None when the channel holds something else."""
        chain = self.chain(checkpoint_id)
        if not chain:
            return []
        version = chain[0].versions(serde).get(channel)
        if version is None:
            return []
        found, value = self._value(chain, channel, version, serde, channel, message_at, None)
        if not found:
            return []
        return cast(list[BaseMessage], value) if isinstance(value, list) else None

    def _value(
        self,
        chain: list[Put],
        name: str,
        version: Any,
        serde: SerializerProtocol,
        channel: str,
        message_at: MessageAt,
        memo: Memo | None,
    ) -> tuple[bool, Any]:
        """The value of version `version` of channel `name`, from the nearest record of
        `chain` that wrote it; (False, None) when none did, or it wrote no value.

        A messages delta applies to its parent's list, itself perhaps a delta: the
        deltas down to a stored list (or none) are gathered first, then applied
        oldest first, so a long thread needs no deep recursion.
        """
        deltas: list[tuple[Put, dict[str, Any]]] = []
        base: list[BaseMessage] = []
        i = 0
        while True:
            while i < len(chain) and not (
                chain[i].blob(name, version) or chain[i].delta(name, version)
            ):
                i += 1
            if i == len(chain):  # no record wrote it
                if not deltas:
                    return False, None
                break
            put = chain[i]
            blob = put.blob(name, version)
            if blob is not None:
                stored = blob[1] != "empty"
                value = _untyped(serde, blob[1], blob[2]) if stored else None
                if not deltas:
                    return stored, value
                base = value if isinstance(value, list) else []
                break
            deltas.append((put, cast(dict[str, Any], put.delta(name, version))))
            i += 1
            if i == len(chain):
                break
            parent = chain[i]
            if memo is not None and parent.id in memo:
                kept, size = memo[parent.id]
                base = kept[:size]  # a copy: this call's list grows in place, not the memo's
                break
            version = parent.versions(serde).get(name)
            if version is None:
                break
        # Applied oldest first, each in time linear in what it adds: a list grows in
        # place (each record's list a prefix of it, for `memo`), and only a removal
        # makes a new one. `base` is this call's own: a stored list is decoded anew.
        for put, delta in reversed(deltas):
            if delta["removed"]:
                removed = set(delta["removed"])
                base = [m for m in base if m.id not in removed]
            count = delta["added"]
            at = put.position
            base.extend(
                message_at(Position(at.branch_id, at.position - count + k)) for k in range(count)
            )
            if memo is not None:
                memo[put.id] = (base, len(base))
        return True, list(base)


def read_thread(changes: Sequence[Event]) -> Thread:
    """The records of a conversation's state changes (`Ledger.state_changes`), in order."""
    thread = Thread()
    for event in changes:
        thread.add(event)
    return thread


def _hide(thread: Thread, hide: Mapping[str, Any]) -> None:
    if hide.get("all"):
        hidden = set(thread.visible)
        thread.writes.clear()  # those of checkpoints hidden before, or kept elsewhere, too
    elif "except" in hide:
        hidden = thread.visible - {hide["except"]}
    else:
        hidden = thread.visible & set(hide.get("ids", []))
    thread.visible -= hidden
    for checkpoint_id in hidden:
        thread.writes.pop(checkpoint_id, None)
