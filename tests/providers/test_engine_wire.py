"""The engine over the real adapters and the strict server: what the model saw
is provable from the log, and every history shape the store produces is one
the providers accept."""

from __future__ import annotations

from typing import Any

import pytest

from chatledger.engine import Agent, Model, RunError, tool
from chatledger.store import Ledger, Message, ToolCall, trim_history

from .strict_server import Call, Fail, Reply, StrictServer


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture(params=["openai_model", "anthropic_model"])
def model(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


def digests(ledger: Ledger, run_id: str) -> list[str]:
    return [
        e.payload["digest"] for e in ledger.events(run_id=run_id) if e.kind == "model.requested"
    ]


def tool_round() -> tuple[Reply, Reply]:
    return Reply(calls=(Call("c1", "weather", '{"city": "Oslo"}'),)), Reply(text="Sunny.")


def test_recorded_digests_equal_what_the_server_received(
    strict_server: StrictServer, model: Model, ledger: Ledger
) -> None:
    strict_server.enqueue(*tool_round())
    result = Agent(model, instructions="Be brief.", tools=[weather]).run(ledger, "Weather?")
    assert digests(ledger, result.run_id) == [r.sha256 for r in strict_server.requests]
    assert strict_server.rejections == []


def test_a_retried_429_is_recorded_once(
    strict_server: StrictServer, model: Model, ledger: Ledger
) -> None:
    strict_server.enqueue(Fail(429, retry_after="0"), Reply(text="Hello."))
    result = Agent(model).run(ledger, "Hi")
    sent = strict_server.requests
    assert len(sent) == 2 and sent[0].sha256 == sent[1].sha256
    assert digests(ledger, result.run_id) == [sent[0].sha256]
    assert result.output == "Hello."


def test_a_stream_cut_off_fails_the_run_with_its_partial(
    strict_server: StrictServer, model: Model, ledger: Ledger
) -> None:
    first, _ = tool_round()
    strict_server.enqueue(first, Reply(text="A long answer that never arrives whole.", cut_after=3))
    agent = Agent(model, tools=[weather])
    with pytest.raises(RunError) as caught:
        agent.run_stream(ledger, "Weather?", on_delta=lambda _d: None)
    error = caught.value
    assert error.stage == "model"
    assert error.partial is not None and error.partial.request_count == 1
    assert [m.role for m in error.partial.messages] == ["user", "assistant", "tool"]
    assert ledger.history(error.conversation_id) == []


def test_resumed_forked_and_trimmed_histories_are_accepted(
    strict_server: StrictServer, model: Model, ledger: Ledger
) -> None:
    calls = {"n": 0}

    @tool(name="weather")
    def flaky(city: str) -> str:
        """Crashes the second time it is called."""
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("service down")
        return f"sunny in {city}"

    agent = Agent(model, tools=[flaky], history_processor=trim_history(4))
    strict_server.enqueue(*tool_round())
    first = agent.run(ledger, "Weather?")
    conv = first.conversation_id
    # A failed run (the tool crashes mid-batch), then its resume.
    strict_server.enqueue(Reply(calls=(Call("c2", "weather", '{"city": "Lima"}'),)))
    with pytest.raises(RunError) as caught:
        agent.run(ledger, "And Lima?", conv)
    strict_server.enqueue(Reply(text="Lima is sunny."))
    agent.resume(ledger, caught.value.run_id)
    # A fork from the first answer, and a trimmed long history on it.
    fork = ledger.fork(conv, at=ledger.runs.get(first.run_id).position)
    for i in range(3):
        strict_server.enqueue(Reply(text=f"answer {i}"))
        agent.run(ledger, f"question {i}", fork.id)
    # Truncated arguments recorded in history (a stream that died) are shaped
    # for the wire, not dropped; the call's missing result is synthesized.
    cut = Message(
        role="assistant", tool_calls=[ToolCall(id="c3", name="weather", arguments='{"ci')]
    )
    ledger.append_messages(conv, [Message(role="user", content="Cairo?"), cut])
    strict_server.enqueue(Reply(text="ok"))
    agent.run(ledger, "Still there?", conv)
    assert strict_server.rejections == []
    assert len(strict_server.requests) == 8
