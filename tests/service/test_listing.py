"""`GET /v1/conversations` and the positions of `/messages`: finding a conversation,
and the position to fork it at."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from chatledger.store import Store
from tests.service.agents import weather_agent
from tests.service.conftest import Tenants


async def test_conversations_are_listed_newest_first_a_page_at_a_time(
    client_for: Callable[..., httpx.AsyncClient], tenants: Tenants, sync_store: Store
) -> None:
    mine = [sync_store.tenant(tenants.a).create_conversation().id for _ in range(5)]
    sync_store.tenant(tenants.b).create_conversation()  # never listed with key a
    client = client_for(weather_agent())
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get("/v1/conversations", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        pages += 1
        seen += [c["id"] for c in page["conversations"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(mine))
    assert pages == 3  # 2, 2, 1: the last page says it is the last
    whole = (await client.get("/v1/conversations")).json()
    assert [c["id"] for c in whole["conversations"]] == seen and whole["nextCursor"] is None
    assert whole["conversations"][0]["head"] == {
        "branchId": whole["conversations"][0]["head"]["branchId"],
        "position": 1,
    }


async def test_a_cursor_of_another_tenant_or_a_made_up_one_is_a_422_and_no_data(
    client_for: Callable[..., httpx.AsyncClient], tenants: Tenants, sync_store: Store
) -> None:
    sync_store.tenant(tenants.a).create_conversation()
    theirs = sync_store.tenant(tenants.b).create_conversation().id
    client = client_for(weather_agent())
    for cursor in [theirs, "not-a-cursor", "018f0000-0000-7000-8000-000000000000"]:
        response = await client.get("/v1/conversations", params={"cursor": cursor})
        assert response.status_code == 422, (cursor, response.text)
        assert response.json()["error"]["message"] == (
            f"The cursor {cursor!r} is not one this listing gave out for your API key: pass "
            f"the `nextCursor` of the previous page unchanged, or start again without `cursor`."
        )
        assert "conversations" not in response.json()


async def test_each_message_shows_the_position_a_fork_keeps_it_at(
    client_for: Callable[..., httpx.AsyncClient],
) -> None:
    client = client_for(weather_agent())
    asked = (await client.post("/v1/ask", json={"question": "Weather?"})).json()
    conversation_id = asked["conversationId"]
    messages = (await client.get(f"/v1/conversations/{conversation_id}/messages")).json()
    positions = [m["position"] for m in messages["messages"]]
    assert [m["role"] for m in messages["messages"]] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[0] > 1  # positions count events: the conversation and run began first
    at_first_answer = positions[1]
    forked = await client.post(
        f"/v1/conversations/{conversation_id}/forks", json={"at": at_first_answer}
    )
    assert forked.status_code == 201, forked.text
    fork_id = forked.json()["conversationId"]
    kept = (await client.get(f"/v1/conversations/{fork_id}/messages")).json()["messages"]
    assert kept[1]["toolCalls"] == messages["messages"][1]["toolCalls"]
    # The kept calls have no results on the fork: the repair answers them, with no event.
    assert [m["role"] for m in kept] == ["user", "assistant", "tool", "tool"]
    assert [m.get("position") for m in kept[:2]] == positions[:2]
    assert all("position" not in m for m in kept[2:])
    at_old = await client.get(
        f"/v1/conversations/{conversation_id}/messages", params={"at": at_first_answer}
    )
    assert [m.get("position") for m in at_old.json()["messages"]][:2] == positions[:2]
