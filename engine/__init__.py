"""chatledger's engine: the agent run loop over the event log."""

from engine._errors import Partial, RunError
from engine.agent import Agent, Hit, Result, RunContext, Source
from engine.audit import RequestCheck, check_request, rebuild_request, rebuild_request_async
from engine.providers import Model, ModelError, ModelRequest, ModelResponse, ToolSpec
from engine.tools import Canceled, Tool, ToolFailed, ToolResult, tool
from store import __version__

__all__ = [
    "Agent",
    "Canceled",
    "Hit",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "Partial",
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
    "rebuild_request",
    "rebuild_request_async",
    "tool",
]
