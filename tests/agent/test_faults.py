"""Fault injection: a run is made to fail at every step in turn.

Each time, the RunError's partial equals the repaired history read at the
failed run's last recorded position, the head is unchanged, the events
beyond the head hold exactly that partial, and the next run sees none of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from chatledger.engine import Agent, Canceled, ModelRequest, RunError, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import (
    Ledger,
    Message,
    Position,
    ResumeConflictError,
    StorageError,
    ToolCall,
    normalize_history,
)
from tests.agent.helpers import weather_agent, weather_script
from tests.agent.intercept import intercepted

RECORDS_IN_A_CLEAN_RUN = 7  # 2 x (requested, responded), started, 2 x finished


ACTIONS = {
    "record": "recording events of run",
    "start_run": "starting a run",
    "complete_run": "ending run",
}


def faulty(ledger: Ledger, method: str, n: int, when: str) -> Ledger:
    """A real ledger whose N-th `record` (or run start, or completion) fails before or
    after writing."""
    calls = 0

    def around(op: Any, run: Callable[[], Any]) -> Any:
        nonlocal calls
        if not op.action.startswith(ACTIONS[method]):
            return run()
        calls += 1
        if calls == n and when == "before":
            raise StorageError(f"injected failure before {method} #{n}")
        result = run()
        if calls == n and when == "after":
            raise StorageError(f"injected failure after {method} #{n}")
        return result

    return intercepted(ledger, around)


def check_failed_run(ledger: Ledger, conversation_id: str, head: Position, error: RunError) -> None:
    assert ledger.conversation(conversation_id).head == head
    run = ledger.runs.get(error.run_id)
    assert run.status in ("failed", "canceled")
    at_failure = ledger.history(conversation_id, at=Position(run.branch_id, run.position))
    responded = [e for e in ledger.events(run_id=run.id) if e.kind == "model.responded"]
    if responded:
        assert error.partial is not None
        assert error.partial.messages == at_failure
        assert error.partial.request_count == len(responded)
        assert normalize_history(at_failure)[0] == at_failure
    else:
        assert error.partial is None
    seen: list[Message] = []

    def spy(request: ModelRequest) -> str:
        seen.extend(request.messages)
        return "fresh"

    Agent(ScriptedModel(spy)).run(ledger, "next question", conversation_id)
    failed_texts = {m.content for m in at_failure} - {
        m.content for m in ledger.history(conversation_id, at=head)
    }
    assert not failed_texts & {m.content for m in seen}, "the next run saw the failed run"


def fresh_conversation(ledger: Ledger) -> tuple[str, Position]:
    conv = ledger.create_conversation()
    ledger.append_messages(
        conv.id,
        [Message(role="user", content="earlier"), Message(role="assistant", content="noted")],
    )
    return conv.id, ledger.conversation(conv.id).head


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("n", range(1, RECORDS_IN_A_CLEAN_RUN + 1))
def test_store_failure_at_every_append(ledger: Ledger, n: int, when: str) -> None:
    conversation_id, head = fresh_conversation(ledger)
    with pytest.raises(RunError) as caught:
        weather_agent().run(faulty(ledger, "record", n, when), "Weather?", conversation_id)
    assert caught.value.stage == "store"
    check_failed_run(ledger, conversation_id, head, caught.value)


@pytest.mark.parametrize(
    ("method", "when"),
    [("start_run", "before"), ("start_run", "after"), ("complete_run", "before")],
)
def test_store_failure_starting_or_completing(ledger: Ledger, method: str, when: str) -> None:
    conversation_id, head = fresh_conversation(ledger)
    with pytest.raises(RunError) as caught:
        weather_agent().run(faulty(ledger, method, 1, when), "Weather?", conversation_id)
    if (method, when) == ("start_run", "before"):
        assert ledger.runs.recent(conversation_id=conversation_id) == []
        assert caught.value.partial is None
        return
    check_failed_run(ledger, conversation_id, head, caught.value)


def test_lost_acknowledgement_of_completion_still_returns_the_result(ledger: Ledger) -> None:
    conversation_id, head = fresh_conversation(ledger)
    result = weather_agent().run(
        faulty(ledger, "complete_run", 1, "after"), "Weather?", conversation_id
    )
    assert ledger.conversation(conversation_id).head != head
    assert ledger.runs.get(result.run_id).status == "completed"


@pytest.mark.parametrize("request_number", [1, 2])
def test_model_failure_at_each_request(ledger: Ledger, request_number: int) -> None:
    from chatledger.engine.providers import ModelError

    conversation_id, head = fresh_conversation(ledger)
    calls = 0

    def script(request: ModelRequest) -> Message | str:
        nonlocal calls
        calls += 1
        if calls == request_number:
            raise ModelError("injected model failure", provider="scripted")
        return weather_script(request)

    with pytest.raises(RunError) as caught:
        Agent(ScriptedModel(script), tools=weather_agent().tools.values()).run(
            ledger, "Weather?", conversation_id
        )
    assert caught.value.stage == "model"
    check_failed_run(ledger, conversation_id, head, caught.value)


@pytest.mark.parametrize("city", ["Oslo", "Lima"])
def test_tool_crash_at_each_tool(ledger: Ledger, city: str) -> None:
    conversation_id, head = fresh_conversation(ledger)

    @tool(name="weather")
    def crashing(city_name: str = "", city: str = "") -> str:
        """Crashes for one city."""
        if city == crash_city:
            raise RuntimeError(f"injected crash for {city}")
        return f"sunny in {city}"

    crash_city = city
    with pytest.raises(RunError) as caught:
        Agent(ScriptedModel(weather_script), tools=[crashing]).run(
            ledger, "Weather?", conversation_id
        )
    assert caught.value.stage == "tool"
    check_failed_run(ledger, conversation_id, head, caught.value)


def test_cancellation_mid_batch_closes_unanswered_calls(ledger: Ledger) -> None:
    conversation_id, head = fresh_conversation(ledger)
    release = asyncio.Event()

    @tool
    async def quick() -> str:
        """Finishes at once."""
        return "quick result"

    @tool
    async def stopper() -> str:
        """Stops the run once quick has finished."""
        raise Canceled("the user pressed stop")

    @tool
    async def hanging() -> str:
        """Never finishes on its own."""
        await release.wait()
        return "never recorded"

    batch = Message(
        role="assistant",
        tool_calls=[
            ToolCall(id="q", name="quick"),
            ToolCall(id="s", name="stopper"),
            ToolCall(id="h", name="hanging"),
        ],
    )
    with pytest.raises(RunError) as caught:
        Agent(ScriptedModel([batch]), tools=[quick, stopper, hanging]).run(
            ledger, "go", conversation_id
        )
    error = caught.value
    assert error.stage == "canceled"
    run = ledger.runs.get(error.run_id)
    assert run.status == "canceled"
    branch = ledger.history(
        conversation_id, at=Position(run.branch_id, run.position), repaired=False
    )
    _repaired, report = normalize_history(branch)
    assert (report.synthesized, report.dropped, report.moved) == ([], [], [])
    results = {m.tool_call_id: m for m in branch if m.role == "tool"}
    assert set(results) == {"q", "s", "h"}
    assert results["q"].content == "quick result"
    origins = {
        e.message.tool_call_id: e.origin
        for e in ledger.events(run_id=run.id)
        if e.message and e.message.role == "tool"
    }
    assert origins["q"] == "run" and origins["h"] == "repair"
    check_failed_run(ledger, conversation_id, head, error)


def test_failed_run_is_resumed_from_its_partial(ledger: Ledger) -> None:
    conversation_id, head = fresh_conversation(ledger)
    calls = {"weather": 0}

    @tool(name="weather")
    def flaky(city: str) -> str:
        """Fails the first time it is asked about Lima."""
        calls["weather"] += 1
        if city == "Lima" and calls["weather"] <= 2:
            raise RuntimeError("weather service crashed")
        return f"sunny in {city}"

    agent = Agent(ScriptedModel(weather_script), tools=[flaky])
    with pytest.raises(RunError) as caught:
        agent.run(ledger, "Weather?", conversation_id)
    failed = caught.value
    resumed = agent.resume(ledger, failed.run_id)
    assert ledger.runs.get(resumed.run_id).resumes == failed.run_id
    history = ledger.history(conversation_id)
    assert history == resumed.messages
    assert [m.content for m in history].count("Weather?") == 1
    assert history[-1].content.startswith("Summary:")
    assert ledger.conversation(conversation_id).head != head
    with pytest.raises(ResumeConflictError):
        agent.resume(ledger, failed.run_id)
