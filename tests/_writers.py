"""A writer loop for the concurrency tests (importable by spawned processes)."""

from __future__ import annotations

from typing import Any

from chatledger.store import ConflictError, Ledger, Message, Store

_start: Any = None
"""The barrier a writer process waits at before its first attempt (`ready`)."""


def write(
    ledger: Ledger, conversation_id: str, writer: int, attempts: int, start: Any
) -> dict[str, Any]:
    """`attempts` appends with expected positions, each from the head just read, once
    every writer has passed `start` (a barrier): they race from the first one.

    Every success is retried once with its idempotency key, which must return
    the same positions.
    """
    acked: list[tuple[int, str]] = []
    conflicts = 0
    errors: list[str] = []
    retries_ok = 0
    start.wait()
    for n in range(1, attempts + 1):
        text = f"writer {writer} message {n}"
        key = f"w{writer}-{n}"
        expected = ledger.conversation(conversation_id).head.position
        try:
            appended = ledger.append_messages(
                conversation_id,
                [Message(role="user", content=text)],
                expected=expected,
                idempotency_key=key,
            )
        except ConflictError as error:
            if error.expected != expected or error.actual is None or error.actual <= expected:
                errors.append(f"conflict with wrong positions: {error}")
            conflicts += 1
            continue
        except Exception as error:
            errors.append(repr(error))
            continue
        acked.append((appended.positions[0], text))
        retry = ledger.append_messages(
            conversation_id,
            [Message(role="user", content=text)],
            expected=expected,
            idempotency_key=key,
        )
        if retry.positions == appended.positions:
            retries_ok += 1
        else:
            errors.append(f"retry of {key} returned {retry.positions}, not {appended.positions}")
    return {
        "acked": acked,
        "conflicts": conflicts,
        "errors": errors,
        "attempts": attempts,
        "retries_ok": retries_ok,
    }


def ready(start: Any) -> None:
    """A writer process's initializer: the barrier its writer waits at."""
    global _start
    _start = start


def process_writer(
    url: str, tenant: str, conversation_id: str, writer: int, attempts: int, fast_paths: bool
) -> dict[str, Any]:
    """`write` in a process of its own, with its own store (fast paths on or off, as
    the test's store), connected and warmed up before it waits at the barrier."""
    with Store.open(url, fast_paths=fast_paths) as store:
        ledger = store.tenant(tenant)
        ledger.conversation(conversation_id)
        return write(ledger, conversation_id, writer, attempts, _start)


__all__ = ["process_writer", "ready", "write"]
