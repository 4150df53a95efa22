"""Audit queries (ledger.audit, engine.audit) on every backend."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from chatledger.engine import (
    Agent,
    Canceled,
    Hit,
    RunError,
    rebuild_request,
    rebuild_request_async,
    tool,
)
from chatledger.engine.audit import check_request
from chatledger.engine.providers import ScriptedModel
from chatledger.store import (
    AsyncStore,
    Event,
    InvalidInputError,
    LeaseError,
    Ledger,
    Message,
    NewEvent,
    NotFoundError,
    Page,
    RunCursor,
    RunStateError,
    Store,
    TimelineEntry,
    ToolCall,
    trim_history,
)
from chatledger.store._sql import append as _append
from chatledger.store._sql import log as _log
from chatledger.store.ids import new_id
from chatledger.store.schema import events, metadata
from tests import _audit_writer, warm
from tests._audit_agent import INSTRUCTIONS, wrapped_agent
from tests._audit_agent import agent as cli_agent
from tests.conftest import citus_url

T = TypeVar("T")


def drain(read: Callable[[str | None], Page[T]], after: str | None = None) -> list[T]:
    """Every item, page after page; a page held back by another open transaction is re-read."""
    items: list[T] = []
    while True:
        page = read(after)
        items += page.items
        after = page.next_after
        if not page.has_more and not page.pending:
            return items


@pytest.fixture
def left_running(ledger: Ledger) -> Iterator[list[RunCursor]]:
    """Runs a test leaves running are ended afterwards: resume workers serve every
    tenant, so a later test must not find them stale."""
    cursors: list[RunCursor] = []
    yield cursors
    for cursor in cursors:
        with contextlib.suppress(LeaseError, RunStateError):
            ledger.runs.fail(cursor, stage="test", error="ended by the test")
    for _, cursor in ledger.runs.claim_stale(owner="test"):
        ledger.runs.fail(cursor, stage="test", error="ended by the test")


def said(message: Message, origin: str = "run") -> NewEvent:
    return NewEvent.of_message(message, origin=origin)  # type: ignore[arg-type]


# -- timeline -----------------------------------------------------------------------


def test_run_timeline_lists_every_event_of_the_run_in_order(ledger: Ledger) -> None:
    result = wrapped_agent("openai").run(ledger, "weather?")
    timeline = drain(lambda after: ledger.audit.run_timeline(result.run_id, after=after, limit=4))
    logged = ledger.events(run_id=result.run_id)
    assert [t.event.seq for t in timeline] == [e.seq for e in logged]
    assert timeline[0].event.kind == "run.started" and timeline[0].elapsed == timedelta(0)
    assert timeline[-1].event.kind == "run.completed"
    assert [t.elapsed for t in timeline] == sorted(t.elapsed for t in timeline)
    stages = {t.event.kind: t.stage for t in timeline}
    assert stages["model.requested"] == "model" and stages["tool.finished"] == "tool"
    assert stages["message.recorded"] == "message" and stages["run.completed"] == "run"


# -- what the model saw -------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_rebuilt_requests_hash_to_the_recorded_digests(ledger: Ledger, adapter: str) -> None:
    agent = wrapped_agent(adapter)
    first = agent.run(ledger, "weather?")
    second = agent.run(ledger, "and again?", first.conversation_id)
    streamed = agent.run_stream(ledger, "streamed?", first.conversation_id, on_delta=print)
    for result in (first, second, streamed):
        assert result.request_count == 3
        for n in range(1, 4):
            check = rebuild_request(ledger, result.run_id, n, agent)
            assert check.matches, (result.run_id, n)
    assert check.prepared.stream  # the streamed run's body says so, and was found


def test_a_resumed_runs_requests_rebuild_from_the_partial(ledger: Ledger) -> None:
    with pytest.raises(RunError) as failed:
        wrapped_agent("anthropic", fail_on=2).run(ledger, "weather?")
    agent = wrapped_agent("anthropic")
    resumed = agent.resume(ledger, failed.value.run_id)
    assert resumed.request_count == 2
    assert all(rebuild_request(ledger, resumed.run_id, n, agent).matches for n in (1, 2))


def test_rebuild_refuses_instructions_that_do_not_match(ledger: Ledger) -> None:
    result = wrapped_agent("openai").run(ledger, "weather?")
    with pytest.raises(InvalidInputError, match="sha256"):
        ledger.audit.model_request(result.run_id, 1, instructions=INSTRUCTIONS + " ")
    assert ledger.audit.model_request(result.run_id, 1, instructions=INSTRUCTIONS).request == 1


def test_rebuild_needs_the_agents_processor_and_retrieval_hits(ledger: Ledger) -> None:
    hits = [Hit("doc-1", "Oslo is in Norway.")]
    agent = wrapped_agent("anthropic", history_processor=trim_history(4), retriever=lambda _: hits)
    first = agent.run(ledger, "weather?")
    second = agent.run(ledger, "and again?", first.conversation_id)
    assert rebuild_request(ledger, second.run_id, 1, agent, hits=hits).matches
    assert not rebuild_request(ledger, second.run_id, 1, agent).matches
    unprocessed = ledger.audit.model_request(
        second.run_id, 1, instructions=INSTRUCTIONS, context="", history_processor=None
    )
    assert not check_request(unprocessed, agent).matches


def test_request_shows_the_synthesized_result_the_model_saw(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    call = ToolCall(id="lost", name="weather", arguments={"city": "Oslo"})
    ledger.append_messages(conv.id, [Message(role="user", content="hi")])
    ledger.append_messages(conv.id, [Message(role="assistant", tool_calls=[call])])
    result = wrapped_agent("openai").run(ledger, "weather?", conv.id)
    recorded = ledger.audit.model_request(result.run_id, 1, instructions=INSTRUCTIONS)
    assert recorded.repair.synthesized == ["lost"]
    assert [m.role for m in recorded.messages][:4] == ["system", "user", "assistant", "tool"]


async def test_async_audit_rebuilds_the_same_request(database_url: str, ledger: Ledger) -> None:
    agent = wrapped_agent("openai")
    result = await agent.run_async(ledger, "weather?")
    async with AsyncStore.open(database_url) as store:
        async_ledger = store.tenant(ledger.tenant)
        check = await rebuild_request_async(async_ledger, result.run_id, 2, agent)
        timeline: list[TimelineEntry] = []
        after = None
        while True:  # a page held back by another open transaction is re-read (`drain`)
            page = await async_ledger.audit.run_timeline(result.run_id, after=after)
            timeline += page.items
            after = page.next_after
            if not page.has_more and not page.pending:
                break
    assert check.matches
    assert timeline == drain(lambda after: ledger.audit.run_timeline(result.run_id, after=after))


# -- tool executions ----------------------------------------------------------------


def started(*calls: tuple[str, str]) -> list[NewEvent]:
    return [NewEvent("tool.started", {"callId": c, "name": n}) for c, n in calls]


def finished(call_id: str, failed: bool = False) -> NewEvent:
    return NewEvent("tool.finished", {"callId": call_id, "failed": failed})


def test_tool_executions_say_how_each_call_ended(
    ledger: Ledger, left_running: list[RunCursor]
) -> None:
    crashed = ledger.runs.start(ledger.create_conversation().id, owner="w")
    _, crashed = ledger.runs.record(crashed, started(("c1", "pay"), ("c2", "pay"), ("c3", "mail")))
    _, crashed = ledger.runs.record(crashed, [finished("c1"), finished("c2", failed=True)])
    ledger.runs.fail(crashed, stage="tool", error="the worker crashed")
    working = ledger.runs.start(ledger.create_conversation().id, owner="w", lease_seconds=600)
    _, working = ledger.runs.record(working, started(("d1", "pay")))
    dead = ledger.runs.start(ledger.create_conversation().id, owner="w")
    _, dead = ledger.runs.record(dead, started(("e1", "pay")))
    ledger.runs.renew_lease(dead, seconds=-5)  # its worker died: the lease ran out
    left_running.append(working)

    def calls(**filters: Any) -> dict[str, str]:
        found = drain(lambda after: ledger.audit.tool_executions(after=after, **filters))
        return {x.call_id or "": x.status for x in found}

    assert calls() == {
        "c1": "finished",
        "c2": "failed",
        "c3": "uncertain",
        "d1": "running",
        "e1": "uncertain",
    }
    assert calls(status="uncertain") == {"c3": "uncertain", "e1": "uncertain"}
    assert calls(failed=True) == {"c2": "failed"}
    assert calls(tool_name="mail") == {"c3": "uncertain"}
    assert set(calls(run_id=dead.run_id)) == {"e1"}


def test_tool_name_query_over_a_time_range(ledger: Ledger, left_running: list[RunCursor]) -> None:
    run = ledger.runs.start(ledger.create_conversation().id, owner="w")
    _, run = ledger.runs.record(run, started(("c1", "pay"), ("c2", "mail")))
    left_running.append(run)
    now = datetime.now(UTC)
    day = {"since": now - timedelta(days=1), "until": now + timedelta(days=1)}
    # Every page, re-read while another transaction on the server holds it back.
    found = drain(lambda after: ledger.audit.tool_executions(tool_name="pay", after=after, **day))
    assert [x.call_id for x in found] == ["c1"]
    assert ledger.audit.tool_executions(tool_name="pay", since=now + timedelta(days=1)).items == []


# -- client and repair messages -----------------------------------------------------


def test_supplied_and_repaired_lists_only_client_and_repair_messages(ledger: Ledger) -> None:
    @tool
    def stop() -> str:
        """Stop the run."""
        raise Canceled("stop")

    def two_calls(_: Any) -> Message:
        calls = [ToolCall(id="a", name="stop"), ToolCall(id="b", name="stop")]
        return Message(role="assistant", tool_calls=calls)

    agent = Agent(ScriptedModel(two_calls), tools=[stop])
    history = [Message(role="user", content="from the client"), Message(role="assistant")]
    with pytest.raises(RunError):
        agent.run_with_history(ledger, history, "go")
    found = drain(lambda after: ledger.audit.supplied_and_repaired(after=after))
    assert [(e.origin, e.message.role) for e in found if e.message] == [
        ("client", "user"),
        ("client", "assistant"),
        ("client", "user"),  # the prompt
        ("repair", "tool"),  # the calls the cancel left open, closed by repair
        ("repair", "tool"),
    ]
    repaired = drain(lambda after: ledger.audit.supplied_and_repaired(origin="repair", after=after))
    assert [e.message.tool_call_id for e in repaired if e.message] == ["a", "b"]


# -- lineage --------------------------------------------------------------------------


def test_lineage_names_branches_forks_and_resumes(ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [Message(role="user", content="hi")])
    failed = ledger.runs.start(conv.id, owner="w")
    ledger.runs.fail(failed, stage="model", error="down")
    resume = ledger.runs.start(conv.id, owner="w", resumes=failed.run_id)
    ledger.runs.complete(resume)
    ledger.move_head(conv.id, 1)
    fork = ledger.fork(conv.id)

    tree = ledger.audit.lineage(conv.id)
    assert [b.reason for b in tree.branches] == ["root", "resume", "edit"]
    resumed = next(b for b in tree.branches if b.reason == "resume")
    assert resumed.resumes_run_id == failed.run_id and resumed.parent is not None
    assert [b.holds_head for b in tree.branches] == [False, False, True]
    assert [(r.run_id, r.resumes) for r in tree.resumes] == [(resume.run_id, failed.run_id)]
    assert [f.id for f in tree.forks] == [fork.id] and tree.forked_from is None
    forked = ledger.audit.lineage(fork.id)
    assert forked.forked_from is not None and forked.forked_from.conversation_id == conv.id
    assert [b.reason for b in forked.branches] == ["fork"]


# -- filters ------------------------------------------------------------------------


@pytest.fixture
def busy(ledger: Ledger) -> Iterator[Ledger]:
    """A conversation with client and run messages, tools (one failed) and a failed run."""
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [Message(role="user", content="hi")])
    run = ledger.runs.start(conv.id, owner="w")
    call = ToolCall(id="c1", name="pay")
    failure = Message(role="tool", tool_call_id="c1", tool_name="pay", content="no", failed=True)
    _, run = ledger.runs.record(run, [said(Message(role="assistant", tool_calls=[call]))])
    _, run = ledger.runs.record(run, started(("c1", "pay")))
    _, run = ledger.runs.record(run, [finished("c1", failed=True), said(failure)])
    ledger.runs.fail(run, stage="tool", error="gave up")
    yield ledger


FILTERS: dict[str, tuple[dict[str, Any], Callable[[Any], bool]]] = {
    "kinds": (
        {"kinds": ["tool.started", "run.failed"]},
        lambda e: e.kind in ("tool.started", "run.failed"),
    ),
    "origin": ({"origin": "client"}, lambda e: e.origin == "client"),
    "tool_name": (
        {"tool_name": "pay"},
        lambda e: e.kind == "tool.started" or (e.message is not None and e.message.role == "tool"),
    ),
    "failed": (
        {"failed": True},
        lambda e: e.kind == "run.failed" or e.payload.get("failed") is True,
    ),
    "not_failed": (
        {"failed": False},
        lambda e: not (e.kind == "run.failed" or e.payload.get("failed") is True),
    ),
    "since_the_future": ({"since": datetime.now(UTC) + timedelta(days=1)}, lambda e: False),
    "until_the_future": ({"until": datetime.now(UTC) + timedelta(days=1)}, lambda e: True),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_filters_select_exactly_the_matching_events(busy: Ledger, name: str) -> None:
    options, wanted = FILTERS[name]
    found = drain(lambda after: busy.audit.events(after=after, **options))
    everything = drain(lambda after: busy.audit.events(after=after))
    assert [e.seq for e in found] == [e.seq for e in everything if wanted(e)]


def test_page_limits_and_cursors_are_checked(ledger: Ledger) -> None:
    for bad in (0, 10_001, True):
        with pytest.raises(InvalidInputError, match="page holds"):
            ledger.audit.events(limit=bad)
    with pytest.raises(InvalidInputError, match="cursor"):
        ledger.audit.events(after="12")


# -- tenancy ----------------------------------------------------------------------------

QUERIES: dict[str, Callable[[Ledger, str, str], Any]] = {
    "events by conversation": lambda a, c, r: a.audit.events(conversation_id=c),
    "events by run": lambda a, c, r: a.audit.events(run_id=r),
    "run_timeline": lambda a, c, r: a.audit.run_timeline(r),
    "model_request": lambda a, c, r: a.audit.model_request(r, 1, instructions=INSTRUCTIONS),
    "tool_executions by conversation": lambda a, c, r: a.audit.tool_executions(conversation_id=c),
    "tool_executions by run": lambda a, c, r: a.audit.tool_executions(run_id=r),
    "supplied_and_repaired": lambda a, c, r: a.audit.supplied_and_repaired(conversation_id=c),
    "lineage": lambda a, c, r: a.audit.lineage(c),
}


@pytest.mark.parametrize("query", list(QUERIES))
def test_another_tenants_ids_are_not_found(store: Store, ledger: Ledger, query: str) -> None:
    theirs = store.tenant(f"other-{new_id()}")
    result = wrapped_agent("openai").run(theirs, "weather?")
    with pytest.raises(NotFoundError, match="does not exist for tenant"):
        QUERIES[query](ledger, result.conversation_id, result.run_id)
    assert ledger.audit.events().items == []
    assert ledger.audit.tool_executions().items == []


# -- pagination under concurrent appends ----------------------------------------------

WRITERS = 3
PER_WRITER = 60


def test_pages_return_every_event_exactly_once_while_processes_append(
    database_url: str, store: Store, ledger: Ledger
) -> None:
    conversations = [ledger.create_conversation().id for _ in range(4)]
    context = multiprocessing.get_context("spawn")
    done = [context.Event() for _ in range(WRITERS)]
    writers = [
        context.Process(
            target=_audit_writer.append,
            args=(
                database_url,
                ledger.tenant,
                conversations,
                PER_WRITER,
                w,
                done[w],
                store.fast_paths,
            ),
        )
        for w in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    seen: list[int] = []
    after = None
    while True:
        finished_writing = all(d.is_set() for d in done)  # before the read: it sees them all
        page = ledger.audit.events(kinds="message.recorded", after=after, limit=7)
        seen += [e.seq for e in page.items]
        after = page.next_after
        if finished_writing and not page.has_more and not page.pending:
            break
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert len(seen) == len(set(seen)) == WRITERS * PER_WRITER
    logged = {e.seq for c in conversations for e in ledger.events(conversation_id=c) if e.message}
    assert set(seen) == logged


def append_in(conn: sa.Connection, tenant: str, conversation_id: str, text: str) -> None:
    """Append a message with the store's own code, inside the caller's open transaction."""
    encoded = _log.encode_events([NewEvent.of_message(Message(role="user", content=text))])
    _append.append_messages(conn, _append.Turn(tenant, conversation_id, encoded))


def postgres_only(backend: str) -> None:
    if backend != "postgres":
        pytest.skip("SQLite commits one writer at a time: its seq order is commit order")


def test_a_page_never_passes_an_event_that_commits_late(
    backend: str, store: Store, ledger: Ledger
) -> None:
    postgres_only(backend)
    late, early = ledger.create_conversation().id, ledger.create_conversation().id

    def texts(after: str | None) -> tuple[list[str], str | None]:
        read = lambda a: ledger.audit.events(kinds="message.recorded", after=a)  # noqa: E731
        found = drain(read, after)
        return [e.message.content for e in found if e.message], read(after).next_after

    with store.engine.connect() as older, store.engine.connect() as newer:
        older.begin()
        newer.begin()
        older.execute(sa.text("SELECT pg_current_xact_id()"))  # the older transaction id
        newer.execute(sa.text("SELECT pg_current_xact_id()"))
        append_in(newer, ledger.tenant, late, "late")  # the lower seq, committed last
        append_in(older, ledger.tenant, early, "early")
        older.commit()
        first, cursor = texts(None)
        newer.commit()
    second, _ = texts(cursor)
    assert (first, second) == (["early"], ["late"])


def test_events_committed_behind_an_open_transaction_are_held_back(
    backend: str, store: Store, ledger: Ledger
) -> None:
    postgres_only(backend)
    conv = ledger.create_conversation().id
    with store.engine.connect() as open_transaction:
        open_transaction.begin()
        open_transaction.execute(sa.text("SELECT pg_current_xact_id()"))
        ledger.append_messages(conv, [Message(role="user", content="committed")])
        page = ledger.audit.events(conversation_id=conv, kinds="message.recorded")
        assert page.pending and page.items == []
        open_transaction.rollback()
    found = drain(lambda after: ledger.audit.events(conversation_id=conv, after=after))
    assert [e.message.content for e in found if e.message] == ["committed"]


# -- the plain SQL of docs/audit.md ---------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
DOC_QUERY = re.compile(
    r"<!--\s*query:\s*(?P<name>\w+);\s*index:\s*(?P<index>\w+)"
    r"\s*(?:;\s*backend:\s*(?P<backend>sqlite|postgres)\s*)?-->\s*```sql\n(?P<sql>.*?)```",
    re.DOTALL,
)
DOC_QUERIES = [m.groupdict() for m in DOC_QUERY.finditer(DOC.read_text(encoding="utf-8"))]


@pytest.fixture
def documented(ledger: Ledger) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Per documented query: its parameters, and the rows it must return (their first column).

    The rows come from the raw log (`ledger.events`), and the library's audit
    pages must agree with them (`settles_to`). A page cannot be the expectation
    itself: on Postgres it holds back every event behind the oldest transaction
    still open on the whole server (transaction ids and `pg_current_snapshot()`
    span databases), so a transaction of any other process (another test run,
    say) would shorten it.
    """
    result = wrapped_agent("openai").run(ledger, "weather?")
    conv = result.conversation_id
    crashed = ledger.runs.start(conv, owner="w")
    recorded, crashed = ledger.runs.record(crashed, started(("c9", "weather")))
    ledger.runs.fail(crashed, stage="tool", error="crashed")
    resume = ledger.runs.start(conv, owner="w", resumes=crashed.run_id)
    ledger.runs.fail(resume, stage="test", error="nothing left to do")
    now = datetime.now(UTC)
    audit = ledger.audit
    log = ledger.events()  # the tenant's, in seq order: one writer at a time, so commit order

    def seqs(keep: Callable[[Event], bool]) -> list[int]:
        return [e.seq for e in log if keep(e)]

    common = {"tenant": ledger.tenant, "conversation_id": conv, "run_id": result.run_id}
    day = {
        "since": now - timedelta(hours=1),
        "until": now + timedelta(hours=1),
        "tool_name": "weather",
    }
    page = {"after_txid": 0, "after_seq": 0}
    timeline = seqs(lambda e: e.run_id == result.run_id)
    settles_to(audit.run_timeline(result.run_id), timeline, lambda t: t.event.seq)
    conversation = seqs(lambda e: e.conversation_id == conv)
    settles_to(audit.events(conversation_id=conv), conversation, lambda e: e.seq)
    supplied = seqs(
        lambda e: (
            e.conversation_id == conv
            and e.kind == "message.recorded"
            and e.origin in ("client", "repair")
        )
    )
    settles_to(audit.supplied_and_repaired(conversation_id=conv), supplied, lambda e: e.seq)
    weather = seqs(lambda e: e.kind == "tool.started" and e.payload["name"] == "weather")
    settles_to(audit.tool_executions(**day), weather, lambda x: x.started_seq)  # type: ignore[arg-type]
    unfinished = [e.seq for e in recorded if e.kind == "tool.started"]
    settles_to(
        audit.tool_executions(run_id=crashed.run_id, status="uncertain"),
        unfinished,
        lambda x: x.started_seq,
    )
    return {
        "run_timeline": (common, timeline),
        "conversation_page": (common | page, conversation),
        "conversation_page_settled": (common | page, conversation),  # see `settled`
        "supplied_and_repaired": (common, supplied),
        "tool_calls_over_a_day": (common | day, weather),
        "unfinished_tool_calls": (common | {"run_id": crashed.run_id}, unfinished),
        "resumes": (common, [r.run_id for r in audit.lineage(conv).resumes] or [resume.run_id]),
    }


def settles_to(page: Page[T], rows: list[Any], key: Callable[[T], Any]) -> None:
    """The library's `page` holds `rows`, or, held back by an older open transaction, a prefix."""
    got = [key(item) for item in page.items]
    assert got == rows[: len(got)] and (page.pending or got == rows), (got, rows)


HORIZON = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
"""The horizon docs/audit.md has a caller read before a settled page."""


def settled(conn: sa.Connection, seqs: list[int], horizon: int) -> list[int]:
    """The events among `seqs` that a query guarded by `horizon` returns on `conn` (see
    docs/audit.md): those whose transaction is below it."""
    found = conn.execute(sa.select(events.c.seq, events.c.txid).where(events.c.seq.in_(seqs)))
    txids = {seq: txid for seq, txid in found}
    return [s for s in seqs if txids[s] < horizon]


def sql_value(value: Any, backend: str) -> Any:
    if backend == "sqlite" and isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")  # the stored text form
    return value


@pytest.mark.parametrize("doc", DOC_QUERIES, ids=lambda d: f"{d['name']}-{d['backend'] or 'both'}")
def test_documented_query_runs_on_an_index_and_returns_the_librarys_rows(
    backend: str, store: Store, documented: dict[str, Any], doc: dict[str, str]
) -> None:
    if doc["backend"] not in (None, backend):
        pytest.skip(f"a {doc['backend']} query")
    params, expected = documented[doc["name"]]
    clause = sa.text(doc["sql"])
    names = clause.compile().params
    bound = {n: sql_value(params[n], backend) for n in names if n != "horizon"}
    with store.engine.connect() as conn:
        plan: list[str] = []
        if "horizon" in names:  # read first, as docs/audit.md says
            bound["horizon"] = conn.execute(sa.text(HORIZON)).scalar_one()
            expected = settled(conn, expected, bound["horizon"])
        rows = conn.execute(clause, bound).all()
        if backend == "postgres":  # SQLite, without statistics, plans tiny tables its own way
            if citus_url() is not None:  # the workers plan the shards' scans: tell them too
                conn.exec_driver_sql("SET LOCAL citus.propagate_set_commands = 'local'")
            conn.exec_driver_sql(
                "SET LOCAL enable_seqscan = off"
            )  # a scan only if nothing else serves
            plan = conn.execute(sa.text("EXPLAIN " + doc["sql"]), bound).scalars().all()
    assert [str(r[0]) for r in rows] == [str(v) for v in expected]
    named = {i.name for t in metadata.tables.values() for i in [*t.indexes, *t.constraints]}
    assert doc["index"] in named
    # Which index wins on a few rows depends on the statistics of the moment;
    # bench/RESULTS.md records the plans at a million events. Here: never a scan of the log.
    assert not any("Seq Scan on chatledger_events" in line for line in plan), "\n".join(plan)


# -- the command ----------------------------------------------------------------------------

EXE = [sys.executable, "-m", "chatledger", "audit"]


def chatledger_audit(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return warm.run(
        [*EXE, *args, "--database-url", url], capture_output=True, text=True, timeout=120
    )


def as_json(url: str, *args: str) -> Any:
    """The command's JSON; a page held back by another open transaction on the
    server (`pending`, ADR 0005) is asked for again until it settles."""
    while True:
        result = chatledger_audit(url, *args, "--json")
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        if not (isinstance(answer, dict) and answer.get("pending")):
            return answer


@pytest.fixture
def seeded(database_url: str) -> tuple[str, str, Any]:
    """A run of `tests._audit_agent:agent` in a tenant of its own: (url, tenant, result)."""
    tenant = f"cli-{new_id()}"
    with Store.open(database_url) as store:
        result = cli_agent.run(store.tenant(tenant), "weather?")
    return database_url, tenant, result


def test_audit_commands_answer_from_the_log(seeded: tuple[str, str, Any]) -> None:
    url, tenant, result = seeded
    run, conv, scope = result.run_id, result.conversation_id, ("--tenant", tenant)
    timeline = as_json(url, "timeline", run, *scope)["items"]
    assert [t["kind"] for t in timeline][:2] == ["run.started", "message.recorded"]
    assert timeline[-1]["kind"] == "run.completed" and timeline[-1]["stage"] == "run"
    tools = as_json(url, "tools", "--run", run, *scope)["items"]
    assert [(t["callId"], t["status"]) for t in tools] == [
        (c, "finished") for c in ("c1", "c2", "c3")
    ]
    request = as_json(url, "request", run, "2", "--agent", "tests._audit_agent:agent", *scope)
    assert request["matches"] and request["digest"] == request["rebuiltDigest"]
    messages = as_json(url, "messages", "--conversation", conv, *scope)["items"]
    assert [(m["origin"], m["payload"]["content"]) for m in messages] == [("client", "weather?")]
    assert [b["reason"] for b in as_json(url, "lineage", conv, *scope)["branches"]] == ["root"]
    started = as_json(url, "events", "--run", run, "--kind", "tool.started", *scope)["items"]
    assert len(started) == 3
    table = chatledger_audit(url, "timeline", run, *scope).stdout
    assert "STAGE" in table and "model.requested" in table


def test_audit_command_pages_follow_the_cursor(seeded: tuple[str, str, Any]) -> None:
    url, tenant, result = seeded
    query = ("events", "--run", result.run_id, "--tenant", tenant)
    everything = as_json(url, *query, "--all", "--limit", "3")
    first = as_json(url, *query, "--limit", "3")
    rest = as_json(url, *query, "--after", first["nextAfter"], "--limit", "1000")
    assert first["hasMore"] and not everything["hasMore"]
    assert first["items"] + rest["items"] == everything["items"]
    assert len(everything["items"]) == len(
        as_json(url, "timeline", result.run_id, "--tenant", tenant)["items"]
    )


def test_audit_commands_refuse_another_tenants_ids(seeded: tuple[str, str, Any]) -> None:
    url, _, result = seeded
    run, conv = result.run_id, result.conversation_id
    for args in (
        ["timeline", run],
        ["request", run, "1"],
        ["tools", "--run", run],
        ["tools", "--conversation", conv],
        ["messages", "--conversation", conv],
        ["lineage", conv],
        ["events", "--run", run],
    ):
        failed = chatledger_audit(url, *args, "--tenant", "someone-else")
        lines = failed.stderr.strip().splitlines()
        assert failed.returncode == 1 and len(lines) == 1, (args, failed.stderr)
        assert "in tenant 'someone-else'. Check the id" in lines[0], args
