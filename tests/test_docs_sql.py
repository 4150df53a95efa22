"""The plain-SQL queries of docs/tables.md, run against the real store on every backend.

Every query block of the page (a ```sql fence preceded by a
`<!-- query: NAME -->` marker, or `<!-- query: NAME; backend: sqlite -->` for
one that only one backend understands) is executed through `sa.text` against
a conversation built with the public API, and its result is checked against
what the library itself returns. A query on the page without a check here
fails, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from chatledger.store import (
    ConflictError,
    Conversation,
    Ledger,
    Message,
    NewEvent,
    Position,
    RunCursor,
    Store,
    ToolCall,
)
from chatledger.store.messages import load_message
from tests.helpers import assistant, user

DOC = Path(__file__).resolve().parents[1] / "docs" / "tables.md"

QUERY = re.compile(
    r"<!--\s*query:\s*(?P<name>[a-z0-9_]+)\s*(?:;\s*backend:\s*(?P<backend>sqlite|postgres)\s*)?-->"
    r"\s*```sql\n(?P<sql>.*?)```",
    re.DOTALL,
)

REQUIRED = {
    "conversation_history",
    "conversation_history_fast",
    "run_events",
    "runs_needing_attention",
    "forks_of_a_conversation",
}


@dataclass(frozen=True)
class DocQuery:
    name: str
    backend: str | None
    sql: str

    @property
    def id(self) -> str:
        return f"{self.name}-{self.backend or 'both'}"


def doc_queries() -> list[DocQuery]:
    text = DOC.read_text(encoding="utf-8")
    return [DocQuery(m["name"], m["backend"], m["sql"]) for m in QUERY.finditer(text)]


QUERIES = doc_queries()


# -- the scenario -------------------------------------------------------------------


def said(message: Message) -> NewEvent:
    return NewEvent.of_message(message)


@dataclass
class Scenario:
    tenant: str
    conv: Conversation
    forks: list[Conversation]
    runs: dict[str, RunCursor]
    """Cursors by role: failed, completed, lost_race, won_race, resume, gave_up, stale."""


def build(ledger: Ledger) -> Scenario:
    """A conversation with appends, failed and completed runs, a race, an edit and forks."""
    conv = ledger.create_conversation(metadata={"purpose": "docs", "n": 1})
    ledger.append_messages(conv.id, [user("hello"), assistant("Hi! How can I help?")])
    ledger.append_messages(conv.id, [user("a NUL \x00 inside")], idempotency_key="k1")

    # A failed run on the head's own branch: its partial lies beyond the head.
    failed = ledger.runs.start(conv.id, owner="w1", model="scripted")
    _, failed = ledger.runs.record(
        failed,
        [
            said(user("partial prompt")),
            NewEvent("model.requested", {"digest": "0" * 64, "request": 1}),
            said(assistant("partial answer", [ToolCall(id="c0", name="lookup")])),
        ],
    )
    ledger.runs.fail(failed, stage="tool", error="the tool crashed")

    # The next run's base (the head) is no longer a tip: it opens a run branch.
    done = ledger.runs.start(conv.id, owner="w1", model="scripted", instructions_digest="d")
    _, done = ledger.runs.record(
        done,
        [
            said(user("what is 6*7?")),
            NewEvent("model.requested", {"digest": "1" * 64, "request": 1}),
            said(assistant(calls=[ToolCall(id="c1", name="calc", arguments={"expr": "6*7"})])),
            NewEvent("tool.started", {"callId": "c1", "name": "calc"}),
            said(Message(role="tool", tool_call_id="c1", tool_name="calc", content="42")),
            NewEvent("tool.finished", {"callId": "c1", "failed": False}),
            NewEvent("model.requested", {"digest": "2" * 64, "request": 2}),
            said(assistant("It is 42.")),
        ],
    )
    ledger.runs.complete(done, request_count=2, tool_count=1)
    ledger.append_messages(conv.id, [user("thanks")])

    # Two runs from the same head: the first to complete moves the head.
    lost = ledger.runs.start(conv.id, owner="w1")  # appends on the head's branch
    won = ledger.runs.start(conv.id, owner="w2")  # opens a run branch
    _, lost = ledger.runs.record(lost, [said(user("race")), said(assistant("lost answer"))])
    _, won = ledger.runs.record(won, [said(user("race")), said(assistant("winning answer"))])
    ledger.runs.complete(won)
    with pytest.raises(ConflictError):
        ledger.runs.complete(lost)  # recorded as failed at stage "conflict"

    # Resume the run that lost, then cancel the resume.
    resume = ledger.runs.start(conv.id, owner="w3", resumes=lost.run_id)
    _, resume = ledger.runs.record(resume, [said(assistant("resumed answer"))])
    ledger.runs.fail(resume, stage="user", error="stopped by the user", canceled=True)

    # An edit: a wrong turn, then the head moved back before it (an edit branch).
    before = ledger.conversation(conv.id).head
    ledger.append_messages(conv.id, [user("wrong question")])
    ledger.move_head(conv.id, before.position)
    call = ToolCall(id="c2", name="lookup", arguments={"q": "chatledger"})
    ledger.append_messages(conv.id, [user("look it up"), assistant(calls=[call])])

    # Forks: one in the middle of the history, one at the head.
    middle = next(
        e.position
        for e in ledger.events(conversation_id=conv.id)
        if e.message is not None and e.message.content == "It is 42."
    )
    early = ledger.fork(conv.id, at=middle, metadata={"fork": "early"})
    ledger.append_messages(early.id, [user("a question only the early fork has")])
    late = ledger.fork(conv.id)
    ledger.append_messages(late.id, [user("a question only the late fork has")])

    # A run that crashed on every attempt is given up: it needs attention.
    crashed = ledger.runs.start(conv.id, owner="w4", lease_seconds=-5)
    assert ledger.runs.claim_stale(owner="rescuer", max_attempts=1) == []

    # A run whose worker died: its lease expired, nobody claimed it yet.
    stale = ledger.runs.start(conv.id, owner="w5", lease_seconds=-5)

    return Scenario(
        tenant=ledger.tenant,
        conv=ledger.conversation(conv.id),
        forks=[early, late],
        runs={
            "failed": failed,
            "completed": done,
            "lost_race": lost,
            "won_race": won,
            "resume": resume,
            "gave_up": crashed,
            "stale": stale,
        },
    )


# -- running the documented SQL -----------------------------------------------------

Rows = list[sa.Row[Any]]
Run = Callable[..., Rows]


def runner(store: Store, query: DocQuery, tenant: str) -> Run:
    """A function that runs `query` with the given parameters (plus the tenant)."""
    clause = sa.text(query.sql)
    names = set(clause.compile().params)

    def run(**params: Any) -> Rows:
        params = {"tenant": tenant, **params}
        missing = names - params.keys()
        assert not missing, f"query {query.name} needs parameters {sorted(missing)}"
        with store.engine.connect() as conn:
            return list(conn.execute(clause, {n: params[n] for n in names}).all())

    return run


def ids(values: Sequence[Any]) -> list[str]:
    """Ids as canonical strings (psycopg returns uuid.UUID for uuid columns)."""
    return [str(v) for v in values]


def messages(rows: Rows) -> list[Message]:
    return [load_message(r.payload) for r in rows]


def assert_history(rows: Rows, expected: list[Message]) -> None:
    got = messages(rows)
    assert [m.content for m in got] == [m.content for m in expected]
    assert got == expected
    positions = [r.position for r in rows]
    assert positions == sorted(set(positions))


# -- the checks, one per documented query -------------------------------------------


def check_conversation_history(run: Run, ledger: Ledger, s: Scenario) -> None:
    history = ledger.history(s.conv.id, repaired=False)
    rows = run(conversation_id=s.conv.id)
    assert_history(rows, history)
    contents = [m.content for m in messages(rows)]
    assert "a NUL \x00 inside" in contents  # the NUL survives, exactly
    for beyond_the_head in ("partial prompt", "partial answer", "lost answer", "wrong question"):
        assert beyond_the_head not in contents
    assert "winning answer" in contents and contents[-2] == "look it up"
    # The SQL reads the raw log: repair (a result for the unanswered call) is Python's.
    assert len(ledger.history(s.conv.id)) == len(history) + 1
    for fork in s.forks:
        fork_rows = run(conversation_id=fork.id)
        assert_history(fork_rows, ledger.history(fork.id, repaired=False))
        assert {str(r.recorded_in) for r in fork_rows} == {s.conv.id, fork.id}
    assert run(conversation_id=s.conv.id, tenant="another-tenant") == []


def check_conversation_history_fast(run: Run, ledger: Ledger, s: Scenario) -> None:
    check_conversation_history(run, ledger, s)


def check_history_at_position(run: Run, ledger: Ledger, s: Scenario) -> None:
    points = {(e.branch_id, e.position) for e in ledger.events(conversation_id=s.conv.id)}
    for branch_id, position in sorted(points):
        expected = ledger.history(s.conv.id, at=Position(branch_id, position), repaired=False)
        rows = run(conversation_id=s.conv.id, branch_id=branch_id, position=position)
        assert_history(rows, expected)


def check_run_history(run: Run, ledger: Ledger, s: Scenario) -> None:
    for cursor in s.runs.values():
        row = ledger.runs.get(cursor.run_id)
        at = Position(row.branch_id, row.position)
        assert_history(run(run_id=row.id), ledger.history(s.conv.id, at=at, repaired=False))
    partial = [m.content for m in messages(run(run_id=s.runs["failed"].run_id))]
    assert partial[-2:] == ["partial prompt", "partial answer"]


def check_run_events(run: Run, ledger: Ledger, s: Scenario) -> None:
    for cursor in s.runs.values():
        rows = run(run_id=cursor.run_id)
        expected = ledger.events(run_id=cursor.run_id)
        assert ids([r.id for r in rows]) == [e.id for e in expected]
        assert [r.kind for r in rows] == [e.kind for e in expected]
        assert [r.payload for r in rows] == [e.payload_json for e in expected]
    kinds = [r.kind for r in run(run_id=s.runs["completed"].run_id)]
    assert kinds[:2] == ["branch.created", "run.started"] and kinds[-1] == "run.completed"


def check_conversation_events(run: Run, ledger: Ledger, s: Scenario) -> None:
    for conv in [s.conv, *s.forks]:
        rows = run(conversation_id=conv.id)
        expected = ledger.events(conversation_id=conv.id)
        assert ids([r.id for r in rows]) == [e.id for e in expected]
        assert [bool(r.head) for r in rows] == [e.head for e in expected]
        assert [r.idempotency_key for r in rows] == [e.idempotency_key for e in expected]


def check_runs_needing_attention(run: Run, ledger: Ledger, s: Scenario) -> None:
    rows = run()
    assert ids([r.id for r in rows]) == [s.runs["gave_up"].run_id]
    assert {r.id for r in ledger.runs.recent(attention=True)} == set(ids([r.id for r in rows]))
    assert (rows[0].status, rows[0].stage) == ("failed", "gave_up")


def check_stale_runs(run: Run, ledger: Ledger, s: Scenario) -> None:
    rows = run()
    assert ids([r.id for r in rows]) == [s.runs["stale"].run_id]
    claimed = ledger.runs.claim_stale(owner="late-rescuer")
    assert [r.id for r, _ in claimed] == ids([r.id for r in rows])
    assert run() == []


def check_unresumed_failed_runs(run: Run, ledger: Ledger, s: Scenario) -> None:
    all_runs = ledger.runs.recent()
    resumed = {r.resumes for r in all_runs if r.resumes}
    expected = {r.id for r in all_runs if r.status in ("failed", "canceled")} - resumed
    rows = run()
    assert set(ids([r.id for r in rows])) == expected
    assert expected == {s.runs[k].run_id for k in ("failed", "resume", "gave_up")}


def check_forks_of_a_conversation(run: Run, ledger: Ledger, s: Scenario) -> None:
    rows = run(conversation_id=s.conv.id)
    assert ids([r.id for r in rows]) == [f.id for f in s.forks]
    for row, fork in zip(rows, s.forks, strict=True):
        assert fork.forked_from is not None
        assert str(row.forked_from_branch_id) == fork.forked_from.branch_id
        assert row.forked_from_position == fork.forked_from.position
    assert run(conversation_id=s.forks[0].id) == []


def check_conversation_branches(run: Run, ledger: Ledger, s: Scenario) -> None:
    tips: dict[str, int] = {}
    for e in ledger.events(conversation_id=s.conv.id):
        tips[e.branch_id] = max(tips.get(e.branch_id, 0), e.position)
    rows = run(conversation_id=s.conv.id)
    assert {str(r.id): r.tip for r in rows} == tips
    assert {r.reason for r in rows} == {"root", "run", "resume", "edit"}
    assert [str(r.id) for r in rows if r.holds_head] == [s.conv.head.branch_id]
    for r in rows:
        first = min(
            e.position for e in ledger.events(conversation_id=s.conv.id) if e.branch_id == str(r.id)
        )
        assert r.first_position == first


def check_head_timeline(run: Run, ledger: Ledger, s: Scenario) -> None:
    for conv in [s.conv, *s.forks]:
        rows = run(conversation_id=conv.id)
        expected = [
            (e.branch_id, e.position) for e in ledger.events(conversation_id=conv.id) if e.head
        ]
        assert [(str(r.branch_id), r.position) for r in rows] == expected
        head = ledger.conversation(conv.id).head
        assert (str(rows[-1].branch_id), rows[-1].position) == (head.branch_id, head.position)


def check_tool_results_of_a_run(run: Run, ledger: Ledger, s: Scenario) -> None:
    rows = run(run_id=s.runs["completed"].run_id)
    assert [(r.tool_call_id, r.tool_name, bool(r.failed)) for r in rows] == [("c1", "calc", False)]
    # A payload with a NUL character in the scanned range does not break the query.
    conv = s.conv.id
    cursor = ledger.runs.start(conv, owner="w6")
    _, cursor = ledger.runs.record(
        cursor,
        [
            said(user("NUL \x00 in the prompt")),
            said(Message(role="tool", tool_call_id="c9", tool_name="probe", failed=True)),
        ],
    )
    rows = run(run_id=cursor.run_id)
    assert [(r.tool_call_id, r.tool_name, bool(r.failed)) for r in rows] == [("c9", "probe", True)]


CHECKS: dict[str, Callable[[Run, Ledger, Scenario], None]] = {
    "conversation_history": check_conversation_history,
    "conversation_history_fast": check_conversation_history_fast,
    "history_at_position": check_history_at_position,
    "run_history": check_run_history,
    "run_events": check_run_events,
    "conversation_events": check_conversation_events,
    "runs_needing_attention": check_runs_needing_attention,
    "stale_runs": check_stale_runs,
    "unresumed_failed_runs": check_unresumed_failed_runs,
    "forks_of_a_conversation": check_forks_of_a_conversation,
    "conversation_branches": check_conversation_branches,
    "head_timeline": check_head_timeline,
    "tool_results_of_a_run": check_tool_results_of_a_run,
}


# -- tests ----------------------------------------------------------------------------


def test_the_page_documents_the_required_queries() -> None:
    names = {q.name for q in QUERIES}
    assert not REQUIRED - names, f"missing from docs/tables.md: {sorted(REQUIRED - names)}"
    assert len({q.id for q in QUERIES}) == len(QUERIES), "a query name is used twice"
    assert not names - CHECKS.keys(), "every documented query needs a check here"


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_documented_query(store: Store, ledger: Ledger, backend: str, query: DocQuery) -> None:
    if query.backend not in (None, backend):
        pytest.skip(f"{query.name} is written for {query.backend}")
    scenario = build(ledger)
    CHECKS[query.name](runner(store, query, ledger.tenant), ledger, scenario)


def test_portable_queries_have_no_backend_specific_syntax() -> None:
    for query in QUERIES:
        if query.backend is None:
            for marker in ("::", "json_extract", "->>", "ILIKE", "RETURNING"):
                assert marker not in query.sql, f"{query.name} uses {marker!r}"
