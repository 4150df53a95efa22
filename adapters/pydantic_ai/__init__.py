"""pydantic-ai backend (extra `pydantic-ai`): `LedgerConversationStore`, and the
translation of pydantic-ai's messages to chatledger messages and back."""

from chatledger.adapters.pydantic_ai._store import LedgerConversationStore
from chatledger.adapters.pydantic_ai._translate import (
    from_messages,
    group_sizes,
    group_start,
    to_messages,
)

__all__ = ["LedgerConversationStore", "from_messages", "group_sizes", "group_start", "to_messages"]
