"""Histories and tools the provider tests send."""

from __future__ import annotations

from chatledger.engine.providers import ModelRequest, ToolSpec
from chatledger.store import Message, ToolCall

LOOKUP = ToolSpec(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
CLOCK = ToolSpec(name="clock")

TRUNCATED = '{"q": "half a wo'


def plain() -> list[Message]:
    return [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Say ok."),
    ]


def with_tool_round(arguments: str = '{"q":"ledger"}') -> list[Message]:
    """A full tool round: one call with `arguments`, a valid second call, both answered."""
    return [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Look up two words."),
        Message(
            role="assistant",
            content="Looking.",
            tool_calls=[
                ToolCall(id="call_1", name="lookup", arguments=arguments),
                ToolCall(id="call_2", name="lookup", arguments='{"q":"event"}'),
            ],
        ),
        Message(role="tool", tool_call_id="call_1", tool_name="lookup", content="a book"),
        Message(role="tool", tool_call_id="call_2", tool_name="lookup", content="", failed=True),
        Message(role="user", content="Thanks. And now?"),
    ]


def call_without_result() -> list[Message]:
    return [
        Message(role="user", content="Look it up."),
        Message(
            role="assistant", tool_calls=[ToolCall(id="call_9", name="lookup", arguments="{}")]
        ),
        Message(role="user", content="Well?"),
    ]


def result_without_call() -> list[Message]:
    return [
        Message(role="user", content="Hello."),
        Message(role="assistant", content="Hi."),
        Message(role="tool", tool_call_id="call_x", content="stray"),
        Message(role="user", content="Hello again."),
    ]


def result_not_after_its_turn() -> list[Message]:
    return [
        Message(role="user", content="Look it up."),
        Message(
            role="assistant", tool_calls=[ToolCall(id="call_5", name="lookup", arguments="{}")]
        ),
        Message(role="user", content="Hurry."),
        Message(role="tool", tool_call_id="call_5", content="late"),
    ]


def request(messages: list[Message], **kwargs: object) -> ModelRequest:
    return ModelRequest(messages=messages, **kwargs)  # type: ignore[arg-type]
