"""The sync and async faces offer the same operations, with the same parameters.

Their operations are written from one declaration each (`store._ops`) by
scripts/faces.py, into the faces' bases in `store/_faces.py`, so the first test
here is that the file holds what it writes: an edit by hand, or a declaration
changed without regenerating, fails it.

Each pair is compared member by member with `inspect`: the same public
names, the same kind of member, the same parameters (names, kinds, defaults,
annotations as written) and return annotation; an async face's method is a
coroutine wherever the sync one does I/O. The differences that must exist are
listed in `DIFFERENCES` and `RENAMED`, each with its reason; an entry that no
longer matches anything fails too, so the list cannot go stale.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chatledger.store import (
    AsyncAudit,
    AsyncLedger,
    AsyncRetention,
    AsyncRuns,
    AsyncStore,
    Audit,
    Ledger,
    Retention,
    Runs,
    Store,
)

ROOT = Path(__file__).resolve().parent.parent

PAIRS = [
    (Store, AsyncStore),
    (Ledger, AsyncLedger),
    (Runs, AsyncRuns),
    (Retention, AsyncRetention),
    (Audit, AsyncAudit),
]

# The context-manager protocol has its own names on each side.
RENAMED = {"__enter__": "__aenter__", "__exit__": "__aexit__"}

# Dunders compared besides the renamed ones: how each face is constructed.
DUNDERS = {"__init__", *RENAMED}

# What the async face does without I/O, so it is a plain method there too:
# `open` only builds an engine, `tenant` only a handle.
NO_IO = {"__init__", "open", "tenant"}

# What does I/O as it is iterated: a plain method on the async face too, which
# checks its arguments at once and returns an async iterator (`async for`).
ITERATED = {"tail"}

# (sync class, member, parameter or "return"): (sync annotation, async annotation).
DIFFERENCES: dict[tuple[str, str, str], tuple[str, str]] = {
    # Each face runs on its own kind of SQLAlchemy engine...
    ("Store", "__init__", "engine"): ("Engine", "AsyncEngine"),
    ("Store", "open", "engine"): ("Engine | None", "AsyncEngine | None"),
    # ...and hands out its own kind of store, ledger and audit.
    ("Store", "open", "return"): ("Store", "AsyncStore"),
    ("Store", "__enter__", "return"): ("Store", "AsyncStore"),
    ("Store", "tenant", "return"): ("Ledger", "AsyncLedger"),
    ("Ledger", "__init__", "store"): ("Store", "AsyncStore"),
    ("Ledger", "audit", "return"): ("Audit", "AsyncAudit"),
    ("Ledger", "runs", "return"): ("Runs", "AsyncRuns"),
    ("Ledger", "retention", "return"): ("Retention", "AsyncRetention"),
    # Joining the caller's transaction takes the caller's kind of connection
    # (on the async face the upgrade runs through `AsyncConnection.run_sync`).
    ("Store", "migrate", "connection"): ("Connection | None", "AsyncConnection | None"),
    ("Store", "execute", "connection"): ("Connection | None", "AsyncConnection | None"),
    # The sub-handles run on whatever executes an `Op`, sync or async
    # (protocols in `store._sql.ops`).
    ("Runs", "__init__", "store"): ("Executor", "AsyncExecutor"),
    ("Retention", "__init__", "store"): ("Executor", "AsyncExecutor"),
    ("Audit", "__init__", "store"): ("Executor", "AsyncExecutor"),
    # A tail is iterated with `for` on one face, `async for` on the other.
    ("Ledger", "tail", "return"): ("Iterator[Page[Event]]", "AsyncIterator[Page[Event]]"),
}


def test_the_faces_hold_what_their_declarations_write() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "faces.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def members(cls: type) -> dict[str, Any]:
    """The public members a face has, its generated base's operations (`store._faces`)
    included, and the dunders that shape its use."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):  # the face's own override its base's
        found.update(vars(klass))
    return {
        name: value
        for name, value in found.items()
        if not name.startswith("_") or name in DUNDERS or name in RENAMED.values()
    }


def kind(member: Any) -> str:
    return type(member).__name__  # function, classmethod, staticmethod, property


def function(member: Any) -> Callable[..., Any]:
    if isinstance(member, property):
        assert member.fget is not None
        return member.fget
    if isinstance(member, classmethod | staticmethod):
        return member.__func__  # type: ignore[no-any-return]
    assert callable(member)
    return member  # type: ignore[no-any-return]


def counterpart(name: str) -> str:
    return RENAMED.get(name, name)


def differences(
    sync_cls: type, name: str, sync_fn: Callable[..., Any], async_fn: Callable[..., Any]
) -> tuple[list[str], set[tuple[str, str, str]]]:
    """What differs between two members beyond `DIFFERENCES`, and which entries it used."""
    found: list[str] = []
    used: set[tuple[str, str, str]] = set()
    where = f"{sync_cls.__name__}.{name}"
    sync_sig, async_sig = inspect.signature(sync_fn), inspect.signature(async_fn)

    def annotations_differ(label: str, sync_ann: Any, async_ann: Any) -> bool:
        key = (sync_cls.__name__, name, label)
        if key in DIFFERENCES and DIFFERENCES[key] == (sync_ann, async_ann):
            used.add(key)
            return False
        return bool(sync_ann != async_ann)

    sync_params = list(sync_sig.parameters.values())
    async_params = list(async_sig.parameters.values())
    if [p.name for p in sync_params] != [p.name for p in async_params]:
        found.append(
            f"{where}: parameters {[p.name for p in sync_params]} "
            f"vs {[p.name for p in async_params]}"
        )
        return found, used
    for s, a in zip(sync_params, async_params, strict=True):
        if s.kind != a.kind:
            found.append(f"{where}({s.name}): kind {s.kind.description} vs {a.kind.description}")
        if s.default != a.default:
            found.append(f"{where}({s.name}): default {s.default!r} vs {a.default!r}")
        if annotations_differ(s.name, s.annotation, a.annotation):
            found.append(f"{where}({s.name}): annotation {s.annotation!r} vs {a.annotation!r}")
    if annotations_differ("return", sync_sig.return_annotation, async_sig.return_annotation):
        found.append(
            f"{where}: returns {sync_sig.return_annotation!r} vs {async_sig.return_annotation!r}"
        )
    return found, used


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_both_faces_offer_the_same_members(sync_cls: type, async_cls: type) -> None:
    sync_names = {counterpart(n) for n in members(sync_cls)}
    async_names = set(members(async_cls))
    only_sync, only_async = sorted(sync_names - async_names), sorted(async_names - sync_names)
    assert not only_sync, f"only on {sync_cls.__name__}: {', '.join(only_sync)}"
    assert not only_async, f"only on {async_cls.__name__}: {', '.join(only_async)}"


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_both_faces_take_the_same_parameters(sync_cls: type, async_cls: type) -> None:
    async_members = members(async_cls)
    found: list[str] = []
    for name, member in members(sync_cls).items():
        twin = async_members.get(counterpart(name))
        if twin is None:
            continue  # test_both_faces_offer_the_same_members names it
        if kind(member) != kind(twin):
            found.append(f"{sync_cls.__name__}.{name}: a {kind(member)} vs a {kind(twin)}")
            continue
        found += differences(sync_cls, name, function(member), function(twin))[0]
    assert not found, "\n" + "\n".join(found)


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_the_async_face_is_a_coroutine_wherever_the_sync_one_does_io(
    sync_cls: type, async_cls: type
) -> None:
    for name, member in members(sync_cls).items():
        twin = members(async_cls).get(counterpart(name))
        if twin is None:
            continue
        assert not inspect.iscoroutinefunction(function(member)), f"{sync_cls.__name__}.{name}"
        if name in ITERATED:
            returns = inspect.signature(function(twin)).return_annotation
            assert str(returns).startswith("AsyncIterator["), f"{async_cls.__name__}.{name}"
            assert not inspect.iscoroutinefunction(function(twin))
            continue
        io = name not in NO_IO and not isinstance(member, property)
        assert inspect.iscoroutinefunction(function(twin)) == io, f"{async_cls.__name__}.{name}"


def test_every_allowed_difference_is_still_needed() -> None:
    used: set[tuple[str, str, str]] = set()
    for sync_cls, async_cls in PAIRS:
        async_members = members(async_cls)
        for name, member in members(sync_cls).items():
            twin = async_members.get(counterpart(name))
            if twin is not None:
                used |= differences(sync_cls, name, function(member), function(twin))[1]
    stale = sorted(set(DIFFERENCES) - used)
    assert not stale, f"DIFFERENCES entries that match nothing: {stale}"


async def test_both_stores_have_the_same_public_attributes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'faces.db'}"
    with Store.open(url) as sync_store:
        async with AsyncStore.open(url) as async_store:
            public = [
                {n for n in vars(s) if not n.startswith("_")} for s in (sync_store, async_store)
            ]
            assert public[0] == public[1]
