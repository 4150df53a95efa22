"""One shape for the whole API: camelCase in every response and stream event, a
response schema for every route, snake_case accepted on input, errors in the API's
own words (docs/adr/0038-one-http-api-shape.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from chatledger.engine import Agent
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.service import ApiKeys, create_app
from chatledger.store import new_id
from tests.service.agents import weather_agent
from tests.service.conftest import sse_events

CAMEL = re.compile(r"[a-z][a-zA-Z0-9]*")
# Keys of these hold the caller's own JSON, not the API's names.
OPAQUE = {"metadata", "state", "arguments"}


def _keys(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every (path, key) of a JSON value, not descending into callers' own JSON."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield where, key
            if key not in OPAQUE:
                yield from _keys(item, f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item, f"{where}[]")


def _not_camel(value: Any) -> list[str]:
    return [f"{where}.{key}" for where, key in _keys(value) if not CAMEL.fullmatch(key)]


def _schema_names(schema: dict[str, Any], components: dict[str, Any]) -> Iterator[str]:
    """Every property name a response schema can hold, through `$ref`s and unions."""
    seen: set[str] = set()
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            seen.add(ref)
            todo.append(components[ref.rsplit("/", 1)[-1]])
        for name, sub in node.get("properties", {}).items():
            yield name
            if name not in OPAQUE:
                todo.append(sub)
        for key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties"):
            if key in node:
                todo.append(node[key])


def test_every_route_has_a_response_schema_whose_names_are_camel_case() -> None:
    app = create_app(Agent(ScriptedModel([])), "sqlite://", keys=ApiKeys.of({}))
    spec = app.openapi()
    components = spec["components"]["schemas"]
    routes = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            routes += 1
            success = [code for code in operation["responses"] if code.startswith("2")]
            assert success, (method, path)
            for code in success:
                content = operation["responses"][code].get("content", {})
                schemas = [media["schema"] for media in content.values() if "schema" in media]
                assert schemas, (method, path, code)
                for schema in schemas:
                    names = list(_schema_names(schema, components))
                    bad = [n for n in names if not CAMEL.fullmatch(n)]
                    assert not bad, (method, path, bad)
            for code, response in operation["responses"].items():
                for media in response.get("content", {}).values():
                    names = _schema_names(media.get("schema", {}), components)
                    assert all(CAMEL.fullmatch(n) for n in names), (method, path, code)
    assert routes >= 9
    assert "/healthz" in spec["paths"]


async def test_every_response_and_stream_event_is_camel_case(
    client_for: Callable[..., httpx.AsyncClient],
) -> None:
    client = client_for(weather_agent())
    asked = await client.post("/v1/ask", json={"question": "Weather?"})
    assert asked.status_code == 200, asked.text
    conversation_id = asked.json()["conversationId"]
    run_id = asked.json()["runId"]
    bodies = [asked.json()]
    for path in [
        "/v1/conversations",
        f"/v1/conversations/{conversation_id}",
        f"/v1/conversations/{conversation_id}/messages",
        f"/v1/conversations/{conversation_id}/runs",
        f"/v1/runs/{run_id}",
        f"/v1/runs/{new_id()}",  # an error body
        "/healthz",
    ]:
        bodies.append((await client.get(path)).json())
    forked = await client.post(f"/v1/conversations/{conversation_id}/forks", json={})
    assert forked.status_code == 201
    bodies.append(forked.json())
    async with client.stream(
        "POST", "/v1/ask/stream", json={"question": "Again?", "conversationId": conversation_id}
    ) as response:
        lines = [line async for line in response.aiter_lines()]
    events = [(event, json.loads(data)) for event, data in sse_events(lines)]
    assert {"start", "tool_call", "tool_result", "answer"} <= {e for e, _ in events}
    bodies.extend(data for _, data in events)
    for body in bodies:
        assert not _not_camel(body), body
    assert bodies[0]["requestCount"] == 2 and "inputTokens" in bodies[0]["usage"]
    assert events[0][1] == {"runId": events[-1][1]["runId"], "conversationId": conversation_id}


async def test_a_request_field_may_be_spelled_in_snake_case_but_only_once(
    client_for: Callable[..., httpx.AsyncClient],
) -> None:
    client = client_for(weather_agent())
    first = (await client.post("/v1/ask", json={"question": "Weather?"})).json()
    conversation_id = first["conversationId"]
    for spelling in ("conversationId", "conversation_id"):
        again = await client.post("/v1/ask", json={"question": "Again?", spelling: conversation_id})
        assert again.status_code == 200, again.text
        assert again.json()["conversationId"] == conversation_id
    both = await client.post(
        "/v1/ask",
        json={"question": "Q?", "conversationId": conversation_id, "conversation_id": new_id()},
    )
    assert both.status_code == 422
    assert both.json()["error"]["message"] == (
        "The field 'conversationId' is sent twice, also as 'conversation_id': send it once, "
        "spelled either way."
    )
    runs = (await client.get(f"/v1/conversations/{conversation_id}/runs")).json()["runs"]
    assert len(runs) == 3  # the refused request wrote nothing


async def test_a_missing_conversation_or_run_is_a_404_in_the_apis_words(
    client_for: Callable[..., httpx.AsyncClient],
) -> None:
    client = client_for(weather_agent())
    missing = new_id()
    for path, kind in [
        (f"/v1/conversations/{missing}", "conversation"),
        (f"/v1/conversations/{missing}/messages", "conversation"),
        (f"/v1/runs/{missing}", "run"),
    ]:
        response = await client.get(path)
        assert response.status_code == 404
        assert response.json()["error"] == {
            "type": "not_found",
            "message": f"There is no {kind} '{missing}' for your API key's tenant. Check the "
            f"id; a {kind} made with another tenant's key is not visible with this one.",
        }
    asked = await client.post("/v1/ask", json={"question": "Q?", "conversationId": missing})
    assert asked.status_code == 404
    assert "store.tenant" not in asked.text and "your API key's tenant" in asked.text
