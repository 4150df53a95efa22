"""Agents for the audit tests whose requests are prepared by the real adapters.

The model is a thin wrapper: `prepare()` is the real adapter's (pure, no
I/O), so the digest a run records is the adapter's; `send()` answers from a
script. Importable by `chatledger audit request --agent tests._audit_agent:agent`.
"""

from __future__ import annotations

from typing import Any

from chatledger.engine import Agent, ModelRequest
from chatledger.engine.providers import (
    AnthropicModel,
    DeltaCallback,
    Model,
    ModelError,
    ModelResponse,
    OpenAIChatModel,
    PreparedRequest,
    ScriptedModel,
)
from chatledger.store import Message, ToolCall
from tests.agent.helpers import results_since_prompt, weather

INSTRUCTIONS = "Answer briefly."


class Wrapped:
    """A real adapter's `prepare()`, a script's answers."""

    def __init__(self, adapter: Model, fail_on: int | None = None) -> None:
        self.adapter = adapter
        self.script = ScriptedModel(three_requests)
        self.fail_on = fail_on
        self.sent = 0

    @property
    def name(self) -> str:
        return self.adapter.name

    def prepare(self, request: ModelRequest, *, stream: bool = False) -> PreparedRequest:
        return self.adapter.prepare(request, stream=stream)

    async def send(
        self, prepared: PreparedRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        self.sent += 1
        if self.sent == self.fail_on:
            raise ModelError("the provider is down", provider="test")
        return await self.script.send(prepared, on_delta=on_delta)


def three_requests(request: ModelRequest) -> Message | str:
    """One call, then two parallel calls, then the answer: three requests per prompt."""
    results = results_since_prompt(request)
    if not results:
        return Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", name="weather", arguments={"city": "Oslo"})],
        )
    if len(results) == 1:
        return Message(
            role="assistant",
            content="Two more.",
            tool_calls=[
                ToolCall(id="c2", name="weather", arguments={"city": "Lima"}),
                ToolCall(id="c3", name="weather", arguments={"city": "Rome"}),
            ],
        )
    return "Summary: " + "; ".join(m.content for m in results)


def adapter(kind: str) -> Model:
    """A real adapter pointed at a port nobody listens on: prepare() does no I/O."""
    if kind == "openai":
        return OpenAIChatModel("gpt-test", api_key="k", base_url="http://127.0.0.1:9")
    return AnthropicModel("claude-test", api_key="k", base_url="http://127.0.0.1:9")


def wrapped_agent(kind: str, *, fail_on: int | None = None, **options: Any) -> Agent:
    """An agent whose model fails its `fail_on`-th request, if given."""
    model = Wrapped(adapter(kind), fail_on)
    return Agent(model, instructions=INSTRUCTIONS, tools=[weather], **options)


agent = wrapped_agent("openai")
