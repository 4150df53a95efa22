"""Every form of the append writes what the general path writes: a property-based differential.

Hypothesis draws sequences of appends with random mixes of their options
(`create` with metadata and subject, `expected` as a position or a
`Position`, idempotency keys fresh and reused, caller event ids fresh and
taken, a new state and an expected state, `after`, run ids, origins),
between them head moves, state changes and appends by another store (so the
head a store kept for a conversation goes stale: a cache miss on the next
append, where the others hit). Each sequence runs four times, on the same
database, each in a tenant of its own:

- the sync face with its fast forms (`Store`), and with them off
  (`fast_paths=False`: the general path alone);
- the async face likewise (`AsyncStore`), which runs the fast forms on the
  event loop, in threads, or not at all.

What each step answered (the `Appended`, its repair report included, or the
error's class and sentence)
and every row the four wrote (conversations, branches, events, caller ids,
the head view) must be the same, ids anonymized in order of first
appearance, times, sequence numbers and hashes left out (every chain is
verified instead). In a store that seals, the payloads compared are the
opened ones.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chatledger.store import (
    Appended,
    AsyncStore,
    ChatledgerError,
    EncryptionError,
    Expected,
    Ledger,
    Message,
    NewConversation,
    Position,
    Store,
    ToolCall,
    new_id,
)
from tests.helpers import Blocking, Loop, called

T = TypeVar("T")
KEK = bytes(range(32))
SLOTS = 2  # conversations per sequence

POOL = [
    Message(role="user", content="hello"),
    Message(role="assistant", content="hi there"),
    Message(
        role="assistant",
        tool_calls=[ToolCall(id="c1", name="weather", arguments='{"city": "Oslo"}')],
    ),
    Message(role="tool", tool_call_id="c1", tool_name="weather", content="sunny"),
    Message(role="tool", tool_call_id="absent", tool_name="weather", content="orphan"),
    Message(role="user", content="again \u00e9"),
    Message(role="user", content="scored", score=math.nan),
]
"""The messages a drawn append picks from (a tool call, its result, a result without a call,
a NaN in a field this version does not know, which every form refuses)."""


# -- the steps ---------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    slot: int
    messages: tuple[int, ...]
    create: bool = False
    metadata: dict[str, Any] | None = None
    subject: str | None = None
    expected: tuple[str, int] | None = None  # ("position" | "branch", offset from the head)
    key: str | None = None
    ids: tuple[str, ...] | None = None
    state: dict[str, Any] | None = None
    expected_state: dict[str, Any] | None = None
    after: int | None = None  # an offset back from the head's position
    run: str | None = None
    origin: str = "client"


@dataclass(frozen=True)
class MoveHead:
    slot: int
    back: int  # positions back from the head


@dataclass(frozen=True)
class SetState:
    slot: int
    state: dict[str, Any]


@dataclass(frozen=True)
class Interlope:
    """An append by another store: the head this store kept goes stale."""

    slot: int


Step = Append | MoveHead | SetState | Interlope

_names = st.sampled_from(["e1", "e2", "e3", "e4"])
_small = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 2), max_size=2)


def _mostly_none(values: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    """None two times in three: most appends take few options, as real ones do."""
    return st.one_of(st.none(), st.none(), values)


@st.composite
def appends(draw: st.DrawFn) -> Append:
    create = draw(st.booleans())
    # What belongs to a creation (a `NewConversation`) comes with it only.
    with_create = st.booleans() if create else st.just(False)
    messages = draw(
        st.lists(
            st.integers(0, len(POOL) - 1),
            min_size=draw(st.sampled_from([0, *[1] * 9])),  # now and then none: refused alike
            max_size=3,
        )
    )
    return Append(
        slot=draw(st.integers(0, SLOTS - 1)),
        messages=tuple(messages),
        create=create,
        metadata={"user": "u1"} if draw(with_create) else None,
        subject="person-1" if draw(with_create) and draw(st.booleans()) else None,
        expected=draw(
            _mostly_none(st.tuples(st.sampled_from(["position", "branch"]), st.integers(-1, 1)))
        ),
        key=draw(_mostly_none(st.sampled_from(["k1", "k2"]))),
        # One caller id per message (what a backend gives), from names that recur.
        ids=draw(
            _mostly_none(
                st.lists(
                    _names,
                    min_size=len(messages),
                    max_size=len(messages),
                    unique=draw(st.sampled_from([True, True, False])),
                ).map(tuple)
            )
        ),
        state=draw(_mostly_none(_small)),
        expected_state=draw(_mostly_none(_small)),
        after=draw(_mostly_none(st.integers(0, 3))),
        run=draw(_mostly_none(st.sampled_from(["r1", "r2"]))),
        origin=draw(st.sampled_from(["client", "client", "run", "repair"])),
    )


@st.composite
def branching(draw: st.DrawFn) -> Append:
    """An append after a position back from the head with no option that refuses it
    (a replaced answer, a framework's record): it opens a branch, which no fast form
    may write. Among `appends()`, whose options mostly refuse such an append, it
    would be rare."""
    return Append(
        slot=draw(st.integers(0, SLOTS - 1)),
        messages=tuple(draw(st.lists(st.integers(0, len(POOL) - 1), max_size=2))),
        state=draw(st.one_of(st.none(), _small)),
        after=draw(st.integers(0, 3)),
        run=draw(_mostly_none(st.sampled_from(["r1", "r2"]))),
    )


steps = st.lists(
    st.one_of(
        appends(),
        appends(),
        appends(),
        branching(),
        st.builds(MoveHead, slot=st.integers(0, SLOTS - 1), back=st.integers(0, 3)),
        st.builds(SetState, slot=st.integers(0, SLOTS - 1), state=_small),
        st.builds(Interlope, slot=st.integers(0, SLOTS - 1)),
    ),
    min_size=1,
    max_size=8,
)


# -- running a sequence on one face ---------------------------------------------------


@dataclass
class Face:
    """One tenant of one store, called alike whether the store is sync or async."""

    ledger: Ledger | Blocking
    interloper: Ledger  # another store's handle on the same tenant

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.ledger, name)(*args, **kwargs)


class Run:
    """One sequence on one face: its outcomes, and its caller-chosen names resolved."""

    def __init__(self, face: Face) -> None:
        self.face = face
        self.convs = [new_id() for _ in range(SLOTS)]
        self.ids: dict[str, str] = {}
        self.runs: dict[str, str] = {}
        self.outcomes: list[Any] = []

    def begin(self) -> None:
        """The first conversation exists before the sequence; the second is the
        sequence's to create (by an append with `create`) or to miss."""
        self.face("append_messages", self.convs[0], [POOL[0]], create=True)

    def head(self, slot: int) -> Position | None:
        try:
            return self.face("conversation", self.convs[slot]).head  # type: ignore[no-any-return]
        except ChatledgerError:
            return None

    def step(self, step: Step) -> None:
        try:
            self.outcomes.append(("ok", self.apply(step)))
        except ChatledgerError as error:
            self.outcomes.append(("error", type(error).__name__, str(error)))

    def apply(self, step: Step) -> Any:
        cid = self.convs[step.slot]
        head = self.head(step.slot)
        match step:
            case Append():
                return self.append(cid, head, step)
            case MoveHead():
                if head is None or head.position - step.back < 1:
                    return "skipped"
                return self.face("move_head", cid, head.position - step.back).head
            case SetState():
                return self.face("append_messages", cid, [], state=step.state).head
            case Interlope():
                done = self.face.interloper.append_messages(cid, [POOL[0]])
                return done.head

    def append(self, cid: str, head: Position | None, step: Append) -> Any:
        options: dict[str, Any] = {"origin": step.origin}
        if step.create:
            new = NewConversation(metadata=step.metadata, subject=step.subject)
            options["create"] = True if new == NewConversation() else new
        expected: int | Position | None = None
        if step.expected is not None:
            form, offset = step.expected
            position = (head.position if head is not None else 1) + offset
            if form == "branch" and head is not None:
                expected = Position(head.branch_id, max(position, 0))
            else:
                expected = max(position, 0)
        if step.expected_state is not None:
            options["expected"] = Expected(head=expected, state=step.expected_state)
        elif expected is not None:
            options["expected"] = expected
        if step.key is not None:
            options["idempotency_key"] = step.key
        if step.ids is not None:
            options["ids"] = [self.ids.setdefault(n, new_id()) for n in step.ids]
        if step.state is not None:
            options["state"] = step.state
        if step.after is not None:
            options["after"] = max((head.position if head is not None else 1) - step.after, 1)
        if step.run is not None:
            options["run_id"] = self.runs.setdefault(step.run, new_id())
        appended: Appended = self.face(
            "append_messages", cid, [POOL[i] for i in step.messages], **options
        )
        return (
            appended.created,
            appended.head,
            appended.repair,
            [
                (
                    e.kind,
                    e.branch_id,
                    e.position,
                    e.origin,
                    e.run_id,
                    e.head,
                    e.idempotency_key,
                    e.payload,
                )
                for e in appended.events
            ],
        )

    def verified(self) -> None:
        for cid in self.convs:
            if self.head(self.convs.index(cid)) is not None:
                assert self.face("verify", cid).ok, f"the chain of {cid} does not verify"


# -- what a run wrote ---------------------------------------------------------------


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def anonymized(value: Any, names: dict[str, str]) -> Any:
    """`value` with every id (also inside strings) replaced by its order of first appearance."""
    if isinstance(value, str):
        return _UUID.sub(lambda m: names.setdefault(m.group(0), f"id{len(names)}"), value)
    if isinstance(value, uuid.UUID):
        return anonymized(str(value), names)
    if isinstance(value, dict):
        return {k: anonymized(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [anonymized(v, names) for v in value]
    if isinstance(value, Position):
        return ("position", anonymized(value.branch_id, names), value.position)
    return value


def rows(engine: sa.Engine, run: Run, sealed: bool) -> Any:
    """Every row the run's conversations hold, in a stable order, seq and times left out."""
    cids = run.convs
    with engine.connect() as conn:

        def select(sql: str) -> list[dict[str, Any]]:
            statement = sa.text(sql).bindparams(sa.bindparam("c", expanding=True))
            found = conn.execute(statement, {"c": cids}).mappings().all()
            return [dict(r) for r in found]

        events = select(
            "SELECT seq, id, conversation_id, branch_id, position, run_id, kind, origin, head,"
            " idempotency_key, payload FROM chatledger_events"
            " WHERE conversation_id IN :c ORDER BY seq"
        )
        order = {e["seq"]: i for i, e in enumerate(events)}
        for e in events:
            e.pop("seq")
            if sealed:
                e.pop("payload")  # sealed: nonces differ; the opened payloads are compared
        conversations = select(
            "SELECT id, head_branch_id, head_position, head_open, metadata, forked_from_conversation_id,"
            " key, state, subject, erased_at IS NULL AS live FROM chatledger_conversations"
            " WHERE id IN :c ORDER BY id"
        )
        for c in conversations:
            if sealed:  # nonces differ: whether each is sealed; the opened state is compared
                c.pop("metadata")
                c["state"] = str(c["state"]).startswith('{"sealed":{')
            c["slot"] = cids.index(str(c.pop("id")))
        branches = select(
            "SELECT id, conversation_id, parent_branch_id, parent_position, reason, run_id,"
            " resumes_run_id FROM chatledger_branches WHERE conversation_id IN :c"
        )
        event_ids = select(
            "SELECT id, conversation_id, event_seq FROM chatledger_event_ids WHERE conversation_id IN :c"
        )
        view = select(
            "SELECT conversation_id, position, event_seq FROM chatledger_view_entries"
            " WHERE conversation_id IN :c ORDER BY conversation_id, position"
        )
    for r in [*event_ids, *view]:
        r["event"] = order.get(r.pop("event_seq"))
    return {
        "conversations": sorted(conversations, key=lambda c: c["slot"]),
        "events": events,
        # Branches and caller ids have no order of their own: sorted once anonymized.
        "branches": branches,
        "event_ids": event_ids,
        "view": [{**r, "conversation_id": cids.index(str(r["conversation_id"]))} for r in view],
    }


def written(engine: sa.Engine, run: Run, sealed: bool) -> Any:
    names: dict[str, str] = {cid: f"conversation{i}" for i, cid in enumerate(run.convs)}
    outcomes = anonymized(run.outcomes, names)
    found = anonymized(rows(engine, run, sealed), names)
    for table in ("branches", "event_ids"):
        found[table] = sorted(found[table], key=repr)
    opened = [
        anonymized(
            [
                *((e.kind, e.position, e.payload) for e in run.face("events", conversation_id=cid)),
                run.face("conversation", cid).state,
            ],
            names,
        )
        for cid in run.convs
        if run.head(run.convs.index(cid)) is not None
    ]
    return outcomes, found, opened


# -- the test -----------------------------------------------------------------------


@dataclass
class Faces:
    engine: sa.Engine
    sealed: bool
    make: list[Callable[[str], Face]]


@pytest.fixture(params=[False, True], ids=["clear", "sealed"])
def faces(request: pytest.FixtureRequest, database_url: str) -> Iterator[Faces]:
    sealed: bool = request.param
    kek = KEK if sealed else None
    loop = Loop()
    sync = {fast: Store.open(database_url, fast_paths=fast, kek=kek) for fast in (True, False)}
    others = {fast: Store.open(database_url, fast_paths=fast, kek=kek) for fast in (True, False)}
    async_ = {
        fast: loop.run(called(AsyncStore.open, (database_url,), {"fast_paths": fast, "kek": kek}))
        for fast in (True, False)
    }

    def sync_face(fast: bool) -> Callable[[str], Face]:
        return lambda tenant: Face(sync[fast].tenant(tenant), others[fast].tenant(tenant))

    def async_face(fast: bool) -> Callable[[str], Face]:
        return lambda tenant: Face(
            Blocking(async_[fast].tenant(tenant), loop), others[fast].tenant(tenant)
        )

    try:
        yield Faces(
            sync[True].engine,
            sealed,
            [sync_face(True), sync_face(False), async_face(True), async_face(False)],
        )
    finally:
        for store in async_.values():
            loop.run(store.close())
        loop.close()
        for store in [*sync.values(), *others.values()]:
            store.close()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
# Each gate of `store._sql.append.plan`, at least once whatever is drawn: at the
# head kept (the first conversation's, from `Run.begin`) with a state to compare,
# or expected elsewhere; a creation expecting an old head, or with caller ids or
# a state, which the create form does not write.
@example(sequence=[Append(slot=0, messages=(0,), expected_state={"a": 1})])
@example(sequence=[Append(slot=0, messages=(1,), expected=("position", 1))])
@example(sequence=[Append(slot=1, messages=(0,), create=True, expected=("position", 2))])
@example(sequence=[Append(slot=1, messages=(0, 1), create=True, ids=("e1", "e2"))])
@example(sequence=[Append(slot=1, messages=(0,), create=True, state={"a": 1})])
# A key used again, and a caller id taken, at the head kept: no form may write them.
@example(sequence=[Append(slot=0, messages=(0,), key="k"), Append(slot=0, messages=(0,), key="k")])
@example(
    sequence=[
        Append(slot=0, messages=(0,), ids=("e1",)),
        Append(slot=0, messages=(1,), ids=("e1",)),
    ]
)
def test_every_form_of_the_append_writes_what_the_general_path_writes(
    faces: Faces, sequence: list[Step]
) -> None:
    results = []
    for make in faces.make:
        run = Run(make(f"differential-{uuid.uuid4()}"))  # its id anonymized too
        run.begin()
        for step in sequence:
            run.step(step)
        run.verified()
        results.append(written(faces.engine, run, faces.sealed))
    fast_sync, general_sync, fast_async, general_async = results
    assert fast_sync == general_sync
    assert fast_async == general_sync
    assert general_async == general_sync


def test_a_subject_on_a_store_that_seals_nothing_is_refused_by_every_form(store: Store) -> None:
    """Found by the differential: the create-append form wrote the conversation and
    dropped the subject, where the general path refused it."""
    ledger = store.tenant(f"subject-{uuid.uuid4().hex[:8]}")
    cid = new_id()
    with pytest.raises(EncryptionError, match="seals nothing"):
        ledger.append_messages(cid, [POOL[0]], create=NewConversation(subject="person-1"))
    assert ledger.conversations() == []
