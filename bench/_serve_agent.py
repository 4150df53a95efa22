"""The agent bench/bench_serve.py serves and runs in process: `bench._serve_agent:agent`.

A `ScriptedModel` over a function, so every run has the same shape without
any I/O: after each question the model says a short sentence and calls
`lookup` once; given the result, it answers from it and the question. A
streamed run therefore sends text deltas, one tool call, one tool result, text
deltas again, and an answer that differs from run to run (it quotes the
question), so the answer found in the log can be matched to the one streamed.
"""

from __future__ import annotations

from chatledger.engine import Agent, ModelRequest, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Message, ToolCall

__all__ = ["agent", "make_agent"]


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term} is in the index ({len(term)} characters)."


def _results_since_prompt(request: ModelRequest) -> list[Message]:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return [m for m in request.messages[last_user:] if m.role == "tool"]


def _script(request: ModelRequest) -> Message | str:
    question = next(m.text for m in reversed(request.messages) if m.role == "user")
    results = _results_since_prompt(request)
    if not results:
        return Message(
            role="assistant",
            content="Let me look that up.",
            tool_calls=[ToolCall(id="lookup-1", name="lookup", arguments={"term": question})],
        )
    return f"You asked {question!r}. The index says: {results[-1].text}"


def make_agent() -> Agent:
    """A new agent: one tool call, then an answer."""
    return Agent(
        ScriptedModel(_script, name="bench"),
        instructions="Answer briefly, after one lookup.",
        tools=[lookup],
    )


agent = make_agent()
