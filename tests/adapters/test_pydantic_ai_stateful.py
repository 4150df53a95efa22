"""`LedgerConversationStore` against pydantic-ai's `InMemoryConversationStore`, as a
Hypothesis state machine.

Both stores get the same operations: saves that extend a loaded conversation
(whole or a window), loads, branches (to a count or to an entry, of the history
or of a branch it left), forks (of forks, from left branches, into a scope),
deletes, and rewrites: a serialized copy of any conversation an earlier step
loaded or got back, or its message objects themselves, cut to a prefix of any
length, continued with a new turn and saved with `new_message_index=None` (or the copy's), with the copy's
revision or the record's, into a scope or not. The messages are built with
fixed timestamps, so both stores see equal messages.

After every step the two stores must hold the same trees: every conversation's
record (head, branches, fork point, scope), its history entry by entry (ids
mapped from one store to the other through what the saves returned, parents,
messages), and the history of each branch it left; and each entry a save
stored must read back with the parent the save said.

They do, while every message is one JSON gives back `==` to itself. With a
tool result JSON changes (a tuple comes back a list) the machine finds the
divergence issue 33 (item 7) reported: the in-memory store deep-copies the
original objects, so a serialized copy of its own history differs from it
there, and the rewritten turn gets another parent (none, when the first
message changed). chatledger keeps what JSON gives back, as any store that
serializes does, and compares a save's messages with its history in that
form, so the objects an app kept and a serialized copy are both recognised;
the second machine holds it to `SerializingStore`, the in-memory store
keeping and comparing what it serializes, and the tests at the end pin both
sides of the difference (docs/pydantic-ai.md, "Limits").
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from chatledger.adapters.pydantic_ai import LedgerConversationStore
from chatledger.store import AsyncStore

T = TypeVar("T")
WHEN = datetime(2025, 1, 1, tzinfo=UTC)
CIDS = ("c1", "c2")
SCOPES = st.sampled_from([None, None, "u1"])


def turn(kind: int, text: int) -> list[ModelMessage]:
    """A turn from a small alphabet, so equal messages recur at other points.

    Kind 3 returns a tuple from its tool: a value JSON gives back as a list, so
    the message read back from any store that serializes is not `==` to it.
    """
    prompt = ModelRequest(
        parts=[UserPromptPart(content=f"p{text}", timestamp=WHEN)], timestamp=WHEN
    )
    if kind == 0:
        return [prompt, ModelResponse(parts=[TextPart(content=f"a{text}")], timestamp=WHEN)]
    call = ToolCallPart(tool_name="lookup", args={"q": text}, tool_call_id=f"call-{text}")
    content = (f"r{text}",) if kind == 3 else f"r{text}"
    returned = ToolReturnPart(
        tool_name="lookup", content=content, tool_call_id=f"call-{text}", timestamp=WHEN
    )
    parts: list[Any] = (
        [returned] if kind == 1 else [returned, UserPromptPart(f"more {text}", timestamp=WHEN)]
    )
    return [
        prompt,
        ModelResponse(parts=[TextPart(content="checking"), call], timestamp=WHEN),
        ModelRequest(parts=parts, timestamp=WHEN),
        ModelResponse(parts=[TextPart(content=f"b{text}")], timestamp=WHEN),
    ]


TURNS = st.tuples(st.integers(0, 3), st.integers(0, 2))


class SerializingStore(InMemoryConversationStore):
    """`InMemoryConversationStore` keeping each message as JSON gives it back, as its
    docstring says it does ("as a store that serializes them would"; it deep-copies),
    and comparing a save's messages with its history in that form, as stored."""

    async def _unsaved_after_history(
        self,
        record: ConversationRecord | None,
        conversation_id: str,
        messages: list[ModelMessage],
        branches: list[str],
        *,
        window: int | None,
    ) -> tuple[str | None, list[ModelMessage], list[str]]:
        as_kept = [ModelMessagesTypeAdapter.validate_json(form(m))[0] for m in messages]
        parent_id, unsaved, left = await super()._unsaved_after_history(
            record, conversation_id, as_kept, branches, window=window
        )
        return parent_id, messages[len(messages) - len(unsaved) :], left

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        kept = [
            dataclasses.replace(
                e, message=ModelMessagesTypeAdapter.validate_json(form(e.message))[0]
            )
            for e in new_entries
        ]
        await super().write_record(record, new_entries=kept, expected_revision=expected_revision)


def continuable(messages: list[ModelMessage]) -> list[int]:
    """The prefix lengths a new prompt may follow: none ends with an unanswered call."""
    return [
        n
        for n in range(len(messages) + 1)
        if n == 0
        or not (
            isinstance(messages[n - 1], ModelResponse)
            and any(p.part_kind == "tool-call" for p in messages[n - 1].parts)
        )
    ]


def form(message: ModelMessage) -> bytes:
    """A message as JSON: what any store that serializes keeps of it."""
    return ModelMessagesTypeAdapter.dump_json([message])


class Outcome:
    """What a call did: its value, or the kind of error it raised."""

    def __init__(self, value: Any = None, error: str | None = None) -> None:
        self.value, self.error = value, error


class Differential(RuleBasedStateMachine):
    """The two stores, driven alike; `ids` maps the reference's entry ids to ours."""

    runner: asyncio.Runner
    """The loop every step runs on (set by the `driven` fixture), with the store."""
    store: AsyncStore
    reference: type[InMemoryConversationStore] = InMemoryConversationStore
    lossy = False
    """Whether turns may hold values JSON does not give back `==` (kind 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.ref = self.reference()
        self.ours = LedgerConversationStore(self.store.tenant(f"sm-{uuid.uuid4().hex[:8]}"))
        self.ids: dict[str | None, str | None] = {None: None}
        self.cids: list[str] = list(CIDS)
        self.copies: list[tuple[str, str]] = []  # serialized conversations, (reference, ours)
        self.held: list[tuple[Conversation, Conversation]] = []  # the objects themselves
        self.forks = 0

    # -- driving both ----------------------------------------------------------------

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(call)

    def both(
        self, call: Callable[[ConversationStore], Coroutine[Any, Any, T]]
    ) -> tuple[Outcome, Outcome]:
        outcomes = []
        for store in (self.ref, self.ours):
            try:
                outcomes.append(Outcome(self.run(call(store))))
            except ConversationConflict:
                outcomes.append(Outcome(error="conflict"))
            except UserError as error:
                outcomes.append(Outcome(error=f"user error: {type(error).__name__}"))
        ref, ours = outcomes
        assert ref.error == ours.error, (ref.error, ours.error)
        return ref, ours

    def keep(self, ref: Conversation | None, ours: Conversation | None) -> None:
        assert (ref is None) == (ours is None)
        if ref is not None and ours is not None:
            assert [form(m) for m in ref.messages] == [form(m) for m in ours.messages]
            self.copies.append(
                (
                    ConversationTypeAdapter.dump_json(ref).decode(),
                    ConversationTypeAdapter.dump_json(ours).decode(),
                )
            )
            self.held.append((ref, ours))

    def saved(self, ref: list[ConversationEntry], ours: list[ConversationEntry]) -> None:
        """Map the entries a save stored, and check each reads back with its parent."""
        assert len(ref) == len(ours)
        for r, o in zip(ref, ours, strict=True):
            self.ids[r.id] = o.id
        for r, o in zip(ref, ours, strict=True):
            assert r.message == o.message
            assert self.ids.get(r.parent_id, "unmapped") == o.parent_id, "parent of a saved entry"
            stored = self.run(self.ours.read_entry(o.id))
            assert (stored.parent_id, form(stored.message)) == (o.parent_id, form(o.message)), (
                "a saved entry reads back with another parent"
            )

    def mapped(self, entries: list[ConversationEntry]) -> list[Any]:
        return [
            (self.ids.get(e.id, "unmapped"), self.ids.get(e.parent_id, "unmapped"), form(e.message))
            for e in entries
        ]

    @staticmethod
    def plain(entries: list[ConversationEntry]) -> list[Any]:
        return [(e.id, e.parent_id, form(e.message)) for e in entries]

    def tips(self, cid: str) -> tuple[list[str], list[str]] | None:
        """The reference's entries of `cid` a branch or fork may start from: history, left branches."""
        entries = self.run(self.ref.load_entries(cid))
        record = self.run(self.ref.read_record(cid))
        if entries is None or record is None:
            return None
        return [e.id for e in entries], list(record.branches)

    # -- rules -----------------------------------------------------------------------

    @rule(
        cid=st.sampled_from(CIDS) | st.integers(0, 9),
        limit=st.sampled_from([None, None, 1, 2]),
        drawn=TURNS,
        scope=SCOPES,
    )
    def save_a_turn(
        self, cid: str | int, limit: int | None, drawn: tuple[int, int], scope: str | None
    ) -> None:
        cid, new = self.pick(cid), self.turn(drawn)

        async def go(store: ConversationStore) -> tuple[Conversation, list[ConversationEntry]]:
            conv = await store.load(cid, limit=limit) or Conversation(conversation_id=cid)
            conv.messages.extend(new)
            return conv, await store.save(conv, scope=scope)

        ref, ours = self.both(go)
        if ref.error is None:
            self.saved(ref.value[1], ours.value[1])
            self.keep(ref.value[0], ours.value[0])

    @rule(cid=st.integers(0, 9), limit=st.sampled_from([None, 0, 1, 2, 5]))
    def load(self, cid: int, limit: int | None) -> None:
        name = self.pick(cid)
        ref, ours = self.both(lambda store: store.load(name, limit=limit))
        self.keep(ref.value, ours.value)

    @rule(cid=st.integers(0, 9), to_entry=st.booleans(), at=st.integers(0, 40))
    def branch(self, cid: int, to_entry: bool, at: int) -> None:
        name = self.pick(cid)
        tips = self.tips(name)
        if tips is None:
            return
        history, left = tips
        if to_entry and history + left:
            entry = (history + left)[at % len(history + left)]
            kwargs: dict[str, Any] = {"from_entry": entry}
            ours_kwargs: dict[str, Any] = {"from_entry": self.ids[entry]}
        else:
            kwargs = ours_kwargs = {"at": at % (len(history) + 1)}

        async def go(store: ConversationStore) -> Conversation:
            conv = await store.load(name)
            assert conv is not None
            return await store.branch(
                name,
                expected_revision=conv.revision,
                **(kwargs if store is self.ref else ours_kwargs),
            )

        ref, ours = self.both(go)
        if ref.error is None:
            self.keep(ref.value, ours.value)

    @rule(
        cid=st.integers(0, 9),
        how=st.sampled_from(["all", "at", "entry"]),
        at=st.integers(0, 40),
        scope=SCOPES,
    )
    def fork(self, cid: int, how: str, at: int, scope: str | None) -> None:
        name = self.pick(cid)
        tips = self.tips(name)
        if tips is None:
            return
        history, left = tips
        kwargs: dict[str, Any] = {}
        ours_kwargs: dict[str, Any] = {}
        if how == "entry" and history + left:
            entry = (history + left)[at % len(history + left)]
            kwargs, ours_kwargs = {"from_entry": entry}, {"from_entry": self.ids[entry]}
        elif how == "at":
            kwargs = ours_kwargs = {"at": at % (len(history) + 1)}
        self.forks += 1
        new = f"f{self.forks}"

        def go(store: ConversationStore) -> Coroutine[Any, Any, Conversation]:
            return store.fork(
                name,
                new_conversation_id=new,
                scope=scope,
                **(kwargs if store is self.ref else ours_kwargs),
            )

        ref, ours = self.both(go)
        if ref.error is None:
            self.cids.append(new)
            self.keep(ref.value, ours.value)

    @rule(
        copy=st.integers(0, 1000),
        cid=st.none() | st.integers(0, 9),
        keep=st.integers(0, 40),
        drawn=TURNS,
        revision=st.sampled_from(["copy", "record"]),
        index=st.sampled_from([None, None, "copy"]),
        scope=SCOPES,
        held=st.booleans(),
    )
    def rewrite(
        self,
        copy: int,
        cid: int | None,
        keep: int,
        drawn: tuple[int, int],
        revision: str,
        index: str | None,
        scope: str | None,
        held: bool,
    ) -> None:
        """A serialized copy, or the message objects an app kept, cut and continued by
        hand, saved without its boundary."""
        if not self.copies:
            return
        new = self.turn(drawn)
        if held:
            copies = list(self.held[copy % len(self.held)])
        else:
            texts = self.copies[copy % len(self.copies)]
            copies = [ConversationTypeAdapter.validate_json(t) for t in texts]
        # Saved under its own id, or under another conversation's.
        name = copies[0].conversation_id if cid is None else self.pick(cid)
        lengths = continuable(copies[0].messages)
        cut = lengths[keep % len(lengths)]

        async def go(store: ConversationStore) -> list[ConversationEntry]:
            base = copies[0] if store is self.ref else copies[1]
            rev = base.revision
            if revision == "record":
                record = await store.read_record(name)
                rev = None if record is None else record.revision
            rebuilt = Conversation(
                conversation_id=name,
                messages=[*base.messages[:cut], *new],
                usage=base.usage,
                revision=rev,
                new_message_index=None if index is None else base.new_message_index,
            )
            return await store.save(rebuilt, scope=scope)

        ref, ours = self.both(go)
        if ref.error is None:
            self.saved(ref.value, ours.value)

    @rule(cid=st.integers(0, 9))
    def delete(self, cid: int) -> None:
        name = self.pick(cid)
        self.both(lambda store: store.delete(name))

    def turn(self, drawn: tuple[int, int]) -> list[ModelMessage]:
        kind, text = drawn
        return turn(0 if kind == 3 and not self.lossy else kind, text)

    def pick(self, cid: str | int) -> str:
        return cid if isinstance(cid, str) else self.cids[cid % len(self.cids)]

    # -- the trees -------------------------------------------------------------------

    @invariant()
    def the_trees_agree(self) -> None:
        for cid in self.cids:
            ref_record = self.run(self.ref.read_record(cid))
            our_record = self.run(self.ours.read_record(cid))
            assert (ref_record is None) == (our_record is None), cid
            if ref_record is None or our_record is None:
                continue
            assert self.described(ref_record, mapped=True) == self.described(our_record), cid
            ref_history = self.run(self.ref.read_history(ref_record.head_id))
            our_history = self.run(self.ours.read_history(our_record.head_id))
            assert self.mapped(ref_history) == self.plain(our_history), f"history of {cid}"
            for ref_tip, our_tip in zip(ref_record.branches, our_record.branches, strict=True):
                ref_line = self.run(self.ref.read_history(ref_tip))
                our_line = self.run(self.ours.read_history(our_tip))
                assert self.mapped(ref_line) == self.plain(our_line), f"a branch {cid} left"

    def described(self, record: ConversationRecord, *, mapped: bool = False) -> list[Any]:
        name = (lambda e: self.ids.get(e, "unmapped")) if mapped else (lambda e: e)
        return [
            name(record.head_id),
            [name(b) for b in record.branches],
            record.forked_from,
            name(record.forked_at),
            record.scope,
        ]


class SerializingDifferential(Differential):
    """Messages that JSON does not give back `==`, against a reference that serializes."""

    reference = SerializingStore
    lossy = True


SETTINGS = settings(
    max_examples=10,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture
def driven(database_url: str) -> Iterator[None]:
    """The machines' store, and the loop their steps run on."""
    with asyncio.Runner() as runner:
        store = AsyncStore.open(database_url)
        Differential.runner = runner
        Differential.store = store
        try:
            yield
        finally:
            runner.run(store.close())


def test_rewrites_after_branches_and_forks_store_pydantic_ais_trees(driven: None) -> None:
    run_state_machine_as_test(Differential, settings=SETTINGS)


def test_values_json_changes_compare_as_a_serializing_reference_store(driven: None) -> None:
    """With tool results JSON gives back changed (a tuple as a list), the store answers
    as `InMemoryConversationStore` would if it kept what it serializes."""
    run_state_machine_as_test(SerializingDifferential, settings=SETTINGS)


# -- the divergence the machines find against `InMemoryConversationStore` itself --------


def looked_up(content: Any, prompt: Any = "p1") -> list[ModelMessage]:
    """A turn whose tool returned `content`."""
    return [
        ModelRequest(parts=[UserPromptPart(prompt, timestamp=WHEN)], timestamp=WHEN),
        ModelResponse(parts=[ToolCallPart("lookup", {"q": 1}, "c1")], timestamp=WHEN),
        ModelRequest(
            parts=[ToolReturnPart("lookup", content, "c1", timestamp=WHEN)], timestamp=WHEN
        ),
        ModelResponse(parts=[TextPart("a1")], timestamp=WHEN),
    ]


async def continue_a_serialized_copy(
    store: ConversationStore, first: list[ModelMessage]
) -> list[Any]:
    """Save `first` and a turn, branch back to `first`, then save a serialized copy of
    what the branch returned with a new turn: which kept entry the turn follows."""
    conv = Conversation(conversation_id="s", messages=[*first, *turn(0, 2)])
    await store.save(conv)
    branched = await store.branch("s", at=len(first), expected_revision=conv.revision)
    copy = ConversationTypeAdapter.validate_json(ConversationTypeAdapter.dump_json(branched))
    rebuilt = Conversation(
        conversation_id="s", messages=[*copy.messages, *turn(0, 3)], revision=copy.revision
    )
    saved = await store.save(rebuilt)
    history = await store.load_entries("s")
    assert history is not None
    index: dict[str | None, int | None] = {e.id: i for i, e in enumerate(history)}
    return [len(saved), index.get(saved[0].parent_id)]


@pytest.mark.parametrize(
    ("first", "in_memory"),
    [
        # A tool's tuple comes back a list: pydantic-ai's in-memory store, which holds
        # the tuple, stores the tool result and what follows again, after the call.
        (looked_up(("r",)), [4, 1]),
        # A prompt of parts as a tuple: it stores the whole history again, from no parent.
        (looked_up("r", prompt=("look", "up")), [6, None]),
    ],
)
async def test_a_serialized_copy_of_a_branch_goes_on_after_its_last_message(
    database_url: str, first: list[ModelMessage], in_memory: list[Any]
) -> None:
    """The copy holds the messages the store has, as JSON gives them back: the new turn
    follows the last one, as with a store that serializes (issue 33, item 7)."""
    async with AsyncStore.open(database_url) as store:
        ours = LedgerConversationStore(store.tenant(f"copy-{uuid.uuid4().hex[:8]}"))
        assert await continue_a_serialized_copy(ours, first) == [2, len(first) - 1]
    assert await continue_a_serialized_copy(SerializingStore(), first) == [2, len(first) - 1]
    assert await continue_a_serialized_copy(InMemoryConversationStore(), first) == in_memory


async def save_the_messages_held(store: ConversationStore) -> list[Any]:
    """Save a turn, then the same message objects and a new turn, without a boundary."""
    held = looked_up(("r",))
    conv = Conversation(conversation_id="s", messages=list(held))
    await store.save(conv)
    record = await store.read_record("s")
    assert record is not None
    again = Conversation(
        conversation_id="s", messages=[*held, *turn(0, 2)], revision=record.revision
    )
    saved = await store.save(again)
    record = await store.read_record("s")
    assert record is not None
    return [len(saved), len(record.branches)]


async def test_messages_an_app_kept_are_recognised_though_json_changes_them(
    database_url: str,
) -> None:
    """The objects an app kept (a tool's tuple) are not `==` to what JSON gives back,
    but they are what the store holds once stored: a save of them and a new turn,
    without a boundary, appends the new turn alone, as the in-memory store does,
    not the history from that message on again, on a branch (docs/pydantic-ai.md,
    "Limits")."""
    async with AsyncStore.open(database_url) as store:
        ours = LedgerConversationStore(store.tenant(f"held-{uuid.uuid4().hex[:8]}"))
        assert await save_the_messages_held(ours) == [2, 0]
    assert await save_the_messages_held(InMemoryConversationStore()) == [2, 0]
