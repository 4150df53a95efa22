"""pydantic-ai agents on chatledger, end to end, on both backends.

An agent with a tool runs on conversations loaded from `LedgerConversationStore`
and saves them back; chatledger then reads the same conversations with its own
API and its command line (`history`, `audit`, `verify`); two writers race to
save the same loaded revision; and pydantic-ai's Vercel AI adapter serves two
requests of one chat from the store. All offline (pydantic-ai's
`FunctionModel`), on real databases.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.ui.vercel_ai import VercelAIAdapter

from chatledger.adapters.pydantic_ai import LedgerConversationStore
from chatledger.engine._cli import main as chatledger
from chatledger.store import AsyncLedger, AsyncStore, Page

T = TypeVar("T")


class Weather:
    """An offline model that looks the weather up once per prompt, then answers.

    Each call's tool call id names the prompt it answers (`call-<n>`), so ids
    never repeat within a conversation; `seen` keeps what each call was sent.
    """

    def __init__(self) -> None:
        self.seen: list[list[ModelMessage]] = []

    def agent(self) -> Agent[None, str]:
        built = Agent(FunctionModel(self.reply, stream_function=self.stream))

        @built.tool_plain
        def weather(city: str) -> str:
            return f"sunny in {city}"

        return built

    def reply(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        last = messages[-1]
        returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(content=f"It is {returned[0].content}.")])
        return ModelResponse(
            parts=[
                ToolCallPart(
                    tool_name="weather", args={"city": "Paris"}, tool_call_id=self.call_id(messages)
                )
            ]
        )

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        response = self.reply(messages, info)
        part = response.parts[0]
        if isinstance(part, TextPart):
            yield part.content
        else:
            assert isinstance(part, ToolCallPart)
            yield {
                0: DeltaToolCall(
                    name=part.tool_name,
                    json_args=part.args_as_json_str(),
                    tool_call_id=part.tool_call_id,
                )
            }

    @staticmethod
    def call_id(messages: list[ModelMessage]) -> str:
        prompts = sum(
            1
            for m in messages
            if m.kind == "request" and any(p.part_kind == "user-prompt" for p in m.parts)
        )
        return f"call-{prompts}"


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


def dumped(messages: list[ModelMessage]) -> Any:
    return json.loads(ModelMessagesTypeAdapter.dump_json(messages))


@pytest.fixture
def tenant() -> str:
    return f"pydantic-ai-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def opened(database_url: str, tenant: str) -> AsyncIterator[AsyncLedger]:
    async with AsyncStore.open(database_url) as store:
        yield store.tenant(tenant)


async def two_turns(conversations: LedgerConversationStore, cid: str) -> list[AgentRunResult[str]]:
    """Two runs of one conversation, each loaded from the store and saved back."""
    agent, results = Weather().agent(), []
    for prompt in ("Weather in Paris?", "And tomorrow?"):
        conv = await conversations.load(cid) or Conversation(conversation_id=cid)
        result = await agent.run(prompt, conversation=conv)
        await conversations.save(result)
        results.append(result)
    return results


async def test_a_run_continues_what_the_store_loaded_and_the_store_keeps_what_it_produced(
    opened: AsyncLedger,
) -> None:
    conversations = LedgerConversationStore(opened)
    first, second = await two_turns(conversations, "chat")

    loaded = await conversations.load("chat")
    assert loaded is not None
    assert ModelMessagesTypeAdapter.dump_json(
        loaded.messages
    ) == ModelMessagesTypeAdapter.dump_json(second.all_messages())
    # The second run started from the first's whole conversation.
    assert dumped(second.all_messages()[: len(first.all_messages())]) == dumped(
        first.all_messages()
    )
    calls = [p for m in loaded.messages for p in m.parts if isinstance(p, ToolCallPart)]
    returns = [p for m in loaded.messages for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(c.tool_call_id, c.args_as_dict()) for c in calls] == [
        ("call-1", {"city": "Paris"}),
        ("call-2", {"city": "Paris"}),
    ]
    assert [(r.tool_call_id, r.content) for r in returns] == [
        ("call-1", "sunny in Paris"),
        ("call-2", "sunny in Paris"),
    ]


async def test_chatledger_reads_a_conversation_the_adapter_wrote(opened: AsyncLedger) -> None:
    conversations = LedgerConversationStore(opened)
    await two_turns(conversations, "chat")
    entries = await conversations.load_entries("chat")
    assert entries is not None

    conv = await opened.conversation_by_key("chat")
    history = await opened.history(conv.id)
    # Repair had nothing to do: every call is answered, in order, and nothing was synthesized.
    assert await opened.history(conv.id, repaired=False) == history
    assert [
        (m.role, m.text, [(c.id, c.name) for c in m.tool_calls], m.tool_call_id) for m in history
    ] == [
        ("user", "Weather in Paris?", [], None),
        ("assistant", "", [("call-1", "weather")], None),
        ("tool", "sunny in Paris", [], "call-1"),
        ("assistant", "It is sunny in Paris.", [], None),
        ("user", "And tomorrow?", [], None),
        ("assistant", "", [("call-2", "weather")], None),
        ("tool", "sunny in Paris", [], "call-2"),
        ("assistant", "It is sunny in Paris.", [], None),
    ]
    assert (await opened.verify(conv.id)).ok

    events = await drain(lambda after: opened.audit.events(conversation_id=conv.id, after=after))
    recorded = [e for e in events if e.kind == "message.recorded"]
    assert [e.message for e in recorded] == history
    # Each entry's id, which pydantic-ai minted, is the id of its group's last message
    # event; here every entry is a group of one (a prompt, a call, a result, an answer).
    assert [e.id for e in entries] == [e.id for e in recorded]
    assert [(await opened.entry(e.id)).message for e in entries] == history
    # Two saves: each appended its messages and then changed the state (the record), once.
    assert [e.kind for e in events if e.kind != "message.recorded"] == [
        "conversation.created",
        "state.changed",
        "state.changed",
    ]
    assert {e.origin for e in events} == {"client"}
    assert events == await opened.events(conversation_id=conv.id)
    supplied = await drain(
        lambda after: opened.audit.supplied_and_repaired(conversation_id=conv.id, after=after)
    )
    assert [e.id for e in supplied] == [e.id for e in recorded]
    repaired = await drain(
        lambda after: opened.audit.supplied_and_repaired(
            conversation_id=conv.id, origin="repair", after=after
        )
    )
    assert repaired == []
    lineage = await opened.audit.lineage(conv.id)
    assert [b.reason for b in lineage.branches] == ["root"] and lineage.forks == []


async def test_the_command_line_reads_a_conversation_the_adapter_wrote(
    opened: AsyncLedger, database_url: str, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await two_turns(LedgerConversationStore(opened), "chat")
    conv = await opened.conversation_by_key("chat")
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
        "user: And tomorrow?",
        'assistant: calls weather({"city":"Paris"})',
        "tool: sunny in Paris",
        "assistant: It is sunny in Paris.",
    ]
    assert run("history", conv.id, "--raw") == run("history", conv.id)

    def audit(*args: str, json_out: bool = False) -> Any:
        """An audit question's every page: a page held back by another open transaction
        on the server (`pending`, ADR 0005), or followed by more, is asked for again."""
        text, items, after = "", [], []
        while True:
            if json_out:
                page = json.loads(run("audit", *args, "--json", *after))
                items += page["items"]
                more = page["hasMore"] or page["pending"]
                cursor = page["nextAfter"]
            else:
                out = run("audit", *args, *after)
                text += out
                found = re.search(r"--after (\S+?)\.?$", out.strip())
                more, cursor = found is not None, found and found[1]
            if not more:
                return items if json_out else text
            after = ["--after", cursor]

    events = audit("events", "--conversation", conv.id, json_out=True)
    kinds = [e["kind"] for e in events]
    assert kinds.count("message.recorded") == 8 and kinds.count("state.changed") == 2
    assert "Weather in Paris?" in audit("events", "--conversation", conv.id)
    assert "And tomorrow?" in audit("messages", "--conversation", conv.id)
    assert conv.id in run("audit", "lineage", conv.id)

    checked = run("verify", "--conversation", conv.id)
    assert "every chain is intact" in checked
    assert json.loads(run("verify", "--conversation", conv.id, "--json"))[0]["ok"] is True
    assert "every chain is intact" in run("verify")


@pytest.mark.parametrize("start", ["loaded", "new"])
async def test_of_two_concurrent_saves_of_one_revision_exactly_one_is_stored(
    database_url: str, tenant: str, start: str
) -> None:
    cid = f"race-{start}"
    async with (
        AsyncStore.open(database_url) as one,
        AsyncStore.open(database_url) as two,
        AsyncStore.open(database_url) as reader,
    ):
        writers = [LedgerConversationStore(s.tenant(tenant)) for s in (one, two)]
        if start == "loaded":
            await two_turns(writers[0], cid)
        for round in range(3):
            # Both writers load the same revision and run on it...
            loads = [await w.load(cid) or Conversation(conversation_id=cid) for w in writers]
            assert loads[0].revision == loads[1].revision
            results = [
                await Weather().agent().run(f"writer {i} round {round}", conversation=conv)
                for i, conv in enumerate(loads)
            ]
            # ...and save at once.
            saved = await asyncio.gather(
                *(w.save(r) for w, r in zip(writers, results, strict=True)),
                return_exceptions=True,
            )
            lost = [s for s in saved if isinstance(s, BaseException)]
            assert len(lost) == 1 and isinstance(lost[0], ConversationConflict), saved
            winner = results[0] if isinstance(saved[1], BaseException) else results[1]

            stored = await LedgerConversationStore(reader.tenant(tenant)).load(cid)
            assert stored is not None
            assert dumped(stored.messages) == dumped(winner.all_messages())
            # Nothing of the loser reached the log, on any branch.
            ledger = reader.tenant(tenant)
            conv = await ledger.conversation_by_key(cid)
            events = await ledger.events(conversation_id=conv.id)
            recorded = [e.message for e in events if e.kind == "message.recorded"]
            assert recorded == await ledger.history(conv.id, repaired=False)
            assert (await ledger.verify(conv.id)).ok


async def test_the_vercel_ai_adapter_serves_a_chat_from_the_store(opened: AsyncLedger) -> None:
    model = Weather()
    agent = model.agent()
    conversations = LedgerConversationStore(opened)

    async def request(message_id: str, text: str) -> list[dict[str, Any]]:
        """One `useChat` submit, its body as the client sends it, its stream as the client reads it."""
        body = {
            "trigger": "submit-message",
            "id": "ui-chat",
            "messages": [
                {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
            ],
        }
        adapter = VercelAIAdapter(
            agent,
            VercelAIAdapter.build_run_input(json.dumps(body).encode()),
            conversation_store=conversations,
        )
        chunks = []
        async for sse in adapter.encode_stream(adapter.run_stream()):
            data = sse.removeprefix("data: ").strip()
            if data != "[DONE]":
                chunks.append(json.loads(data))
        assert not [c for c in chunks if c["type"] == "error"], chunks
        return chunks

    first = await request("m1", "Weather in Paris?")
    after_first = await conversations.load("ui-chat")
    assert after_first is not None and len(after_first.messages) == 4
    calls = len(model.seen)
    second = await request("m2", "And tomorrow?")

    # The second request's first model call was sent what the first stored, then the new prompt.
    sent = model.seen[calls]
    assert dumped(sent[:-1]) == dumped(after_first.messages)
    assert [p.content for p in sent[-1].parts if isinstance(p, UserPromptPart)] == ["And tomorrow?"]

    # The store holds both turns, and each stream named the entries it saved.
    loaded = await conversations.load("ui-chat")
    assert loaded is not None
    entries = await conversations.load_entries("ui-chat")
    assert entries is not None
    saved = [
        c["data"]["entry_ids"] for c in (*first, *second) if c["type"] == "data-conversation-saved"
    ]
    assert [i for ids in saved for i in ids] == [e.id for e in entries]
    assert len(entries) == len(loaded.messages) == 8
    conv = await opened.conversation_by_key("ui-chat")
    history = await opened.history(conv.id)
    assert [m.text for m in history if m.role == "user"] == ["Weather in Paris?", "And tomorrow?"]
    assert [m.tool_call_id for m in history if m.role == "tool"] == ["call-1", "call-2"]
    assert await opened.history(conv.id, repaired=False) == history
