"""A writer process for the audit pagination test (importable by spawned processes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatledger.store import Message, Store


def append(
    url: str,
    tenant: str,
    conversation_ids: Sequence[str],
    count: int,
    writer: int,
    done: Any,
    fast_paths: bool,
) -> None:
    """Append `count` one-message turns across the conversations, then set `done`.

    The store's fast paths are on or off as in the test's own store.
    """
    try:
        with Store.open(url, fast_paths=fast_paths) as store:
            ledger = store.tenant(tenant)
            for n in range(count):
                conversation = conversation_ids[n % len(conversation_ids)]
                text = f"writer {writer} message {n}"
                ledger.append_messages(conversation, [Message(role="user", content=text)])
    finally:
        done.set()
