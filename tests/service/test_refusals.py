"""Requests the service refuses write nothing, and every error's advice works when followed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from chatledger.engine import Agent, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.service import create_app
from chatledger.store import AsyncStore, Message, Store, ToolCall, new_id
from chatledger.store._sql import migrate as _migrate
from tests.service.agents import blocking_agent, weather_agent
from tests.service.conftest import Tenants, sse_events

Client = Callable[..., httpx.AsyncClient]
ROUTES = ["/v1/ask", "/v1/ask/stream"]
JSON = {"Content-Type": "application/json"}


def outcome(response: httpx.Response, route: str) -> tuple[int, dict[str, Any]]:
    """The status and body of an answer or error: a stream's last event, with its 200."""
    if not route.endswith("stream"):
        body = response.json()
        return response.status_code, body.get("error", body)
    assert response.status_code == 200, response.text
    kind, data = sse_events(response.text.splitlines())[-1]
    assert kind in ("answer", "error")
    return 200, json.loads(data)


def state(store: Store, tenant: str) -> tuple[Any, ...]:
    """Everything of `tenant` a write could change: its conversations (and their
    heads), its whole log (branches and head moves included), each head's history."""
    ledger = store.tenant(tenant)
    conversations = ledger.conversations(limit=1000)
    return (
        conversations,
        ledger.events(),
        [ledger.history(c.id) for c in conversations],
    )


# -- item 1: a refused request writes nothing ------------------------------------------

# A lone surrogate, as a JSON escape: valid JSON, text no database column takes.
UNENCODABLE = '[["user", "a lone \\udfff"]]'


@pytest.mark.parametrize("route", ROUTES)
async def test_a_refused_history_leaves_an_existing_conversation_as_it_was(
    client_for: Client, sync_store: Store, tenants: Tenants, route: str
) -> None:
    client = client_for(weather_agent())
    first = (await client.post("/v1/ask", json={"question": "Weather?"})).json()
    before = state(sync_store, tenants.a)
    body = (
        f'{{"question": "Again?", "conversation_id": "{first["conversationId"]}", '
        f'"history": {UNENCODABLE}}}'
    )
    status, error = outcome(await client.post(route, content=body, headers=JSON), route)
    assert status == (200 if route.endswith("stream") else 422)
    assert error["type"] == "invalid_request" and "surrogate" in error["message"]
    assert state(sync_store, tenants.a) == before
    messages = await client.get(f"/v1/conversations/{first['conversationId']}/messages")
    assert len(messages.json()["messages"]) == len(before[2][0]) > 0


@pytest.mark.parametrize("route", ROUTES)
async def test_a_refused_history_creates_no_conversation(
    client_for: Client, sync_store: Store, tenants: Tenants, route: str
) -> None:
    client = client_for(weather_agent())
    body = f'{{"question": "Weather?", "history": {UNENCODABLE}}}'
    status, error = outcome(await client.post(route, content=body, headers=JSON), route)
    assert status == (200 if route.endswith("stream") else 422)
    assert error["type"] == "invalid_request"
    assert state(sync_store, tenants.a) == ([], [], [])


# -- item 2: concurrent asks on one conversation -----------------------------------------


@pytest.fixture
async def live_run(
    client_for: Client, sync_store: Store, tenants: Tenants
) -> AsyncIterator[tuple[httpx.AsyncClient, str, asyncio.Task[httpx.Response], asyncio.Event]]:
    """A client, a conversation, and an ask on it whose run is live (its tool waits)
    until the test sets the event."""
    started, release = asyncio.Event(), asyncio.Event()
    client = client_for(blocking_agent(started, release))
    conversation_id = sync_store.tenant(tenants.a).create_conversation().id
    first = asyncio.create_task(
        client.post("/v1/ask", json={"question": "First?", "conversation_id": conversation_id})
    )
    await started.wait()
    yield client, conversation_id, first, release
    release.set()
    await first


@pytest.mark.parametrize("route", ROUTES)
async def test_a_second_ask_while_a_run_is_live_is_409_writes_nothing_and_its_retry_answers(
    live_run: tuple[httpx.AsyncClient, str, asyncio.Task[httpx.Response], asyncio.Event],
    sync_store: Store,
    tenants: Tenants,
    route: str,
) -> None:
    client, conversation_id, first, release = live_run
    second = {"question": "Second?", "conversation_id": conversation_id}
    before = state(sync_store, tenants.a)
    status, error = outcome(await client.post(route, json=second), route)
    assert status == (200 if route.endswith("stream") else 409)
    assert error["type"] == "conflict" and "resume" not in error
    assert "Retry once it has ended" in error["message"]
    assert state(sync_store, tenants.a) == before
    # The advice, followed: once the first run has ended, the retry is answered.
    release.set()
    assert (await first).status_code == 200
    status, answer = outcome(await client.post(route, json=second), route)
    assert status == 200 and answer["answer"] == "Finished after waiting."
    history = sync_store.tenant(tenants.a).history(conversation_id)
    assert [m.content for m in history if m.role == "user"] == ["First?", "Second?"]


async def test_an_ask_whose_head_another_writer_moved_is_409_and_asking_again_answers(
    live_run: tuple[httpx.AsyncClient, str, asyncio.Task[httpx.Response], asyncio.Event],
    sync_store: Store,
    tenants: Tenants,
) -> None:
    client, conversation_id, first, release = live_run
    ledger = sync_store.tenant(tenants.a)
    ledger.append_messages(conversation_id, [Message(role="user", content="Meanwhile.")])
    release.set()
    response = await first
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert (error["type"], error["stage"]) == ("conflict", "conflict")
    assert "resume" not in error and "Ask again" in error["message"]
    assert ledger.runs.get(error["runId"]).stage == "conflict"
    # The advice, followed: the same question asked again is answered on the new head.
    again = await client.post(
        "/v1/ask", json={"question": "First?", "conversation_id": conversation_id}
    )
    assert again.status_code == 200, again.text
    assert [m.content for m in ledger.history(conversation_id)] == [
        "Meanwhile.",
        "First?",
        "",
        "released",
        "Finished after waiting.",
    ]


# -- item 3: a database the service cannot use is 503 on every route ----------------------


def _client(agent: Agent, store: AsyncStore, tenants: Tenants) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(agent, store, keys=tenants.keys)),
        base_url="http://service.test",
        headers=tenants.auth(tenants.key_a),
    )


@pytest.mark.parametrize("route", ROUTES)
async def test_the_ask_routes_answer_503_on_an_unmigrated_database(
    empty_url: str, tenants: Tenants, route: str
) -> None:
    async with (
        AsyncStore.open(empty_url) as store,
        _client(weather_agent(), store, tenants) as client,
    ):
        read = await client.get(f"/v1/conversations/{new_id()}")
        assert read.status_code == 503, read.text
        status, error = outcome(await client.post(route, json={"question": "Hi?"}), route)
    assert status == (200 if route.endswith("stream") else 503)
    assert error["type"] == "unavailable" and "migrate" in error["message"]
    assert "resume" not in error


def _downgrade(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            _migrate.downgrade(conn, "base")
    finally:
        engine.dispose()


@pytest.mark.parametrize("route", ROUTES)
async def test_a_schema_that_disappears_during_a_run_is_503(
    own_database: str, tenants: Tenants, route: str
) -> None:
    @tool
    async def drop_the_schema() -> str:
        """Remove chatledger's tables (what an operator's mistake would do)."""
        await asyncio.to_thread(_downgrade, own_database)
        return "dropped"

    def script(request: Any) -> Message | str:
        if any(m.role == "tool" for m in request.messages):
            return "never recorded"
        return Message(role="assistant", tool_calls=[ToolCall(id="d", name="drop_the_schema")])

    agent = Agent(ScriptedModel(script), tools=[drop_the_schema])
    async with AsyncStore.open(own_database) as store, _client(agent, store, tenants) as client:
        status, error = outcome(await client.post(route, json={"question": "Drop?"}), route)
    assert status == (200 if route.endswith("stream") else 503)
    assert error["type"] == "unavailable" and "migrate" in error["message"]
    assert "resume" not in error
