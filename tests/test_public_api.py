"""The packages' public surface: one sorted `__all__`, complete and importable."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import chatledger
from chatledger import engine, service, store


@pytest.mark.parametrize("package", [chatledger, store, engine, service])
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


def test_submodules_are_package_attributes_without_their_own_import() -> None:
    """`store.schema.metadata` works without importing `store.schema` first."""
    code = (
        "from chatledger import engine, store\n"
        "assert store.schema.metadata.tables\n"
        "assert engine.providers.ScriptedModel and engine.agent.Agent\n"
        "try:\n"
        "    store.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('a missing name resolved')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
