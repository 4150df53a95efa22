"""A question asked over the service is traced: its run, model requests and tools."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.agent.test_telemetry import exporter  # the SDK provider set once per process
from tests.service.agents import weather_agent

__all__ = ["exporter"]


async def test_an_asked_question_is_one_run_span_with_its_requests_and_tools(
    client_for: Callable[..., httpx.AsyncClient], exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    client = client_for(weather_agent())
    answer = (await client.post("/v1/ask", json={"question": "Weather?"})).json()
    spans = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("chatledger.run.id") == answer["runId"]
    ]
    by_name = sorted(s.name for s in spans)
    assert by_name == [
        "chat scripted:default",
        "chat scripted:default",
        "execute_tool weather",
        "execute_tool weather",
        "invoke_agent",
    ]
    run = next(s for s in spans if s.name == "invoke_agent")
    assert all(
        s.parent is not None and s.parent.span_id == run.context.span_id
        for s in spans
        if s is not run
    )
    assert {(s.attributes or {}).get("gen_ai.conversation.id") for s in spans} == {
        answer["conversationId"]
    }
    calls = {(s.attributes or {}).get("gen_ai.tool.call.id") for s in spans if "tool" in s.name}
    assert calls == {"c1", "c2"}
    assert (run.attributes or {})["gen_ai.usage.output_tokens"] == answer["usage"]["outputTokens"]
