"""Agents of the service tests: one per shape a question can take.

Each is a `ScriptedModel` over a function, so its requests are kept byte for
byte (`model.requests`) and its answers follow from what it was given.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from chatledger.engine import Agent, Hit, ModelRequest, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Message, ToolCall
from tests.agent.helpers import results_since_prompt, weather_agent

__all__ = [
    "KNOWLEDGE",
    "NOT_FOUND",
    "SHAPES",
    "blocking_agent",
    "echo_agent",
    "multi_step_agent",
    "retrieval_agent",
    "weather_agent",
]

NOT_FOUND = "I could not find that in the knowledge base."

KNOWLEDGE = {
    "fy2024": Hit("kb-revenue", "FY2024 revenue was 12 million."),
    "oslo": Hit("kb-oslo", "Oslo is the capital of Norway."),
}


def knowledge_base(question: str) -> list[Hit]:
    """Hits whose keyword is in the question; nothing for anything else."""
    return [hit for word, hit in KNOWLEDGE.items() if word in question.lower()]


def context_of(request: ModelRequest) -> list[str]:
    """The retrieval context lines the system message carries (`[id] text`)."""
    system = next((m.text for m in request.messages if m.role == "system"), "")
    return re.findall(r"^\[[^\]]+\] (.*)$", system, flags=re.MULTILINE)


def answer_from_context(request: ModelRequest) -> str:
    """Answer with the retrieved context, or refuse: never from anything else."""
    found = context_of(request)
    return " ".join(found) if found else NOT_FOUND


def retrieval_agent(**options: Any) -> Agent:
    """Answers only from its knowledge base; a miss is a refusal."""
    return Agent(
        ScriptedModel(answer_from_context),
        instructions="Answer from the context only.",
        retriever=knowledge_base,
        **options,
    )


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term} means {term.upper()}"


def _steps(request: ModelRequest) -> Message | str:
    done = results_since_prompt(request)
    if len(done) < 2:
        term = ["alpha", "beta"][len(done)]
        return Message(
            role="assistant",
            content=f"Step {len(done) + 1}.",
            tool_calls=[
                ToolCall(id=f"step-{len(done) + 1}", name="lookup", arguments={"term": term})
            ],
        )
    return "Done: " + "; ".join(m.text for m in done)


def multi_step_agent() -> Agent:
    """Two tool calls one after the other, then an answer: three requests."""
    return Agent(ScriptedModel(_steps), instructions="Work step by step.", tools=[lookup])


def echo_agent(**options: Any) -> Agent:
    """Repeats whatever context it was given (a model that leaks what it sees)."""
    return Agent(
        ScriptedModel(lambda r: "Context: " + " | ".join(context_of(r)) or "none"), **options
    )


def blocking_agent(
    started: asyncio.Event | None = None, release: asyncio.Event | None = None
) -> Agent:
    """Calls `wait`, a tool whose first call returns once `release` is set (never,
    without it) and every later call at once: a run that stays live until the test
    lets it finish, or cancels it, and others beside it that do not wait."""
    calls = 0

    @tool
    async def wait(reason: str) -> str:
        """Wait."""
        nonlocal calls
        calls += 1
        if calls == 1:
            if started is not None:
                started.set()
            await (release or asyncio.Event()).wait()
        return "released"

    def script(request: ModelRequest) -> Message | str:
        if results_since_prompt(request):
            return "Finished after waiting."
        return Message(
            role="assistant",
            tool_calls=[ToolCall(id="w1", name="wait", arguments={"reason": "test"})],
        )

    return Agent(ScriptedModel(script), tools=[wait])


SHAPES = {
    "tool-using": (weather_agent, "Weather?"),
    "answered-from-retrieval": (retrieval_agent, "What was FY2024 revenue?"),
    "not-found": (retrieval_agent, "Who won the 1930 world cup?"),
    "multi-step": (multi_step_agent, "Explain alpha then beta."),
}
"""Agent shapes and a question for each, as `(make_agent, question)`."""
