"""The service's boundary: bad requests, keys and tenants, and the read endpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from chatledger.engine import Agent, tool
from chatledger.engine.providers import ModelError
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Message, Store, ToolCall, new_id
from tests.service.agents import retrieval_agent, weather_agent
from tests.service.conftest import Tenants

Client = Callable[..., httpx.AsyncClient]


def written(store: Store, tenant: str) -> tuple[int, int]:
    """How many events and conversations `tenant` has."""
    ledger = store.tenant(tenant)
    return len(ledger.events()), len(ledger.conversations(limit=1000))


BAD_REQUESTS: dict[str, tuple[dict[str, Any], int, str]] = {
    "malformed JSON": ({"content": b'{"question": "hi",'}, 400, "not valid JSON"),
    "not an object": ({"json": ["hi"]}, 422, "JSON object"),
    "no body": ({}, 422, "body is missing"),
    "no question": ({"json": {"history": []}}, 422, "'question' is required"),
    "blank question": ({"json": {"question": "  "}}, 422, "blank"),
    "history not a list": ({"json": {"question": "q", "history": "hi"}}, 422, "list of"),
    "history not pairs": (
        {"json": {"question": "q", "history": [["user", "a"], ["user"]]}},
        422,
        "history[1]",
    ),
    "history pair not strings": (
        {"json": {"question": "q", "history": [["user", 1]]}},
        422,
        "pair of two strings",
    ),
    "unknown field": ({"json": {"question": "q", "tenant": "other"}}, 422, "'tenant'"),
    "10 MB question": ({"json": {"question": "x" * 10_000_000}}, 413, "over 1,048,576 bytes"),
    "malformed conversation id": (
        {"json": {"question": "q", "conversation_id": "nope"}},
        422,
        "nope",
    ),
    "unknown conversation": (
        {"json": {"question": "q", "conversation_id": "<random>"}},
        404,
        "<random>",
    ),
}


@pytest.mark.parametrize("route", ["/v1/ask", "/v1/ask/stream"])
@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_a_bad_request_gets_a_json_sentence_and_writes_nothing(
    client_for: Client, sync_store: Store, tenants: Tenants, route: str, case: str
) -> None:
    request, status, says = BAD_REQUESTS[case]
    random = new_id()
    if "json" in request:
        request = {"json": json.loads(json.dumps(request["json"]).replace("<random>", random))}
    if "content" in request:
        request = {**request, "headers": {"Content-Type": "application/json"}}
    client = client_for(weather_agent())
    response = await client.post(route, **request)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert says.replace("<random>", random) in error["message"]
    assert error["message"].endswith(".") and error["type"]
    assert written(sync_store, tenants.a) == (0, 0)


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer nope", "Bearer ", "Basic a2V5OnZhbHVl", "key-a-raw"],
)
async def test_a_request_without_a_valid_key_is_401_and_writes_nothing(
    client_for: Client, sync_store: Store, tenants: Tenants, authorization: str | None
) -> None:
    client = client_for(weather_agent())
    headers = {} if authorization is None else {"Authorization": authorization}
    client.headers.pop("Authorization")
    for method, path, body in [
        ("POST", "/v1/ask", {"question": "Weather?"}),
        ("POST", "/v1/ask", None),  # not even a body is looked at without a key
        ("GET", f"/v1/conversations/{new_id()}/messages", None),
    ]:
        response = await client.request(
            method, path, json=body, headers=headers, content=None if body else b"{"
        )
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    assert written(sync_store, tenants.a) == (0, 0)


async def test_another_tenants_ids_are_404_exactly_like_missing_ones(
    client_for: Client, sync_store: Store, tenants: Tenants
) -> None:
    client = client_for(weather_agent())
    theirs = (await client.post("/v1/ask", json={"question": "Weather?"})).json()
    before = written(sync_store, tenants.a)
    other = client_for(weather_agent())
    other.headers["Authorization"] = f"Bearer {tenants.key_b}"
    missing = {"conversationId": new_id(), "runId": new_id()}
    requests = [
        ("GET", "/v1/conversations/{conversation_id}", None),
        ("GET", "/v1/conversations/{conversation_id}/messages", None),
        ("GET", "/v1/conversations/{conversation_id}/runs", None),
        ("POST", "/v1/conversations/{conversation_id}/forks", {}),
        ("GET", "/v1/runs/{run_id}", None),
        ("POST", "/v1/ask", {"question": "q", "conversation_id": "{conversation_id}"}),
        ("POST", "/v1/ask/stream", {"question": "q", "conversation_id": "{conversation_id}"}),
    ]
    for method, path, body in requests:
        shapes = []
        shouted = {k: theirs[k].upper() for k in missing}  # the same ids, in capitals
        for ids in (theirs, missing, shouted):
            fill = {"conversation_id": ids["conversationId"], "run_id": ids["runId"]}
            data = (
                {k: v.format(**fill) if isinstance(v, str) else v for k, v in body.items()}
                if body is not None
                else None
            )
            response = await other.request(method, path.format(**fill), json=data)
            assert response.status_code == 404, (path, response.text)
            text = response.text
            for value in fill.values():
                text = text.replace(value.lower(), "<id>")
            shapes.append(text)
        assert shapes[0] == shapes[1] == shapes[2], path
    assert written(sync_store, tenants.a) == before
    assert written(sync_store, tenants.b) == (0, 0)


async def test_the_read_endpoints(client_for: Client, tenants: Tenants) -> None:
    client = client_for(retrieval_agent())
    first = (await client.post("/v1/ask", json={"question": "FY2024 revenue?"})).json()
    cid = first["conversationId"]
    p1 = (await client.get(f"/v1/conversations/{cid}")).json()["head"]["position"]
    second = (
        await client.post("/v1/ask", json={"question": "oslo?", "conversation_id": cid})
    ).json()

    conversation = (await client.get(f"/v1/conversations/{cid}")).json()
    assert conversation["id"] == cid and conversation["head"]["position"] > p1
    assert "headOpen" not in conversation

    at_two = (await client.get(f"/v1/conversations/{cid}/messages", params={"at": p1})).json()
    assert [m["role"] for m in at_two["messages"]] == ["user", "assistant"]

    runs = (await client.get(f"/v1/conversations/{cid}/runs")).json()["runs"]
    assert [r["id"] for r in runs] == [second["runId"], first["runId"]]
    assert all(r["status"] == "completed" for r in runs)

    timeline = (await client.get(f"/v1/runs/{first['runId']}")).json()
    assert timeline["run"]["id"] == first["runId"]
    assert [e["kind"] for e in timeline["events"]] == [
        "run.started",
        "message.recorded",
        "model.requested",
        "model.responded",
        "message.recorded",
        "run.completed",
    ]

    forked = await client.post(f"/v1/conversations/{cid}/forks", json={"at": p1})
    assert forked.status_code == 201, forked.text
    fork_id = forked.json()["conversationId"]
    assert forked.json()["forkedFrom"] == cid
    history = (await client.get(f"/v1/conversations/{fork_id}/messages")).json()["messages"]
    assert [m["content"] for m in history] == at_two_contents(at_two)
    whole = await client.post(f"/v1/conversations/{cid}/forks")
    assert whole.status_code == 201
    bad = await client.post(f"/v1/conversations/{cid}/forks", json={"at": 0})
    assert bad.status_code == 422 and "at" in bad.json()["error"]["message"]
    past = await client.get(f"/v1/conversations/{cid}/messages", params={"at": 999})
    said = past.json()["error"]["message"]
    assert past.status_code == 422 and "Pass a position in that range" in said, said
    assert "Position(" not in said  # no Python in the API's words


def at_two_contents(page: dict[str, Any]) -> list[str]:
    return [m["content"] for m in page["messages"]]


async def test_a_refusing_guard_is_422_at_stage_guard_and_writes_nothing(
    client_for: Client, sync_store: Store, tenants: Tenants
) -> None:
    def guard(prompt: str) -> None:
        raise ValueError("off topic")

    client = client_for(Agent(ScriptedModel(["never"]), guard=guard))
    response = await client.post("/v1/ask", json={"question": "Weather?"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["stage"] == "guard" and "off topic" in error["message"]
    assert "resume" not in error
    assert written(sync_store, tenants.a) == (0, 0)


@pytest.mark.parametrize("route", ["/v1/ask", "/v1/ask/stream"])
async def test_a_failed_run_names_its_stage_and_the_run_to_resume(
    client_for: Client, sync_store: Store, tenants: Tenants, route: str
) -> None:
    agent = Agent(ScriptedModel([ModelError("the model is down", provider="scripted")]))
    client = client_for(agent)
    response = await client.post(route, json={"question": "Weather?"})
    if route.endswith("stream"):
        assert response.status_code == 200
        from tests.service.test_ask import stream_events

        kind, error = stream_events(response)[-1]
        assert kind == "error"
    else:
        assert response.status_code == 502
        error = response.json()["error"]
    assert error["stage"] == "model" and "the model is down" in error["message"]
    assert error["resume"] == error["runId"]
    ledger = sync_store.tenant(tenants.a)
    assert ledger.runs.get(error["runId"]).status == "failed"
    resumed = await Agent(ScriptedModel(["Back up."])).resume_async(ledger, error["resume"])
    assert resumed.output == "Back up."
    assert ledger.history(error["conversationId"])[-1].text == "Back up."


async def test_sealed_content_without_the_key_is_a_503_in_the_apis_words(
    client_for: Client, database_url: str, tenants: Tenants
) -> None:
    with Store.open(database_url, kek=bytes(range(32))) as sealing:
        sealed = sealing.tenant(tenants.a).create_conversation(metadata={"title": "private"})
        client = client_for(weather_agent())  # its store has no key-encryption key
        before = written(sealing, tenants.a)
        for method, path, body in [
            ("GET", "/v1/conversations", None),
            ("GET", f"/v1/conversations/{sealed.id}", None),
            ("POST", "/v1/ask", {"question": "q", "conversationId": sealed.id}),
        ]:
            response = await client.request(method, path, json=body)
            error = response.json()["error"]
            assert (response.status_code, error["type"]) == (503, "unavailable"), response.text
            assert "CHATLEDGER_KEK" in error["message"] and "Store.open" not in error["message"]
        assert written(sealing, tenants.a) == before


async def test_a_sealed_runs_error_reads_opened_and_then_erased(
    client_for: Client, database_url: str, tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATLEDGER_KEK", bytes(range(32)).hex())  # the service's store seals
    secret = f"Atlantis-{new_id()}"

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError(f"failed for {city}")

    call = ToolCall(id="c1", name="weather", arguments={"city": secret})
    client = client_for(
        Agent(ScriptedModel([Message(role="assistant", tool_calls=[call])]), tools=[weather])
    )
    error = (await client.post("/v1/ask", json={"question": "Weather?"})).json()["error"]
    timeline = (await client.get(f"/v1/runs/{error['runId']}")).json()
    ended = [e["payload"] for e in timeline["events"] if e["kind"] == "run.failed"]
    assert timeline["run"]["error"] == f"failed for {secret}"
    assert [e["error"] for e in ended] == [f"failed for {secret}"]
    with Store.open(database_url) as store:
        with store.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT r.error, e.payload FROM chatledger_runs r JOIN chatledger_events e "
                    "ON e.run_id = r.id WHERE r.id = :r"
                ),
                {"r": error["runId"]},
            ).all()
        assert rows and not any(secret in str(value) for row in rows for value in row)
        store.tenant(tenants.a).erase(error["conversationId"], reason="the person asked")
    timeline = (await client.get(f"/v1/runs/{error['runId']}")).json()
    ended = [e["payload"] for e in timeline["events"] if e["kind"] == "run.failed"]
    assert timeline["run"]["error"] == "[erased]"
    assert [(e["stage"], e["error"], e["erased"]) for e in ended] == [("tool", "[erased]", True)]


async def test_the_openapi_schema_is_served_without_a_key(client_for: Client) -> None:
    client = client_for(weather_agent())
    client.headers.pop("Authorization")
    schema = (await client.get("/openapi.json")).json()
    assert {"/v1/ask", "/v1/ask/stream", "/v1/runs/{run_id}"} <= set(schema["paths"])
    ask = schema["components"]["schemas"]["AskRequest"]
    assert set(ask["properties"]) == {"question", "conversationId", "history"}
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert (await client.get("/docs")).status_code == 200


async def test_an_unknown_endpoint_and_method_are_json_errors(client_for: Client) -> None:
    client = client_for(weather_agent())
    missing = await client.get("/v1/nothing")
    assert missing.status_code == 404 and "no such endpoint" in missing.json()["error"]["message"]
    wrong = await client.get("/v1/ask")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"


async def test_a_defect_during_a_stream_ends_it_with_an_error_event(
    client_for: Client, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_sources: Any) -> list[Any]:
        raise RuntimeError("a filter with a bug")

    client = client_for(weather_agent(), source_filter=broken)
    from tests.service.test_ask import stream_events

    events = stream_events(await client.post("/v1/ask/stream", json={"question": "Weather?"}))
    kind, error = events[-1]
    assert kind == "error" and error["type"] == "internal_error"
    assert error["runId"] == events[0][1]["runId"] and "RuntimeError" in error["message"]
    assert "a filter with a bug" in caplog.text  # the traceback is logged, not sent
    assert "a filter with a bug" not in json.dumps(error)
