"""Agents for the crash tests, importable by child processes and by `chatledger resume`.

Tools take a little time, and every execution is appended to the file named by
CHATLEDGER_TEST_EXECUTIONS (one line: conversation, call id, city, run id), so
a test can prove no tool was re-executed once its result was recorded.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from chatledger.engine import Agent, ModelRequest, RunContext, tool
from chatledger.engine.providers.scripted import ScriptedModel
from chatledger.store import Ledger, Message, Store, ToolCall
from tests.agent.helpers import results_since_prompt
from tests.agent.intercept import intercepted

CITIES = ("Oslo", "Lima", "Cairo")
PROMPT = "Weather in Oslo, Lima and Cairo?"
NO_RESULT = "No result was recorded"


def script(request: ModelRequest) -> Message | str:
    """Call one tool per city; call again for a city whose result is missing."""
    results = results_since_prompt(request)
    if not results:
        return Message(
            role="assistant",
            tool_calls=[
                ToolCall(id=f"{c.lower()}-1", name="weather", arguments={"city": c}) for c in CITIES
            ],
        )
    done = {m.content.split(":")[0] for m in results if not m.content.startswith(NO_RESULT)}
    missing = [c for c in CITIES if c not in done]
    if missing:
        attempt = len(results)
        return Message(
            role="assistant",
            tool_calls=[
                ToolCall(id=f"{c.lower()}-{attempt}", name="weather", arguments={"city": c})
                for c in missing
            ],
        )
    return "Summary: " + "; ".join(
        sorted(m.content for m in results if not m.content.startswith(NO_RESULT))
    )


_context: dict[str, str] = {}


def _remember(context: RunContext) -> str:
    _context["run_id"] = context.run_id
    _context["conversation_id"] = context.conversation_id
    return ""


@tool
def weather(city: str) -> str:
    """The weather in a city, from a slow service."""
    path = os.environ.get("CHATLEDGER_TEST_EXECUTIONS")
    if path:
        line = f"{_context.get('conversation_id')} {city} {_context.get('run_id')}\n"
        with open(path, "a") as log:
            log.write(line)
            log.flush()
            os.fsync(log.fileno())
    if os.environ.get("CHATLEDGER_TEST_HANG") == city:
        time.sleep(3600)
    if os.environ.get("CHATLEDGER_TEST_EXIT") == city:
        os._exit(9)  # the worker process dies in the middle of the resume
    slow_city, _, seconds = os.environ.get("CHATLEDGER_TEST_SLOW", "").partition(":")
    if slow_city == city:
        time.sleep(float(seconds))
    time.sleep(random.uniform(0.05, 0.3))
    return f"{city}: fine"


agent = Agent(ScriptedModel(script), instructions_fn=_remember, tools=[weather])


def acking(ledger: Ledger) -> Ledger:
    """A real ledger that prints the seq of every event it acknowledges."""

    def around(op: Any, run: Callable[[], Any]) -> Any:
        result = run()
        if op.action.startswith("recording events of run"):
            events, _ = result
            print("ack " + " ".join(str(e.seq) for e in events), flush=True)
        return result

    return intercepted(ledger, around)


def main(url: str, tenant: str, conversation_id: str, lease_seconds: str) -> None:
    with Store.open(url) as store:
        ledger = acking(store.tenant(tenant))
        agent.run(
            ledger,
            PROMPT,
            conversation_id,
            owner=f"child-{os.getpid()}",
            lease_seconds=float(lease_seconds),
        )
    print("completed", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
