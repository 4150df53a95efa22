"""A LangGraph thread across processes, on both backends: a tool that asks for
approval (`interrupt`), resumed with `Command(resume=...)` by a second process;
a third process killed (SIGKILL) while a tool runs, and a fourth that resumes
from the last checkpoint; then a time-travel fork from an earlier checkpoint.

The processes are `tests/adapters/_langgraph_child.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from chatledger.adapters.langgraph import Saver
from chatledger.store import Store
from tests.adapters._langgraph_child import graph
from tests.conftest import kill_when_paused

ROOT = Path(__file__).resolve().parent.parent.parent
CHILD = "tests.adapters._langgraph_child"


def step(*args: str) -> str:
    """Run one step of the child to its end; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", CHILD, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def killed_in_the_tool(*args: str) -> None:
    """Run one step of the child and SIGKILL it once its tool runs."""
    kill_when_paused(CHILD, *args, at="tool running")


def test_a_thread_survives_an_interrupt_a_kill_and_a_fork(database_url: str) -> None:
    tenant, thread = f"e2e-{uuid.uuid4().hex[:8]}", "thread-1"
    config: Any = {"configurable": {"thread_id": thread}}
    asked = json.loads(step(database_url, tenant, thread, "ask"))
    assert asked == [{"question": "add 1 and 2?"}]
    approved = json.loads(step(database_url, tenant, thread, "approve"))
    assert approved == [
        ["human", "What is 1 + 2?"],
        ["ai", ""],
        ["tool", "3"],
        ["ai", "the answer is 3"],
    ]

    killed_in_the_tool(database_url, tenant, thread, "look-up")
    with Store.open(database_url) as store:
        waiting = graph(Saver(store.tenant(tenant))).get_state(config)
        assert waiting.next == ("tools",)  # the killed step left no checkpoint past it
        assert [m.content for m in waiting.values["messages"]][-2:] == ["Look up 7", ""]

    # A new process resumes from the last checkpoint; the tool runs again, to its end.
    finished = json.loads(step(database_url, tenant, thread, "continue"))
    assert finished == [
        *approved,
        ["human", "Look up 7"],
        ["ai", ""],
        ["tool", "entry 7"],
        ["ai", "the answer is entry 7"],
    ]

    with Store.open(database_url) as store:
        ledger = store.tenant(tenant)
        saver = Saver(ledger)
        app = graph(saver)
        conversation = ledger.conversation_by_key(f'langgraph:["{thread}",""]').id
        line = ledger.conversation(conversation).head
        assert [m.content for m in ledger.history(conversation)] == [m[1] for m in finished]
        assert ledger.verify(conversation).ok

        # Time travel: from the checkpoint that holds only the first question, another.
        history = list(app.get_state_history(config))
        question = next(s for s in history if [m.type for m in s.values["messages"]] == ["human"])
        forked = app.update_state(
            question.config, {"messages": [HumanMessage(content="And 2 + 5?")]}
        )
        paused = app.invoke(None, forked)
        assert [i.value for i in paused["__interrupt__"]] == [{"question": "add 2 and 5?"}]
        answered = app.invoke(Command(resume="yes"), config)
        assert [m.content for m in answered["messages"]] == [
            "What is 1 + 2?",
            "And 2 + 5?",
            "",
            "7",
            "the answer is 7",
        ]
        # The fork is a branch of its own; the first line is whole where it was.
        assert ledger.conversation(conversation).head.branch_id != line.branch_id
        assert [m.content for m in ledger.history(conversation, at=line)] == [
            m[1] for m in finished
        ]
        listed = {t.config["configurable"]["checkpoint_id"] for t in saver.list(config)}
        assert {s.config["configurable"]["checkpoint_id"] for s in history} <= listed
