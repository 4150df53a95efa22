"""chatledger's engine: the agent run loop over the event log.

Every name is imported on first use (PEP 562), so `chatledger --version` and
other light entry points do not pay for the providers, httpx or the store's
database layer.
"""

import typing as _typing

from chatledger import __version__
from chatledger._lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from chatledger.engine._errors import Partial, RunError
    from chatledger.engine._values import (
        RESTRICTED,
        Hit,
        HitFilter,
        Result,
        RunContext,
        Source,
        drop_restricted,
    )
    from chatledger.engine.agent import Agent
    from chatledger.engine.audit import (
        RequestCheck,
        check_request,
        rebuild_request,
        rebuild_request_async,
    )
    from chatledger.engine.providers import Model, ModelError, ModelRequest, ModelResponse, ToolSpec
    from chatledger.engine.tools import Canceled, Tool, ToolFailed, ToolResult, tool

# Each public name, and the module it comes from.
_LAZY = {
    "Agent": ".agent",
    "Canceled": ".tools",
    "Hit": "._values",
    "HitFilter": "._values",
    "Model": ".providers",
    "ModelError": ".providers",
    "ModelRequest": ".providers",
    "ModelResponse": ".providers",
    "Partial": "._errors",
    "RESTRICTED": "._values",
    "RequestCheck": ".audit",
    "Result": "._values",
    "RunContext": "._values",
    "RunError": "._errors",
    "Source": "._values",
    "Tool": ".tools",
    "ToolFailed": ".tools",
    "ToolResult": ".tools",
    "ToolSpec": ".providers",
    "check_request": ".audit",
    "drop_restricted": "._values",
    "rebuild_request": ".audit",
    "rebuild_request_async": ".audit",
    "tool": ".tools",
}


__getattr__, __dir__ = _lazy_names(globals(), _LAZY)


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
