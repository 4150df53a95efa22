"""chatledger: an event-sourced conversation store for LLM agents.

The package is split by what each part needs:

- `chatledger.store`: the message contract, the history algorithms and the
  event log (SQLite or PostgreSQL);
- `chatledger.engine`: the agent run loop, the model providers and the
  `chatledger` command;
- `chatledger.service`: the HTTP ask service (the `serve` extra);
- `chatledger.adapters`: backends for other agent frameworks (one extra each);
- `chatledger.migrations`: the Alembic environment `Store.migrate()` runs.

`import chatledger` loads none of them. The names most programs start from
are here too, imported on first use (PEP 562):

    from chatledger import Agent, Message, Store, tool
"""


import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from chatledger.engine import Agent, tool
    from chatledger.store import AsyncStore, Message, Store

# Each shortcut, and the subpackage that defines it.
_LAZY = {
    "Agent": "chatledger.engine",
    "AsyncStore": "chatledger.store",
    "Message": "chatledger.store",
    "Store": "chatledger.store",
    "tool": "chatledger.engine",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatledger' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["Agent", "AsyncStore", "Message", "Store", "__version__", "tool"]
