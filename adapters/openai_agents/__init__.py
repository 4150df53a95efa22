"""OpenAI Agents SDK backend (extra `openai-agents`): the translation of the SDK's
session items to chatledger messages and back."""

# from adapters.openai_agents._session import ...  (the Session backend; exported by its author)
from adapters.openai_agents._translate import from_messages, item_count, to_messages

__all__ = ["from_messages", "item_count", "to_messages"]
