"""chatledger's engine: the agent run loop over the event log.

Every name is imported on first use (PEP 562), so `chatledger --version` and
other light entry points do not pay for the providers, httpx or the store's
database layer.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

from store import __version__

if _typing.TYPE_CHECKING:
    from engine._errors import Partial, RunError
    from engine._values import (
        RESTRICTED,
        Hit,
        HitFilter,
        Result,
        RunContext,
        Source,
        drop_restricted,
    )
    from engine.agent import Agent
    from engine.audit import RequestCheck, check_request, rebuild_request, rebuild_request_async
    from engine.providers import Model, ModelError, ModelRequest, ModelResponse, ToolSpec
    from engine.tools import Canceled, Tool, ToolFailed, ToolResult, tool

# Each public name, and the module it comes from.
_LAZY = {
    "Agent": "engine.agent",
    "Canceled": "engine.tools",
    "Hit": "engine._values",
    "HitFilter": "engine._values",
    "Model": "engine.providers",
    "ModelError": "engine.providers",
    "ModelRequest": "engine.providers",
    "ModelResponse": "engine.providers",
    "Partial": "engine._errors",
    "RESTRICTED": "engine._values",
    "RequestCheck": "engine.audit",
    "Result": "engine._values",
    "RunContext": "engine._values",
    "RunError": "engine._errors",
    "Source": "engine._values",
    "Tool": "engine.tools",
    "ToolFailed": "engine.tools",
    "ToolResult": "engine.tools",
    "ToolSpec": "engine.providers",
    "check_request": "engine.audit",
    "drop_restricted": "engine._values",
    "rebuild_request": "engine.audit",
    "rebuild_request_async": "engine.audit",
    "tool": "engine.tools",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module), name)
    elif not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}"):
        value = _importlib.import_module(f"{__name__}.{name}")  # a submodule, as `engine.providers`
    else:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [  # noqa: RUF022 (sorted as the test sorts: plain str order)
    "Agent",
    "Canceled",
    "Hit",
    "HitFilter",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "Partial",
    "RESTRICTED",
    "RequestCheck",
    "Result",
    "RunContext",
    "RunError",
    "Source",
    "Tool",
    "ToolFailed",
    "ToolResult",
    "ToolSpec",
    "__version__",
    "check_request",
    "drop_restricted",
    "rebuild_request",
    "rebuild_request_async",
    "tool",
]
