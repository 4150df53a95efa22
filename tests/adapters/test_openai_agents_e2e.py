"""OpenAI Agents SDK runs on `ChatledgerSession`, end to end, on both backends.

An agent with a function tool runs twice on one session through `Runner.run`,
`Runner.run_sync` and `Runner.run_streamed`, and the same script runs on the
SDK's own `SQLiteSession`: the two sessions must end JSON-equal and the model
must have been sent the same inputs. Then guardrail trips and the runner's
rewind helper, two runners racing on one session, and chatledger reading what
the session wrote with its own API and its command line. All offline
(`agents.testing.ScriptedModel`), on real databases.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    Runner,
    TResponseInputItem,
    UserError,
    function_tool,
    input_guardrail,
    output_guardrail,
)
from agents.memory import SQLiteSession
from agents.run_internal.session_persistence import rewind_session_items
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from chatledger.adapters.openai_agents import ChatledgerSession
from chatledger.engine._cli import main as chatledger
from chatledger.store import AsyncLedger, AsyncStore, ConflictError, Page

T = TypeVar("T")

PROMPTS = ("Weather in Paris?", "And in Oslo?")
CONFIG = RunConfig(tracing_disabled=True)


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def script(tag: str = "") -> list[Any]:
    """Two runs' model responses: each a `weather` call (the first with reasoning
    before it), then an answer; `tag` keeps ids apart between scripts."""
    return [
        [
            ResponseReasoningItem(
                id=f"rs{tag}_1",
                type="reasoning",
                summary=[Summary(type="summary_text", text="Look it up.")],
            ),
            function_call("weather", {"city": "Paris"}, call_id=f"call{tag}_1"),
        ],
        [assistant_message("It is sunny in Paris.", item_id=f"msg{tag}_1")],
        [function_call("weather", {"city": "Oslo"}, call_id=f"call{tag}_2")],
        [assistant_message("It is sunny in Oslo.", item_id=f"msg{tag}_2")],
    ]


def forecaster(model: ScriptedModel, **kwargs: Any) -> Agent[Any]:
    return Agent(name="forecaster", model=model, tools=[weather], **kwargs)


def dumped(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def inputs(model: ScriptedModel) -> list[str]:
    """What the model was sent, call by call."""
    return [dumped(call.input) for call in model.calls]


async def run_async(session: Any, model: ScriptedModel, streamed: bool, **kwargs: Any) -> None:
    """Both prompts on `session`, one run each."""
    for prompt in PROMPTS:
        if streamed:
            result = Runner.run_streamed(
                forecaster(model, **kwargs), prompt, session=session, run_config=CONFIG
            )
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(
                forecaster(model, **kwargs), prompt, session=session, run_config=CONFIG
            )


def run_sync_in_a_thread_of_its_own(
    make_session: Callable[[], Any], close: Callable[[Any], Awaitable[None]] | None
) -> tuple[list[TResponseInputItem], ScriptedModel]:
    """Both prompts through `Runner.run_sync`, which needs a thread without a running
    loop: it runs on (and leaves open) the thread's default loop, set here so that
    the session's reads and its close run there too, and the loop is closed after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        session, model = make_session(), ScriptedModel(script())
        for prompt in PROMPTS:
            Runner.run_sync(forecaster(model), prompt, session=session, run_config=CONFIG)
        items = loop.run_until_complete(session.get_items())
        if close is not None:
            loop.run_until_complete(close(session))
        return items, model
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


async def drain(read: Callable[[str | None], Awaitable[Page[T]]]) -> list[T]:
    """Every item of an audit query, page after page; a page held back by another
    open transaction on the server (`pending`, ADR 0005) is asked for again."""
    items: list[T] = []
    after = None
    while True:
        page = await read(after)
        items += page.items
        after = page.next_after
        if not page.has_more and not page.pending:
            return items


@pytest.fixture
def tenant() -> str:
    return f"agents-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def opened(database_url: str, tenant: str) -> AsyncIterator[AsyncLedger]:
    async with AsyncStore.open(database_url) as store:
        yield store.tenant(tenant)


@pytest.fixture
def theirs() -> AsyncIterator[SQLiteSession]:
    session = SQLiteSession("user-7", ":memory:")
    yield session
    session.close()


# -- a: the three ways to run, against the SDK's own session -------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_two_runs_leave_what_the_sdks_own_session_would(
    opened: AsyncLedger, theirs: SQLiteSession, streamed: bool
) -> None:
    ours = ChatledgerSession("user-7", opened)
    model, reference = ScriptedModel(script()), ScriptedModel(script())
    await run_async(ours, model, streamed)
    await run_async(theirs, reference, streamed)

    items = await ours.get_items()
    assert dumped(items) == dumped(await theirs.get_items())
    assert inputs(model) == inputs(reference)
    assert all(call.streamed is streamed for call in model.calls)
    assert model.remaining_steps == 0 and len(items) == 9
    # The second run's first call was sent the first run's items, then its prompt.
    second = model.calls[2].input
    assert dumped(second[:-1]) == dumped(items[:5])
    assert second[-1] == {"role": "user", "content": PROMPTS[1]}


async def test_run_sync_leaves_what_the_sdks_own_session_would(
    database_url: str, tenant: str
) -> None:
    stores: list[AsyncStore] = []

    def ours() -> ChatledgerSession:
        stores.append(AsyncStore.open(database_url))  # opened, used and closed in that thread
        return ChatledgerSession("user-7", stores[-1].tenant(tenant))

    async def close(session: ChatledgerSession) -> None:
        await stores.pop().close()

    items, model = await asyncio.to_thread(run_sync_in_a_thread_of_its_own, ours, close)
    reference_items, reference = await asyncio.to_thread(
        run_sync_in_a_thread_of_its_own, lambda: SQLiteSession("user-7", ":memory:"), None
    )
    assert dumped(items) == dumped(reference_items) and len(items) == 9
    assert inputs(model) == inputs(reference)
    assert dumped(model.calls[2].input[:-1]) == dumped(items[:5])
    # And the database holds it for any other reader.
    async with AsyncStore.open(database_url) as store:
        again = ChatledgerSession("user-7", store.tenant(tenant))
        assert dumped(await again.get_items()) == dumped(items)


# -- b: guardrail trips, and the runner's rewind ----------------------------------------


class CountingPops(ChatledgerSession):
    """A `ChatledgerSession` that counts the runner's `pop_item` calls."""

    pops = 0

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> Any:
        self.pops += 1
        return await super().pop_item(wrapper=wrapper)


@input_guardrail
async def no_secrets_asked(
    ctx: RunContextWrapper[Any], agent: Agent[Any], given: Any
) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="Oslo" in str(given))


@output_guardrail
async def no_oslo_said(
    ctx: RunContextWrapper[Any], agent: Agent[Any], output: str
) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="Oslo" in output)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("guardrail", ["input", "output"])
async def test_a_guardrail_trip_leaves_what_the_sdks_own_session_would(
    opened: AsyncLedger, theirs: SQLiteSession, guardrail: str, streamed: bool
) -> None:
    """The second prompt trips a guardrail. In openai-agents 0.24 the runner does not
    pop on a trip: an input trip keeps the prompt, an output trip keeps the turn's
    calls and results but not the blocked answer, on either session."""
    guard: dict[str, Any] = (
        {"input_guardrails": [no_secrets_asked]}
        if guardrail == "input"
        else {"output_guardrails": [no_oslo_said]}
    )
    tripped = (
        InputGuardrailTripwireTriggered
        if guardrail == "input"
        else OutputGuardrailTripwireTriggered
    )
    ours = CountingPops("user-7", opened)
    for session in (ours, theirs):
        with pytest.raises(tripped):
            await run_async(session, ScriptedModel(script()), streamed, **guard)

    items = await ours.get_items()
    assert dumped(items) == dumped(await theirs.get_items())
    assert ours.pops == 0
    assert items[5] == {"role": "user", "content": "And in Oslo?"}
    assert [i.get("type") for i in items[6:]] == (
        [] if guardrail == "input" else ["function_call", "function_call_output"]
    )
    assert (await opened.verify((await opened.conversation_by_key("user-7")).id)).ok


async def test_the_runners_rewind_pops_what_it_added_as_on_the_sdks_own_session(
    opened: AsyncLedger, theirs: SQLiteSession
) -> None:
    """`rewind_session_items`, the runner's undo on a `conversation_locked` retry, pops
    the tail back while it matches what the runner added. The runner only reaches it
    with a server-managed conversation, which it refuses to combine with a session,
    so it is driven here directly, as the runner calls it."""
    ours = ChatledgerSession("user-7", opened)
    await run_async(ours, ScriptedModel(script()), streamed=False)
    await run_async(theirs, ScriptedModel(script()), streamed=False)
    items = await ours.get_items()
    for session in (ours, theirs):
        # The second run's items, and a suffix that splits the first run's model response
        # (reasoning and call in one chatledger message).
        await rewind_session_items(session, items[5:])
        assert dumped(await session.get_items()) == dumped(items[:5])
        await rewind_session_items(session, items[2:5])
        assert dumped(await session.get_items()) == dumped(items[:2])
        # A tail that does not match what it asks for is left alone.
        await rewind_session_items(session, items[3:5])
        assert dumped(await session.get_items()) == dumped(items[:2])

    conv = await opened.conversation_by_key("user-7")
    assert (await opened.verify(conv.id)).ok
    assert await opened.history(conv.id, repaired=False) == await opened.history(conv.id)
    # What was popped stays in the log.
    recorded = [
        e for e in await opened.events(conversation_id=conv.id) if e.kind == "message.recorded"
    ]
    assert "It is sunny in Oslo." in [e.message.text for e in recorded if e.message]

    with pytest.raises(UserError, match="Session persistence cannot be combined"):
        await Runner.run(
            forecaster(ScriptedModel(script())),
            "hi",
            session=ours,
            conversation_id="conv_1",
            run_config=CONFIG,
        )


# -- c: two runners on one session ---------------------------------------------------


async def test_two_concurrent_runs_on_one_session_never_interleave(
    database_url: str, tenant: str
) -> None:
    """Two runners (two stores on one database) run on one session at once. The runner
    writes a run in several `add_items` calls (the prompt, each model response with its
    tool results, the answer); each run's writes expect the head where its last read or
    write left it, so the runs land one after the other, or one fails with a clear
    `ConflictError` and stores nothing more: a run's items are never split by
    another's."""
    kinds = ["message", "reasoning", "function_call", "function_call_output", "message"]
    async with AsyncStore.open(database_url) as one, AsyncStore.open(database_url) as two:
        for round_ in range(4):
            sessions = [ChatledgerSession("shared", s.tenant(tenant)) for s in (one, two)]
            tags = [f"-{round_}a", f"-{round_}b"]
            models = [ScriptedModel(script(tag)[:2]) for tag in tags]
            before = await sessions[0].get_items()
            outcomes = await asyncio.gather(
                *(
                    Runner.run(forecaster(m), f"run {t}", session=s, run_config=CONFIG)
                    for m, t, s in zip(models, tags, sessions, strict=True)
                ),
                return_exceptions=True,
            )
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(failed) <= 1, round_
            for error in failed:
                assert isinstance(error, ConflictError), error
                assert "changed since this run read it" in str(error)
            items = await sessions[1].get_items()
            assert dumped(items[: len(before)]) == dumped(before)
            added = items[len(before) :]
            for tag, outcome in zip(tags, outcomes, strict=True):
                mine = [n for n, i in enumerate(added) if tag in dumped(i)]
                # A run's items are contiguous: whole when it landed, what it
                # wrote before its conflict when it failed.
                assert mine == list(range(mine[0], mine[0] + len(mine))) if mine else True
                if not isinstance(outcome, BaseException):
                    assert [added[n].get("type", "message") for n in mine] == kinds, round_

            ledger = one.tenant(tenant)
            conv = await ledger.conversation_by_key("shared")
            history = await ledger.history(conv.id)
            assert await ledger.history(conv.id, repaired=False) == history
            assert (await ledger.verify(conv.id)).ok


# -- d: chatledger reads what the session wrote ---------------------------------------


EXPECTED = [
    ("user", "Weather in Paris?", [], None),
    ("assistant", "", [("call_1", "weather")], None),
    ("tool", "sunny in Paris", [], "call_1"),
    ("assistant", "It is sunny in Paris.", [], None),
    ("user", "And in Oslo?", [], None),
    ("assistant", "", [("call_2", "weather")], None),
    ("tool", "sunny in Oslo", [], "call_2"),
    ("assistant", "It is sunny in Oslo.", [], None),
]


async def test_chatledger_reads_a_session_the_runner_wrote(opened: AsyncLedger) -> None:
    session = ChatledgerSession("user-7", opened)
    await run_async(session, ScriptedModel(script()), streamed=False)

    conv = await opened.conversation_by_key("user-7")
    history = await opened.history(conv.id)
    assert await opened.history(conv.id, repaired=False) == history
    assert [
        (m.role, m.text, [(c.id, c.name) for c in m.tool_calls], m.tool_call_id) for m in history
    ] == EXPECTED
    assert [p.kind for p in history[1].parts] == ["thinking"]
    assert [c.arguments for m in history for c in m.tool_calls] == [
        '{"city":"Paris"}',
        '{"city":"Oslo"}',
    ]
    assert (await opened.verify(conv.id)).ok

    events = await drain(lambda after: opened.audit.events(conversation_id=conv.id, after=after))
    recorded = [e for e in events if e.kind == "message.recorded"]
    assert [e.message for e in recorded] == history
    assert [e.kind for e in events if e.kind != "message.recorded"] == ["conversation.created"]
    assert {e.origin for e in events} == {"client"}
    assert events == await opened.events(conversation_id=conv.id)
    repaired = await drain(
        lambda after: opened.audit.supplied_and_repaired(
            conversation_id=conv.id, origin="repair", after=after
        )
    )
    assert repaired == []


async def test_the_command_line_reads_a_session_the_runner_wrote(
    opened: AsyncLedger, database_url: str, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await run_async(ChatledgerSession("user-7", opened), ScriptedModel(script()), streamed=True)
    conv = await opened.conversation_by_key("user-7")
    where = ["--database-url", database_url, "--tenant", tenant]

    def run(*args: str) -> str:
        status = chatledger([*args, *where])
        out, err = capsys.readouterr()
        assert (status, err) == (0, ""), err
        return out

    # Each line: the message's position, then the message.
    lines = [line.split(maxsplit=1)[1] for line in run("history", conv.id).splitlines()]
    assert lines == [
        "user: Weather in Paris?",
        'assistant: calls weather({"city":"Paris"})',
        "tool: sunny in Paris",
        "assistant: It is sunny in Paris.",
        "user: And in Oslo?",
        'assistant: calls weather({"city":"Oslo"})',
        "tool: sunny in Oslo",
        "assistant: It is sunny in Oslo.",
    ]
    assert run("history", conv.id, "--raw") == run("history", conv.id)

    events, after = [], []
    while True:
        page = json.loads(run("audit", "events", "--conversation", conv.id, "--json", *after))
        events += page["items"]
        if not page["hasMore"] and not page["pending"]:
            break
        after = ["--after", page["nextAfter"]]
    assert [e["kind"] for e in events].count("message.recorded") == 8
    assert re.search(r"Weather in Paris\?", run("audit", "events", "--conversation", conv.id))

    assert "every chain is intact" in run("verify", "--conversation", conv.id)
    assert json.loads(run("verify", "--conversation", conv.id, "--json"))[0]["ok"] is True
