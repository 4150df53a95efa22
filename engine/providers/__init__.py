"""Models: the protocol the engine speaks, and its adapters."""

from engine.providers._base import (
    Delta,
    DeltaCallback,
    Model,
    ModelRequest,
    ModelResponse,
    PreparedRequest,
    ToolChoice,
    ToolSpec,
)
from engine.providers._errors import (
    ModelConfigError,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelRequestError,
    ModelResponseError,
    ModelStreamError,
)
from engine.providers._http import RetryPolicy
from engine.providers.anthropic import AnthropicModel
from engine.providers.openai import OpenAIChatModel
from engine.providers.scripted import ScriptedModel, ScriptFunction, ScriptItem

__all__ = [
    "AnthropicModel",
    "Delta",
    "DeltaCallback",
    "Model",
    "ModelConfigError",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRequest",
    "ModelRequestError",
    "ModelResponse",
    "ModelResponseError",
    "ModelStreamError",
    "OpenAIChatModel",
    "PreparedRequest",
    "RetryPolicy",
    "ScriptFunction",
    "ScriptItem",
    "ScriptedModel",
    "ToolChoice",
    "ToolSpec",
]
