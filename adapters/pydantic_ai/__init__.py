"""pydantic-ai backend (extra `pydantic-ai`): its messages as chatledger messages and back."""

from adapters.pydantic_ai._translate import from_messages, group_sizes, group_start, to_messages

__all__ = ["from_messages", "group_sizes", "group_start", "to_messages"]
