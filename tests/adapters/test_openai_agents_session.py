"""`ChatledgerSession` against the OpenAI Agents SDK's own `SQLiteSession`.

Seeded random sequences of `add_items`, `get_items(limit)`, `pop_item` and
`clear_session` go to both, and every result must be JSON-equal. Then what the
SDK's sessions cannot do, and what a store must do beside them: concurrent
pops, a second session object on the same id, tenants chosen from the run
context, items a caller mutates, and the log keeping what was popped.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents.memory import SQLiteSession
from agents.memory.session_settings import SessionSettings
from agents.run_context import RunContextWrapper

from chatledger.adapters.openai_agents import ChatledgerSession
from chatledger.store import AsyncStore, ConflictError

TEXT = "The quick brown fox jumps over the lazy dog."


def corpus(step: int) -> list[list[dict[str, Any]]]:
    """Batches of items as the runner adds them: a user turn, a model response with
    reasoning and calls, the calls' outputs, and a final answer."""
    call = f"call_{step}"
    return [
        [{"role": "user", "content": f"question {step}: {TEXT}"}],
        [
            {
                "type": "reasoning",
                "id": f"rs_{step}",
                "summary": [{"type": "summary_text", "text": "think"}],
            },
            {
                "type": "function_call",
                "call_id": call,
                "name": "lookup",
                "arguments": json.dumps({"q": step}),
                "id": f"fc_{step}",
                "status": "completed",
            },
            {
                "type": "function_call",
                "call_id": call + "b",
                "name": "lookup",
                "arguments": "{}",
                "id": "__fake_id__",
                "provider_data": {"model": "other", "n": step},
            },
        ],
        [
            {"type": "function_call_output", "call_id": call, "output": f"result {step}"},
            {"type": "function_call_output", "call_id": call + "b", "output": "none"},
        ],
        [
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{step}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"answer {step}", "annotations": []}],
            }
        ],
    ]


def dumped(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


async def play(session: Any, seed: int, steps: int) -> list[Any]:
    rng = random.Random(seed)
    seen: list[Any] = []
    for step in range(steps):
        op = rng.choice(["add", "add", "add", "get", "get", "pop", "pop", "clear"])
        if op == "add":
            batches = corpus(step)
            start = rng.randrange(len(batches))
            items = [i for batch in batches[start : start + rng.randint(1, 4)] for i in batch]
            await session.add_items(items)
        elif op == "get":
            limit = rng.choice([None, 0, 1, 2, 3, 5, 8])
            seen.append((step, "get", limit, dumped(await session.get_items(limit))))
        elif op == "pop":
            seen.append((step, "pop", dumped(await session.pop_item())))
        elif rng.random() < 0.3:  # clear, but rarely
            await session.clear_session()
    seen.append(("end", dumped(await session.get_items())))
    return seen


@pytest.fixture
async def ledger_store(database_url: str) -> AsyncIterator[AsyncStore]:
    async with AsyncStore.open(database_url) as store:
        yield store


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_the_session_answers_as_the_sdks_own(ledger_store: AsyncStore, seed: int) -> None:
    ours = ChatledgerSession("s", ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}"))
    theirs = SQLiteSession("s")
    try:
        assert await play(ours, seed, 60) == await play(theirs, seed, 60)
    finally:
        theirs.close()


async def test_settings_limit_and_a_new_session_object_see_the_database(
    ledger_store: AsyncStore,
) -> None:
    ledger = ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}")
    first = ChatledgerSession("s", ledger)
    items = [i for batch in corpus(1) for i in batch]
    await first.add_items(items)
    again = ChatledgerSession("s", ledger, session_settings=SessionSettings(limit=2))
    assert dumped(await again.get_items()) == dumped(items[-2:])
    assert dumped(await again.get_items(limit=4)) == dumped(items[-4:])
    # A caller mutating what it got back changes nothing stored.
    got = await first.get_items()
    got[0]["content"] = "changed"
    got[1]["summary"].append({"type": "summary_text", "text": "x"})
    assert dumped(await first.get_items()) == dumped(items)


async def test_two_concurrent_pops_take_the_two_newest_items(database_url: str) -> None:
    tenant = f"agents-{uuid.uuid4().hex[:8]}"
    items = [i for step in range(3) for batch in corpus(step) for i in batch]
    async with AsyncStore.open(database_url) as one, AsyncStore.open(database_url) as two:
        await ChatledgerSession("s", one.tenant(tenant)).add_items(items)
        for round_ in range(3):
            a = ChatledgerSession("s", one.tenant(tenant))
            b = ChatledgerSession("s", two.tenant(tenant))
            popped = await asyncio.gather(a.pop_item(), b.pop_item())
            newest = items[-2:]
            assert sorted(map(dumped, popped)) == sorted(map(dumped, newest)), round_
            items = items[:-2]
            assert dumped(await a.get_items()) == dumped(items)


async def test_what_pop_and_clear_removed_stays_in_the_log(ledger_store: AsyncStore) -> None:
    ledger = ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}")
    session = ChatledgerSession("s", ledger)
    items = [i for batch in corpus(1) for i in batch]
    await session.add_items(items)
    conv = await ledger.conversation_by_key("s")
    full_head = conv.head
    assert dumped(await session.pop_item()) == dumped(items[-1])
    assert dumped(await session.pop_item()) == dumped(items[-2])  # inside a message
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    # Nothing was deleted: the history as it was is still there.
    kept = await ledger.entries(conv.id, at=full_head)
    from chatledger.adapters.openai_agents import from_messages

    assert dumped(from_messages([e.message for e in kept])) == dumped(items)
    assert (await ledger.verify(conv.id)).ok


async def test_fork_and_rewind_do_what_the_sdk_cannot(ledger_store: AsyncStore) -> None:
    ledger = ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}")
    session = ChatledgerSession("s", ledger)
    items = [i for batch in corpus(1) + corpus(2) for i in batch]
    await session.add_items(items)
    fork = await session.fork("s-fork", keep=3)  # inside the first model response
    assert dumped(await fork.get_items()) == dumped(items[:3])
    await fork.add_items([{"role": "user", "content": "in the fork"}])
    assert dumped(await session.get_items()) == dumped(items)
    await session.rewind(5)
    assert dumped(await session.get_items()) == dumped(items[:5])
    whole = await session.fork("s-copy")
    assert dumped(await whole.get_items()) == dumped(items[:5])


async def test_the_run_context_chooses_the_tenant(ledger_store: AsyncStore) -> None:
    suffix = uuid.uuid4().hex[:8]
    session = ChatledgerSession(
        "s",
        ledger_store.tenant(f"default-{suffix}"),
        tenant=lambda wrapper: ledger_store.tenant(f"{wrapper.context['org']}-{suffix}"),
    )
    acme = RunContextWrapper(context={"org": "acme"})
    globex = RunContextWrapper(context={"org": "globex"})
    await session.add_items([{"role": "user", "content": "acme's"}], wrapper=acme)
    await session.add_items([{"role": "user", "content": "globex's"}], wrapper=globex)
    assert [i["content"] for i in await session.get_items(wrapper=acme)] == ["acme's"]
    assert [i["content"] for i in await session.get_items(wrapper=globex)] == ["globex's"]
    assert await session.get_items() == []  # no run context: the default tenant
    assert [c.key for c in await ledger_store.tenant(f"acme-{suffix}").conversations()] == ["s"]
    theirs = copy.deepcopy(await session.get_items(wrapper=globex))
    assert await session.pop_item(wrapper=acme) is not None
    assert await session.get_items(wrapper=globex) == theirs


async def test_a_run_that_another_run_wrote_past_is_refused(ledger_store: AsyncStore) -> None:
    """Within a run (the runner passes its context wrapper), a write expects the head
    where the run last read or wrote it; another run's write in between refuses it."""
    session = ChatledgerSession("s", ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}"))
    await session.add_items([{"role": "user", "content": "before"}])
    first, second = RunContextWrapper(context=None), RunContextWrapper(context=None)
    await session.get_items(wrapper=first)
    await session.get_items(wrapper=second)
    await session.add_items([{"role": "user", "content": "second's"}], wrapper=second)
    with pytest.raises(ConflictError, match="changed since this run read it"):
        await session.add_items([{"role": "user", "content": "first's"}], wrapper=first)
    await session.add_items([{"role": "user", "content": "second's again"}], wrapper=second)
    assert [i["content"] for i in await session.get_items()] == [
        "before",
        "second's",
        "second's again",
    ]
    # A new run starts from the session as it is, and so does a write outside a run.
    third = RunContextWrapper(context=None)
    await session.get_items(wrapper=third)
    await session.add_items([{"role": "user", "content": "third's"}], wrapper=third)
    await session.add_items([{"role": "user", "content": "outside a run"}])
    assert len(await session.get_items()) == 5


async def test_a_run_notices_a_clear_or_rewind_that_leaves_the_same_position_number(
    ledger_store: AsyncStore,
) -> None:
    ledger = ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}")
    session = ChatledgerSession("s", ledger)
    await session.add_items([{"role": "user", "content": "m0"}, {"role": "user", "content": "m1"}])
    for other in ("clear", "rewind"):
        run = RunContextWrapper(context=None)
        await session.get_items(wrapper=run)
        meddler = ChatledgerSession("s", ledger)
        if other == "clear":
            await meddler.clear_session()
        else:
            await meddler.rewind(1)
        with pytest.raises(ConflictError, match="changed since this run read it"):
            await session.add_items([{"role": "user", "content": "run's"}], wrapper=run)
        await session.add_items(
            [{"role": "user", "content": "m0"}, {"role": "user", "content": "m1"}]
        )


async def test_a_runs_own_rewind_is_where_its_next_write_goes(ledger_store: AsyncStore) -> None:
    session = ChatledgerSession("s", ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}"))
    await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(3)])
    run = RunContextWrapper(context=None)
    await session.get_items(wrapper=run)
    await session.rewind(2, wrapper=run)
    await session.add_items([{"role": "user", "content": "run's"}], wrapper=run)
    assert [i["content"] for i in await session.get_items()] == ["m0", "m1", "run's"]


async def test_a_fork_of_an_empty_session_onto_a_taken_id_is_refused(
    ledger_store: AsyncStore,
) -> None:
    ledger = ledger_store.tenant(f"agents-{uuid.uuid4().hex[:8]}")
    await ChatledgerSession("taken", ledger).add_items([{"role": "user", "content": "its own"}])
    with pytest.raises(ConflictError, match="exists already"):
        await ChatledgerSession("never-written", ledger).fork("taken")
    fresh = await ChatledgerSession("never-written", ledger).fork("new")
    assert await fresh.get_items() == []
