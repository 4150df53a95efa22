"""`Saver`, LangGraph's checkpointer over a chatledger tenant, on both backends.

LangGraph's own conformance suite first (every capability the saver has), then
what the suite does not look at: checkpoints rebuilt exactly from messages
stored once, a put that reads nothing, time travel onto a branch of its own,
deletion that hides, erasure, tenants, and the handle the saver is built from.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from chatledger.adapters.langgraph import Saver, _saver
from chatledger.adapters.langgraph._records import encode_writes
from chatledger.store import AsyncStore, Ledger, Store
from chatledger.store._crypto import ERASED_CONTENT, SEALED_PREFIX
from tests.conftest import _libpq
from tests.store.test_erasure import _stored_payloads, _stored_state

KEK = bytes(range(96, 128))


def tenant() -> str:
    return f"lg-{uuid.uuid4().hex[:8]}"


def agent(state: MessagesState) -> dict[str, Any]:
    """A model's stand-in: a tool call for each question, then an answer."""
    last = state["messages"][-1]
    n = len(state["messages"])
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"the sum is {last.content}", id=f"a{n}")]}
    call = {"name": "add", "args": {"a": n, "b": 1}, "id": f"call{n}"}
    return {"messages": [AIMessage(content="", tool_calls=[call], id=f"a{n}")]}


def tools(state: MessagesState) -> dict[str, Any]:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[attr-defined]
    total = call["args"]["a"] + call["args"]["b"]
    return {
        "messages": [
            ToolMessage(
                content=str(total), tool_call_id=call["id"], name="add", id=f"t{call['id']}"
            )
        ]
    }


def route(state: MessagesState) -> str:
    return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[attr-defined]


def graph(saver: Saver) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": name}}


@pytest.fixture
def sync_store(database_url: str) -> Iterator[Store]:
    with Store.open(database_url) as store:
        yield store


def conversation_id(ledger: Ledger, thread_id: str, namespace: str = "") -> str:
    return ledger.conversation_by_key(f'langgraph:["{thread_id}","{namespace}"]').id


# -- LangGraph's conformance suite ---------------------------------------------------------


async def test_langgraphs_conformance_suite_passes_every_capability(database_url: str) -> None:
    async with AsyncStore.open(database_url) as store:

        @checkpointer_test(name="chatledger")
        async def saver() -> Any:
            yield Saver(store.tenant(tenant()))

        report = await validate(saver)
    failures = [f for r in report.results.values() for f in r.failures]
    assert failures == []
    assert {name for name, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.passed_all()


# -- messages stored once, checkpoints rebuilt exactly -------------------------------------


class Recording(Saver):
    """A saver that keeps what LangGraph asked it to put."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.put_checkpoints: dict[str, Checkpoint] = {}

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self.put_checkpoints[checkpoint["id"]] = copy.deepcopy(checkpoint)
        return super().put(config, checkpoint, metadata, new_versions)


def test_every_checkpoint_is_rebuilt_as_it_was_put(sync_store: Store) -> None:
    ledger = sync_store.tenant(tenant())
    saver = Recording(ledger)
    app = graph(saver)
    for question in ("1 + 1?", "2 + 2?", "3 + 3?"):
        app.invoke({"messages": [HumanMessage(content=question, id=question)]}, thread("t"))
    fresh = Saver(ledger)  # another process: it knows nothing the first one saw
    listed = {t.checkpoint["id"]: t for t in fresh.list(thread("t"))}
    assert listed.keys() == saver.put_checkpoints.keys()
    serde = saver.serde
    for checkpoint_id, put in saver.put_checkpoints.items():
        expected = serde.loads_typed(serde.dumps_typed(put))
        assert listed[checkpoint_id].checkpoint == expected
        assert fresh.get_tuple(listed[checkpoint_id].config).checkpoint == expected  # type: ignore[union-attr]


def test_a_thread_stores_each_message_once_and_reads_as_a_chatledger_history(
    sync_store: Store,
) -> None:
    ledger = sync_store.tenant(tenant())
    app = graph(Saver(ledger))
    for question in ("1 + 1?", "2 + 2?"):
        state = app.invoke({"messages": [HumanMessage(content=question)]}, thread("t"))
    conv = conversation_id(ledger, "t")
    recorded = [e for e in ledger.events(conversation_id=conv) if e.kind == "message.recorded"]
    assert len(recorded) == len(state["messages"]) == 8
    history = ledger.history(conv)
    assert [(m.role, m.content) for m in history] == [
        ("user", "1 + 1?"),
        ("assistant", ""),
        ("tool", "2"),
        ("assistant", "the sum is 2"),
        ("user", "2 + 2?"),
        ("assistant", ""),
        ("tool", "6"),
        ("assistant", "the sum is 6"),
    ]
    assert history[1].tool_calls[0].arguments == '{"a":1,"b":1}'
    assert history[2].tool_call_id == "call1" and history[2].tool_name == "add"
    assert ledger.verify(conv).ok


class Calls(Ledger):
    """A ledger that notes the name of every operation the saver calls."""

    def __init__(self, store: Store, tenant: str) -> None:
        super().__init__(store, tenant)
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if not name.startswith("_") and callable(value):
            super().__getattribute__("calls").append(name)
        return value


def test_a_put_after_its_parent_reads_nothing_of_the_thread(sync_store: Store) -> None:
    ledger = Calls(sync_store, tenant())
    app = graph(Saver(ledger))
    app.invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    ledger.calls.clear()
    app.invoke({"messages": [HumanMessage(content="2 + 2?")]}, thread("t"))
    # When the run starts, the heads of the thread's conversation and of its writes'
    # (their records and messages are those this saver wrote); then each of the run's
    # five checkpoints and four tasks' writes is an append.
    assert [c for c in ledger.calls if c not in ("append_messages", "conversation")] == []
    assert ledger.calls.count("append_messages") == 9


def test_a_thread_another_saver_wrote_to_is_read_anew(sync_store: Store) -> None:
    ledger = Calls(sync_store, tenant())
    first, other = Saver(ledger), Saver(sync_store.tenant(ledger.tenant))  # two processes
    graph(first).invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    state = graph(other).invoke({"messages": [HumanMessage(content="2 + 2?")]}, thread("t"))
    ledger.calls.clear()
    loaded = first.get_tuple(thread("t"))
    assert "state_changes" in ledger.calls  # the head moved: its records are read again
    assert loaded is not None
    assert loaded.checkpoint == other.get_tuple(thread("t")).checkpoint  # type: ignore[union-attr]
    assert [m.content for m in loaded.checkpoint["channel_values"]["messages"]] == [
        m.content for m in state["messages"]
    ]
    ledger.calls.clear()
    assert first.get_tuple(thread("t")) == loaded
    assert "state_changes" not in ledger.calls  # the head stands: the records kept serve


class Raced(Ledger):
    """A ledger whose next append first lets `race` write (another process, in between)."""

    race: Any = None

    def append_messages(self, *args: Any, **kwargs: Any) -> Any:
        race, self.race = self.race, None
        if race is not None:
            race()
        return super().append_messages(*args, **kwargs)


def test_a_put_raced_by_another_savers_deletion_reads_the_thread_anew(sync_store: Store) -> None:
    ledger = Raced(sync_store, tenant())
    graph(Saver(ledger)).invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    first = Saver(ledger)
    loaded = first.get_tuple(thread("t"))  # the records kept, as of the head
    assert loaded is not None
    first._lists.clear()  # a parent it has not seen: the put reads (keeps) the thread
    # Between that read and the put's append, another process deletes the thread;
    # the put then goes after its parent's record, the end of the branch the kept
    # head stood on.
    ledger.race = lambda: Saver(sync_store.tenant(ledger.tenant)).delete_thread("t")
    after = {**copy.deepcopy(loaded.checkpoint), "id": str(uuid6(clock_seq=-2))}
    versions = {"messages": after["channel_versions"]["messages"]}
    first.put(loaded.config, after, {"source": "update", "step": 9, "parents": {}}, versions)
    seen = [t.checkpoint["id"] for t in first.list(thread("t"))]
    assert seen == [t.checkpoint["id"] for t in Saver(ledger).list(thread("t"))]
    assert loaded.checkpoint["id"] not in seen


def test_a_thread_this_saver_wrote_or_read_loads_from_the_messages_it_kept(
    sync_store: Store,
) -> None:
    # Every checkpoint of a thread with a removed message and a fork, loaded by another
    # saver (from the log), by the saver that wrote it, and by one that read it: the
    # same checkpoint; a second time, from the messages kept, reading none.
    ledger = Calls(sync_store, tenant())
    saver = Saver(ledger)
    app = graph(saver)
    state = app.invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    app.update_state(thread("t"), {"messages": [RemoveMessage(id=state["messages"][1].id)]})  # type: ignore[arg-type]
    app.invoke({"messages": [HumanMessage(content="2 + 2?")]}, thread("t"))
    asked = next(
        s for s in app.get_state_history(thread("t")) if len(s.values.get("messages", [])) == 1
    )
    app.invoke(None, app.update_state(asked.config, {"messages": [HumanMessage(content="3?")]}))
    fresh = Saver(sync_store.tenant(ledger.tenant))
    listed = list(fresh.list(thread("t")))
    assert len(listed) > 10
    for warm in (saver, Saver(ledger)):
        for reading in ("first", "again"):
            ledger.calls.clear()
            for expected in listed:
                loaded = warm.get_tuple(expected.config)
                assert loaded is not None and loaded.checkpoint == expected.checkpoint
            assert reading == "first" or "entries" not in ledger.calls


def test_a_long_thread_does_not_push_out_the_messages_kept_of_the_others(
    sync_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_saver, "_MESSAGES_KEPT", 40)  # a thread of over 20 is not kept
    ledger = Calls(sync_store, tenant())
    saver = Saver(ledger)
    app = graph(saver)
    for turn in range(6):
        app.invoke({"messages": [HumanMessage(content=f"{turn} + 1?")]}, thread("long"))
    for turn in range(2):
        app.invoke({"messages": [HumanMessage(content=f"{turn} + 1?")]}, thread("short"))
    ledger.calls.clear()
    assert saver.get_tuple(thread("long")) is not None
    assert "entries" in ledger.calls  # 24 messages: read each time, not kept
    ledger.calls.clear()
    assert saver.get_tuple(thread("short")) is not None
    assert "entries" not in ledger.calls  # still kept
    assert saver._stored_count == sum(len(kept) for kept in saver._stored.values()) == 8


def test_a_loaded_checkpoint_changed_by_its_reader_leaves_the_next_load_alone(
    sync_store: Store,
) -> None:
    ledger = sync_store.tenant(tenant())
    saver = Saver(ledger)
    graph(saver).invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    loaded = saver.get_tuple(thread("t"))
    assert loaded is not None
    fresh = Saver(ledger).get_tuple(thread("t"))
    loaded.checkpoint["channel_versions"]["messages"] = "changed"
    loaded.checkpoint["versions_seen"].clear()
    loaded.checkpoint["channel_values"]["messages"][0].content = "changed"
    loaded.metadata["step"] = -7
    again = saver.get_tuple(thread("t"))
    assert again is not None and fresh is not None
    assert again.checkpoint == fresh.checkpoint
    assert again.metadata == fresh.metadata


# -- what LangGraph does with a thread -----------------------------------------------------


def test_a_removed_message_leaves_the_state_and_stays_in_the_log(sync_store: Store) -> None:
    ledger = sync_store.tenant(tenant())
    app = graph(Saver(ledger))
    state = app.invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    first = state["messages"][0]
    app.update_state(thread("t"), {"messages": [RemoveMessage(id=first.id)]})  # type: ignore[arg-type]
    kept = Saver(ledger).get_tuple(thread("t"))
    assert kept is not None
    assert [m.id for m in kept.checkpoint["channel_values"]["messages"]] == [
        m.id for m in state["messages"][1:]
    ]
    assert ledger.history(conversation_id(ledger, "t"))[0].content == "1 + 1?"


def test_time_travel_forks_onto_a_branch_of_its_own(sync_store: Store) -> None:
    ledger = sync_store.tenant(tenant())
    app = graph(Saver(ledger))
    app.invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    history = list(app.get_state_history(thread("t")))
    conv = conversation_id(ledger, "t")
    before = ledger.conversation(conv).head
    asked = next(s for s in history if s.values and len(s.values["messages"]) == 1)
    forked = app.update_state(asked.config, {"messages": [HumanMessage(content="no, 2 + 2?")]})
    state = app.invoke(None, forked)
    assert [m.content for m in state["messages"]] == [
        "1 + 1?",
        "no, 2 + 2?",
        "",
        "3",
        "the sum is 3",
    ]
    head = ledger.conversation(conv).head
    assert head.branch_id != before.branch_id  # the fork is a branch; the first line stays
    assert [m.content for m in ledger.history(conv)] == [m.content for m in state["messages"]]
    assert [m.content for m in ledger.history(conv, at=before)][-1] == "the sum is 2"
    everything = list(Saver(ledger).list(thread("t")))
    assert {s.config["configurable"]["checkpoint_id"] for s in history} <= {
        t.config["configurable"]["checkpoint_id"] for t in everything
    }


def test_a_deleted_thread_is_hidden_its_log_kept_and_its_id_free(sync_store: Store) -> None:
    ledger = sync_store.tenant(tenant())
    saver = Saver(ledger)
    app = graph(saver)
    app.invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    conv = conversation_id(ledger, "t")
    logged = len(ledger.events(conversation_id=conv))
    saver.delete_thread("t")
    assert saver.get_tuple(thread("t")) is None and list(saver.list(thread("t"))) == []
    assert ledger.history(conv) == []
    assert len(ledger.events(conversation_id=conv)) > logged  # nothing removed from the log
    state = app.invoke({"messages": [HumanMessage(content="2 + 2?")]}, thread("t"))
    assert state["messages"][0].content == "2 + 2?"
    assert Saver(ledger).get_tuple(thread("t")) is not None


def put_first(saver: Saver) -> tuple[Checkpoint, RunnableConfig]:
    """Thread "t"'s first checkpoint (one channel, `notes`), and its config once put."""
    first = first_checkpoint({"notes": "first"})
    return first, saver.put(thread("t"), first, {"source": "input", "step": -1}, {"notes": "1"})


def task_values(got: CheckpointTuple | None) -> list[tuple[str, Any]]:
    """The pending writes of `got`, each as its task and value."""
    assert got is not None
    return [(task, value) for task, _, value in got.pending_writes or []]


def waiting_for_a_row(url: str) -> None:
    """Until a session of the database at `url` waits on a lock another holds."""
    deadline = time.monotonic() + 30
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        while time.monotonic() < deadline:  # each statement sees the activity afresh
            row = conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None:
                return
    raise AssertionError("no session waited on the lock")


def test_a_put_does_not_wait_for_the_writes_saved_beside_it(postgres_url: str) -> None:
    # LangGraph saves a step's writes in the background while it puts the next
    # checkpoint: writes held up in the database hold up no checkpoint.
    with Store.open(postgres_url) as store, psycopg.connect(_libpq(postgres_url)) as holder:
        ledger = store.tenant(tenant())
        saver = Saver(ledger)
        _, config = put_first(saver)
        saver.put_writes(config, [("notes", "early")], task_id="task-1")
        writes = ledger.conversation_by_key('langgraph-writes:["t",""]').id
        holder.execute("SELECT 1 FROM chatledger_conversations WHERE id = %s FOR UPDATE", [writes])
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(saver.put_writes, config, [("notes", "late")], "task-2")
            waiting_for_a_row(postgres_url)  # the writes wait on the row `holder` locked
            second = {**first_checkpoint({"notes": "second"}), "id": str(uuid6(clock_seq=-2))}
            metadata: CheckpointMetadata = {"source": "loop", "step": 0}
            put = pool.submit(saver.put, config, second, metadata, {"notes": "2"}).result(30)
            assert not held.done()
            holder.commit()
            held.result(timeout=30)
    with Store.open(postgres_url) as store:
        saver = Saver(store.tenant(ledger.tenant))
        assert saver.get_tuple(put) is not None
        assert task_values(saver.get_tuple(config)) == [("task-1", "early"), ("task-2", "late")]


def test_writes_recorded_in_a_threads_own_conversation_still_read(sync_store: Store) -> None:
    # Before writes had a conversation of their own, each was a record of the thread's
    # conversation, keeping its line's `tip`: such a thread reads as it did.
    ledger = sync_store.tenant(tenant())
    saver = Saver(ledger)
    first, config = put_first(saver)
    record = encode_writes(saver.serde, first["id"], [("notes", "old")], "task-1", "")
    ledger.append_messages(
        conversation_id(ledger, "t"), [], state={"tip": first["id"], "writes": record}
    )
    saver.put_writes(config, [("notes", "new"), ("notes", "newer")], task_id="task-1")
    saver.put_writes(config, [("notes", "other")], task_id="task-2")
    # The first of each (task, index): the thread's own record, then the others'.
    assert task_values(Saver(ledger).get_tuple(config)) == [
        ("task-1", "old"),
        ("task-1", "newer"),
        ("task-2", "other"),
    ]


def test_a_deleted_threads_writes_go_with_it(sync_store: Store) -> None:
    ledger = sync_store.tenant(tenant())
    saver = Saver(ledger)
    first, config = put_first(saver)
    saver.put_writes(config, [("notes", "before")], task_id="task-1")
    saver.delete_thread("t")
    # The same checkpoint put again (a replay of the same config) has no writes yet.
    config = saver.put(thread("t"), first, {"source": "input", "step": -1}, {"notes": "1"})
    assert task_values(saver.get_tuple(config)) == task_values(Saver(ledger).get_tuple(config))
    assert task_values(saver.get_tuple(config)) == []


async def test_erasing_the_threads_subject_erases_its_checkpoints(database_url: str) -> None:
    async with AsyncStore.open(database_url, kek=KEK) as store:
        ledger = store.tenant(tenant())
        saver = Saver(ledger, subject=lambda thread_id: f"user-of-{thread_id}")
        app = graph(saver)
        await app.ainvoke({"messages": [HumanMessage(content="SECRET 1 + 1?")]}, thread("t"))
        await app.ainvoke(
            {"messages": [HumanMessage(content="SECRET")]},
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
        )
        assert await saver.aget_tuple(thread("t")) is not None
        await ledger.erase("user-of-t", reason="the user asked")
        assert await Saver(ledger).aget_tuple(thread("t")) is None
        assert await saver.aget_tuple(thread("t")) is None  # nothing served from memory
        assert [t async for t in Saver(ledger).alist(thread("t"))] == []
        await Saver(ledger).adelete_thread("t")  # nothing of it reads: nothing to hide
        conv = (await ledger.conversation_by_key('langgraph:["t",""]')).id
        shown = repr(await ledger.history(conv))
        assert "SECRET" not in shown and ERASED_CONTENT in shown


def first_checkpoint(values: dict[str, Any]) -> Checkpoint:
    """A thread's first checkpoint, holding `values` (each channel at version "1")."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = dict.fromkeys(values, "1")
    return checkpoint


def test_a_sealed_threads_records_are_sealed_and_erased_with_it(database_url: str) -> None:
    # What a thread keeps besides its messages (other channels, pending writes such as
    # an interrupt's value, metadata) is its conversation's state: sealed with it.
    secret = f"SECRET-{uuid.uuid4().hex}"
    with Store.open(database_url, kek=KEK) as store:
        ledger = store.tenant(tenant())
        saver = Saver(ledger, subject=lambda thread_id: f"user-of-{thread_id}")
        checkpoint = first_checkpoint(
            {"messages": [HumanMessage(content="hi", id="h1")], "notes": {"address": secret}}
        )
        config = saver.put(
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
            checkpoint,
            {"source": "input", "step": -1, "note": secret},  # type: ignore[typeddict-unknown-key]
            checkpoint["channel_versions"],
        )
        saver.put_writes(config, [("notes", secret), ("__interrupt__", secret)], task_id="task-1")
        got = saver.get_tuple(config)
        assert got is not None and got.checkpoint["channel_values"]["notes"] == {"address": secret}
        assert got.metadata["note"] == secret  # type: ignore[typeddict-item]
        assert [w[2] for w in got.pending_writes or []] == [secret, secret]

        # The thread's conversation and that of its pending writes, each a record and a state.
        keys = ('langgraph:["t",""]', 'langgraph-writes:["t",""]')
        convs = [ledger.conversation_by_key(key).id for key in keys]
        stored = [p for c in convs for k, p in _stored_payloads(store, c) if k == "state.changed"]
        stored += [_stored_state(store, c) for c in convs]
        assert len(stored) == 4
        assert all(text.startswith(SEALED_PREFIX) and secret not in text for text in stored)

        ledger.erase("user-of-t", reason="the user asked")
        assert Saver(ledger).get_tuple(config) is None
        for conv_id in convs:
            assert [e.payload["state"] for e in ledger.state_changes(conv_id)] == [{"erased": True}]
            assert ledger.verify(conv_id).ok


def test_erasing_a_threads_own_subject_erases_its_writes(database_url: str) -> None:
    # With no `subject=`, a thread's conversation is a subject of its own; its writes'
    # conversation is sealed under that subject too, so one erasure takes both.
    secret = f"SECRET-{uuid.uuid4().hex}"
    with Store.open(database_url, kek=KEK) as store:
        ledger = store.tenant(tenant())
        saver = Saver(ledger)
        _, config = put_first(saver)
        saver.put_writes(config, [("__interrupt__", secret)], task_id="task-1")
        conv = ledger.conversation_by_key('langgraph:["t",""]')
        writes = ledger.conversation_by_key('langgraph-writes:["t",""]')
        assert conv.subject is not None and writes.subject == conv.subject
        ledger.erase(conv.subject, reason="the user asked")
        assert saver.get_tuple(config) is None
        assert [e.payload["state"] for e in ledger.state_changes(writes.id)] == [{"erased": True}]


def test_a_copied_threads_checkpoints_go_with_its_sources_erasure(database_url: str) -> None:
    # The copy continues its source's records, sealed under the source's subject:
    # erasing that subject moves no head of the copy's, and the copy's checkpoint,
    # read before, is not served from memory after.
    secret = f"SECRET-{uuid.uuid4().hex}"
    with Store.open(database_url, kek=KEK) as store:
        ledger = store.tenant(tenant())
        saver = Saver(ledger, subject=lambda thread_id: f"user-of-{thread_id}")
        checkpoint = first_checkpoint({"notes": {"address": secret}})
        saver.put(
            thread("t"), checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"]
        )
        saver.copy_thread("t", "copy")
        got = saver.get_tuple(thread("copy"))
        assert got is not None and got.checkpoint["channel_values"]["notes"] == {"address": secret}
        ledger.erase("user-of-t", reason="the user asked")
        assert saver.get_tuple(thread("copy")) == Saver(ledger).get_tuple(thread("copy"))
        assert saver.get_tuple(thread("copy")) is None


def test_a_copied_threads_messages_read_before_its_sources_erasure_are_not_served(
    database_url: str,
) -> None:
    # The copy's own checkpoints are its own subject's and outlive the erasure; the
    # messages they continue from are the source's, erased with it.
    secret = f"SECRET-{uuid.uuid4().hex}"
    with Store.open(database_url, kek=KEK) as store:
        ledger = store.tenant(tenant())
        saver = Saver(ledger, subject=lambda thread_id: f"user-of-{thread_id}")
        app = graph(saver)
        app.invoke({"messages": [HumanMessage(content=f"{secret} 1 + 1?")]}, thread("t"))
        saver.copy_thread("t", "copy")
        app.invoke({"messages": [HumanMessage(content="2 + 2?")]}, thread("copy"))
        got = saver.get_tuple(thread("copy"))
        assert got is not None and secret in repr(got.checkpoint["channel_values"]["messages"])
        ledger.erase("user-of-t", reason="the user asked")
        assert saver.get_tuple(thread("copy")) is None
        assert Saver(ledger).get_tuple(thread("copy")) is None


def test_a_thread_lists_every_namespace_unless_one_is_named(sync_store: Store) -> None:
    saver = Saver(sync_store.tenant(tenant()))
    for namespace in ("", "tools:call-1", "tools:call-2"):
        config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": namespace}}
        saver.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 3
    named = {"configurable": {"thread_id": "t", "checkpoint_ns": "tools:call-2"}}
    (only,) = saver.list(named)
    assert only.config["configurable"]["checkpoint_ns"] == "tools:call-2"
    saver.delete_thread("t")
    assert list(Saver(saver.ledger).list({"configurable": {"thread_id": "t"}})) == []  # type: ignore[arg-type]


def test_a_thread_lives_in_its_tenant(sync_store: Store) -> None:
    mine, theirs = sync_store.tenant(tenant()), sync_store.tenant(tenant())
    graph(Saver(mine)).invoke({"messages": [HumanMessage(content="1 + 1?")]}, thread("t"))
    other = Saver(theirs)
    assert other.get_tuple(thread("t")) is None and list(other.list(None)) == []
    assert len(list(Saver(mine).list(None))) > 0


# -- the handle ----------------------------------------------------------------------------


async def test_a_saver_serves_the_face_of_its_handle(database_url: str) -> None:
    with pytest.raises(TypeError, match="a tenant's handle"):
        Saver("acme")  # type: ignore[arg-type]
    async with AsyncStore.open(database_url) as store:
        with pytest.raises(TypeError, match="built from an AsyncLedger"):
            Saver(store.tenant(tenant())).get_tuple(thread("t"))
    with Store.open(database_url) as sync, pytest.raises(TypeError, match="built from a Ledger"):
        await Saver(sync.tenant(tenant())).aget_tuple(thread("t"))
