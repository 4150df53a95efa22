"""What the model saw: a run's request N, rebuilt from the log and hashed as sent.

```python
check = rebuild_request(store.tenant("acme"), run_id, 2, agent)
assert check.matches          # sha256 of the rebuilt body == the digest model.requested recorded
print(check.body.decode())    # the exact bytes the provider received
```

The store rebuilds the provider-neutral messages (`ledger.audit.model_request`);
the agent's model adapter turns them into the wire body with the same pure
`prepare()` the run used, together with the agent's tools, tool choice and
settings, which the log does not record. So the check needs the agent the
run used, and, when its instructions are dynamic, the instructions the run
resolved (the log keeps only their sha256, which they must match). A run with
a retriever also needs the hits it was given (`hits=`): the log does not keep
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from chatledger.engine._values import Hit, context_block, given_hits, model_request
from chatledger.engine.agent import Agent
from chatledger.engine.providers import ModelRequest, PreparedRequest
from chatledger.store import AsyncLedger, InvalidInputError, Ledger, RecordedRequest

__all__ = ["RequestCheck", "check_request", "rebuild_request", "rebuild_request_async"]

T = TypeVar("T")


@dataclass(frozen=True)
class RequestCheck:
    """A rebuilt request, its wire body, and whether it hashes to the recorded digest.

    Attributes:
        recorded: what the store rebuilt from the log, with the recorded digest.
        request: the provider-neutral request given to the adapter.
        prepared: the wire body whose digest matched, or the non-streaming
            body when none did.
    """

    recorded: RecordedRequest
    request: ModelRequest
    prepared: PreparedRequest

    @property
    def matches(self) -> bool:
        """Whether sha256 of the rebuilt body equals the digest the run recorded."""
        return self.prepared.digest == self.recorded.digest

    @property
    def body(self) -> bytes:
        """The exact bytes of the request."""
        return self.prepared.body


def check_request(recorded: RecordedRequest, agent: Agent) -> RequestCheck:
    """Prepare `recorded` with `agent`'s model and tools, and compare digests. Pure: no I/O."""
    request = model_request(agent, recorded.messages)
    # The log does not say whether the request was streamed, which changes the
    # body (`"stream": true`): both forms are tried.
    bodies = [agent.model.prepare(request, stream=stream) for stream in (False, True)]
    prepared = next((p for p in bodies if p.digest == recorded.digest), bodies[0])
    return RequestCheck(recorded, request, prepared)


def rebuild_request(
    ledger: Ledger,
    run_id: str,
    request: int,
    agent: Agent,
    *,
    instructions: str | None = None,
    hits: Sequence[Hit] = (),
) -> RequestCheck:
    """Rebuild request `request` of run `run_id` and check it against the log.

    Args:
        agent: the agent the run used (its model, tools, settings and history
            processor).
        instructions: the instructions the run resolved; default the agent's
            static instructions (required when it has `instructions_fn`).
        hits: the retrieval hits the run was given, for an agent with a
            retriever (the agent's `context_filter` is applied, as the run did).
    """
    recorded = _read(ledger.audit.model_request, run_id, request, agent, instructions, hits)
    return check_request(recorded, agent)


async def rebuild_request_async(
    ledger: AsyncLedger,
    run_id: str,
    request: int,
    agent: Agent,
    *,
    instructions: str | None = None,
    hits: Sequence[Hit] = (),
) -> RequestCheck:
    """`rebuild_request` on an `AsyncLedger`."""
    recorded = await _read(ledger.audit.model_request, run_id, request, agent, instructions, hits)
    return check_request(recorded, agent)


def _read(
    model_request: Callable[..., T],
    run_id: str,
    request: int,
    agent: Agent,
    instructions: str | None,
    hits: Sequence[Hit],
) -> T:
    """`model_request` (a `Ledger`'s or an `AsyncLedger`'s audit) for `agent`'s run: its
    instructions, the hits it was given (the retriever's, filtered as the run filtered
    them) and its history processor."""
    return model_request(
        run_id,
        request,
        instructions=_instructions(agent, instructions),
        context=context_block(given_hits(agent.context_filter, hits)),
        history_processor=agent.history_processor,
    )


def _instructions(agent: Agent, given: str | None) -> str:
    if given is not None:
        return given
    if agent.instructions_fn is not None:
        raise InvalidInputError(
            "The agent has dynamic instructions (instructions_fn), which the log keeps only as "
            "a sha256. Pass instructions= with the text the run resolved."
        )
    return agent.instructions
