"""OpenAI Agents SDK backend (extra `openai-agents`): `ChatledgerSession`, and the
translation of the SDK's session items to chatledger messages and back."""

from chatledger.adapters.openai_agents._session import ChatledgerSession
from chatledger.adapters.openai_agents._translate import from_messages, item_count, to_messages

__all__ = ["ChatledgerSession", "from_messages", "item_count", "to_messages"]
