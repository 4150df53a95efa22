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

__all__ = [
    "Delta",
    "DeltaCallback",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "PreparedRequest",
    "ToolChoice",
    "ToolSpec",
]
