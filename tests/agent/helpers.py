"""A scripted scenario shared by the engine tests."""

from __future__ import annotations

from typing import Any

from chatledger.engine import Agent, ModelRequest, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Message, ToolCall


def results_since_prompt(request: ModelRequest) -> list[Message]:
    """The tool results in the request after its last user message."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return [m for m in request.messages[last_user:] if m.role == "tool"]


def weather_script(request: ModelRequest) -> Message | str:
    """Call two tools in parallel after each new prompt, then answer from their results."""
    results = results_since_prompt(request)
    if not results:
        return Message(
            role="assistant",
            tool_calls=[
                ToolCall(id="c1", name="weather", arguments={"city": "Oslo"}),
                ToolCall(id="c2", name="weather", arguments={"city": "Lima"}),
            ],
        )
    return "Summary: " + "; ".join(m.content for m in results)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def weather_agent(**options: Any) -> Agent:
    return Agent(
        ScriptedModel(weather_script), instructions="Answer briefly.", tools=[weather], **options
    )
