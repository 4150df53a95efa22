"""The processes of the LangGraph end-to-end test (tests/adapters/test_langgraph_e2e.py).

Run as `python -m tests.adapters._langgraph_child URL TENANT THREAD STEP`, each
step in a process of its own, on one thread:

- `ask`: "What is 1 + 2?"; the tool `add` asks for approval (`interrupt`), and
  the process prints the interrupt's value and exits;
- `approve`: resumes with `Command(resume="yes")`: `add` runs, the agent answers;
- `look-up`: "Look up 7": the tool `look_up` prints `tool running` and blocks
  reading stdin: the test kills the process there;
- `continue`: resumes from the last checkpoint (`invoke(None)`): `look_up` runs
  again, to its end, and the agent answers.

Each step prints the thread's messages when it ends (or the interrupt's
value). The graph: an agent (a plain function standing in for a model) that
calls a tool for a question and answers with its result, and LangGraph's
`ToolNode` running the tools.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

from chatledger.adapters.langgraph import Saver
from chatledger.store import Store

BLOCK = {"on": False}  # set by the `look-up` step: `look_up` blocks once it runs


@tool
def add(a: int, b: int) -> int:
    """Add two numbers, once a person approves."""
    if interrupt({"question": f"add {a} and {b}?"}) != "yes":
        raise ValueError("not approved")
    return a + b


@tool
def look_up(key: int) -> str:
    """Look a number up."""
    if BLOCK["on"]:
        print("tool running", flush=True)
        sys.stdin.readline()  # the test kills this process here
    return f"entry {key}"


def agent(state: MessagesState) -> dict[str, Any]:
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"the answer is {last.content}")]}
    words = str(last.content).replace("?", " ").split()
    numbers = [int(w) for w in words if w.isdigit()]
    if words[0] == "Look":
        call = {"name": "look_up", "args": {"key": numbers[0]}, "id": f"call-{len(words)}"}
    else:
        call = {"name": "add", "args": {"a": numbers[0], "b": numbers[1]}, "id": "call-add"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def graph(saver: Saver) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([add, look_up]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def main() -> None:
    url, tenant, thread_id, step = sys.argv[1:5]
    config: Any = {"configurable": {"thread_id": thread_id}}
    with Store.open(url) as store:
        app = graph(Saver(store.tenant(tenant)))
        # Every checkpoint and write saved before the next step starts: a kill
        # leaves exactly what ran.
        if step == "ask":
            out = app.invoke(
                {"messages": [HumanMessage(content="What is 1 + 2?")]}, config, durability="sync"
            )
            print(json.dumps([i.value for i in out["__interrupt__"]]))
            return
        if step == "approve":
            out = app.invoke(Command(resume="yes"), config, durability="sync")
        elif step == "look-up":
            BLOCK["on"] = True
            out = app.invoke(
                {"messages": [HumanMessage(content="Look up 7")]}, config, durability="sync"
            )
        else:
            out = app.invoke(None, config, durability="sync")
        print(json.dumps([[m.type, m.content] for m in out["messages"]]))


if __name__ == "__main__":
    main()
