"""OpenTelemetry spans of a run: names, parents, GenAI attributes, failures, no content.

OpenTelemetry lets a process set its tracer provider once, so the `exporter`
fixture sets an SDK provider once (or joins one already set) and each test
starts from an empty exporter. The provider stays for the rest of the
session; the exporter is shut down after this module, so later runs' spans
are dropped instead of kept.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from chatledger.engine import Agent, Canceled, RunError, ToolFailed, tool
from chatledger.engine.providers import ModelError, ModelResponse
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Ledger, Message, NotFoundError, ToolCall, Usage, new_id
from tests.agent.helpers import weather, weather_agent

ROOT = Path(__file__).resolve().parents[2]
MODEL = "scripted:default"
PROMPT = "Quetzal-7f3a: what is the weather?"

Spans = Callable[[], tuple[ReadableSpan, ...]]


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another tracer provider is already set"
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Spans:
    """The spans finished since the test began."""
    exporter.clear()
    return exporter.get_finished_spans


def one(spans: Spans, name: str) -> ReadableSpan:
    (span,) = [s for s in spans() if s.name == name]
    return span


def named(spans: Spans, name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans() if s.name == name), key=lambda s: s.start_time or 0)


def usage_of(span: ReadableSpan) -> Usage:
    attributes = span.attributes or {}
    return Usage(
        input_tokens=attributes["gen_ai.usage.input_tokens"],
        output_tokens=attributes["gen_ai.usage.output_tokens"],
        cache_read_tokens=attributes.get("gen_ai.usage.cache_read.input_tokens"),
        cache_write_tokens=attributes.get("gen_ai.usage.cache_creation.input_tokens"),
    )


def every_text(span: ReadableSpan) -> list[str]:
    """Every string a span carries: its name, attributes, events and status."""
    texts = [span.name, span.status.description or ""]
    attribute_sets = [span.attributes or {}, *(e.attributes or {} for e in span.events)]
    texts += [e.name for e in span.events]
    for attributes in attribute_sets:
        for value in attributes.values():
            texts += [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
    return texts


def test_a_run_is_a_span_with_its_requests_and_tools_as_children(
    ledger: Ledger, spans: Spans
) -> None:
    weather_agent().run(ledger, PROMPT)
    run = one(spans, "invoke_agent")
    children = named(spans, f"chat {MODEL}") + named(spans, "execute_tool weather")
    assert len(spans()) == 5 and len(children) == 4
    assert run.parent is None and run.kind is SpanKind.INTERNAL
    assert run.context is not None
    for child in children:
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context is not None and child.context.trace_id == run.context.trace_id
    assert [s.kind for s in children] == [SpanKind.CLIENT] * 2 + [SpanKind.INTERNAL] * 2


def test_spans_carry_the_runs_ids_and_operations(ledger: Ledger, spans: Spans) -> None:
    result = weather_agent().run(ledger, PROMPT)
    run = one(spans, "invoke_agent")
    requests = named(spans, f"chat {MODEL}")
    tools = named(spans, "execute_tool weather")
    assert (run.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
    assert {(s.attributes or {})["gen_ai.operation.name"] for s in requests} == {"chat"}
    assert {(s.attributes or {})["gen_ai.operation.name"] for s in tools} == {"execute_tool"}
    for span in [run, *requests, *tools]:
        attributes = span.attributes or {}
        assert attributes["chatledger.run.id"] == result.run_id
        assert attributes["gen_ai.conversation.id"] == result.conversation_id
    for span in [run, *requests]:
        assert (span.attributes or {})["gen_ai.request.model"] == MODEL


def test_tool_spans_carry_the_recorded_calls_ids(ledger: Ledger, spans: Spans) -> None:
    result = weather_agent().run(ledger, PROMPT)
    recorded = sorted(c.id or "" for m in result.new_messages for c in m.tool_calls)
    tools = named(spans, "execute_tool weather")
    assert sorted(str((s.attributes or {})["gen_ai.tool.call.id"]) for s in tools) == recorded
    assert {(s.attributes or {})["gen_ai.tool.name"] for s in tools} == {"weather"}
    assert all(s.status.status_code is StatusCode.UNSET for s in tools)


def test_usage_on_the_spans_is_the_results(ledger: Ledger, spans: Spans) -> None:
    result = weather_agent().run(ledger, PROMPT)
    requests = named(spans, f"chat {MODEL}")
    assert usage_of(one(spans, "invoke_agent")) == result.usage
    assert sum((usage_of(s) for s in requests), Usage()) == result.usage
    reasons = [(s.attributes or {})["gen_ai.response.finish_reasons"] for s in requests]
    assert reasons == [("tool_calls",), ("stop",)]
    assert {(s.attributes or {})["gen_ai.response.model"] for s in requests} == {MODEL}


def test_cache_tokens_are_on_the_spans_only_when_nonzero(ledger: Ledger, spans: Spans) -> None:
    usage = Usage(input_tokens=10, output_tokens=2, cache_read_tokens=4, cache_write_tokens=0)
    answer = ModelResponse(Message(role="assistant", content="hi"), usage, "stop")
    result = Agent(ScriptedModel([answer])).run(ledger, PROMPT)
    for span in (one(spans, "invoke_agent"), one(spans, f"chat {MODEL}")):
        attributes = span.attributes or {}
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == 4
        assert "gen_ai.usage.cache_creation.input_tokens" not in attributes
    assert result.usage == usage


def test_a_failed_runs_span_has_the_error_and_the_stage(ledger: Ledger, spans: Spans) -> None:
    calls = Message(
        role="assistant",
        tool_calls=[ToolCall(id="c1", name="weather", arguments={"city": "Oslo"})],
    )
    model = ScriptedModel([calls, ModelError("injected failure", provider="scripted")])
    with pytest.raises(RunError) as caught:
        Agent(model, tools=[weather]).run(ledger, PROMPT)
    assert len(spans()) == 4  # every span ended: the run, two requests, one tool
    run = one(spans, "invoke_agent")
    attributes = run.attributes or {}
    assert run.status.status_code is StatusCode.ERROR
    assert attributes["chatledger.run.stage"] == "model"
    assert attributes["error.type"] == "ModelError"
    assert attributes["gen_ai.conversation.id"] == caught.value.conversation_id
    assert caught.value.partial is not None and usage_of(run) == caught.value.partial.usage
    first, second = named(spans, f"chat {MODEL}")
    assert first.status.status_code is StatusCode.UNSET
    assert second.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})["error.type"] == "ModelError"


def test_a_canceled_runs_span_has_the_error_and_the_stage(ledger: Ledger, spans: Spans) -> None:
    @tool
    def stop() -> str:
        """Stops the run."""
        raise Canceled("the user pressed stop")

    calls = Message(role="assistant", tool_calls=[ToolCall(id="s", name="stop")])
    with pytest.raises(RunError):
        Agent(ScriptedModel([calls]), tools=[stop]).run(ledger, PROMPT)
    run = one(spans, "invoke_agent")
    assert run.status.status_code is StatusCode.ERROR
    assert (run.attributes or {})["chatledger.run.stage"] == "canceled"
    assert (one(spans, "execute_tool stop").attributes or {})["error.type"] == "Canceled"


async def test_a_disconnected_runs_span_has_the_error_and_the_stage(
    ledger: Ledger, spans: Spans
) -> None:
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """Waits until the caller goes away."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    calls = Message(role="assistant", tool_calls=[ToolCall(id="h", name="hang")])
    run = asyncio.create_task(Agent(ScriptedModel([calls]), tools=[hang]).run_async(ledger, PROMPT))
    await started.wait()
    run.cancel()
    with pytest.raises(RunError):
        await run
    span = one(spans, "invoke_agent")
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["chatledger.run.stage"] == "disconnect"
    assert (one(spans, "execute_tool hang").attributes or {})["error.type"] == "CancelledError"


def test_failed_and_invalid_calls_mark_their_span_not_the_run(ledger: Ledger, spans: Spans) -> None:
    @tool
    def broken() -> str:
        """Fails definitively."""
        raise ToolFailed("out of order")

    calls = Message(
        role="assistant",
        tool_calls=[ToolCall(id="b", name="broken"), ToolCall(id="u", name="unknown")],
    )
    Agent(ScriptedModel([calls, "done"]), tools=[broken]).run(ledger, PROMPT)
    assert (one(spans, "execute_tool broken").attributes or {})["error.type"] == "tool_failed"
    assert (one(spans, "execute_tool unknown").attributes or {})["error.type"] == "invalid_call"
    assert one(spans, "invoke_agent").status.status_code is StatusCode.UNSET


def test_a_refused_run_ends_its_span_without_a_stage(ledger: Ledger, spans: Spans) -> None:
    with pytest.raises(NotFoundError):
        weather_agent().run(ledger, PROMPT, new_id())
    (run,) = spans()
    attributes = run.attributes or {}
    assert run.status.status_code is StatusCode.ERROR
    assert attributes["error.type"] == "NotFoundError" and "chatledger.run.stage" not in attributes


def test_a_run_nests_under_the_callers_span(ledger: Ledger, spans: Spans) -> None:
    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        weather_agent().run(ledger, PROMPT)
    run = one(spans, "invoke_agent")
    assert run.parent is not None and run.parent.span_id == caller.get_span_context().span_id


def test_no_span_carries_the_prompt_or_any_content(ledger: Ledger, spans: Spans) -> None:
    result = weather_agent().run(ledger, PROMPT)

    def quoting(prompt: str) -> None:
        raise ValueError(f"refused: {prompt}")

    with pytest.raises(RunError) as caught:
        weather_agent(guard=quoting).run(ledger, PROMPT)
    assert PROMPT in str(caught.value)  # the error quotes the prompt; its span must not
    assert len(spans()) == 6
    texts = [t for span in spans() for t in every_text(span)]
    content = [PROMPT, "Quetzal", "Answer briefly", "Oslo", "sunny", result.output]
    assert not [t for t in texts for c in content if c in t]
    assert not [e for span in spans() for e in span.events]


_RUN_IN_A_CHILD = """
import sys

if sys.argv[2] == "absent":
    sys.modules["opentelemetry"] = None  # every import of opentelemetry now fails

from chatledger.engine._telemetry import _get_tracer
from chatledger.store import Store
from tests.agent.helpers import weather_agent

with Store.open(sys.argv[1]) as store:
    store.migrate()
    result = weather_agent().run(store.tenant("t"), "Weather?")
assert (_get_tracer() is None) == (sys.argv[2] == "absent")
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")]
print(result.output)
"""


@pytest.mark.parametrize("api", ["absent", "without-sdk"])
def test_a_run_works_without_opentelemetry_or_its_sdk(tmp_path: Path, api: str) -> None:
    url = f"sqlite:///{tmp_path / 'chatledger.db'}"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _RUN_IN_A_CHILD, url, api],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Summary: sunny in")
