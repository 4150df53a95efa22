"""What every framework backend checks of the tenant handle it is built from."""

from __future__ import annotations

from chatledger.store import AsyncLedger, Ledger

__all__ = ["require_async_ledger", "require_ledger"]


def require_async_ledger(ledger: object, backend: str) -> AsyncLedger:
    """`ledger` when it is an `AsyncLedger`; else a `TypeError` that says what to pass.

    The frameworks call their stores and sessions with `await`, so a backend
    needs the async handle; a sync `Ledger` would only fail on first use, far
    from the line that built the backend.
    """
    if isinstance(ledger, AsyncLedger):
        return ledger
    if isinstance(ledger, Ledger):
        raise TypeError(
            f"{backend} needs an AsyncLedger, not a Ledger: the framework awaits every "
            "call. Open the store with AsyncStore.open(...) and pass "
            "async_store.tenant(name)."
        )
    raise TypeError(
        f"{backend} needs an AsyncLedger (AsyncStore.open(...).tenant(name)), "
        f"not {type(ledger).__name__}."
    )


def require_ledger(ledger: object, backend: str) -> Ledger | AsyncLedger:
    """`ledger` when it is a `Ledger` or an `AsyncLedger`; else a `TypeError` that says
    what to pass (a backend that serves a sync face and an async one)."""
    if isinstance(ledger, Ledger | AsyncLedger):
        return ledger
    raise TypeError(
        f"{backend} needs a tenant's handle: a Ledger (Store.open(...).tenant(name)) for "
        f"sync calls or an AsyncLedger (AsyncStore.open(...).tenant(name)) for async ones, "
        f"not {type(ledger).__name__}."
    )
