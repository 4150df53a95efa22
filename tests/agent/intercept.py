"""A real ledger whose store passes every operation through a hook of the test's.

The engine's run loop does not call a ledger's methods: it builds operations
(`store._ops`) and runs them on the ledger's store (`store._steps.Steps`). A
test that injects a fault, or watches what is acknowledged, does it there:
`intercepted(ledger, around)` is the same tenant on a store whose `execute`
calls `around(op, run)`, where `run()` executes `op` (a coroutine function
on an `AsyncLedger`'s store). Operations are told apart by `Op.action`:
"recording events of run", "starting a run", "ending run" (a completion or
a failure).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

L = TypeVar("L")


class _Store:
    def __init__(self, store: Any, around: Callable[[Any, Callable[[], Any]], Any]) -> None:
        self._store, self._around = store, around

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def execute(self, op: Any, connection: Any = None) -> Any:
        return self._around(op, lambda: self._store.execute(op, connection))


def intercepted(ledger: L, around: Callable[[Any, Callable[[], Any]], Any]) -> L:
    """`ledger`, each operation run on its store through `around(op, run)`."""
    twin = copy.copy(ledger)
    twin._store = _Store(ledger._store, around)  # type: ignore[attr-defined]
    return twin
