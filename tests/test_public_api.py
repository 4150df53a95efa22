"""The packages' public surface: one sorted `__all__`, complete and importable."""

from __future__ import annotations

import types

import pytest

import engine
import store


@pytest.mark.parametrize("package", [store, engine])
def test_all_is_sorted_and_complete(package: types.ModuleType) -> None:
    exported = list(package.__all__)
    assert exported == sorted(exported)
    for name in exported:
        assert hasattr(package, name), name
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(exported), public - set(exported)


def test_every_public_error_is_a_chatledger_error() -> None:
    errors = [
        getattr(p, n)
        for p in (store, engine)
        for n in p.__all__
        if isinstance(getattr(p, n), type) and issubclass(getattr(p, n), Exception)
    ]
    plain = [e for e in errors if not issubclass(e, store.ChatledgerError)]
    # Canceled and ToolFailed are raised *by tools* to steer the run, not by chatledger.
    assert {e.__name__ for e in plain} == {"Canceled", "ToolFailed"}
