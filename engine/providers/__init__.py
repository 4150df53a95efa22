"""Models: the protocol the engine speaks, and its adapters."""

from chatledger.engine.providers._base import (
    Delta,
    DeltaCallback,
    Model,
    ModelRequest,
    ModelResponse,
    PreparedRequest,
    ToolChoice,
    ToolSpec,
)
from chatledger.engine.providers._errors import (
    ModelConfigError,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelRequestError,
    ModelResponseError,
    ModelStreamError,
)
from chatledger.engine.providers._http import RetryPolicy
from chatledger.engine.providers.anthropic import AnthropicModel
from chatledger.engine.providers.openai import OpenAIChatModel
from chatledger.engine.providers.scripted import ScriptedModel, ScriptFunction, ScriptItem

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
