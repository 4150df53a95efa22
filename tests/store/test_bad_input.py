"""Bad input: a clear `ChatledgerError` naming what is wrong, and nothing written.

The same input gets the same answer on both backends: nothing that is a
caller's mistake surfaces as a `StorageError` (which callers retry as a
fault), and SQLite never stores past a declared width.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatledger.store import (
    AsyncStore,
    ChatledgerError,
    ConflictError,
    Expected,
    InvalidInputError,
    Ledger,
    Message,
    NewEvent,
    Position,
    RunCursor,
    StorageError,
    Store,
    ToolCall,
    _checks,
)
from chatledger.store.ids import new_id
from chatledger.store.messages import load_message
from chatledger.store.schema import branches, conversations, events, runs, view_entries
from tests.helpers import user


def counts(store: Store) -> tuple[int, ...]:
    with store.engine.connect() as conn:
        return tuple(
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (conversations, branches, events, runs, view_entries)
        )


def refused(store: Store, call: Callable[[], object], *words: str) -> InvalidInputError:
    """`call` raises InvalidInputError whose message has `words`, and writes nothing."""
    before = counts(store)
    with pytest.raises(InvalidInputError) as caught:
        call()
    assert counts(store) == before
    for word in words:
        assert word in str(caught.value)
    return caught.value


def _deep(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return root


NOT_JSON = {
    "set": {"x": {1, 2}},
    "bytes": {"x": b"raw"},
    "datetime": {"x": dt.datetime(2026, 1, 1)},
    "tuple": {"x": (1, 2)},
    "int key": {1: "a"},
    "mixed keys": {1: "a", "b": 2},
    "nan": {"x": math.nan},
    "infinity": {"x": [math.inf]},
    "10,000 deep": _deep(10_000),
}


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_metadata_that_is_not_json_is_refused_naming_the_field(
    store: Store, ledger: Ledger, name: str
) -> None:
    refused(store, lambda: ledger.create_conversation(metadata=NOT_JSON[name]), "metadata")
    conv = ledger.create_conversation()
    refused(store, lambda: ledger.fork(conv.id, metadata=NOT_JSON[name]), "metadata")


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_event_payloads_that_are_not_json_are_refused_naming_the_field(
    store: Store, ledger: Ledger, name: str
) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w")
    bad = [NewEvent("model.responded", {"usage": NOT_JSON[name]})]
    refused(store, lambda: ledger.runs.record(cursor, bad), "model.responded payload")
    refused(
        store,
        lambda: ledger.runs.start(conv.id, owner="w", events=bad),
        "model.responded payload",
    )


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_dict_tool_arguments_that_are_not_json_are_refused_naming_the_field(
    store: Store, ledger: Ledger, name: str
) -> None:
    conv = ledger.create_conversation()
    message = {
        "role": "assistant",
        "toolCalls": [{"id": "c1", "name": "t", "arguments": NOT_JSON[name]}],
    }
    error = refused(
        store,
        lambda: ledger.append_messages(conv.id, [message]),
        "arguments",  # type: ignore[list-item]
    )
    assert "toolCalls" in str(error)
    with pytest.raises(ValueError, match="arguments"):
        ToolCall(id="c1", name="t", arguments=NOT_JSON[name])


def test_nan_never_reaches_the_database_as_a_token(ledger: Ledger) -> None:
    # json.dumps writes NaN as the bare token NaN, which no JSON parser (and
    # no documented `::json` query) reads back.
    conv = ledger.create_conversation({"ok": 1.5})
    assert ledger.conversation(conv.id).metadata == {"ok": 1.5}
    with pytest.raises(InvalidInputError, match="NaN or Infinity"):
        ledger.create_conversation({"x": math.nan})


# A value JSON cannot hold in a field this version does not know (kept on round
# trip, `extra="allow"`): pydantic would write it as null, silently.
_NOT_FINITE = {
    "message field": lambda bad: Message(role="user", content="x", score=bad),
    "nested in a field": lambda bad: Message(role="user", content="x", meta={"a": [1, bad]}),
    "part field": lambda bad: load_message(
        {"role": "user", "parts": [{"kind": "text", "text": "x", "weight": bad}]}
    ),
    "unknown part": lambda bad: load_message(
        {"role": "user", "parts": [{"kind": "future", "value": bad}]}
    ),
    "tool call field": lambda bad: Message(
        role="assistant", tool_calls=[ToolCall(id="c1", name="t", confidence=bad)]
    ),
    "parsed from JSON": lambda bad: load_message(
        '{"role":"user","content":"x","score":' + json.dumps(bad) + "}"
    ),
}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", sorted(_NOT_FINITE))
def test_nan_in_an_unknown_field_is_refused_as_in_a_known_one(
    store: Store, ledger: Ledger, where: str, bad: float
) -> None:
    message = _NOT_FINITE[where](bad)
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w")
    for append in (
        lambda: ledger.append_messages(conv.id, [user("fine"), message]),
        lambda: ledger.append_messages(new_id(), [user("fine"), message], create=True),
        lambda: ledger.runs.record(
            cursor, [NewEvent.of_message(user("fine")), NewEvent.of_message(message)]
        ),
    ):
        refused(store, append, "which JSON cannot hold", "NaN or Infinity")
    assert ledger.history(conv.id) == []


async def test_nan_in_an_unknown_field_is_refused_by_the_async_face(database_url: str) -> None:
    async with AsyncStore.open(database_url) as store:
        ledger = store.tenant(f"nan-{uuid.uuid4().hex[:8]}")
        conv = await ledger.create_conversation()
        with pytest.raises(InvalidInputError, match="NaN or Infinity"):
            await ledger.append_messages(
                conv.id, [user("fine"), _NOT_FINITE["message field"](math.nan)]
            )
        assert await ledger.history(conv.id) == []


@pytest.mark.parametrize(
    "call",
    [
        lambda ledger, conv: ledger.create_conversation(conversation_id=""),
        lambda ledger, conv: ledger.runs.start(conv.id, owner="w", run_id=""),
        lambda ledger, conv: ledger.runs.recent(conversation_id=""),
        lambda ledger, conv: ledger.runs.recent(conversation_id="garbage"),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], run_id="garbage"),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], run_id=""),
        lambda ledger, conv: ledger.events(run_id=""),
        lambda ledger, conv: ledger.conversations(before=""),
        lambda ledger, conv: ledger.runs.start(conv.id, owner="w", resumes=""),
        lambda ledger, conv: ledger.history(conv.id.upper()),
    ],
    ids=[
        "create ''",
        "start_run ''",
        "runs ''",
        "runs garbage",
        "append run_id garbage",
        "append run_id ''",
        "events run ''",
        "conversations before ''",
        "resumes ''",
        "uppercase id",
    ],
)
def test_every_id_parameter_refuses_what_is_not_a_canonical_id(
    store: Store, ledger: Ledger, call: Callable[[Ledger, Any], object]
) -> None:
    conv = ledger.create_conversation()
    refused(store, lambda: call(ledger, conv), "id", "canonical form")


@pytest.mark.parametrize(
    "call",
    [
        lambda ledger, conv: ledger.runs.start(conv.id, owner="w", model="m" * 201),
        lambda ledger, conv: ledger.runs.start(conv.id, owner="o" * 201),
        lambda ledger, conv: ledger.append_messages(
            conv.id, [user("x")], idempotency_key="k" * 201
        ),
        lambda ledger, conv: ledger.runs.fail(
            ledger.runs.start(conv.id, owner="w"), stage="s" * 33, error="x"
        ),
        lambda ledger, conv: ledger.runs.record(
            ledger.runs.start(conv.id, owner="w"),
            [NewEvent("no.such.kind", {})],  # type: ignore[arg-type]
        ),
        lambda ledger, conv: ledger.runs.record(
            ledger.runs.start(conv.id, owner="w"),
            [NewEvent("model.responded", {}, origin="elsewhere")],  # type: ignore[arg-type]
        ),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], origin="x" * 9),
    ],
    ids=["model", "owner", "idempotency key", "stage", "kind", "origin", "append origin"],
)
def test_text_past_its_declared_width_is_refused_on_both_backends(
    store: Store, ledger: Ledger, call: Callable[[Ledger, Any], object]
) -> None:
    conv = ledger.create_conversation()
    before = counts(store)
    with pytest.raises(InvalidInputError):
        call(ledger, conv)
    # A run the call started before its own refusal is all that may remain.
    assert counts(store)[2] - before[2] <= 1


HUGE = 10**20


@pytest.mark.parametrize(
    "call",
    [
        lambda ledger, conv: ledger.runs.recent(limit=-1),
        lambda ledger, conv: ledger.runs.recent(limit=HUGE),
        lambda ledger, conv: ledger.runs.recent(limit=0),
        lambda ledger, conv: ledger.events(limit=-1),
        lambda ledger, conv: ledger.events(limit=HUGE),
        lambda ledger, conv: ledger.events(after_seq=-1),
        lambda ledger, conv: ledger.events(after_seq=HUGE),
        lambda ledger, conv: ledger.conversations(limit=HUGE),
        lambda ledger, conv: ledger.conversations(limit=True),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], expected="1"),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], expected=HUGE),
        lambda ledger, conv: ledger.append_messages(conv.id, [user("x")], expected=-1),
        lambda ledger, conv: ledger.history(conv.id, at=HUGE),
        lambda ledger, conv: ledger.history(conv.id, at=Position(conv.head.branch_id, HUGE)),
        lambda ledger, conv: ledger.runs.claim_stale(owner="w", limit=HUGE),
        lambda ledger, conv: ledger.runs.claim_stale(owner="w", max_attempts=0),
        lambda ledger, conv: ledger.runs.claim_stale(owner="w", run_id="not-a-run"),
        lambda ledger, conv: ledger.runs.claim_stale(owner="w", lease_seconds=math.nan),
        lambda ledger, conv: ledger.runs.start(conv.id, owner="w", lease_seconds=math.inf),
        lambda ledger, conv: ledger.audit.events(limit=HUGE),
        lambda ledger, conv: ledger.audit.events(after=f"{HUGE}:{HUGE}"),
    ],
)
def test_numbers_out_of_range_are_invalid_input_never_a_storage_error(
    store: Store, ledger: Ledger, call: Callable[[Ledger, Any], object]
) -> None:
    conv = ledger.create_conversation()
    refused(store, lambda: call(ledger, conv))


def test_a_cursor_with_a_huge_position_is_invalid_input(store: Store, ledger: Ledger) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w")
    forged = RunCursor(cursor.run_id, cursor.conversation_id, cursor.branch_id, HUGE, "w", 1)
    refused(store, lambda: ledger.runs.record(forged, [NewEvent.of_message(user("x"))]), "position")


# --- idempotency keys -----------------------------------------------------------------


@pytest.mark.parametrize(
    "retry",
    [["a"], ["a", "b", "c"], ["b", "a"], ["a", "B"]],
    ids=["shorter", "longer", "reordered", "changed"],
)
def test_a_key_replayed_with_other_content_is_the_callers_mistake(
    store: Store, ledger: Ledger, retry: list[str]
) -> None:
    """Not a `ConflictError`, which callers retry: the same retry fails for ever."""
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("a"), user("b")], idempotency_key="k")
    before = counts(store)
    with pytest.raises(InvalidInputError, match="different append") as caught:
        ledger.append_messages(conv.id, [user(t) for t in retry], idempotency_key="k")
    assert not isinstance(caught.value, ConflictError)
    assert counts(store) == before


def test_a_key_replayed_after_another_append_cannot_reach_into_it(
    store: Store, ledger: Ledger
) -> None:
    conv = ledger.create_conversation()
    ledger.append_messages(conv.id, [user("a"), user("b")], idempotency_key="k")
    ledger.append_messages(conv.id, [user("c")])
    before = counts(store)
    with pytest.raises(InvalidInputError, match="different append"):
        ledger.append_messages(conv.id, [user(t) for t in "abc"], idempotency_key="k")
    with pytest.raises(InvalidInputError, match="different append"):
        ledger.append_messages(conv.id, [user("a")], idempotency_key="k")
    assert counts(store) == before
    # The true retry still returns the original, the head where it now is.
    again = ledger.append_messages(conv.id, [user("a"), user("b")], idempotency_key="k")
    assert [e.message.content for e in again.events if e.message] == ["a", "b"]


def test_a_run_records_key_replayed_with_other_content_is_the_callers_mistake(
    store: Store, ledger: Ledger
) -> None:
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w")
    two = [NewEvent.of_message(user("a")), NewEvent.of_message(user("b"))]
    written, after = ledger.runs.record(cursor, two, idempotency_key="k")
    replay, replayed_cursor = ledger.runs.record(cursor, two, idempotency_key="k")
    assert [e.seq for e in replay] == [e.seq for e in written] and replayed_cursor == after
    before = counts(store)
    for other in (two[:1], [*two, NewEvent.of_message(user("c"))]):
        with pytest.raises(InvalidInputError, match="different append"):
            ledger.runs.record(cursor, other, idempotency_key="k")
    assert counts(store) == before


# --- the property --------------------------------------------------------------------

_TEXT = st.one_of(
    st.just(""),
    st.text(min_size=201, max_size=260),
    st.text(max_size=10).map(lambda t: t + "\x00"),
    st.just("\ud800"),
    st.integers(),
    st.none(),
)
_ID = st.one_of(
    st.just(""),
    st.text(max_size=40),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.integers(),
    st.builds(lambda: new_id()).map(lambda i: " " + i),
)
_INT = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.booleans(),
    st.text(max_size=5),
    st.floats(allow_nan=True),
)
_NOT_JSON_LEAF = st.one_of(
    st.sets(st.integers(), max_size=2),
    st.binary(max_size=4),
    st.datetimes(),
    st.tuples(st.integers()),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not math.isfinite(f)),
)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), _NOT_JSON_LEAF),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), inner, max_size=3),
    ),
    max_leaves=6,
)

OPERATIONS: dict[str, tuple[Callable[..., object], st.SearchStrategy[Any]]] = {
    "create_conversation metadata": (
        lambda ledger, conv, cursor, v: ledger.create_conversation(metadata=v),
        _JSON,
    ),
    "create_conversation id": (
        lambda ledger, conv, cursor, v: ledger.create_conversation(conversation_id=v),
        _ID,
    ),
    "conversation": (lambda ledger, conv, cursor, v: ledger.conversation(v), _ID),
    "conversations limit": (lambda ledger, conv, cursor, v: ledger.conversations(limit=v), _INT),
    "history": (lambda ledger, conv, cursor, v: ledger.history(v), _ID),
    "history at": (lambda ledger, conv, cursor, v: ledger.history(conv.id, at=v), _INT),
    "append to": (
        lambda ledger, conv, cursor, v: ledger.append_messages(v, [user("x")]),
        _ID,
    ),
    "append expected": (
        lambda ledger, conv, cursor, v: ledger.append_messages(conv.id, [user("x")], expected=v),
        _INT,
    ),
    "append run_id": (
        lambda ledger, conv, cursor, v: ledger.append_messages(conv.id, [user("x")], run_id=v),
        _ID,
    ),
    "append key": (
        lambda ledger, conv, cursor, v: ledger.append_messages(
            conv.id, [user("x")], idempotency_key=v
        ),
        _TEXT,
    ),
    "append tool arguments": (
        lambda ledger, conv, cursor, v: ledger.append_messages(
            conv.id,
            [{"role": "assistant", "toolCalls": [{"id": "c", "name": "t", "arguments": v}]}],
        ),
        _JSON,
    ),
    "fork metadata": (lambda ledger, conv, cursor, v: ledger.fork(conv.id, metadata=v), _JSON),
    "fork at": (lambda ledger, conv, cursor, v: ledger.fork(conv.id, at=v), _INT),
    "move_head to": (lambda ledger, conv, cursor, v: ledger.move_head(conv.id, v), _INT),
    "events after_seq": (lambda ledger, conv, cursor, v: ledger.events(after_seq=v), _INT),
    "events limit": (lambda ledger, conv, cursor, v: ledger.events(limit=v), _INT),
    "start_run owner": (lambda ledger, conv, cursor, v: ledger.runs.start(conv.id, owner=v), _TEXT),
    "start_run model": (
        lambda ledger, conv, cursor, v: ledger.runs.start(conv.id, owner="w", model=v),
        _TEXT,
    ),
    "start_run run_id": (
        lambda ledger, conv, cursor, v: ledger.runs.start(conv.id, owner="w", run_id=v),
        _ID,
    ),
    "record payload": (
        lambda ledger, conv, cursor, v: ledger.runs.record(
            cursor, [NewEvent("model.responded", v)]
        ),
        _JSON,
    ),
    "record key": (
        lambda ledger, conv, cursor, v: ledger.runs.record(
            cursor, [NewEvent.of_message(user("x"))], idempotency_key=v
        ),
        _TEXT,
    ),
    "fail_run stage": (
        lambda ledger, conv, cursor, v: ledger.runs.fail(cursor, stage=v, error="e"),
        _TEXT,
    ),
    "complete_run request_count": (
        lambda ledger, conv, cursor, v: ledger.runs.complete(cursor, request_count=v),
        _INT,
    ),
    "renew_lease seconds": (
        lambda ledger, conv, cursor, v: ledger.runs.renew_lease(cursor, v),
        st.one_of(st.floats(allow_nan=True).filter(lambda f: not math.isfinite(f)), _TEXT),
    ),
    "run": (lambda ledger, conv, cursor, v: ledger.runs.get(v), _ID),
    "runs limit": (lambda ledger, conv, cursor, v: ledger.runs.recent(limit=v), _INT),
    "runs conversation": (
        lambda ledger, conv, cursor, v: ledger.runs.recent(conversation_id=v),
        _ID,
    ),
    "claim_stale_runs owner": (
        lambda ledger, conv, cursor, v: ledger.runs.claim_stale(owner=v),
        _TEXT,
    ),
    "claim_stale_runs limit": (
        lambda ledger, conv, cursor, v: ledger.runs.claim_stale(owner="w", limit=v),
        _INT,
    ),
    "verify": (lambda ledger, conv, cursor, v: ledger.verify(v), _ID),
    "audit events limit": (lambda ledger, conv, cursor, v: ledger.audit.events(limit=v), _INT),
    "audit timeline": (lambda ledger, conv, cursor, v: ledger.audit.run_timeline(v), _ID),
    "tenant": (lambda ledger, conv, cursor, v: ledger._store.tenant(v).conversations(), _TEXT),
    "create_conversation key": (
        lambda ledger, conv, cursor, v: ledger.create_conversation(key=v),
        _TEXT,
    ),
    "conversation_by_key": (lambda ledger, conv, cursor, v: ledger.conversation_by_key(v), _TEXT),
    "entries last": (lambda ledger, conv, cursor, v: ledger.entries(conv.id, last=v), _INT),
    "entries at": (lambda ledger, conv, cursor, v: ledger.entries(conv.id, at=v), _INT),
    "entry": (lambda ledger, conv, cursor, v: ledger.entry(v), _ID),
    "append ids": (
        lambda ledger, conv, cursor, v: ledger.append_messages(conv.id, [user("x")], ids=[v]),
        _ID,
    ),
    "append after": (
        lambda ledger, conv, cursor, v: ledger.append_messages(conv.id, [user("x")], after=v),
        _INT,
    ),
    "set_state": (
        lambda ledger, conv, cursor, v: ledger.append_messages(conv.id, [], state={"v": v}),
        _JSON,
    ),
    "set_state expected": (
        lambda ledger, conv, cursor, v: ledger.append_messages(
            conv.id, [], state={}, expected=Expected(state={"v": v})
        ),
        _JSON,
    ),
}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_operation_given_bad_values_refuses_cleanly_or_round_trips(
    store: Store, data: st.DataObject
) -> None:
    ledger = store.tenant(f"bad-{uuid.uuid4().hex[:8]}")
    conv = ledger.create_conversation()
    cursor = ledger.runs.start(conv.id, owner="w")
    name = data.draw(st.sampled_from(sorted(OPERATIONS)), label="operation")
    call, values = OPERATIONS[name]
    value = data.draw(values, label="value")
    before = counts(store)
    try:
        result = call(ledger, conv, cursor, value)
    except StorageError as error:  # a fault to retry: never the answer to bad input
        pytest.fail(f"{name}({value!r:.80}) raised StorageError: {error}")
    except ChatledgerError:
        assert counts(store) == before, f"{name}({value!r:.80}) wrote before refusing"
        return
    # Accepted: then it must read back exactly as given.
    if name in ("create_conversation metadata", "fork metadata"):
        expected = {} if value is None else value  # None is documented as no metadata
        assert ledger.conversation(result.id).metadata == expected  # type: ignore[attr-defined]
    if name == "set_state":
        assert ledger.conversation(conv.id).state == {"v": value}
    if name == "create_conversation key" and value is not None:  # None: no key
        assert ledger.conversation_by_key(value).id == result.id  # type: ignore[attr-defined]
    if name == "append tool arguments":
        stored = ledger.history(conv.id, repaired=False)[-1].tool_calls[0].arguments
        assert stored == value or stored == ToolCall(id="c", name="t", arguments=value).arguments


def _reference_json_text(value: object, what: str) -> str:
    """What `json_text` answers, by the walk that names where a value is not JSON."""
    _checks._check_plain(value, what)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


class _Text(str):
    pass


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and the infinities included: refused
    st.text(max_size=5),
    st.sampled_from(["\ud800", "a\udfff", _Text("sub"), True, 1.5, (1, 2), {1}, b"x"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.dictionaries(st.sampled_from([1, "\udc80", "k"]), inner, max_size=2),
        st.tuples(inner),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_json_text_answers_as_the_walk_that_names_where(value: object) -> None:
    try:
        expected: object = _reference_json_text(value, "the value")
    except InvalidInputError as error:
        expected = str(error)
    try:
        got: object = _checks.json_text(value, "the value")
    except InvalidInputError as error:
        got = str(error)
    assert got == expected


def test_json_text_refuses_what_nests_too_deep_whatever_the_last_level_holds() -> None:
    for leaf in (1, "s", None, 1.5, [], {}):
        for levels, allowed in (
            (_checks.MAX_JSON_DEPTH, True),
            (_checks.MAX_JSON_DEPTH + 1, False),
        ):
            deep: object = leaf
            for i in range(levels):
                deep = [deep] if i % 2 else {"k": deep}
            if allowed:  # the leaf at depth MAX_JSON_DEPTH
                assert json.loads(_checks.json_text(deep, "it")) == deep
            else:
                with pytest.raises(InvalidInputError, match="deeper than"):
                    _checks.json_text(deep, "it")
