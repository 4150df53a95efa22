"""LangGraph backend (extra `langgraph`): `Saver`, LangGraph's checkpointer over a
chatledger tenant, and the translation of LangChain's messages to chatledger
messages and back."""

from chatledger.adapters.langgraph._saver import Saver
from chatledger.adapters.langgraph._translate import from_message, to_message

__all__ = ["Saver", "from_message", "to_message"]
