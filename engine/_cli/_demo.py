"""`chatledger demo`: the whole product in a few seconds, offline.

A multi-turn conversation with tool calls (a scripted model), a run killed
with SIGKILL in the middle of a tool batch in a child process, the resume
worker finishing it exactly once, a fork, a short audit of the log and a check
of its hash chain. It writes to the tenant every command reads by default, and
ends with the commands that explore what it wrote.

The child is this module again: `python -m chatledger.engine._cli._demo child CONVERSATION`,
with the database URL in `CHATLEDGER_DATABASE_URL` (not on its command line,
where `ps` would show a password).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from sqlalchemy import make_url

from chatledger.engine._cli._common import DEFAULT_TENANT, counted, message_line, where
from chatledger.engine.agent import Agent
from chatledger.engine.providers import ModelRequest
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.engine.resume import ResumeOutcome, ResumeWorker, uncertain_tool_calls
from chatledger.engine.tools import tool
from chatledger.store import Ledger, Message, Store, ToolCall

# Where `chatledger runs`, `history` and the rest look when given no --tenant,
# so that a newcomer's next command finds what the demo wrote.
TENANT = DEFAULT_TENANT
LEASE_SECONDS = 1.0


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return {"Oslo": "snow, -3 °C", "Lima": "sunny, 24 °C", "Cairo": "clear, 31 °C"}.get(
        city, "unknown"
    )


@tool
def slow_weather(city: str) -> str:
    """The weather, from a slow service (Cairo takes a long time)."""
    if city == "Cairo":
        time.sleep(30)
    return weather.function(city)  # type: ignore[no-any-return]


def script(request: ModelRequest) -> Message | str:
    """Ask for the weather of every city in the prompt, then summarize the results."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    prompt = request.messages[last_user].content
    results = [m for m in request.messages[last_user:] if m.role == "tool"]
    tool_name = "slow_weather" if "slow" in prompt else "weather"
    cities = [c for c in ("Oslo", "Lima", "Cairo") if c in prompt]
    answered = {m.tool_call_id for m in results}
    missing = [
        m
        for m in results
        if m.content.startswith("No result was recorded")
        and f"{m.tool_call_id}-again" not in answered
    ]
    if cities and not results:
        return Message(
            role="assistant",
            tool_calls=[
                ToolCall(id=f"call-{c.lower()}", name=tool_name, arguments={"city": c})
                for c in cities
            ],
        )
    if missing:
        retry = [m.tool_call_id for m in missing]
        return Message(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id=f"{call_id}-again",
                    name="weather",
                    arguments={"city": str(call_id).removeprefix("call-").capitalize()},
                )
                for call_id in retry
            ],
        )
    if results:
        known = [m.content for m in results if not m.content.startswith("No result")]
        return "Weather: " + "; ".join(known) + "."
    return f"You said {prompt!r}. Ask me about the weather in Oslo, Lima or Cairo."


def make_agent() -> Agent:
    """The demo's agent: a scripted model and two weather tools."""
    return Agent(
        ScriptedModel(script, name="weather-demo"),
        instructions="You report the weather briefly.",
        tools=[weather, slow_weather],
    )


def child(conversation_id: str) -> None:
    """The doomed process: a run whose tool batch never finishes."""
    with Store.open(os.environ["CHATLEDGER_DATABASE_URL"]) as store:
        make_agent().run(
            store.tenant(TENANT),
            "slow weather for Oslo and Cairo, please",
            conversation_id,
            owner=f"demo-child:{os.getpid()}",
            lease_seconds=LEASE_SECONDS,
        )


def demo(
    url: str | None, say: Callable[[str], None] = print, *, shown_url: str | None = None
) -> int:
    """Run the demo on `url` (default ./chatledger.db); return the exit status.

    Args:
        url: the database.
        say: prints a line.
        shown_url: the `--database-url` the closing commands pass, or None
            when they find `url` without one.
    """
    started = time.monotonic()
    with Store.open(url) as store:
        store.migrate()
        ledger = store.tenant(TENANT)
        agent = make_agent()
        say(f"chatledger demo on {where(store)}, tenant {TENANT!r}\n")

        say("1. A conversation with tool calls")
        first = agent.run(ledger, "What is the weather in Oslo and Lima?")
        conv = first.conversation_id
        for m in first.new_messages:
            say(f"   {message_line(m, align=9)}")
        second = agent.run(ledger, "Thanks!", conv)
        say(f"   {message_line(second.new_messages[-1], align=9)}")

        say("\n2. A crash in the middle of a tool batch")
        process = subprocess.Popen(
            [sys.executable, "-m", "chatledger.engine._cli._demo", "child", conv],
            env={
                **os.environ,
                "CHATLEDGER_DATABASE_URL": store.engine.url.render_as_string(hide_password=False),
                "PYTHONUNBUFFERED": "1",
            },
        )
        run_id = _wait_for_tool_batch(ledger, conv, process)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        say(f"   child process {process.pid} started run {run_id[:13]}… and recorded")
        for event in ledger.events(run_id=run_id):  # the prompt first
            if event.message is not None:
                say(f"   {message_line(event.message, align=9)}")
        say("   then it was killed (SIGKILL) in the middle of its tool batch")
        for call, name in uncertain_tool_calls(ledger, run_id):
            say(f"   the log shows {name} call {call} started, never finished")
        say(f"   the head did not move: {counted(len(ledger.history(conv)), 'message')}, as before")

        say("\n3. The resume worker finishes it, exactly once")
        worker = ResumeWorker(agent, store, owner="demo-worker", lease_seconds=LEASE_SECONDS)
        outcomes = asyncio.run(_resume_when_stale(worker))
        for outcome in outcomes:
            result = outcome.result
            assert result is not None
            say(f"   resumed run {outcome.run_id[:13]}… as run {result.run_id[:13]}…")
            for m in result.new_messages:
                say(f"   {message_line(m, align=9)}")
        again = asyncio.run(worker.run_once())
        say(f"   a second pass finds {counted(len(again), 'run')} to resume")

        say("\n4. A fork: the same conversation, another question")
        point = ledger.runs.get(first.run_id).position  # where the first run completed
        fork = ledger.fork(conv, at=point)
        forked = agent.run(ledger, "And in Cairo?", fork.id)
        say(f"   fork {fork.id[:13]}… of {conv[:13]}… at position {point}")
        say(f"   {message_line(forked.new_messages[-1], align=9)}")
        say(
            f"   the source still has {counted(len(ledger.history(conv)), 'message')}, the fork {len(ledger.history(fork.id))}"
        )

        say("\n5. Audit")
        for run in reversed(ledger.runs.recent(conversation_id=conv)):
            stage = f" at {run.stage}" if run.stage else ""
            resumes = f", resumes {run.resumes[:13]}…" if run.resumes else ""
            say(f"   run {run.id[:13]}… {run.status}{stage}{resumes}")
        events = ledger.events(conversation_id=conv)
        kinds: dict[str, int] = {}
        for event in events:
            kinds[event.origin] = kinds.get(event.origin, 0) + 1
        say(f"   {counted(len(events), 'event')} in the log by origin: {kinds}")
        chain = ledger.verify(conv)
        verdict = "intact" if chain.ok else f"BROKEN: {chain.problem}"
        say(f"   hash chain of {conv[:13]}…: {chain.checked} events, {verdict}")
    say(f"\nDone in {time.monotonic() - started:.1f} s. To see what it wrote:")
    database = "" if shown_url is None else f" --database-url {shlex.quote(_hidden(shown_url))}"
    for command in (
        f"history {conv}",
        "runs",
        f"audit timeline {run_id}",
        "verify",
    ):
        say(f"  chatledger {command}{database}")
    if shown_url is not None and _hidden(shown_url) != shown_url:
        say("  (the password is hidden: put it back in, or set CHATLEDGER_DATABASE_URL)")
    return 0


def _hidden(url: str) -> str:
    """`url` with its password, if any, shown as `***` (printed text is often logged)."""
    parsed = make_url(url)
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def _wait_for_tool_batch(
    ledger: Ledger, conversation_id: str, process: subprocess.Popen[bytes]
) -> str:
    """Poll the log until the child's run has finished one tool of its batch."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the demo's child process exited early ({process.returncode})")
        for run in ledger.runs.recent(conversation_id=conversation_id, status="running"):
            kinds = [e.kind for e in ledger.events(run_id=run.id)]
            if "tool.finished" in kinds:
                return run.id
        time.sleep(0.05)
    raise RuntimeError("the demo's child process did not reach its tool batch in time")


async def _resume_when_stale(worker: ResumeWorker) -> list[ResumeOutcome]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        outcomes = await worker.run_once()
        if outcomes:
            return outcomes
        await asyncio.sleep(0.1)
    raise RuntimeError("the killed run's lease did not expire in time")


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2])
