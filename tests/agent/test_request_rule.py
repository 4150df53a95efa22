"""What the model sees has one rule: the audit rebuilds every request exactly as sent.

The property drives random runs (tool calls, invalid calls, failed tools,
text turns, a script that runs out, a request bound, resumes) with random
instructions, dynamic instructions, retrieval context, tool choice and
settings, sometimes through a history processor, on a SQLite file, and checks
that every request the model was sent is what `ledger.audit.model_request`
and `engine.rebuild_request` rebuild from the log.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatledger.engine import Agent, Hit, RunContext, RunError, ToolFailed, rebuild_request, tool
from chatledger.engine.providers import PreparedRequest, ScriptedModel
from chatledger.store import (
    HistoryError,
    HistoryProcessor,
    Ledger,
    Message,
    Store,
    ToolCall,
    budget_history,
    trim_history,
)

WORDS = st.sampled_from(["alpha", "beta", "Oslo", "Lima", "ünï", "42", "why?", "x\ny", ""])
TEXT = st.lists(WORDS, max_size=4).map(" ".join)
PROMPT = st.lists(WORDS, min_size=1, max_size=3).map(lambda w: "q " + " ".join(w))


@tool
def echo(text: str) -> str:
    """Say it back."""
    return f"echo: {text}"


@tool
def refuse(text: str) -> str:
    """Always fails, and the model is told."""
    raise ToolFailed(f"refused {text!r}")


def shout(history: list[Message]) -> list[Message]:
    """A processor that rebuilds every message, the prompt included."""
    return [m.model_copy(update={"content": m.content.upper()}) for m in history]


def no_tool_results(history: list[Message]) -> list[Message]:
    """A processor that drops tool traffic, so repair synthesizes results."""
    return [m for m in history if m.role != "tool"]


def drop_prompt(history: list[Message]) -> list[Message]:
    """A processor that breaks the rule: the prompt is gone."""
    return history[:-1]


PROCESSORS: dict[str, HistoryProcessor | None] = {
    "none": None,
    "trim 2": trim_history(2),
    "trim 5": trim_history(5),
    "budget": budget_history(None, 60),
    "shout": shout,
    "no tool results": no_tool_results,
    "drop prompt": drop_prompt,
}


@st.composite
def calls(draw: st.DrawFn, turn: int) -> Message:
    """A model turn that calls good, failing and unknown tools, with or without text."""
    names = draw(st.lists(st.sampled_from(["echo", "refuse", "nosuch"]), min_size=1, max_size=3))
    return Message(
        role="assistant",
        content=draw(TEXT),
        tool_calls=[
            ToolCall(id=f"c{turn}.{i}", name=name, arguments={"text": draw(TEXT)})
            for i, name in enumerate(names)
        ],
    )


@st.composite
def script(draw: st.DrawFn) -> list[Message | str]:
    """A run's answers: turns of calls, then mostly a text answer (else the script runs out)."""
    answers: list[Message | str] = [
        draw(calls(turn)) for turn in range(draw(st.integers(min_value=0, max_value=3)))
    ]
    if draw(st.sampled_from([True, True, True, False])):
        answers.append(draw(TEXT))
    return answers


@dataclass
class Sent:
    """A run and every request its model was sent, in order."""

    run_id: str
    conversation_id: str
    sent: list[PreparedRequest]


def run_once(
    agent: Agent, ledger: Ledger, prompt: str, conversation_id: str | None, stream: bool
) -> tuple[str, str, RunError | None]:
    """Run, returning (run id, conversation id, the error when it failed)."""
    try:
        if stream:
            result = agent.run_stream(ledger, prompt, conversation_id, on_delta=lambda _: None)
        else:
            result = agent.run(ledger, prompt, conversation_id)
    except RunError as error:
        return error.run_id, error.conversation_id, error
    return result.run_id, result.conversation_id, None


@pytest.mark.parametrize("backend", ["sqlite"])
@settings(
    max_examples=25,
    deadline=None,
    report_multiple_bugs=False,  # each example runs whole agents: shrink one failure, not all
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_request_rebuilds_to_exactly_what_the_model_was_sent(
    store: Store, data: st.DataObject
) -> None:
    ledger = store.tenant(f"rule-{uuid.uuid4().hex[:8]}")
    instructions = data.draw(TEXT, label="instructions")
    dynamic = data.draw(st.none() | TEXT, label="dynamic instructions")
    hits = data.draw(
        st.lists(st.builds(Hit, st.sampled_from(["d1", "d2"]), TEXT), max_size=2), label="hits"
    )
    retrieves = data.draw(st.booleans(), label="retriever")
    processor = PROCESSORS[data.draw(st.sampled_from(sorted(PROCESSORS)), label="processor")]
    tools = data.draw(st.sampled_from([[], [echo], [echo, refuse]]), label="tools")
    max_requests = data.draw(st.integers(min_value=1, max_value=4), label="max_requests")
    choice = data.draw(st.sampled_from([None, "auto", "required"]), label="tool choice")
    model_settings = data.draw(st.sampled_from([None, {"temperature": 0.5}]), label="settings")

    def agent_with(model: ScriptedModel) -> Agent:
        return Agent(
            model,
            instructions=instructions,
            instructions_fn=None if dynamic is None else (lambda _context: dynamic),
            tools=tools,
            history_processor=processor,
            retriever=(lambda _prompt: hits) if retrieves else None,
            max_requests=max_requests,
            tool_choice=choice,
            settings=model_settings,
        )

    runs: list[Sent] = []
    failed: list[str] = []
    conversation_id: str | None = None
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="runs")):
        model = ScriptedModel(data.draw(script(), label="script"))
        prompt = data.draw(PROMPT, label="prompt")
        stream = data.draw(st.booleans(), label="stream")
        run_id, conversation_id, error = run_once(
            agent_with(model), ledger, prompt, conversation_id, stream
        )
        runs.append(Sent(run_id, conversation_id, model.requests))
        if error is None:
            continue
        failed.append(error.stage)
        if data.draw(st.booleans(), label="resume"):
            model = ScriptedModel(data.draw(script(), label="resume script"))
            try:
                resumed_id = agent_with(model).resume(ledger, run_id).run_id
            except RunError as again:
                resumed_id = again.run_id
            runs.append(Sent(resumed_id, conversation_id, model.requests))

    checked = 0
    for run in runs:
        recorded = [e for e in ledger.events(run_id=run.run_id) if e.kind == "model.requested"]
        assert len(recorded) == len(run.sent)
        agent = agent_with(ScriptedModel([]))
        resolved = asyncio.run(
            agent.resolve_instructions(RunContext(run.run_id, run.conversation_id, ""))
        )
        given_hits = hits if retrieves else []
        for number, sent in enumerate(run.sent, start=1):
            # rebuild_request asks the store (`ledger.audit.model_request`) for
            # the messages, then prepares them with the agent's adapter.
            check = rebuild_request(
                ledger, run.run_id, number, agent, instructions=resolved, hits=given_hits
            )
            assert check.recorded.messages == sent.request.messages
            assert check.recorded.digest == sent.digest
            assert check.request == sent.request
            assert check.prepared.body == sent.body and check.matches
            checked += 1
    if processor is drop_prompt:
        assert checked == 0 and set(failed) == {"processor"}


def test_the_rebuild_fails_as_the_run_did_when_the_processor_drops_the_prompt(
    ledger: Ledger,
) -> None:
    with pytest.raises(RunError) as refused:
        Agent(ScriptedModel(["never sent"]), history_processor=drop_prompt).run(ledger, "q")
    assert refused.value.stage == "processor"
    cause = refused.value.__cause__
    assert isinstance(cause, HistoryError)

    answered = Agent(ScriptedModel(["hello"])).run(ledger, "q", refused.value.conversation_id)
    with pytest.raises(HistoryError) as rebuilt:
        ledger.audit.model_request(
            answered.run_id, 1, instructions="", history_processor=drop_prompt
        )
    assert str(rebuilt.value) == str(cause)
