"""The framework adapters on sealed conversations, before and after an erasure.

Both adapters read through the ledger, so what they read is opened by the
store: the exact messages while the key lives, erased markers (content
`[erased]`) once the subject is erased, and nothing of the plaintext.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from chatledger.adapters.openai_agents import ChatledgerSession
from chatledger.adapters.pydantic_ai import LedgerConversationStore
from chatledger.store import AsyncStore, ErasedError
from chatledger.store._crypto import ERASED_CONTENT

KEK = bytes(range(64, 96))


def _model(messages: list[Any], info: Any) -> ModelResponse:
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"SECRET answer: {returned[0].content}")])
    return ModelResponse(parts=[ToolCallPart("weather", {"city": "SECRET-city"})])


async def test_a_pydantic_ai_conversation_reads_as_absent_after_an_erasure(
    database_url: str,
) -> None:
    agent = Agent(FunctionModel(_model), instructions="Answer briefly.")

    @agent.tool_plain
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async with AsyncStore.open(database_url, kek=KEK) as store:
        ledger = store.tenant(f"t-{uuid.uuid4().hex[:8]}")
        conversations = LedgerConversationStore(ledger)
        result = await agent.run(
            "SECRET question", conversation=Conversation(conversation_id="trip")
        )
        await conversations.save(result)
        loaded = await conversations.load("trip")
        assert loaded is not None and loaded.messages == result.all_messages()

        conversation_id = (await ledger.conversation_by_key("trip")).id
        await ledger.erase(conversation_id, reason="the user asked")
        # Its record (usage, deferred tool requests, title, metadata) was sealed with its
        # messages: the conversation reads as absent, its log as erased markers.
        assert await conversations.load("trip") is None
        assert [r.conversation_id for r in await conversations.list_conversations()] == []
        shown = repr(await ledger.history(conversation_id))
        assert "SECRET" not in shown and ERASED_CONTENT in shown
        again = await agent.run("more", conversation=Conversation(conversation_id="trip"))
        with pytest.raises(ErasedError):  # the id stays with its erased log
            await conversations.save(again)


async def test_openai_agents_session_reads_markers_after_an_erasure(database_url: str) -> None:
    async with AsyncStore.open(database_url, kek=KEK) as store:
        ledger = store.tenant(f"t-{uuid.uuid4().hex[:8]}")
        session = ChatledgerSession("user-7", ledger)
        items: list[Any] = [
            {"role": "user", "content": "SECRET question"},
            {"role": "assistant", "content": "SECRET answer"},
        ]
        await session.add_items(items)
        assert [i["content"] for i in await session.get_items()] == [
            "SECRET question",
            "SECRET answer",
        ]
        conversation_id = (await ledger.conversation_by_key("user-7")).id
        await ledger.erase(conversation_id, reason="the user asked")
        after = await session.get_items()
        assert len(after) == 2
        assert "SECRET" not in repr(after) and ERASED_CONTENT in repr(after)
