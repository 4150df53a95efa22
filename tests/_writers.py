"""A writer loop for the concurrency tests (importable by spawned processes)."""

from __future__ import annotations

import time
from typing import Any

from chatledger.store import ConflictError, Ledger, Message, Store


def write_until(
    ledger: Ledger, conversation_id: str, writer: int, deadline: float
) -> dict[str, Any]:
    """Append with expected positions until `deadline` (time.time()).

    Every success is retried once with its idempotency key, which must return
    the same positions.
    """
    acked: list[tuple[int, str]] = []
    conflicts = 0
    errors: list[str] = []
    retries_ok = 0
    n = 0
    while time.time() < deadline:
        n += 1
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
        "attempts": n,
        "retries_ok": retries_ok,
    }


def process_writer(
    url: str, tenant: str, conversation_id: str, writer: int, seconds: float, fast_paths: bool
) -> dict[str, Any]:
    """`write_until` in a process of its own, with its own store (fast paths on
    or off, as the test's store), for `seconds` from when the process is ready
    (a loaded machine starts processes late)."""
    with Store.open(url, fast_paths=fast_paths) as store:
        ledger = store.tenant(tenant)
        ledger.conversation(conversation_id)  # connected and warmed up
        return write_until(ledger, conversation_id, writer, time.time() + seconds)
