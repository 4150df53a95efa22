"""The engine's errors, under `store.ChatledgerError`.

```
ChatledgerError
├── RunError          a run failed, was canceled or disconnected; carries its partial
└── ModelError        (engine.providers) a model request failed for good
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatledger.store import ChatledgerError, Message, Usage

__all__ = ["FailureStage", "Partial", "RunError"]

FailureStage = Literal[
    "guard",
    "retrieval",
    "processor",
    "model",
    "tool",
    "store",
    "conflict",
    "limit",
    "canceled",
    "disconnect",
]
"""Where a run stopped (see `RunError.stage`)."""


@dataclass(frozen=True)
class Partial:
    """What a failed run completed, exactly as its events record it.

    `messages` is the repaired history at the failed run's last recorded
    position: the replayed history, the prompt, every completed model turn
    and the tool results recorded before the failure.
    """

    messages: list[Message]
    usage: Usage = field(default_factory=Usage)
    request_count: int = 0
    tool_count: int = 0


class RunError(ChatledgerError):
    """A run did not complete.

    Attributes:
        stage: where it stopped: `guard` (the guard rejected the prompt),
            `retrieval` (the retriever raised), `processor` (the history
            processor raised or dropped the prompt), `model` (a model
            request failed), `tool` (a tool crashed, or the model made too
            many invalid calls), `store` (the ledger failed a write),
            `conflict` (the run completed, but another writer had moved the
            head meanwhile: ask again, a resume would meet the same head), `limit`
            (the agent's `max_requests` was reached), `canceled` (a tool
            canceled the run) or `disconnect` (the caller's task was
            canceled).
        partial: what completed before it stopped, or None when no model
            turn completed.
        run_id: the run.
        conversation_id: its conversation.
    """

    def __init__(
        self,
        message: str,
        *,
        stage: FailureStage,
        partial: Partial | None,
        run_id: str,
        conversation_id: str,
    ) -> None:
        self.stage = stage
        self.partial = partial
        self.run_id = run_id
        self.conversation_id = conversation_id
        super().__init__(message)
