"""`engine.providers` re-exports every public name of its modules, in a sorted `__all__`."""

from __future__ import annotations

import chatledger.engine.providers as providers
from chatledger.engine.providers import _base, _errors, anthropic, openai, scripted


def test_all_is_sorted_and_complete() -> None:
    assert providers.__all__ == sorted(providers.__all__)
    modules = [_base, _errors, anthropic, openai, scripted]
    public = {name for module in modules for name in module.__all__}
    assert public <= set(providers.__all__)
    assert all(hasattr(providers, name) for name in providers.__all__)
