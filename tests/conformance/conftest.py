"""The store's conformance suite, on both faces.

Every test here takes `ledger`, and runs on each backend with the fast paths
on and off (`tests/conftest.py`) on the sync face, and on each backend on the
async face (ids `sqlite-async`, `postgres-async`): there `ledger` is an
`AsyncLedger` called as a `Ledger` is (`Blocking`), each call run to its end
on the test's event loop, on a thread of its own (`Loop`), which the store
was opened on. A test writes its behaviour once, and both faces are held to
it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from chatledger.store import AsyncStore, Ledger, Store
from tests.conftest import citus_url
from tests.helpers import Blocking, Loop, called


@pytest.fixture
def ids_per_tenant(backend: str) -> bool:
    """Whether a caller's conversation and event ids are unique within a tenant only:
    on a Citus cluster, where every key holds the tenant (ADR 0054); on one server
    they are unique across tenants."""
    return backend == "postgres" and citus_url() is not None


@pytest.fixture
def face(request: pytest.FixtureRequest) -> str:
    """The face this run's `ledger` is: `sync` or `async` (see tests/conftest.py)."""
    return str(getattr(request, "param", "sync"))


@pytest.fixture
def ledger(store: Store, face: str, database_url: str, fast_paths: bool) -> Iterator[Ledger]:
    """A handle on a tenant no other test uses, on this run's face."""
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    if face == "sync":
        yield store.tenant(tenant)
        return
    loop = Loop()
    try:
        # Opened on the loop that runs its calls: its engine belongs to it.
        opened: AsyncStore = loop.run(
            called(AsyncStore.open, (database_url,), {"fast_paths": fast_paths})
        )
        try:
            yield Blocking(opened.tenant(tenant), loop)  # type: ignore[misc]
        finally:
            loop.run(opened.close())
    finally:
        loop.close()
