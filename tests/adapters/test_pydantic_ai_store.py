"""`LedgerConversationStore` against pydantic-ai's own `InMemoryConversationStore`.

The same seeded sequence of runs, saves, stale saves, branches, forks (of
forks too, from a branch left, into a scope), rewrites (a serialized copy of
what a branch, fork, run or load returned, cut and continued by hand, saved
with `new_message_index` lost or kept, into a scope or not), limited loads,
listings and deletes goes to both stores, offline (pydantic-ai's
`FunctionModel`), and must give the same observable results: the messages
each load returns, the entries each save stores, which operations conflict,
the listings, and the records, with the ids and times either store mints
replaced by their order of first appearance.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
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
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from chatledger.adapters.pydantic_ai import LedgerConversationStore
from chatledger.store import AsyncStore, Message

IDS = ("c1", "c2", "c3")


def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that calls the `lookup` tool on every third prompt, else answers."""
    last = messages[-1]
    prompts = sum(
        1
        for m in messages
        if m.kind == "request" and any(p.part_kind == "user-prompt" for p in m.parts)
    )
    if any(p.part_kind == "tool-return" for p in last.parts):
        return ModelResponse(parts=[TextPart(content=f"looked up after {len(messages)} messages")])
    if prompts % 3 == 0:
        return ModelResponse(
            parts=[
                TextPart(content="let me check"),
                ToolCallPart(
                    tool_name="lookup", args={"q": f"p{prompts}"}, tool_call_id=f"call-{prompts}"
                ),
            ]
        )
    return ModelResponse(parts=[TextPart(content=f"answer {prompts} to {len(messages)} messages")])


def agent() -> Agent[None, str]:
    built = Agent(FunctionModel(reply))

    @built.tool_plain
    def lookup(q: str) -> str:
        return f"result for {q}"

    return built


VOLATILE = ("timestamp", "updated_at", "request_timestamp", "duration")
"""Fields that differ between two runs of the same agent: times, and how long a call took."""


class Names:
    """Ids and times replaced by their order of first appearance, per store."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str) and _minted(value):
            return self.seen.setdefault(value, f"#{len(self.seen)}")
        return value


def _minted(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def dumped(messages: list[ModelMessage]) -> Any:
    return json.loads(ModelMessagesTypeAdapter.dump_json(messages))


async def play(store: ConversationStore, seed: int, steps: int) -> list[Any]:
    """What a seeded sequence of operations observes on `store`."""
    rng = random.Random(seed)
    names = Names()
    runner = agent()
    seen: list[Any] = []
    # The conversation a branch or fork returned last, per id: what a rewrite starts from.
    returned: dict[str, Conversation] = {}

    async def observe(label: str, call: Any) -> Any:
        try:
            result = await call
        except ConversationConflict:
            seen.append((label, "conflict"))
            return None
        except UserError as error:
            seen.append((label, "user error", type(error).__name__))
            return None
        return result

    for step in range(steps):
        # Now and then a fork, so that forks are branched, rewritten and forked too.
        forks = sorted(f for f in returned if f.startswith("fork-"))
        cid = rng.choice(forks) if forks and rng.random() < 0.25 else rng.choice(IDS)
        op = rng.choice(
            [
                "run",
                "run",
                "run",
                "stale save",
                "branch",
                "branch to left",
                "fork",
                "load",
                "list",
                "delete",
                "save unchanged",
                "rewrite",
                "rewrite",
            ]
        )
        label = f"{step} {op} {cid}"
        if op == "run":
            limit = rng.choice([None, None, 1, 3])
            scope = rng.choice([None, None, "u1"])
            conv = await store.load(cid, limit=limit) or Conversation(conversation_id=cid)
            try:
                result = await runner.run(f"prompt {step}", conversation=conv)
            except UserError:  # a branch cut between a tool call and its result
                seen.append((label, "unanswered call"))
                continue
            saved = await observe(label, store.save(result, scope=scope))
            returned[cid] = result.conversation
            if saved is not None:
                seen.append(
                    (
                        label,
                        names([dumped([e.message]) for e in saved]),
                        names([[e.id, e.parent_id] for e in saved]),
                    )
                )
        elif op == "stale save":
            # Two writers load the same conversation; the second to save conflicts.
            first, second = await store.load(cid), await store.load(cid)
            if first is not None and second is not None:
                for i, conv in enumerate((first, second)):
                    try:
                        result = await runner.run(f"writer {i} at {step}", conversation=conv)
                    except UserError:  # a branch cut between a tool call and its result
                        seen.append((f"{label} {i}", "unanswered call"))
                        break
                    saved = await observe(f"{label} {i}", store.save(result))
                    seen.append((f"{label} {i}", saved is not None))
        elif op == "branch":
            conv = await store.load(cid)
            if conv is not None:
                at = rng.randint(0, len(conv.messages))
                branched = await observe(
                    label, store.branch(cid, at=at, expected_revision=conv.revision)
                )
                if branched is not None:
                    returned[cid] = branched
                    seen.append((label, names(dumped(branched.messages))))
        elif op == "branch to left":
            record = await store.read_record(cid)
            conv = await store.load(cid)
            if record is not None and conv is not None and record.branches:
                tip = rng.choice(record.branches)
                branched = await observe(
                    label, store.branch(cid, from_entry=tip, expected_revision=conv.revision)
                )
                if branched is not None:
                    returned[cid] = branched
                    seen.append((label, names(dumped(branched.messages))))
        elif op == "fork":
            entries = await store.load_entries(cid)
            if entries is not None:
                new = f"fork-{step}"
                record = await store.read_record(cid)
                # From the history, a branch it left, or a count; into a scope of its own or not.
                tips = [e.id for e in entries] + (record.branches if record is not None else [])
                scope = rng.choice([None, None, "u1"])
                if tips and rng.random() < 0.5:
                    forked = await observe(
                        label,
                        store.fork(
                            cid, from_entry=rng.choice(tips), new_conversation_id=new, scope=scope
                        ),
                    )
                else:
                    forked = await observe(
                        label,
                        store.fork(
                            cid,
                            at=rng.randint(0, len(entries)),
                            new_conversation_id=new,
                            scope=scope,
                        ),
                    )
                if forked is not None:
                    returned[new] = forked
                    seen.append((label, names(dumped(forked.messages))))
        elif op == "load":
            limit = rng.choice([None, 0, 1, 2, 5])
            conv = await store.load(cid, limit=limit)
            entries = await store.load_entries(cid, limit=limit)
            seen.append(
                (
                    label,
                    None if conv is None else names(dumped(conv.messages)),
                    None if entries is None else names([[e.id, e.parent_id] for e in entries]),
                )
            )
        elif op == "list":
            listed = await store.list_conversations(
                scope=rng.choice([None, "u1"]), limit=rng.choice([None, 1, 2])
            )
            seen.append((label, [r.conversation_id for r in listed]))
        elif op == "delete":
            await store.delete(cid)
            seen.append((label, await store.load(cid)))
        elif op == "rewrite":
            # A serialized copy (of what a branch or fork returned, else of a load),
            # cut and continued by hand: saved with `new_message_index=None`, so the
            # store compares it with the stored history.
            if rng.random() < 0.5 and any(f.startswith("fork-") for f in returned):
                cid = rng.choice(sorted(f for f in returned if f.startswith("fork-")))
            base = returned.get(cid) if rng.random() < 0.7 else None
            base = base or await store.load(cid, limit=rng.choice([None, None, 1, 2, 4]))
            if base is not None:
                copy = ConversationTypeAdapter.validate_json(
                    ConversationTypeAdapter.dump_json(base)
                )
                kept = copy.messages[: rng.choice(_continuable(copy.messages))]
                turn = [
                    ModelRequest(parts=[UserPromptPart(content=f"rewrite {step}")]),
                    ModelResponse(parts=[TextPart(content=f"rewritten at {step}")]),
                ]
                revision = copy.revision
                if rng.random() < 0.5:
                    # The copy is older than the stored conversation: the app took
                    # its messages from its own storage and the revision from the record.
                    record = await store.read_record(cid)
                    revision = None if record is None else record.revision
                rebuilt = Conversation(
                    conversation_id=cid,
                    messages=[*kept, *turn],
                    usage=copy.usage,
                    revision=revision,
                    # Lost with the copy, or serialized with it (a window's length, say).
                    new_message_index=rng.choice([None, None, copy.new_message_index]),
                )
                scope = rng.choice([None, None, "u1"])
                saved = await observe(f"{label} {cid}", store.save(rebuilt, scope=scope))
                if saved is not None:
                    seen.append(
                        (
                            f"{label} {cid}",
                            names([dumped([e.message]) for e in saved]),
                            names([[e.id, e.parent_id] for e in saved]),
                        )
                    )
        elif op == "save unchanged":
            conv = await store.load(cid)
            if conv is not None:
                await observe(label, store.save(conv))
    for cid in sorted({*IDS, *(f"fork-{s}" for s in range(steps))}):
        record = await store.read_record(cid)
        if record is not None:
            seen.append(
                (
                    cid,
                    names(
                        [
                            record.head_id,
                            record.forked_from,
                            record.forked_at,
                            record.branches,
                            record.scope,
                        ]
                    ),
                    record.usage.requests,
                )
            )
    return seen


def _continuable(messages: list[ModelMessage]) -> list[int]:
    """The lengths of the prefixes of `messages` that a new prompt may follow:
    none ends with a response whose tool calls are unanswered."""
    return [
        n
        for n in range(len(messages) + 1)
        if n == 0
        or not (
            isinstance(messages[n - 1], ModelResponse)
            and any(p.part_kind == "tool-call" for p in messages[n - 1].parts)
        )
    ]


@pytest.fixture
async def ledger_store(database_url: str) -> AsyncIterator[LedgerConversationStore]:
    async with AsyncStore.open(database_url) as store:
        yield LedgerConversationStore(store.tenant(f"pydantic-ai-{uuid.uuid4().hex[:8]}"))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_the_ledger_store_answers_as_pydantic_ais_own(
    ledger_store: LedgerConversationStore, seed: int
) -> None:
    expected = await play(InMemoryConversationStore(), seed, steps=40)
    assert await play(ledger_store, seed, steps=40) == expected


async def long_talk(store: ConversationStore, turns: int) -> list[Any]:
    """A conversation of many turns, then every window of it."""
    runner, names = agent(), Names()
    for turn in range(turns):
        conv = await store.load("long") or Conversation(conversation_id="long")
        await store.save(await runner.run(f"turn {turn}", conversation=conv))
    seen: list[Any] = []
    for limit in range(0, 12):
        conv = await store.load("long", limit=limit)
        entries = await store.load_entries("long", limit=limit)
        assert conv is not None and entries is not None
        seen.append(
            (limit, names(dumped(conv.messages)), names([[e.id, e.parent_id] for e in entries]))
        )
    return seen


async def test_windows_of_a_long_conversation_are_pydantic_ais(
    ledger_store: LedgerConversationStore,
) -> None:
    # Twenty turns, a third of them with a tool call: windows far shorter than
    # the history, starting inside and between groups of messages.
    expected = await long_talk(InMemoryConversationStore(), 20)
    assert await long_talk(ledger_store, 20) == expected


async def test_messages_appended_beside_the_store_do_not_enter_its_history(
    database_url: str,
) -> None:
    """chatledger's own writers may append to the same conversation: the next save
    goes after the store's own history, and their messages stay in the log."""
    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant(f"mixed-{uuid.uuid4().hex[:8]}")
        conversations, runner = LedgerConversationStore(ledger), agent()
        first = await runner.run("prompt 1", conversation=Conversation(conversation_id="m"))
        await conversations.save(first)
        conv = await ledger.conversation_by_key("m")
        beside = await ledger.append_messages(
            conv.id, [Message(role="user", content="written beside the store")]
        )

        loaded = await conversations.load("m")
        assert loaded is not None and dumped(loaded.messages) == dumped(first.all_messages())
        second = await runner.run("prompt 2", conversation=loaded)
        await conversations.save(second)
        again = await conversations.load("m")
        assert again is not None and dumped(again.messages) == dumped(second.all_messages())
        for entry in await conversations.load_entries("m") or []:
            assert (await conversations.read_entry(entry.id)).message == entry.message
        # The message written beside it is still in the log, on its branch.
        kept = await ledger.entries(conv.id, at=beside.head)
        assert kept[-1].message.content == "written beside the store"
        assert (await ledger.verify(conv.id)).ok


async def fork_and_branch_back(store: ConversationStore) -> list[Any]:
    """A fork that leaves its shared history, then branches back into it and goes on."""
    runner, names = agent(), Names()
    await store.save(await runner.run("c1", conversation=Conversation(conversation_id="c")))
    fork = await store.fork("c", new_conversation_id="f")
    left = await store.branch("f", at=0, expected_revision=fork.revision)
    await store.save(await runner.run("on a branch", conversation=left))
    record, loaded = await store.read_record("f"), await store.load("f")
    assert record is not None and loaded is not None
    back = await store.branch(
        "f", from_entry=record.branches[-1], expected_revision=loaded.revision
    )
    await store.save(await runner.run("after coming back", conversation=back))
    again = await store.load("f")
    assert again is not None
    return names(dumped(again.messages))


async def test_a_fork_that_branches_back_into_its_source_goes_on_from_there(
    ledger_store: LedgerConversationStore,
) -> None:
    expected = await fork_and_branch_back(InMemoryConversationStore())
    assert await fork_and_branch_back(ledger_store) == expected


async def test_a_head_moved_back_to_the_same_position_number_is_noticed(
    database_url: str,
) -> None:
    """Another writer moves the chatledger head back two positions: its `head.moved`
    lands at the same position number on a new branch; the store still notices."""
    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant(f"aba-{uuid.uuid4().hex[:8]}")
        conversations, runner = LedgerConversationStore(ledger), agent()
        first = await runner.run("p1", conversation=Conversation(conversation_id="m"))
        await conversations.save(first)
        conv = await ledger.conversation_by_key("m")
        moved = await ledger.move_head(conv.id, conv.head.position - 2)
        assert moved.head.position == conv.head.position  # same number, another branch
        second = await runner.run("p2", conversation=first.conversation)
        await conversations.save(second)
        loaded = await conversations.load("m")
        assert loaded is not None and dumped(loaded.messages) == dumped(second.all_messages())


async def test_a_fork_onto_a_deleted_conversations_id_is_a_conflict(
    ledger_store: LedgerConversationStore,
) -> None:
    """chatledger keeps a deleted conversation's log under its id, so a fork cannot
    take the id over (a save can: it starts a new history in that log)."""
    runner = agent()
    for cid in ("s", "d"):
        await ledger_store.save(
            await runner.run(cid, conversation=Conversation(conversation_id=cid))
        )
    await ledger_store.delete("d")
    with pytest.raises(ConversationConflict):
        await ledger_store.fork("s", new_conversation_id="d")
    await ledger_store.save(
        await runner.run("anew", conversation=Conversation(conversation_id="d"))
    )
    assert (await ledger_store.load("d")) is not None
